"""Where built-in tiny models and synthetic task media are materialised on disk."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """``MMGRPO_CACHE`` or ``~/.cache/mmgrpo``."""
    return Path(os.environ.get("MMGRPO_CACHE", Path.home() / ".cache" / "mmgrpo"))


def publish_dir(target: Path, write: Callable[[Path], None], complete: dict) -> None:
    """Materialise the folder ``target`` once, atomically: ``write(tmp)`` fills a fresh sibling folder, which gets
    the marker ``complete.json`` (``complete``: what it was made from) and is renamed into place. A folder without
    the marker (an interrupted attempt) is replaced; if another process published first, its folder is kept. Does
    nothing when ``target/complete.json`` exists."""
    if (target / "complete.json").is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    write(tmp)
    (tmp / "complete.json").write_text(json.dumps(complete, indent=1))
    try:
        if target.exists():  # an incomplete earlier attempt
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except OSError:  # another process wrote it first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
