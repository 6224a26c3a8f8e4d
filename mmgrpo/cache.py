"""Where built-in tiny models and synthetic task media are materialised on disk."""

from __future__ import annotations

import contextlib
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
    the marker (an interrupted attempt) is renamed aside and removed; a complete one that another process published
    while this one wrote is kept, never removed (readers of it may already hold its paths). Does nothing when
    ``target/complete.json`` exists."""
    if (target / "complete.json").is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    write(tmp)
    (tmp / "complete.json").write_text(json.dumps(complete, indent=1))
    if target.exists() and not (target / "complete.json").is_file():  # an interrupted earlier attempt
        stale = Path(tempfile.mkdtemp(prefix=target.name + ".stale.", dir=target.parent))
        with contextlib.suppress(OSError):  # fails when another process moved it first
            os.replace(target, stale)  # onto an empty folder: atomic
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.replace(tmp, target)  # fails (not empty) when another process published first: keep theirs
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
