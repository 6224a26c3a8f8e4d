"""What resume checks before it loads a checkpoint (docs/reliability.md, "Resume checks what it loads").

Two stages, each returning one line saying why a checkpoint cannot be used, or ``None``:

- :func:`problem`, on the files alone, before the model loads (:func:`mmgrpo.checkpoint.find`): every file present
  (weights, trainer state, both optimizer files, each process's RNG state, ``config.yaml``), every file readable,
  every weight and optimizer tensor finite and floating point, each optimizer tensor named after a parameter the
  optimizer file lists, and the step in ``state/trainer.json`` a non-negative integer equal to the directory's step
  (its name, and the ``COMPLETE`` marker); last, every file's size and SHA-256 against the checkpoint's
  ``MANIFEST.json`` (:mod:`mmgrpo.manifest`; one written before manifests is not hash-checked).
- :func:`mismatch`, against the built model and optimizer, before anything is loaded into them
  (:func:`mmgrpo.run_dir.load_checkpoint`): every model tensor's name and shape, and the optimizer's groups and the
  shape of each state tensor.

``resume=latest`` passes over a checkpoint that fails either stage for the previous complete one, with one line
saying why; a checkpoint named explicitly (``resume=<path>``) is refused in one line instead. Nothing here imports
the rest of mmgrpo but :mod:`mmgrpo.sharded_checkpoint` (torch only) and :mod:`mmgrpo.manifest` (standard library;
:mod:`mmgrpo.checkpoint` imports this module).
A sharded checkpoint (:mod:`mmgrpo.sharded_checkpoint`) is checked on its index and the sizes of its shard files;
its tensors are not loaded here (that would hold the whole model on one process), but its shard files are hashed
against the manifest, so a flipped byte in a ``.distcp`` falls back like any other damage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from mmgrpo import manifest, sharded_checkpoint

STEP = re.compile(r"^step-(\d+)$")
_OPTIMIZER_KEY = re.compile(r"^state\.(\d+)\.(\w+)$")


def damage(directory: Path) -> str | None:
    """Why a checkpoint marked COMPLETE cannot be loaded (a file missing, truncated or corrupt), else ``None``.

    Cheap: reads each safetensors header (whose offsets must cover the file exactly, so a truncated file fails)
    and parses each JSON file; no tensor is read. :func:`problem` checks this and more."""
    state = Path(directory) / "state"
    if not state.is_dir():  # not this version's layout: :func:`mmgrpo.checkpoint.load` says so in one line
        return None
    for name in (_weights_file(state), "trainer.json"):
        if not (state / name).is_file():
            return f"state/{name} is missing"
    for path in sorted(state.iterdir()):
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as f:
                    f.keys()
            elif path.suffix == ".json":
                json.loads(path.read_text())
        except Exception as e:  # SafetensorError, JSONDecodeError, UnicodeDecodeError, OSError
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            return f"state/{path.name} is unreadable ({first})"
    return None


def _weights_file(state: Path) -> str:
    """The file that holds (or, sharded, indexes) the policy's weights: ``model.safetensors`` or ``sharded.json``."""
    return sharded_checkpoint.INDEX if sharded_checkpoint.is_sharded(state) else "model.safetensors"


