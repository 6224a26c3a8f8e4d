"""Data paths in a config resolve against the config's folder, as reward modules do (``mmgrpo.loader.load_config``).

``task.args.train``, ``task.args.eval`` and ``task.args.media_root`` of the ``dataset`` task, when relative:

- in the config file: the config's folder first; else, where the path exists from the working directory (the
  behaviour before), that one, with a one-line note saying to write it relative to the config's folder; else the
  value stays as written (a hub id such as ``org/name``; a missing file is then the task's one-line error);
- given as a ``key.sub=value`` override on the command line: the working directory, where it was typed.

The resolved value is absolute, so the saved ``config.yaml`` of a run holds absolute paths and its run directory
is self-contained (``mmgrpo demo RUN_DIR`` and ``resume`` read the same data from any working directory).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from mmgrpo.config import TrainConfig

logger = logging.getLogger(__name__)

DATA_PATH_KEYS = ("train", "eval", "media_root")
"""``task.args`` keys of the ``dataset`` task that name files or folders."""


def resolve_data_paths(cfg: TrainConfig, config_path: str | Path | None, overrides: Iterable[str] = ()) -> None:
    """Make the dataset task's relative data paths absolute in place (module docstring)."""
    if cfg.task.name != "dataset" or not isinstance(cfg.task.args, dict):
        return
    overridden = {ov.partition("=")[0].strip() for ov in overrides}
    folder = Path(config_path).resolve().parent if config_path is not None else None
    for key in DATA_PATH_KEYS:
        value = cfg.task.args.get(key)
        if not isinstance(value, str) or not value or value.startswith(("http://", "https://")):
            continue
        path = Path(value).expanduser()
        if path.is_absolute():
            continue
        from_cwd = f"task.args.{key}" in overridden or folder is None
        if from_cwd:
            if path.exists():
                cfg.task.args[key] = str(path.resolve())
        elif (folder / path).exists():
            cfg.task.args[key] = str((folder / path).resolve())
        elif path.exists():
            cfg.task.args[key] = str(path.resolve())
            logger.warning(
                "mmgrpo: note: task.args.%s %r is not in the config's folder (%s); read from the working directory "
                "(%s); write it relative to the config's folder to run from anywhere",
                key,
                value,
                folder,
                cfg.task.args[key],
            )


__all__ = ["DATA_PATH_KEYS", "resolve_data_paths"]
