"""Where built-in tiny models and synthetic task media are materialised on disk."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``MMGRPO_CACHE`` or ``~/.cache/mmgrpo``."""
    return Path(os.environ.get("MMGRPO_CACHE", Path.home() / ".cache" / "mmgrpo"))
