"""Sharded checkpoints: each process writes its own shards of the policy and its optimizer state
(``torch.distributed.checkpoint``, DCP), and another number of processes reads them back (resume across world
sizes: as many or fewer, since each process also needs the RNG state it saved, :mod:`mmgrpo.checkpoint`).

Under FSDP a gathered checkpoint (:mod:`mmgrpo.checkpoint`'s default layout) first assembles every weight and
optimizer tensor whole on process 0: its host memory grows with the model (weights + two AdamW moments), on one
process. Here every process saves only its ``DTensor`` shards, in parallel, and DCP's load reshards them for the
resuming world (``torch/distributed/checkpoint/state_dict_saver.py`` ``save``, ``state_dict_loader.py`` ``load``;
``torch/distributed/checkpoint/state_dict.py`` ``get_model_state_dict`` / ``get_optimizer_state_dict`` for the
names: parameter FQNs, the same on a sharded and an unsharded model, so a checkpoint saved on 2 FSDP processes
resumes on 1 plain process and on 2 FSDP processes).

Layout, under a checkpoint's ``state/`` (the rest as in :mod:`mmgrpo.checkpoint`)::

    sharded/.metadata          DCP's index (which file holds which shard of which tensor)
    sharded/__<rank>_0.distcp  the shards process <rank> wrote
    sharded.json               {"format", "world_size", "model": [names], "optimizer": {"param_groups", "scalars"}}

DCP keys are ``model.<fqn>`` and ``optim.<fqn>.<state key>``; they are tensors only: the optimizer's scalars and
param groups go to ``sharded.json``, so nothing DCP would pickle is written. DCP's ``.metadata`` is itself a pickle:
it is read with an unpickler that builds only DCP's metadata classes, torch dtypes and sizes (:class:`SafeReader`),
and every entry must describe a tensor, so a crafted checkpoint cannot run code on resume (docs/reliability.md).
The shard files' tensors are read by DCP with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import warnings
from pathlib import Path

import torch

DIR, INDEX = "sharded", "sharded.json"
FORMAT = "torch.distributed.checkpoint/1"


class ShardedCheckpointError(RuntimeError):
    """A sharded checkpoint cannot be read (its index is not DCP's, or names something other than tensors)."""


# ----------------------------------------------------------------------------------------------- reading safely

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": None,  # any of DCP's metadata dataclasses
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        allowed = _ALLOWED.get(module, set())
        is_dtype = module == "torch" and isinstance(vars(torch).get(name), torch.dtype)
        if (module in _ALLOWED and (allowed is None or name in allowed)) or is_dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


def _reader(path: Path):
    """DCP's ``FileSystemReader`` whose ``read_metadata`` builds only DCP's own classes (see module docstring) and
    refuses an index with a non-tensor entry (DCP would read it with ``torch.load`` of arbitrary objects)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            with open(Path(self.path) / ".metadata", "rb") as f:
                try:
                    metadata = _MetadataUnpickler(f).load()
                except Exception as e:  # UnpicklingError, EOFError, AttributeError, ...
                    raise ShardedCheckpointError(f"{DIR}/.metadata is not a DCP index ({e})") from None
            if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
                raise ShardedCheckpointError(f"{DIR}/.metadata is not a DCP index")
            odd = [k for k, v in metadata.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata)]
            if odd:
                raise ShardedCheckpointError(f"{DIR}/.metadata lists {odd[0]!r}, which is not a tensor")
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def tensor_shapes(state: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{DCP key: (whole shape, dtype)}`` of a sharded checkpoint's index (:class:`ShardedCheckpointError` when it
    cannot be read safely)."""
    meta = _reader(Path(state) / DIR).read_metadata()
    return {k: (tuple(v.size), v.properties.dtype) for k, v in meta.state_dict_metadata.items()}


def is_sharded(state: Path) -> bool:
    """Whether the checkpoint's ``state/`` holds the sharded layout."""
    return (Path(state) / INDEX).is_file()


# ----------------------------------------------------------------------------------------------- saving


@contextlib.contextmanager
def _one_process():
    """Yields True when there is no process group (one process, no launcher): DCP then saves and loads without
    collectives, and its warning that it assumes so is dropped."""
    import torch.distributed as dist

    no_dist = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield no_dist


def _flat(model: torch.nn.Module, optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The DCP dict (tensors: this process's shards under FSDP) and the JSON part (scalars, param groups)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    flat = {f"model.{k}": v for k, v in get_model_state_dict(model).items() if torch.is_tensor(v)}
    extra: dict = {"model": sorted(k[len("model.") :] for k in flat)}
    if optimizer is not None:
        osd = get_optimizer_state_dict(model, optimizer)  # {"state": {fqn: {key: value}}, "param_groups": [...]}
        scalars = {}
        for fqn, entry in osd["state"].items():
            for key, value in entry.items():
                if torch.is_tensor(value):
                    flat[f"optim.{fqn}.{key}"] = value
                else:
                    scalars[f"{fqn}\t{key}"] = value
        extra["optimizer"] = {"param_groups": osd["param_groups"], "scalars": scalars}
    return flat, extra


def save(state: Path, model: torch.nn.Module, optimizer, world_size: int, main: bool) -> None:
    """Write the policy's and the optimizer's shards under ``state/sharded`` (a collective under FSDP: every process
    calls it) and, on the main process, ``state/sharded.json``."""
    import torch.distributed.checkpoint as dcp

    flat, extra = _flat(model, optimizer)
    writer = dcp.FileSystemWriter(str(Path(state) / DIR), single_file_per_rank=True)
    with _one_process() as no_dist:
        dcp.save(flat, storage_writer=writer, no_dist=no_dist)
    if main:
        index = {"format": FORMAT, "world_size": world_size, **extra}
        tmp = Path(state) / f".{INDEX}.tmp"
        tmp.write_text(json.dumps(index))
        os.replace(tmp, Path(state) / INDEX)


# ----------------------------------------------------------------------------------------------- loading


def load(state: Path, model: torch.nn.Module, optimizer) -> None:
    """Load a sharded checkpoint into ``model`` and ``optimizer``, on any number of processes, sharded (FSDP) or
    not: each process reads the parts of the saved shards that its own tensors cover (DCP resharding). A collective
    under a process group: every process calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    index = json.loads((Path(state) / INDEX).read_text())
    reader = _reader(Path(state) / DIR)
    reader.read_metadata()  # a crafted or damaged index: one line here, before DCP wraps it in its own report
    msd = get_model_state_dict(model)
    osd = get_optimizer_state_dict(model, optimizer) if optimizer is not None and "optimizer" in index else None
    flat = {f"model.{k}": v for k, v in msd.items() if torch.is_tensor(v)}
    if osd is not None:  # the live optimizer's state, initialised (torch's _init_optim_state), to be overwritten
        flat.update({f"optim.{f}.{k}": v for f, e in osd["state"].items() for k, v in e.items() if torch.is_tensor(v)})
    with _one_process() as no_dist:
        try:
            dcp.load(flat, storage_reader=reader, no_dist=no_dist)
        except CheckpointException as e:  # a BaseException holding every rank's traceback (175 lines on 2 ranks)
            raise ShardedCheckpointError(_unreadable(e)) from None
    set_model_state_dict(model, {k: flat.get(f"model.{k}", v) for k, v in msd.items()}, options=StateDictOptions())
    if osd is not None:
        saved = index["optimizer"]
        entries: dict[str, dict] = {}
        for fqn, entry in osd["state"].items():
            entries[fqn] = {k: flat[f"optim.{fqn}.{k}"] for k in entry if f"optim.{fqn}.{k}" in flat}
        for key, value in saved["scalars"].items():
            fqn, name = key.split("\t")
            entries.setdefault(fqn, {})[name] = value
        groups = [  # JSON turned tuples (AdamW's betas) into lists: back to the live groups' types
            {k: tuple(v) if isinstance(live.get(k), tuple) else v for k, v in group.items()}
            for group, live in zip(saved["param_groups"], osd["param_groups"], strict=True)
        ]
        set_optimizer_state_dict(model, optimizer, {"state": entries, "param_groups": groups})


def _unreadable(e) -> str:
    """One line for DCP's ``CheckpointException`` on load: the failing processes and the first one's error (a shard
    damaged after the save; a checkpoint with a manifest is passed over before this, :mod:`mmgrpo.manifest`)."""
    ranks = sorted(e.failures)
    error = e.failures[ranks[0]][0] if ranks else e
    first = (str(error).strip().splitlines() or [""])[0][:160]
    return (
        f"{DIR}: a shard cannot be read on process(es) {ranks} ({type(error).__name__}: {first}); its files changed "
        "after the save: resume from another checkpoint"
    )


def read(state: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The whole tensors of a sharded checkpoint in this process, without a process group (tests, tools): the
    policy's ``{fqn: tensor}`` and the optimizer's ``{"state": {fqn: {key: value}}, "param_groups": [...]}``.
    Holds the whole model and optimizer state: for inspection, not for training."""
    import torch.distributed.checkpoint as dcp

    index = json.loads((Path(state) / INDEX).read_text())
    flat = {k: torch.empty(shape, dtype=dtype) for k, (shape, dtype) in tensor_shapes(state).items()}
    with _one_process():
        dcp.load(flat, storage_reader=_reader(Path(state) / DIR), no_dist=True)
    model = {k[len("model.") :]: v for k, v in flat.items() if k.startswith("model.")}
    optim: dict = {"state": {}, "param_groups": index.get("optimizer", {}).get("param_groups", [])}
    for k, v in flat.items():
        if k.startswith("optim."):
            fqn, name = k[len("optim.") :].rsplit(".", 1)
            optim["state"].setdefault(fqn, {})[name] = v
    for key, value in index.get("optimizer", {}).get("scalars", {}).items():
        fqn, name = key.split("\t")
        optim["state"].setdefault(fqn, {})[name] = value
    return model, optim


# ----------------------------------------------------------------------------------------------- resume checks


def problem(state: Path) -> str | None:
    """Why a sharded ``state/`` cannot be resumed, judged on its files (the index readable and tensors only, the
    JSON part well formed, every shard file the index names present with the bytes it names), else None. The
    tensors' values are not read (that would hold the whole model on one process); the weights were checked finite
    on every process before saving."""
    state = Path(state)
    try:
        index = json.loads((state / INDEX).read_text())
        meta = _reader(state / DIR).read_metadata()
    except (OSError, ValueError, ShardedCheckpointError) as e:
        return f"state/{INDEX} or state/{DIR}: {(str(e).splitlines() or [type(e).__name__])[0][:160]}"
    if not isinstance(index, dict) or index.get("format") != FORMAT or not isinstance(index.get("model"), list):
        return f"state/{INDEX} is not a sharded checkpoint index of this version"
    optim = index.get("optimizer")
    if optim is not None and not (isinstance(optim, dict) and isinstance(optim.get("param_groups"), list)):
        return f"state/{INDEX}: its optimizer part holds no param_groups"
    sizes: dict[str, int] = {}
    for info in (meta.storage_data or {}).values():
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(sizes.items()):
        path = state / DIR / name
        if not path.is_file() or path.stat().st_size < size:
            return f"state/{DIR}/{name} is missing or shorter than its index says"
    return None


def mismatch(state: Path, model: torch.nn.Module, optimizer=None) -> str | None:
    """Why the checkpoint's tensors do not fit ``model`` (names and whole shapes) or ``optimizer`` (its parameters'
    names), else None; only the index is read."""
    saved = tensor_shapes(state)
    want = {k: tuple(t.shape) for k, t in model.state_dict(keep_vars=True).items()}  # whole shapes under FSDP
    have = {k[len("model.") :]: s for k, (s, _) in saved.items() if k.startswith("model.")}
    missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or unexpected:
        return (
            f"state/{DIR} does not match the model this config builds ({len(missing)} missing, {len(unexpected)} "
            f"unexpected tensors, e.g. {(missing or unexpected)[0]})"
        )
    for key, shape in have.items():
        if shape != want[key]:
            return f"state/{DIR}[model.{key}] has shape {list(shape)}, the model's is {list(want[key])}"
    if optimizer is not None:
        index = json.loads((Path(state) / INDEX).read_text())
        groups = index.get("optimizer", {}).get("param_groups", [])
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
            return f"state/{INDEX}: its optimizer's groups do not match this optimizer's"
    return None
