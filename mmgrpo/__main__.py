import sys

from mmgrpo.cli import main, note_deprecations

note_deprecations()
sys.exit(main())
