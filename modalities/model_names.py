"""``model.args.name_or_path`` checked before any weights load (the adapters' ``load_check``, so ``--dry-run`` too).

A name is loadable when it is, in this order:

1. one of the family's built-in tiny names (built from config on first use);
2. a real model of :mod:`mmgrpo.modalities.real_models` (``smollm2-135m-instruct``; case does not matter), which
   must be set up (:func:`mmgrpo.modalities.real_models.load_problem` says so in one line otherwise);
3. a local directory or file that exists;
4. a hub id with a snapshot in the Hugging Face cache;
5. online only: a hub id the hub answers for (one ``HEAD`` request of at most
   :data:`mmgrpo.rewards.weights.PROBE_TIMEOUT_S`), never the loader's minutes of retries.

Anything else is one line naming the field, why the name cannot load (offline: ``HF_HUB_OFFLINE`` is set, or the hub
cannot be reached) and, where one is close, "did you mean" a name this machine has: the family's built-in names, the
real models (a registered model's upstream hub id, ``HuggingFaceTB/SmolLM2-135M-Instruct``, is answered with its
registered name) and the hub ids in the Hugging Face cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from mmgrpo.hub import hf_cache_dir, hub_weights_problem
from mmgrpo.suggest import did_you_mean

from . import real_models

FIELD = "model.args.name_or_path"


def cached_hub_ids() -> list[str]:
    """The model repos with a folder in the Hugging Face cache (``models--org--name`` → ``org/name``)."""
    try:
        entries = os.listdir(hf_cache_dir())
    except OSError:
        return []
    return sorted(e[len("models--") :].replace("--", "/") for e in entries if e.startswith("models--"))


def suggestion(name: str, family: str, built_in: Iterable[str]) -> str | None:
    """The name this machine has that ``name`` most likely meant, with what it is; None when none is close: a real
    model's upstream hub id, a name that starts with ``name`` (``smollm2``), else the closest by
    :func:`mmgrpo.suggest.did_you_mean` (the whole name, then its last ``/`` part)."""
    lowered = name.lower()
    real = {n: m for n, m in real_models.MODELS.items() if m.adapter == family}
    for registered, model in real_models.MODELS.items():
        if model.hub_id and model.hub_id.lower() == lowered:
            other = f", with model.adapter: {model.adapter}" if model.adapter != family else ""
            return f"`{registered}` (its real weights{other}; set up by scripts/setup_real_models.sh)"
    kinds = dict.fromkeys(built_in, "a built-in tiny model")
    kinds |= dict.fromkeys(real, "real weights, docs/real_models.md")
    kinds |= dict.fromkeys(cached_hub_ids(), "in the Hugging Face cache")
    tail = name.rstrip("/").rpartition("/")[2]
    starts = sorted(n for n in kinds if n.lower().startswith(tail.lower()) and len(tail) >= 4)
    close = (starts or [None])[0] or did_you_mean(name, kinds) or (did_you_mean(tail, kinds) if tail != name else None)
    return f"`{close}` ({kinds[close]})" if close else None


def name_problem(
    name: object, family: str, built_in: Iterable[str] = (), *, filenames: tuple[str, ...] = ("config.json",)
) -> str | None:
    """Why ``name`` cannot be loaded by an adapter of ``family`` (``real_models``' adapter names: ``vlm``,
    ``whisper``, ...), as one line; None when it can (module docstring). ``filenames``: one of them marks a usable
    snapshot in the Hugging Face cache (``model_index.json`` for a diffusers pipeline)."""
    if not isinstance(name, str) or not name:
        return None
    built_in = list(built_in)
    if name in built_in:
        return None
    if real_models.canonical(name) is not None:
        return real_models.load_problem(name, family)
    if Path(name).expanduser().exists():
        return None
    problem = hub_weights_problem(name, filenames=filenames)
    if problem is None:
        return None
    close = suggestion(name, family, built_in)
    if close is not None:
        return f"{FIELD}: {problem}; did you mean {close}?"
    have = ", ".join(sorted({*built_in, *(n for n, m in real_models.MODELS.items() if m.adapter == family)}))
    return (
        f"{FIELD}: {problem}; give a local model directory, a hub id in the cache, or one of this machine's "
        f"names: {have}"
    )


__all__ = ["FIELD", "cached_hub_ids", "name_problem", "suggestion"]
