import sys

from mmgrpo.cli import main

sys.exit(main())
