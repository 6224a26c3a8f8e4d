"""Checkpoints: resumable state (accelerate) plus the model in Hugging Face format, written atomically.

Layout under ``<output_dir>/checkpoints/``::

    step-000010/            accelerate state (model, optimizer, scheduler, trainer state, RNG per process)
        model/              the policy in Hugging Face format (full model or PEFT adapter) + processor
        COMPLETE            written last; a directory without it is ignored by resume
    final/                  the final model (same layout)

Each checkpoint is first written to ``.tmp-step-000010`` and renamed when complete, so a crash mid-save never
corrupts the last good checkpoint; old checkpoints are deleted only after the new one is in place.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

_STEP = re.compile(r"^step-(\d+)$")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(accelerator, adapter, output_dir: Path, step: int, *, keep_last: int, final: bool = False) -> Path:
    """Save a resumable checkpoint of ``step`` (all processes must call this)."""
    root = Path(output_dir) / "checkpoints"
    name = "final" if final else f"step-{step:06d}"
    target, tmp = root / name, root / f".tmp-{name}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        adapter.save_pretrained(str(tmp / "model"))
        atomic_write_text(tmp / "COMPLETE", f"{step}\n")
        if target.exists():  # re-saving the same step: move the old one aside before replacing it
            old = root / f".old-{name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        if not final:
            _prune(root, keep_last)
    accelerator.wait_for_everyone()
    return target


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete step checkpoints under ``output_dir/checkpoints``, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and (p / "COMPLETE").is_file()]
    return [p for _, p in sorted(found)]


def find(output_dir: Path, resume: str) -> Path:
    """The checkpoint to resume from: ``latest`` (newest complete under output_dir) or an explicit path."""
    if resume == "latest":
        found = complete_checkpoints(output_dir)
        if not found:
            raise FileNotFoundError(
                f"resume=latest: no complete checkpoint under {Path(output_dir) / 'checkpoints'}; "
                "set checkpoint.every to save some, or pass resume=PATH"
            )
        return found[-1]
    path = Path(resume)
    if not (path / "COMPLETE").is_file():
        raise FileNotFoundError(f"resume={resume}: not a complete mmgrpo checkpoint (no COMPLETE marker)")
    return path


def _prune(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for old in complete_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
