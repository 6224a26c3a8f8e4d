"""Checkpoints: resumable state without pickle, plus the model in Hugging Face format, written atomically.

Layout under ``<output_dir>/checkpoints/``::

    step-000010/
        state/model.safetensors       every tensor of the (unwrapped) policy, ``safetensors.torch.save_model``
        state/reference.safetensors   the frozen reference copy, when the run has one
        state/optimizer.safetensors   optimizer tensors (``state.<param>.<name>``)
        state/optimizer.json          optimizer scalars and param_groups
        state/trainer.json            step, warm-up flag, scheduler state
        state/rng-<rank>.json         Python and NumPy RNG of process <rank> (one file per process)
        state/rng-<rank>.safetensors  torch CPU (and CUDA) RNG of process <rank>
        model/                        the policy in Hugging Face format (full model or PEFT adapter) + README.md
        config.yaml                   the run's resolved config
        COMPLETE                      the step (and ``manifest``); a directory without it is ignored by resume
        MANIFEST.json                 every file's size and SHA-256, written last (:mod:`mmgrpo.manifest`)
    final/                            the final model (same layout)

Under FSDP (the policy's weights sharded over processes, :mod:`mmgrpo.sharding`) every process takes part in
gathering the whole weights and optimizer state (``torch.distributed.checkpoint.state_dict``), process 0 writes the
same files as under DDP, and on resume every process reads them and keeps its own shards; the optimizer state is
saved by parameter index in both cases, so the files do not depend on the launcher.

Nothing is unpickled on resume: tensors are read with ``safetensors`` and everything else is JSON, so a
crafted file in a checkpoint cannot run code (unlike ``torch.load(weights_only=False)`` / ``pickle.load``).
Each checkpoint is first written to ``.tmp-step-000010``, verified (every tensor finite, every file present),
and renamed; old checkpoints are deleted only after the new one is in place, so a crash or a bad save never
removes the last good checkpoint. A policy with a non-finite weight is never saved. Resume checks a checkpoint
again before it loads it (:mod:`mmgrpo.resume_checks`; :func:`find` passes over one that fails).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from mmgrpo import manifest, sharded_checkpoint, sharding
from mmgrpo.resume_checks import STEP as _STEP
from mmgrpo.resume_checks import damage, marker_step, non_finite, problem  # damage: the demo's cheap check
from mmgrpo.types import frozen_reference


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written (non-finite weights) or read (missing or malformed files)."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------- output directory


class RunDirError(RuntimeError):
    """The run directory cannot be used: another live run holds its lock, or it cannot be created or written."""


def os_reason(what: str, e: OSError) -> str:
    """``what (reason); how to fix`` for an OSError from the file system (one line)."""
    reason = e.strerror or str(e)
    fix = {
        errno.ENOSPC: "free some disk space or choose an output_dir on another disk",
        errno.EDQUOT: "free some space (disk quota exceeded) or choose another output_dir",
        errno.EROFS: "the file system is read-only; choose a writable output_dir",
        errno.EACCES: "choose an output_dir you can write to",
        errno.EPERM: "choose an output_dir you can write to",
    }.get(e.errno, "choose a writable output_dir")
    return f"{what} ({reason}); {fix}"


def write_error(what: str, e: OSError) -> RunDirError:
    """A one-line :class:`RunDirError` for an ``OSError`` (disk full, read-only, no permission) while writing."""
    return RunDirError(os_reason(what, e))


def holds_a_run(output_dir: Path) -> bool:
    """True when ``output_dir`` holds a run that would be lost by writing a new one into it: a complete checkpoint
    (``step-*`` or ``final/``) or a ``summary.json`` (a run that finished without saving a checkpoint).

    A directory with only the start of a run (``config.yaml``, tracker logs, warm-up or evaluation records, an
    incomplete checkpoint) cannot be resumed, so it is not a run: a new run may start there (its leftovers are
    moved aside first, see :func:`mmgrpo.run_dir.prepare_output_dir`)."""
    out = Path(output_dir)
    root = out / "checkpoints"
    return bool(_complete(root)) or (root / "final" / "COMPLETE").is_file() or (out / "summary.json").is_file()


# ------------------------------------------------------------------------------------------ saving


def non_finite_parameters(module: torch.nn.Module) -> list[str]:
    """Names of the parameters and buffers of ``module`` holding NaN or ±inf (this process's shard under FSDP)."""
    named = list(module.named_parameters()) + list(module.named_buffers())
    return [n for n, t in named if t.is_floating_point() and not bool(torch.isfinite(sharding.local(t)).all())]


def _non_finite_anywhere(accelerator, module: torch.nn.Module) -> list[str]:
    """:func:`non_finite_parameters` over the shards of every process (the same list on all of them)."""
    from accelerate.utils import gather_object

    return sorted(set(gather_object(non_finite_parameters(module))))


def save(
    accelerator,
    adapter,
    output_dir: Path,
    step: int,
    *,
    keep_last: int,
    final: bool = False,
    optimizer=None,
    scheduler=None,
    trainer_state: dict | None = None,
    config_text: str | None = None,
    model_files: dict[str, str] | None = None,
    sharded: bool | None = None,
) -> Path:
    """Save a resumable checkpoint of ``step`` (all processes must call this).

    ``sharded`` (``checkpoint.sharded``): a step checkpoint in the sharded layout (:mod:`mmgrpo.sharded_checkpoint`:
    every process writes its own shards, nothing gathered) — None: when the policy is FSDP-sharded. ``final/`` is
    always gathered: the run's Hugging Face export and a single-file state.

    Raises :class:`CheckpointError` (on every process, before anything is written) when a weight is non-finite.
    """
    root = Path(output_dir) / "checkpoints"
    name = "final" if final else f"step-{step:06d}"
    target, tmp = root / name, root / f".tmp-{name}"
    model = accelerator.unwrap_model(adapter.model)
    fsdp = sharding.is_sharded(model)
    layout = (fsdp if sharded is None else sharded) and not final  # the sharded layout (DCP)
    bad = _non_finite_anywhere(accelerator, model) if fsdp else non_finite_parameters(model)
    if bad:
        raise CheckpointError(
            f"refusing to save {name}: {len(bad)} non-finite weight tensor(s) (first: {bad[0]}); "
            f"the last good checkpoint under {root} is kept"
        )
    if accelerator.is_main_process:
        with _writing(name, root, tmp):
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "state").mkdir(parents=True)
    accelerator.wait_for_everyone()
    state = tmp / "state"
    with _writing(name, root, tmp):
        _save_rng(state, accelerator.process_index)
    if layout:
        with _writing(name, root, tmp):  # every process its shards; the main process the rest (no model/ export)
            sharded_checkpoint.save(state, model, optimizer, accelerator.num_processes, accelerator.is_main_process)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            with _writing(name, root, tmp):
                _write_main(tmp, adapter, model, None, scheduler, (trainer_state, config_text, None), None, None, False)
                _publish(tmp, target, root, name, step, final, keep_last, accelerator.num_processes)
        accelerator.wait_for_everyone()
        return target
    whole = optim_state = None
    if fsdp:  # collectives: every process takes part, process 0 gets the tensors
        whole = sharding.full_state_dict(model, main_only=True)
        optim_state = None if optimizer is None else _full_optimizer_state(model, optimizer)
    if accelerator.is_main_process:
        with _writing(name, root, tmp):
            files = (trainer_state, config_text, model_files)
            _write_main(tmp, adapter, model, optimizer, scheduler, files, whole, optim_state, True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with _writing(name, root, tmp):
            _publish(tmp, target, root, name, step, final, keep_last, accelerator.num_processes)
    accelerator.wait_for_everyone()
    return target


def _write_main(tmp, adapter, model, optimizer, scheduler, files, whole, optim_state, weights: bool) -> None:
    """The files process 0 writes into ``tmp``; ``files``: (trainer state, config text, model files);
    ``whole``/``optim_state``: the gathered FSDP state, else None; ``weights``: the policy's weights, optimizer and
    Hugging Face export too (False: the sharded layout wrote them, :mod:`mmgrpo.sharded_checkpoint`)."""
    trainer_state, config_text, model_files = files
    sharded = whole is not None
    state = tmp / "state"
    if sharded and weights:
        tied = _tied_names(model)
        save_file({k: v.contiguous() for k, v in whole.items() if k not in tied}, str(state / "model.safetensors"))
    elif weights:
        save_model(model, str(state / "model.safetensors"))
    reference = frozen_reference(adapter)
    if reference is not None:
        save_model(reference, str(state / "reference.safetensors"))
    if optimizer is not None and weights:
        _save_optimizer(state, optim_state if sharded else optimizer.state_dict())
    sched = None if scheduler is None else {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    atomic_write_text(state / "trainer.json", json.dumps({"trainer": trainer_state or {}, "scheduler": sched}))
    if weights:
        with _whole_weights(model, whole) if sharded else nullcontext():
            adapter.save_pretrained(str(tmp / "model"))
    for file_name, text in (model_files or {}).items():  # model card, sampling settings
        atomic_write_text(tmp / "model" / file_name, text)
    if config_text is not None:
        atomic_write_text(tmp / "config.yaml", config_text)


def _publish(tmp: Path, target: Path, root: Path, name: str, step: int, final: bool, keep_last: int, processes: int):
    """Verify ``tmp``, mark it COMPLETE, rename it to ``target`` and prune old checkpoints (process 0)."""
    verify(tmp, num_processes=processes)
    atomic_write_text(tmp / "COMPLETE", f"{step}\n{manifest.MARK}\n")
    manifest.write(tmp)  # last: the size and SHA-256 of every file, COMPLETE and the DCP shards included
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


_WRITE_ERRORS = {"No space left": errno.ENOSPC, "Read-only file system": errno.EROFS, "Permission denied": errno.EACCES}


@contextmanager
def _writing(name: str, root: Path, tmp: Path):
    """Turn a failed write of checkpoint ``name`` (disk full, read-only, no permission) into one-line
    :class:`RunDirError`; the partial ``tmp`` directory is removed and the older checkpoints are kept.

    safetensors reports its write errors as ``SafetensorError`` (not ``OSError``) with the OS message inside,
    e.g. "No space left on device (os error 28)"; that message is mapped back to its errno."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, OSError):
            text = str(e)
            code = next((c for k, c in _WRITE_ERRORS.items() if k in text), None)
            e = OSError(code, os.strerror(code) if code else text.splitlines()[0][:200])
        raise RunDirError(
            os_reason(f"cannot write checkpoint {name} under {root}; the older checkpoints are kept", e)
        ) from None


def verify(directory: Path, *, num_processes: int = 1) -> None:
    """Check a written checkpoint before it is published: files present, every saved tensor finite."""
    state = Path(directory) / "state"
    weights = sharded_checkpoint.INDEX if sharded_checkpoint.is_sharded(state) else "model.safetensors"
    needed = [weights, "trainer.json"] + [f"rng-{r}.json" for r in range(num_processes)]
    missing = [n for n in needed if not (state / n).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {directory} is missing {', '.join(missing)}")
    for path in state.glob("*.safetensors"):
        if not path.name.startswith("rng-") and (why := non_finite(path)):
            raise CheckpointError(f"checkpoint {directory}: {why}")
    if sharded_checkpoint.is_sharded(state) and (why := sharded_checkpoint.problem(state)):
        raise CheckpointError(f"checkpoint {directory}: {why}")


def _tied_names(model: torch.nn.Module) -> dict[str, str]:
    """``{alias: kept}`` for tensors registered under several names (tied weights): the first name in sorted order
    is kept, as ``safetensors.torch.save_model`` does, so FSDP and DDP checkpoints hold the same keys."""
    groups: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(name)
    return {alias: min(names) for names in groups.values() for alias in names if alias != min(names)}


@contextmanager
def _whole_weights(model: torch.nn.Module, whole: dict[str, torch.Tensor]):
    """While exporting the Hugging Face format from an FSDP model, ``model.state_dict()`` returns the gathered tensors.

    transformers' ``save_pretrained``, peft's ``get_peft_model_state_dict`` and diffusers' ``save_pretrained`` all
    read ``model.state_dict()``, which under FSDP returns this process's shards; an instance attribute shadows the
    method for the duration of the export (process 0 only, no collective inside). Tied names share one tensor, so
    the libraries drop the duplicates as they do for an unsharded model.
    """
    whole = {**whole, **{alias: whole[kept] for alias, kept in _tied_names(model).items()}}  # tied: one tensor
    model.state_dict = lambda *args, **kwargs: dict(whole)
    try:
        yield
    finally:
        del model.state_dict


def _param_names(model: torch.nn.Module, optimizer) -> list[str]:
    """The name of each parameter the optimizer holds, in ``param_groups`` order (= its state-dict index)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _full_optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The optimizer state of an FSDP model, whole, in ``torch.optim.Optimizer.state_dict()`` form (indices, not
    names); a collective: every process calls it, process 0 gets the tensors (on CPU), the others ``{}``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )  # {"state": {name: {...}}, "param_groups": [{"params": [name, ...], ...}]}
    if not full:
        return {}
    index = {n: i for i, n in enumerate(_param_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]
    return {"state": {index[n]: entry for n, entry in full["state"].items()}, "param_groups": groups}


def _to_named_optimizer_state(model: torch.nn.Module, optimizer, sd: dict) -> dict:
    """Inverse of the index form of :func:`_full_optimizer_state`, for ``set_optimizer_state_dict``."""
    names = _param_names(model, optimizer)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {"state": {names[i]: entry for i, entry in sd["state"].items()}, "param_groups": groups}


def _save_optimizer(state: Path, sd: dict) -> None:
    """Tensors to safetensors, everything else (scalars, param_groups) to JSON."""
    tensors, scalars = {}, {}
    for pid, entry in sd["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"state.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    save_file(tensors, str(state / "optimizer.safetensors"))
    atomic_write_text(state / "optimizer.json", json.dumps({"scalars": scalars, "param_groups": sd["param_groups"]}))


def _save_rng(state: Path, rank: int) -> None:
    """Python, NumPy and torch RNG of this process, without pickle."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 - the global RNG is what is saved
    atomic_write_text(
        state / f"rng-{rank}.json",
        json.dumps(
            {
                "python": [version, list(internal), gauss],
                "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
            }
        ),
    )
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    save_file(tensors, str(state / f"rng-{rank}.safetensors"))


# ----------------------------------------------------------------------------------------- loading


def load(directory: Path, accelerator, adapter, *, optimizer, scheduler) -> dict:
    """Restore a checkpoint written by :func:`save` into the live objects; returns the trainer state dict.

    Only ``safetensors`` and JSON are read; any ``*.pkl`` / ``*.bin`` in the directory is ignored.
    """
    state = Path(directory) / "state"
    layered = sharded_checkpoint.is_sharded(state)
    if not layered and not (state / "model.safetensors").is_file():
        raise CheckpointError(
            f"{directory} has no state/model.safetensors (written by an older mmgrpo or not a checkpoint); "
            "start a new run or resume from a checkpoint written by this version"
        )
    model = accelerator.unwrap_model(adapter.model)
    if layered:  # any world size, sharded or not: DCP reads each process's part of the saved shards
        try:
            sharded_checkpoint.load(state, model, optimizer)
        except sharded_checkpoint.ShardedCheckpointError as e:
            raise CheckpointError(f"{directory}: {e}") from None
    elif sharding.is_sharded(model):  # every process reads the whole tensors and keeps its shards
        whole = load_file(str(state / "model.safetensors"))
        whole.update({alias: whole[kept] for alias, kept in _tied_names(model).items() if kept in whole})
        sharding.load_full_state_dict(model, whole)
    else:
        _load_strict(model, state / "model.safetensors", _device_name(accelerator.device), directory)
    reference = frozen_reference(adapter)
    if reference is not None and (state / "reference.safetensors").is_file():
        device = _device_name(next(reference.parameters()).device)
        _load_strict(reference, state / "reference.safetensors", device, directory)
    if (state / "optimizer.json").is_file() and not layered:
        if sharding.is_sharded(model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            named = _to_named_optimizer_state(model, optimizer, _load_optimizer(state))
            set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))
        else:
            optimizer.load_state_dict(_load_optimizer(state))
    saved = json.loads((state / "trainer.json").read_text())
    if scheduler is not None and saved.get("scheduler") is not None:
        scheduler.load_state_dict({**saved["scheduler"], "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    _load_rng(state, accelerator.process_index)
    return saved["trainer"]


def _load_strict(module: torch.nn.Module, path: Path, device: str, directory: Path) -> None:
    """``safetensors.torch.load_model`` with every key required, mismatches as one line (not torch's list of
    hundreds of missing keys): a checkpoint saved with another model or ``model.lora`` setting, typically one whose
    ``config.yaml`` was lost so that the configs could not be compared first."""
    missing, unexpected = load_model(module, str(path), strict=False, device=device)
    missing, unexpected = sorted(missing), sorted(unexpected)
    if missing or unexpected:
        raise CheckpointError(
            f"{directory}: {path.name} does not match the model this config builds ({len(missing)} missing, "
            f"{len(unexpected)} unexpected tensors, e.g. {(missing or unexpected)[0]}); resume it with the config "
            "it was trained with (model.args, model.lora.enabled)"
        )


def _device_name(device: torch.device | str) -> str:
    """The device as safetensors accepts it: ``cpu``, not ``cpu:0``.

    Processes launched for gloo (``Accelerator(cpu=True)`` under torchrun) get ``accelerator.device == cpu:0``,
    which safetensors refuses ("device cpu:0 is invalid"); an accelerator keeps its index (``cuda:1``)."""
    device = torch.device(device)
    return "cpu" if device.type == "cpu" else str(device)


def _load_optimizer(state: Path) -> dict:
    meta = json.loads((state / "optimizer.json").read_text())
    entries: dict[int, dict] = {}
    for key, value in load_file(str(state / "optimizer.safetensors")).items():
        _, pid, name = key.split(".", 2)
        entries.setdefault(int(pid), {})[name] = value
    for key, value in meta["scalars"].items():
        pid, name = key.split(".", 1)
        entries.setdefault(int(pid), {})[name] = value
    return {"state": entries, "param_groups": meta["param_groups"]}


def _load_rng(state: Path, rank: int) -> None:
    path = state / f"rng-{rank}.json"
    if not path.is_file():
        raise CheckpointError(f"{state.parent} has no RNG state for process {rank} (saved with fewer processes?)")
    saved = json.loads(path.read_text())
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = saved["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    tensors = load_file(str(state / f"rng-{rank}.safetensors"))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


# ------------------------------------------------------------------------------------------ finding


def _complete(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    return [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and (p / "COMPLETE").is_file()]


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete step checkpoints under ``output_dir/checkpoints``, oldest first."""
    return [p for _, p in sorted(_complete(Path(output_dir) / "checkpoints"))]


def saved_step(directory: Path) -> int:
    """The step recorded in a checkpoint's COMPLETE marker."""
    return int((Path(directory) / "COMPLETE").read_text().split()[0])


def newest_first(output_dir: Path) -> list[Path]:
    """The complete checkpoints under ``output_dir/checkpoints`` (``step-*`` and ``final/``), newest step first;
    a ``final/`` whose marker holds no step sorts last (:func:`mmgrpo.resume_checks.problem` names it)."""
    root = Path(output_dir) / "checkpoints"
    found = _complete(root)
    final = root / "final"
    if (final / "COMPLETE").is_file() and (final / "state").is_dir():
        step = marker_step(final)
        found.append((-1 if step is None else step, final))
    return [p for _, p in sorted(found, key=lambda t: (t[0], t[1].name != "final"), reverse=True)]


def find(output_dir: Path, resume: str, skipped: list[str] | None = None, *, processes: int | None = None) -> Path:
    """The checkpoint to resume from: ``latest`` or an explicit path (raises ``FileNotFoundError``, one line).

    ``latest`` is the complete checkpoint with the highest step among ``step-*`` and ``final/`` (a run saved only
    at the end resumes from ``final/``, whose state is that of its last step, e.g. to train for more ``steps``).
    A complete checkpoint that cannot be used is passed over for the next newest one; ``skipped`` receives
    ``"<name>: <why>"`` for each. With ``processes`` (the resuming run's process count) that is every check of
    :func:`mmgrpo.resume_checks.problem` (files present, tensors finite, the step, the stored config; each tensor is
    read once); without, only :func:`damage` (truncated or corrupt files; no tensor read).
    """
    root = Path(output_dir) / "checkpoints"

    def check(path: Path) -> str | None:
        return damage(path) if processes is None else problem(path, processes)

    if resume == "latest":
        found, reasons = newest_first(output_dir), []
        for path in found:
            why = check(path)
            if why is None:
                return path
            reasons.append(f"{path.name}: {why}")
            if skipped is not None:
                skipped.append(reasons[-1])
        if found:
            raise FileNotFoundError(no_usable_checkpoint(root, reasons))
        there = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        what = f"{root} holds only {', '.join(there)} (incomplete)" if there else f"{root} does not exist"
        out = Path(output_dir)  # the lock and the start mark live inside it: a directory with only them never ran
        started = out.is_dir() and any(p.name not in (".mmgrpo-lock", ".mmgrpo-run") for p in out.iterdir())
        if started and not holds_a_run(output_dir):  # stopped before its first checkpoint
            raise FileNotFoundError(
                f"resume=latest: no complete checkpoint, {what}: the run stopped before its first checkpoint, so "
                "there is nothing to continue; start it again without resume= (the same output_dir is accepted)"
            )
        raise FileNotFoundError(
            f"resume=latest: no complete checkpoint, {what}; set checkpoint.every=N to save some, "
            "or start a new run (drop resume; overwrite=true moves the old one aside)"
        )
    path = Path(resume)
    if not (path / "COMPLETE").is_file():
        raise FileNotFoundError(f"resume={resume}: not a complete mmgrpo checkpoint (no COMPLETE marker)")
    why = check(path)
    if why is not None:
        raise FileNotFoundError(f"resume={resume}: the checkpoint is damaged ({why}); resume from another one")
    return path


def no_usable_checkpoint(root: Path, reasons: list[str]) -> str:
    """The one line when every complete checkpoint under ``root`` failed resume's checks (``reasons``)."""
    return (
        f"resume=latest: no complete checkpoint under {root} can be resumed ({'; '.join(reasons)}); restore one, "
        "or start a new run (drop resume; overwrite=true moves the old run aside, nothing is deleted)"
    )


def _prune(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for old in complete_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------- model card

LORA_FORMATS = {"transformers": "peft", "diffusers": "diffusers LoRA format"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

CARD_TEMPLATE = """---
{{ card_data }}
---

# mmgrpo policy: {{ task }}, {{ steps }}

Trained with mmgrpo (group-relative policy optimisation) from the config below.

- **Base model**: {{ base_line }}
- **Weights**: {{ weights_line }}
- **Algorithm**: {{ algorithm_line }}
- **Rewards**: {{ rewards_line }}

## Use

```python
import json

sampling_settings = json.load(open("path/to/this/directory/mmgrpo_sampling.json"))["sampling_settings"]
{{ usage }}
```

## Sampling

Sample with the settings the policy was trained with (also in `mmgrpo_sampling.json`); the library defaults
can differ and then give different (worse) outputs.

{{ sampling_line }}

## Training config

```yaml
{{ config_text }}
```
"""


def _base_expression(info: dict, seed: int) -> tuple[str, str]:
    """(import lines, Python expression) giving the base model's ``from_pretrained`` argument (or, for a built-in
    flow pipeline, the pipeline itself)."""
    built = info.get("built_in")
    if not built:
        return "", repr(info["base_model"])
    fn = built["function"]
    return f"from {built['module']} import {fn}\n", f"{fn}({info['base_model']!r}, seed={seed})"


def _usage(info: dict, seed: int) -> str:
    """A snippet that loads the export with the stock library classes."""
    cls, here = info["model_class"], '"path/to/this/directory"'
    if info["library"] not in ("transformers", "diffusers"):  # a plugin adapter without export_info()
        return f"# written by the {cls} adapter's save_pretrained(); load it with the library that adapter uses"
    imports, base = _base_expression(info, seed)
    if info["library"] == "diffusers":
        built_pipe = bool(info.get("built_in")) and info["built_in"]["function"] == "resolve_pipeline"
        load_base = f"pipe = {base}" if built_pipe else f"pipe = DiffusionPipeline.from_pretrained({base})"
        if info["lora"]:
            return (
                f"from diffusers import DiffusionPipeline\n{imports}\n{load_base}\n"
                f"pipe.load_lora_weights({here})  # pipe.fuse_lora() merges them into the weights\n"
                "image = pipe(prompt, **sampling_settings).images[0]"
            )
        return (
            f"from diffusers import DiffusionPipeline\n\npipe = DiffusionPipeline.from_pretrained({here})\n"
            "image = pipe(prompt, **sampling_settings).images[0]"
        )
    text = info.get("pipeline_tag") == "text-generation"  # a text-only causal LM: its tokenizer, a chat
    auto, proc = ("AutoTokenizer", "tokenizer") if text else ("AutoProcessor", "processor")
    inputs = (
        f"{proc}.apply_chat_template(messages, add_generation_prompt=True, return_tensors='pt', return_dict=True)"
        if text
        else f"{proc}(...)"
    )
    lines = f"from transformers import {auto}, {cls}\n"
    if info["lora"]:
        return (
            f"{lines}from peft import PeftModel\n{imports}\nbase = {cls}.from_pretrained({base})\n"
            f"model = PeftModel.from_pretrained(base, {here})\n"
            "model = model.merge_and_unload()  # optional: plain transformers weights (model.save_pretrained(...))\n"
            f"{proc} = {auto}.from_pretrained({here})\n"
            f"outputs = model.generate(**{inputs}, **sampling_settings)"
        )
    return (
        f"{lines}\nmodel = {cls}.from_pretrained({here})\n{proc} = {auto}.from_pretrained({here})\n"
        f"outputs = model.generate(**{inputs}, **sampling_settings)"
    )


def model_card(
    info: dict,
    *,
    task: str,
    step: int,
    seed: int,
    algorithm: str,
    rewards: str,
    sampling_call: str,
    config_text: str,
) -> str:
    """The ``README.md`` of a saved model (``huggingface_hub.ModelCard``, hub metadata in its YAML header).

    ``info`` is the adapter's ``export_info()``: ``base_model`` as the config named it (a hub id, a path, or a
    built-in tiny name with ``built_in`` saying how to rebuild it; a real model's directory, with ``real_name``,
    ``origin`` and ``hub_id``), ``library``, ``model_class``, ``lora``, ``pipeline_tag``. The metadata's
    ``base_model`` is set only for a hub id (the hub rejects anything else): the config's, or a real model's
    upstream one.
    """
    from huggingface_hub import ModelCard, ModelCardData

    name, lora = info["base_model"], bool(info["lora"])
    hub = bool(_HUB_ID.match(name)) and not Path(name).exists() and not info.get("built_in")
    data = ModelCardData(
        base_model=info.get("hub_id") or (name if hub else None),  # a real model: its upstream hub id
        library_name="peft" if lora and info["library"] == "transformers" else info["library"] or None,
        pipeline_tag=info.get("pipeline_tag") or None,
        tags=["mmgrpo", "grpo", "reinforcement-learning", *(["lora"] if lora else [])],
    )
    if info.get("built_in"):
        imports, base = _base_expression(info, seed)
        base_line = (
            f"`{name}`, one of mmgrpo's built-in tiny models (on no hub; "
            f"`{imports.strip()}; {base}` builds it from config or loads the copy shipped with mmgrpo)"
        )
    elif info.get("real_name"):
        base_line = (
            f"`{name}`: mmgrpo's real model `{info['real_name']}`, {info.get('origin') or info.get('hub_id')} "
            "converted on the training machine (docs/real_models.md; `bash scripts/setup_real_models.sh` makes it)"
        )
    else:
        base_line = f"`{name}` ({'hub id' if hub else 'path'} as the config named it)"
    weights_line = (
        f"a LoRA adapter only ({LORA_FORMATS.get(info['library'], 'in the adapter format')}); "
        "load it on the base model (below)"
        if lora
        else f"the full fine-tuned model (`{info['model_class']}`), loadable on its own"
    )
    card = ModelCard.from_template(
        data,
        template_str=CARD_TEMPLATE,
        task=task,
        steps=f"{step} step{'' if step == 1 else 's'}",
        base_line=base_line,
        weights_line=weights_line,
        algorithm_line=algorithm,
        rewards_line=rewards,
        usage=_usage(info, seed),
        sampling_line=f"Call the pipeline / generate with: `{sampling_call}`"
        if sampling_call
        else "Use the adapter options in `model.args` below.",
        config_text=config_text.rstrip(),
    )
    return str(card)