def marker_step(directory: Path) -> int | None:
    """The step in a checkpoint's ``COMPLETE`` marker, or ``None`` when it holds none."""
    try:
        return int((Path(directory) / "COMPLETE").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def problem(directory: Path, processes: int = 1) -> str | None:
    """Why resume cannot use this checkpoint, judged on its files (every tensor is read once), else ``None``.

    ``processes``: the resuming run's process count (each needs its RNG state). A directory without ``state/``
    (another version's layout) passes: :func:`mmgrpo.checkpoint.load` refuses it in one line."""
    directory = Path(directory)
    state = directory / "state"
    if not state.is_dir():
        return None
    needed = [f"state/{n}" for n in (_weights_file(state), "trainer.json")]
    needed += [f"state/rng-{r}.{ext}" for r in range(processes) for ext in ("json", "safetensors")]
    if (state / "optimizer.json").exists() or (state / "optimizer.safetensors").exists():
        needed += ["state/optimizer.json", "state/optimizer.safetensors"]
    missing = [n for n in needed + ["config.yaml"] if not (directory / n).is_file()]
    saved = len(list(state.glob("rng-*.json")))  # processes that saved it
    fewer = {f"state/rng-{r}.{ext}" for r in range(saved, processes) for ext in ("json", "safetensors")}
    if missing and set(missing) <= fewer and saved > 0:
        return f"it holds the RNG state of {saved} process(es), not {processes}: resume with {saved} process(es)"
    if missing:
        return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"
    return (
        damage(directory)
        or _step_problem(directory, state)
        or _config_problem(directory / "config.yaml")
        or _rng_problem(state, processes)
        or _optimizer_problem(state)
        or _tensor_problem(state)
        or (sharded_checkpoint.problem(state) if sharded_checkpoint.is_sharded(state) else None)
        or manifest.problem(directory)  # last: every file's size and SHA-256 against MANIFEST.json
    )


def _step_problem(directory: Path, state: Path) -> str | None:
    """The step in trainer.json: a non-negative int, equal to the COMPLETE marker's and the name's (``step-*``)."""
    marker = marker_step(directory)
    if marker is None or marker < 0:
        return "COMPLETE holds no step"
    named = STEP.match(directory.name)
    if named and int(named.group(1)) != marker:
        return f"COMPLETE says step {marker}, not the step of its name"
    saved = json.loads((state / "trainer.json").read_text())
    trainer = saved.get("trainer") if isinstance(saved, dict) else None
    step = trainer.get("step") if isinstance(trainer, dict) else None
    if type(step) is not int or step < 0:
        return f"state/trainer.json: step {step!r} is not a non-negative integer"
    if step != marker:
        return f"state/trainer.json: step {step} does not match the checkpoint's step {marker}"
    return None


def _config_problem(path: Path) -> str | None:
    """config.yaml must parse to a mapping (it is compared with the resuming config)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        return f"config.yaml is unreadable ({(str(e).strip().splitlines() or [type(e).__name__])[0][:160]})"
    return None if isinstance(data, dict) else "config.yaml holds no config (not a mapping)"


def _rng_problem(state: Path, processes: int) -> str | None:
    """Each process's RNG files hold what :func:`mmgrpo.checkpoint._load_rng` unpacks."""
    for rank in range(processes):
        saved = json.loads((state / f"rng-{rank}.json").read_text())
        python = saved.get("python") if isinstance(saved, dict) else None
        numpy = saved.get("numpy") if isinstance(saved, dict) else None
        if not (isinstance(python, list) and len(python) == 3 and isinstance(numpy, list) and len(numpy) == 5):
            return f"state/rng-{rank}.json is not an RNG state"
        with safe_open(str(state / f"rng-{rank}.safetensors"), framework="pt") as f:
            if "torch_cpu" not in f.keys():  # noqa: SIM118 - safe_open is not iterable
                return f"state/rng-{rank}.safetensors has no torch_cpu state"
    return None


def _optimizer_problem(state: Path) -> str | None:
    """optimizer.json: scalars and param_groups of parameter indices; optimizer.safetensors: ``state.<i>.<name>``
    tensors, i among those indices."""
    if not (state / "optimizer.json").is_file():
        return None
    meta = json.loads((state / "optimizer.json").read_text())
    groups = meta.get("param_groups") if isinstance(meta, dict) else None
    if not (
        isinstance(groups, list)
        and isinstance(meta.get("scalars"), dict)
        and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
    ):
        return "state/optimizer.json is not an optimizer state (scalars, param_groups)"
    indices = [i for g in groups for i in g["params"]]
    if indices != list(range(len(indices))):
        return "state/optimizer.json: param_groups do not list parameters 0, 1, ... in order"
    bad = [k for k in meta["scalars"] if not re.match(r"^\d+\.\w+$", k) or int(k.split(".")[0]) >= len(indices)]
    with safe_open(str(state / "optimizer.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not iterable
            m = _OPTIMIZER_KEY.match(key)
            if not m or int(m.group(1)) >= len(indices):
                bad.append(key)
    if bad:
        return f"state/optimizer.safetensors: {bad[0]!r} names no parameter of the optimizer ({len(indices)} listed)"
    return None


def non_finite(path: Path) -> str | None:
    """``<file>[<key>] is ...`` for the first tensor of a safetensors file that is not finite, else ``None``
    (one tensor in memory at a time)."""
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not iterable
            t = f.get_tensor(key)
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{path.name}[{key}] is not finite"
    return None


def _tensor_problem(state: Path) -> str | None:
    """Every weight finite; every optimizer tensor finite and floating point (AdamW's moments and step)."""
    for name in ("model.safetensors", "reference.safetensors", "optimizer.safetensors"):
        if (state / name).is_file() and (why := non_finite(state / name)):
            return f"state/{why}"
    if (state / "optimizer.safetensors").is_file():
        with safe_open(str(state / "optimizer.safetensors"), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not iterable
                dtype = f.get_slice(key).get_dtype()
                if not dtype.startswith(("F", "BF")):
                    return f"state/optimizer.safetensors[{key}] is {dtype}, not floating point"
    return None


# ------------------------------------------------------------------------------------- against the model


def mismatch(directory: Path, model: torch.nn.Module, optimizer=None, reference=None) -> str | None:
    """Why the checkpoint's tensors do not fit the built ``model`` (and ``reference``, ``optimizer``), else
    ``None``; only the safetensors headers are read, nothing is loaded. Under FSDP the shapes compared are the
    whole (unsharded) ones, as the files hold."""
    state = Path(directory) / "state"
    if sharded_checkpoint.is_sharded(state):
        why = sharded_checkpoint.mismatch(state, model, optimizer)
        if why is None and reference is not None and (state / "reference.safetensors").is_file():
            why = _module_mismatch(state / "reference.safetensors", reference)
        return why
    if not (state / "model.safetensors").is_file():  # another version's layout: loading refuses it in one line
        return None
    why = _module_mismatch(state / "model.safetensors", model)
    if why is None and reference is not None and (state / "reference.safetensors").is_file():
        why = _module_mismatch(state / "reference.safetensors", reference)
    if why is None and optimizer is not None:
        why = _optimizer_mismatch(state, optimizer)
    return why


def _module_mismatch(path: Path, module: torch.nn.Module) -> str | None:
    expected = module.state_dict(keep_vars=True)
    tied: dict[int, list[str]] = {}  # tensors registered under several names are saved once
    for name, t in expected.items():
        tied.setdefault(id(t), []).append(name)
    with safe_open(str(path), framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    missing = sorted(names[0] for names in tied.values() if not any(n in saved for n in names))
    unexpected = sorted(set(saved) - set(expected))
    if missing or unexpected:
        return (
            f"state/{path.name} does not match the model this config builds ({len(missing)} missing, "
            f"{len(unexpected)} unexpected tensors, e.g. {(missing or unexpected)[0]})"
        )
    for key, shape in saved.items():
        want = tuple(expected[key].shape)
        if shape != want:
            return f"state/{path.name}[{key}] has shape {list(shape)}, the model's is {list(want)}"
    return None


def _optimizer_mismatch(state: Path, optimizer) -> str | None:
    if not (state / "optimizer.json").is_file():
        return "state/optimizer.json and state/optimizer.safetensors are missing"
    saved = [len(g["params"]) for g in json.loads((state / "optimizer.json").read_text())["param_groups"]]
    live = [len(g["params"]) for g in optimizer.param_groups]
    if saved != live:
        return f"state/optimizer.json holds {saved} parameters per group, the optimizer {live}"
    params = [p for g in optimizer.param_groups for p in g["params"]]
    with safe_open(str(state / "optimizer.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not iterable
            index, name = _OPTIMIZER_KEY.match(key).groups()
            shape, want = tuple(f.get_slice(key).get_shape()), tuple(params[int(index)].shape)
            if (shape not in ((), (1,))) if name == "step" else shape != want:
                return f"state/optimizer.safetensors[{key}] has shape {list(shape)}, its parameter's is {list(want)}"
    return None
