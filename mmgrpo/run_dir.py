"""The run directory: its lock (:class:`RunLock`), the checks before the model loads, resume's config comparison,
and the files written next to the saved weights.

:func:`take_run_lock` and :func:`check_run_dir` run in ``Trainer.__init__`` before the model loads, on the path
:func:`resolve_output_dir` gives, so a used, locked or unwritable ``output_dir`` and a resume with a changed config
fail in one line, whatever spelling of the directory names them. :func:`load_checkpoint` loads the checkpoint
chosen, after checking it fits the built model (:mod:`mmgrpo.resume_checks`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from mmgrpo import checkpoint as ckpt
from mmgrpo import manifest, tracking
from mmgrpo.config import ConfigError, TrainConfig, dump_config, to_dict
from mmgrpo.loader import load_config
from mmgrpo.resume_checks import mismatch, problem
from mmgrpo.types import ExportInfo, SamplingSettings, frozen_reference

logger = logging.getLogger(__name__)
RESUMABLE_CHANGES = ("steps", "resume", "stop_after", "overwrite")  # config fields a resume may change


@dataclass
class TrainerState:
    """What resume needs beyond model/optimizer/RNG: saved as JSON in each checkpoint (``state/trainer.json``)."""

    step: int = 0  # GRPO steps completed
    warmup_done: bool = False

    def state_dict(self) -> dict:
        return {"step": self.step, "warmup_done": self.warmup_done}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.warmup_done = int(state["step"]), bool(state["warmup_done"])


def resolve_output_dir(output_dir: str) -> Path:
    """The run directory as the file system resolves it: absolute, symlinks followed, ``..`` applied after them
    (``os.path.realpath``; a ``..`` after a folder that does not exist yet steps back over it, as ``mkdir -p`` then
    the kernel would). Every spelling of one directory (``runs/a1``, a symlink to it, ``runs/missing/../a1``)
    thus takes the same lock, sees the same run and is moved aside by ``overwrite=true``."""
    if not str(output_dir).strip():
        raise ConfigError("output_dir: empty; name the run's directory, e.g. output_dir=runs/my-run")
    path = Path(os.path.realpath(output_dir))
    if path.parent == path:
        raise ConfigError(f"output_dir={output_dir} is the file-system root; name a directory for the run")
    return path


# ------------------------------------------------------------------------------------------ the run lock


LOCK = ".mmgrpo-lock"  # the lock file, inside the run directory
MARK = ".mmgrpo-run"  # written into a directory a run starts in: what makes it a run before its first checkpoint
_RUN_FILES = re.compile(  # the names a run writes into output_dir (a directory of only these is a run's leftovers)
    r"^(config\.yaml|metrics\.jsonl|summary\.json|reward_curve\.png|checkpoints|logs|wandb|samples|samples_\w+\.json"
    r"|\.mmgrpo-run|\.mmgrpo-lock)$"
)


def lock_path(output_dir: Path) -> Path:
    """The lock file of a run directory: ``.mmgrpo-lock`` inside it. A ``flock`` belongs to the file's inode, and
    the file lives in the directory, so the lock is keyed by the directory itself (device and inode), not by a
    path: a symlink, ``..``, a second path or a bind mount of the directory all meet the same lock."""
    return Path(os.path.realpath(output_dir)) / LOCK


class RunLock:
    """An exclusive lock on a run directory, held for the run's life (``fcntl.flock`` on :func:`lock_path`, inside
    the directory, which it creates when missing and removes again on release if it is still empty).

    The kernel releases a ``flock`` when its holder exits, however it exits (SIGKILL included), so a lock left by a
    dead process is never mistaken for a live one: the file may remain, holding the dead process's PID and host,
    and the next run takes it over and says so. The holder writes ``{"pid", "host", "started", "output_dir",
    "directory"}`` (``directory``: the run directory's device and inode) into the file, which a refused run quotes.
    :meth:`release` unlinks the file before unlocking, and :meth:`acquire` checks after locking that the path still
    names the locked file (else retries), so a run never holds a lock on a file that another has already unlinked.
    ``overwrite=true`` moves the old run's files aside but not the directory (:func:`move_aside`), so the lock stays
    where it is. Over NFS, Linux maps ``flock`` to POSIX byte-range locks (``nfs(5)``, ``local_lock``), so runs on
    two hosts exclude each other as long as the NFS lock service runs.
    """

    def __init__(self, output_dir: Path):
        self.output_dir = Path(output_dir)
        self.path = lock_path(output_dir)
        self._fd: int | None = None
        self._created = False  # whether acquire() made the run directory (release removes it again if empty)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> dict | None:
        """Take the lock or raise :class:`RunDirError` (one line naming the holder's PID and host).

        Returns the record of a dead holder whose stale lock was taken over, else ``None``."""
        import fcntl
        import socket

        directory = self.path.parent
        if directory.exists() and not directory.is_dir():
            what = f"output_dir={self.output_dir} is a file, not a directory"
            raise ckpt.RunDirError(f"{what}; choose another output_dir")
        self._created = not directory.exists()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            what = f"output_dir={self.output_dir}: cannot create the run lock {self.path}"
            raise ckpt.RunDirError(ckpt.os_reason(what, e)) from None
        for _ in range(20):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                what = f"output_dir={self.output_dir}: cannot create the run lock {self.path}"
                raise ckpt.RunDirError(ckpt.os_reason(what, e)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_record(fd)
                os.close(fd)
                raise ckpt.RunDirError(
                    f"output_dir={self.output_dir} is in use by {_describe(holder)}; wait for it to finish or stop "
                    f"it, or choose another output_dir (lock file {self.path})"
                ) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:  # a holder released (unlinked) it between our open and flock: lock the new file
                os.close(fd)
                continue
            previous = _read_record(fd)
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "output_dir": str(self.output_dir),
                "directory": [os.fstat(fd).st_dev, os.stat(directory).st_ino],
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
            self._fd = fd
            # released by release(), or at interpreter exit while os is still whole (a __del__ there can run after
            # the os module is torn down: "'NoneType' object has no attribute 'path'")
            self._finalizer = weakref.finalize(self, _unlock, fd, self.path, self._created)
            return previous or None
        raise ckpt.RunDirError(f"output_dir={self.output_dir}: could not take the run lock {self.path}; try again")

    def release(self) -> None:
        """Unlink the lock file and unlock (idempotent)."""
        if self._fd is None:
            return
        self._fd = None
        self._finalizer()


def _unlock(fd: int, path: Path, created: bool) -> None:
    """Unlink the lock file if it is still ours, close (which unlocks) it, and remove the run directory when the
    lock created it and nothing was written there (a run refused before it started leaves no empty folder)."""
    try:
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            os.unlink(path)
    except OSError:
        pass
    os.close(fd)
    if created:
        with contextlib.suppress(OSError):  # not empty (the run wrote files), or gone
            os.rmdir(path.parent)


def _read_record(fd: int) -> dict:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _describe(holder: dict) -> str:
    if not holder.get("pid"):
        return "another mmgrpo run (it has not yet written its PID)"
    return f"mmgrpo process {holder['pid']} on host {holder.get('host', '?')} (started {holder.get('started', '?')})"


def take_run_lock(acc: Accelerator, out: Path) -> RunLock | None:
    """Process 0 takes the run directory's lock (:class:`RunLock`) and tells the others
    whether it got it, so that every process raises the same one-line :class:`~mmgrpo.checkpoint.RunDirError`
    (no process waits in a collective for one that has already failed)."""
    lock, error, stale = None, None, None
    if acc.is_main_process:
        lock = RunLock(out)
        try:
            stale = lock.acquire()
        except ckpt.RunDirError as e:
            error = str(e)
    if acc.num_processes > 1:
        error = broadcast_object_list([error])[0]
    if error:
        raise ckpt.RunDirError(error)
    if stale:
        logger.warning(
            "took over the lock of %s: process %s on host %s is no longer running",
            out,
            stale.get("pid", "?"),
            stale.get("host", "?"),
        )
    return lock


def is_a_run(output_dir: Path) -> bool:
    """Whether ``output_dir`` is an mmgrpo run directory: it holds a run (:func:`mmgrpo.checkpoint.holds_a_run`), a
    run started there (:data:`MARK`), or it holds a run's leftovers from before the mark (``config.yaml`` and only
    names a run writes)."""
    out = Path(output_dir)
    if (out / MARK).is_file() or ckpt.holds_a_run(out):
        return True
    names = [p.name for p in out.iterdir()]
    return "config.yaml" in names and all(_RUN_FILES.match(n) for n in names)


def prepare_output_dir(output_dir: Path, *, resume: str | None, overwrite: bool) -> Path | None:
    """Refuse to write a new run into an ``output_dir`` that holds a run, unless ``overwrite``, or that exists and
    is not a run (:func:`is_a_run`: a folder of notes, sources or data is never moved); read-only, every process
    may call it.

    Returns the directory the old files will be moved to (``<dir>.old-<time>``; nothing is deleted) when
    ``overwrite`` is set, or when the directory holds only the leftovers of a run stopped before its first
    checkpoint (anything besides ``config.yaml``), else ``None``. Raises :class:`ValueError` with one line.
    """
    out = Path(output_dir)
    if resume or not out.exists():
        return None
    if not out.is_dir():
        raise ValueError(f"output_dir={out} is a file, not a directory; choose another output_dir")
    try:
        contents = sorted(p.name for p in out.iterdir() if p.name not in (LOCK, MARK))
    except OSError as e:
        raise ValueError(ckpt.os_reason(f"output_dir={out} cannot be read", e)) from None
    if not contents or contents == ["config.yaml"]:  # empty, or a run stopped before it wrote anything else
        return None
    if not is_a_run(out):
        raise ValueError(
            f"output_dir={out} exists and is not an mmgrpo run ({len(contents)} entries, e.g. {contents[0]}); "
            "nothing was moved; choose a new or empty output_dir"
        )
    if ckpt.holds_a_run(out) and not overwrite:
        raise ValueError(
            f"output_dir={out} already holds a run; pass resume=latest to continue it, overwrite=true to move it "
            "aside (nothing is deleted), or another output_dir"
        )
    return out.with_name(f"{out.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")


def move_aside(output_dir: Path, target: Path) -> Path:
    """Move the old run's files (all but the lock, which the new run holds) into a new directory beside it (main
    process); returns that directory. The run directory itself stays, so its lock is never released or moved."""
    n, dest = 0, target
    while dest.exists():
        n += 1
        dest = target.with_name(f"{target.name}-{n}")
    dest.mkdir()
    for entry in sorted(Path(output_dir).iterdir()):
        if entry.name != LOCK:
            os.replace(entry, dest / entry.name)
    return dest


def mark_run(out: Path) -> None:
    """Write :data:`MARK` into the run directory (main process): from now on it is a run, even before its first
    checkpoint, and a later run there restarts it or is refused as a run, never as a stranger's folder."""
    try:
        ckpt.atomic_write_text(out / MARK, json.dumps({"started": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
    except OSError as e:
        raise ckpt.write_error(f"output_dir={out} is not writable", e) from None


def check_run_dir(cfg: TrainConfig, acc: Accelerator, out: Path) -> Path | None:
    """Refuse a used output_dir (``overwrite=true`` moves its files aside) or one that is not a run; for
    ``resume``, find the checkpoint and refuse a config that differs from the saved one except in
    :data:`RESUMABLE_CHANGES`. Returns the checkpoint to resume from. Errors are one-line :class:`ConfigError`
    raised before the model loads.

    A directory holding only the start of a run that saved no checkpoint (:func:`mmgrpo.checkpoint.holds_a_run`
    is false) is not a run to keep: its leftovers are moved aside (nothing is deleted) and the new run starts
    there."""
    if not cfg.resume:
        try:
            aside = prepare_output_dir(out, resume=None, overwrite=cfg.overwrite)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        acc.wait_for_everyone()  # every process has checked before the main one moves anything
        if acc.is_main_process:
            if aside is not None:
                was_run = ckpt.holds_a_run(out)
                moved = move_aside(out, aside)
                what = "the previous run" if was_run else "the leftovers of a run stopped before its first checkpoint"
                logger.warning("%s in %s moved to %s (nothing deleted)", what, out, moved)
            check_writable(out)
            mark_run(out)
        acc.wait_for_everyone()
        return None
    skipped: list[str] = []
    try:
        directory = ckpt.find(out, cfg.resume, skipped=skipped, processes=acc.num_processes)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    _warn_skipped(cfg, acc, skipped, directory)
    if acc.is_main_process and (line := manifest.note(directory)):  # a checkpoint written before manifests
        logger.warning("resume=%s: %s", cfg.resume, line)
    step = ckpt.saved_step(directory)
    if step > cfg.steps:
        raise ConfigError(
            f"resume={cfg.resume}: {directory} is at step {step}, past steps={cfg.steps}; set steps above {step} "
            "to train on (steps only grows on resume)"
        )
    if step == cfg.steps and acc.is_main_process:
        logger.warning(
            "resume=%s: %s is already at steps=%d; only the final evaluation and save run (raise steps to train on)",
            cfg.resume,
            directory,
            step,
        )
    if acc.is_main_process:
        check_writable(out)
    compare_config(cfg, directory)
    return directory


def compare_config(cfg: TrainConfig, directory: Path) -> None:
    """Refuse (one-line :class:`ConfigError`) a config that differs from the checkpoint's ``config.yaml`` except
    in :data:`RESUMABLE_CHANGES`. The file is there: :func:`mmgrpo.resume_checks.problem` passes over a checkpoint
    without it (only a directory of another version's layout, which loading refuses, may lack it)."""
    saved = directory / "config.yaml"
    if not saved.is_file():
        return
    diffs = config_differences(load_config(saved), cfg)
    if diffs:
        raise ConfigError(
            f"resume={cfg.resume}: config differs from the saved {saved} in {'; '.join(diffs)}; only "
            "steps may change on resume (use the saved values, or start a new run in another output_dir)"
        )


def _warn_skipped(cfg: TrainConfig, acc: Accelerator, skipped: list[str], directory: Path) -> None:
    """One line for the checkpoints resume passed over, and the one it resumes from instead (main process)."""
    if skipped and acc.is_main_process:
        logger.warning(
            "resume=%s: skipped damaged checkpoint(s) %s; resuming from %s, the newest complete one",
            cfg.resume,
            "; ".join(skipped),
            directory,
        )


def load_checkpoint(cfg: TrainConfig, acc: Accelerator, adapter, optimizer, scheduler, directory: Path) -> dict:
    """Load ``directory`` (chosen by :func:`check_run_dir`) into the built model, optimizer and scheduler once its
    tensors fit them (:func:`mmgrpo.resume_checks.mismatch`: names and shapes, read from the headers before
    anything is loaded); returns the saved trainer state.

    With ``resume=latest`` a checkpoint that does not fit is passed over, as :func:`check_run_dir` passes over a
    damaged one, for the previous complete checkpoint that passes every check (its config compared too); with an
    explicit ``resume=<path>``, or none left, the error is one line (:class:`mmgrpo.checkpoint.CheckpointError`)."""
    model, reference = acc.unwrap_model(adapter.model), frozen_reference(adapter)
    older = ckpt.newest_first(directory.parent.parent) if cfg.resume == "latest" else []  # <out>/checkpoints/<name>
    older = older[older.index(directory) + 1 :] if directory in older else []
    skipped: list[str] = []
    for candidate in [directory, *older]:
        fallback = candidate != directory  # (``directory`` passed :func:`problem` in check_run_dir)
        why = (problem(candidate, acc.num_processes) if fallback else None) or mismatch(
            candidate, model, optimizer, reference
        )
        if why is None:
            if skipped:
                compare_config(cfg, candidate)
                _warn_skipped(cfg, acc, skipped, candidate)
            return ckpt.load(candidate, acc, adapter, optimizer=optimizer, scheduler=scheduler)
        if cfg.resume != "latest":
            raise ckpt.CheckpointError(
                f"resume={cfg.resume}: {why}; resume it with the config it was trained with (model.args, "
                "model.lora.enabled)"
            )
        skipped.append(f"{candidate.name}: {why}")
    raise ckpt.CheckpointError(ckpt.no_usable_checkpoint(directory.parent, skipped))


def check_writable(out: Path) -> None:
    """Create ``output_dir`` and write a scratch file in it: a read-only or full file system, or a path like
    ``/proc/x``, fails here in one line, before the model loads (main process)."""
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out) as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ckpt.write_error(f"output_dir={out} is not writable", e) from None


def config_differences(saved: TrainConfig, new: TrainConfig) -> list[str]:
    """``field: saved -> new`` for every config value that differs, except those a resume may change."""
    flat_saved, flat_new = _flatten(to_dict(saved)), _flatten(to_dict(new))
    out = []
    for key in sorted(set(flat_saved) | set(flat_new)):
        if key.split(".")[0] in RESUMABLE_CHANGES + ("output_dir",):
            continue
        a, b = flat_saved.get(key, "<unset>"), flat_new.get(key, "<unset>")
        if a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def _flatten(node, prefix: str = "") -> dict:
    if isinstance(node, dict) and node:
        flat = {}
        for k, v in node.items():
            flat.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return flat
    return {prefix: node}


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the records of steps <= ``step`` (a resumed run re-runs the later ones and writes them again)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
    ckpt.atomic_write_text(path, "".join(line + "\n" for line in kept))


def model_files(cfg: TrainConfig, adapter, step: int) -> dict[str, str]:
    """``README.md`` (model card, :func:`mmgrpo.checkpoint.model_card`) and ``mmgrpo_sampling.json`` written next
    to the saved weights.

    The JSON holds what sampling needs beyond the weights: the adapter's options and, where the adapter reports
    them (``sampling_settings()``), the effective values it used, e.g. a diffusion pipeline's text-encoder
    ``max_sequence_length``; the plain library defaults may differ. The card describes the export as the adapter
    reports it (``export_info()``: full model or LoRA adapter, base model as the config named it).
    """
    settings = adapter.sampling_settings() if isinstance(adapter, SamplingSettings) else {}
    model = to_dict(cfg)["model"]
    sampling = {
        "adapter": cfg.model.adapter,
        "model_args": model.get("args", {}),
        "lora": model.get("lora"),
        "dtype": cfg.model.dtype,
        "sampling_settings": settings,
        "step": step,
    }
    info = adapter.export_info() if isinstance(adapter, ExportInfo) else {}
    lora = cfg.model.lora.enabled
    info = {
        "base_model": model.get("args", {}).get("name_or_path", "(the adapter default)"),
        "library": "",  # unknown: an adapter without export_info()
        "model_class": cfg.model.adapter,
        "pipeline_tag": "",
        "built_in": None,
        **info,
        "lora": lora,
    }
    a = cfg.algorithm
    card = ckpt.model_card(
        info,
        task=cfg.task.name,
        step=step,
        seed=cfg.seed,
        algorithm=f"estimator `{a.estimator}`, surrogate `{a.surrogate}`, group size {a.group_size}, β = {a.beta}",
        rewards=", ".join(f"`{r.name}` × {r.weight}" for r in cfg.rewards),
        sampling_call=", ".join(f"{k}={v!r}" for k, v in settings.items()),
        config_text=dump_config(cfg),
    )
    return {"README.md": card, "mmgrpo_sampling.json": json.dumps(sampling, indent=1, default=str)}


def write_summary(cfg: TrainConfig, out: Path, summary: dict, step: int) -> None:
    """``summary.json`` (the run's summary with the reward's first value and last-10% mean from ``metrics.jsonl``)
    and, with ``logging.plot``, ``reward_curve.png`` (main process)."""
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [h["reward/mean"] for h in history if h.get("reward/mean") is not None]  # null: non-finite
    if rewards:
        tail = rewards[-max(1, len(rewards) // 10) :]
        summary["train/reward_first"] = rewards[0]
        summary["train/reward_last10pct"] = sum(tail) / len(tail)
    summary["train/steps"] = step
    ckpt.atomic_write_text(out / "summary.json", json.dumps(tracking.json_safe(summary), indent=2, sort_keys=True))
    if cfg.logging.plot:
        from mmgrpo.plotting import plot_reward_curve

        plot_reward_curve(history, out / "reward_curve.png", title=cfg.output_dir)


def write_config(cfg: TrainConfig, out: Path) -> None:
    """``config.yaml``, the run's resolved config (main process; a resume compares against it)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        ckpt.atomic_write_text(out / "config.yaml", dump_config(cfg))
    except OSError as e:
        raise ckpt.write_error(f"output_dir={out}: cannot write config.yaml", e) from None


def saved_summary(out: Path) -> dict:
    """The ``summary.json`` of the run being resumed (empty when it has none yet)."""
    path = out / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}
