"""Hugging Face plumbing shared by every model family: unwrapping, LoRA, dtypes, the tiny-model cache.

- :func:`unwrap` strips DDP / accelerate wrappers (``.module``) to reach the model that owns the weights.
- :func:`peft_lora` wraps a transformers model with peft (``get_peft_model``); :func:`diffusers_lora` injects
  an adapter into a diffusers denoiser with ``add_adapter`` (Gaussian init, as Flow-GRPO). Both turn peft's
  "target modules not found" into a one-line ``ConfigError`` naming ``model.lora.target_modules``.
- :data:`DTYPES` maps ``model.dtype`` to torch dtypes.
- :func:`loading` turns a failed ``from_pretrained`` (a path that does not exist, a hub id offline or unknown, a
  directory without a model) into a one-line ``ConfigError`` naming ``model.args.name_or_path``, for every family.
- :func:`save_policy` exports a policy in Hugging Face format (a full model, or a peft adapter whose
  ``adapter_config.json`` names the base model as the config named it); :func:`export_info` describes the
  export for the model card.
- :func:`kv_cache` / :func:`returned_cache`: the one place that names the KV-cache argument and output field of a
  transformers forward (``past_key_values``, renamed ``cache`` in transformers 5.x, the old name to be removed in
  5.40), so every decode loop passes and reads the cache the way the installed transformers expects and no
  rename notice is raised. :func:`peft_lora` hides, around ``get_peft_model`` only, the
  ``is_gradient_checkpointing`` deprecation peft triggers in transformers (nothing the user can act on).
- :func:`cached_build` materialises a built-in tiny model under ``MMGRPO_CACHE`` once, atomically (written to
  a temporary sibling directory and renamed), so concurrent processes never read a half-written model.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from mmgrpo.cache import cache_dir
from mmgrpo.config import ConfigError, LoraConfig
from mmgrpo.hub import hf_offline
from mmgrpo.plugins import BuildContext

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cache_field() -> str:
    """``cache`` where transformers' model outputs carry it under that name (5.x), else ``past_key_values``."""
    from dataclasses import fields

    from transformers.modeling_outputs import BaseModelOutputWithPast

    return "cache" if "cache" in {f.name for f in fields(BaseModelOutputWithPast)} else "past_key_values"


CACHE_FIELD = _cache_field()


def kv_cache(cache) -> dict:
    """The keyword argument that hands a KV cache to a transformers forward: ``model(..., **kv_cache(c))``."""
    return {CACHE_FIELD: cache}


def returned_cache(out):
    """The KV cache a transformers forward returned (``use_cache=True``)."""
    return getattr(out, CACHE_FIELD)


@contextmanager
def loading(name_or_path: str, field: str = "model.args.name_or_path") -> Iterator[None]:
    """Within the block, an ``OSError`` / ``ValueError`` from ``from_pretrained`` becomes one ``ConfigError`` line.

    transformers and diffusers raise ``OSError`` for a hub id that is offline, unknown or not cached ("We couldn't
    connect to 'https://huggingface.co' ...", the first of several lines), ``ValueError`` / huggingface_hub's
    ``HFValidationError`` for a path that is neither a directory nor a repo id; their tracebacks run 80+ lines
    through the hub client. The message says which of the three cases it is and quotes the library's first line.
    """
    try:
        yield
    except ConfigError:
        raise
    except (OSError, ValueError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        path = Path(name_or_path).expanduser()
        if path.exists():
            message = f"could not load {name_or_path!r} ({reason})"
        elif path.is_absolute() or name_or_path.startswith((".", "~")) or name_or_path.count("/") > 1:
            message = f"{name_or_path!r} does not exist (a local path); check the path"
        elif hf_offline():  # (never advise setting what is set)
            message = (
                f"{name_or_path!r} is not a local directory and HF_HUB_OFFLINE is set, so it could not be loaded "
                f"from the Hugging Face hub ({reason}); put the model in the cache or give its local directory"
            )
        else:
            message = (
                f"{name_or_path!r} is not a local directory and could not be loaded from the Hugging Face hub "
                f"({reason}); check the hub id and the network, or set HF_HUB_OFFLINE=1 with the model in the cache"
            )
        raise ConfigError(f"{field}: {message}") from None


def unwrap(model: torch.nn.Module, *, peft: bool = False) -> torch.nn.Module:
    """The module under DDP / accelerate wrappers (follows ``.module`` while it is an ``nn.Module``); with ``peft``
    also under a peft wrapper (``get_base_model()``: the transformers model, whose layers hold the LoRA modules).
    The one way every family reaches its model."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    if peft and hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def _peft_config(lora: LoraConfig, **extra):
    from peft import LoraConfig as PeftLoraConfig

    targets = lora.target_modules  # peft takes a list of names, or one string: "all-linear" or a regex
    targets = targets if isinstance(targets, str) else list(targets)
    return PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, **extra)


def peft_lora(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """``peft.get_peft_model(model, ...)``: the base weights frozen, LoRA B initialised to zero."""
    from peft import get_peft_model

    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated alias; nothing for the user to do
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            return get_peft_model(model, _peft_config(lora))
    except ValueError as e:
        raise ConfigError(f"model.lora.target_modules {lora.target_modules}: {e}") from None


def lora_or_reference(model: torch.nn.Module, ctx: BuildContext) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy and its KL reference, as every token family builds them: with ``model.lora`` enabled the policy
    is ``model`` wrapped by peft and the reference is the base (adapter disabled, so none is returned); else, when
    the config needs one (``ctx.need_reference``), a frozen copy in eval mode. The policy is left in train mode."""
    reference = None
    if ctx.lora is not None and ctx.lora.enabled:
        model = peft_lora(model, ctx.lora)
    elif ctx.need_reference:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    model.train()
    return model, reference


def diffusers_lora(model: torch.nn.Module, lora: LoraConfig, hint: str = "") -> None:
    """Freeze ``model`` and inject a LoRA adapter in place with diffusers' ``add_adapter`` (Gaussian init)."""
    model.requires_grad_(False)
    try:
        model.add_adapter(_peft_config(lora, init_lora_weights="gaussian"))
    except ValueError as e:
        raise ConfigError(f"model.lora.target_modules {lora.target_modules}: {e}{hint}") from None


def cached_build(name: str, marker: str, build: Callable[[Path], None]) -> Path:
    """``cache_dir()/name``, built by ``build(tmp_directory)`` on first use and renamed into place atomically.

    ``marker`` is a file whose presence means the directory is complete (``config.json``, ``model_index.json``).
    When two processes build at once, the first rename wins and the other's copy is deleted. Inside an initialised
    process group only process 0 may build (transformers writes no weights on the others).
    """
    directory = cache_dir() / name
    if (directory / marker).is_file():
        return directory
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        # transformers writes weights on rank 0 only once a process group exists (should_save_on_this_rank): a
        # build here would publish a model without weights
        raise RuntimeError(
            f"the tiny model {name!r} is not in the cache {directory.parent} yet, and process {dist.get_rank()} "
            "cannot build it (transformers saves weights on process 0 only); build it on process 0 first "
            "(the trainer wraps model loading in accelerator.main_process_first())"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
    try:
        build(tmp)
        os.replace(tmp, directory)
    except OSError:
        if not (directory / marker).is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def exported_base(model: torch.nn.Module, name_or_path: str) -> str:
    """The base-model name an export records, one that resolves outside mmgrpo: a real model of
    :mod:`~mmgrpo.modalities.real_models` (``smollm2-135m-instruct``, a name only mmgrpo knows) → the directory it was
    loaded from (its converted weights: the hub's differ, e.g. by the GGUF rounding); a local path → absolute; a hub
    id or a built-in tiny name → as the config named it (the model card says how to rebuild a tiny one)."""
    from . import real_models

    if real_models.canonical(name_or_path) is not None:
        loaded = str(getattr(unwrap(model, peft=True), "name_or_path", "") or "")
        return loaded or name_or_path
    path = Path(name_or_path).expanduser()
    return str(path.resolve()) if path.exists() else name_or_path


def save_policy(model: torch.nn.Module, directory: str, base_model: str) -> None:
    """``save_pretrained`` of the unwrapped policy: the whole model, or (peft) the LoRA adapter only.

    A peft adapter records ``base_model_name_or_path`` = :func:`exported_base` of ``base_model``, the name the config
    gave (``model.args.name_or_path``: a hub id, the user's path made absolute, a real model's directory), not the
    directory a built-in tiny model was loaded from (in this machine's cache). ``PeftModel.from_pretrained(base,
    directory)`` ignores the field; ``AutoPeftModel*`` loads the base from it, which works for hub ids and paths.
    """
    model.save_pretrained(directory, safe_serialization=True)
    if hasattr(model, "peft_config"):  # named after saving: peft checks the vocabulary against the loaded base
        for path in Path(directory).glob("**/adapter_config.json"):
            config = json.loads(path.read_text())
            config["base_model_name_or_path"] = exported_base(model, base_model)
            path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


TEXT_GENERATION = "text-generation"
"""The hub task of a text-only causal LM (``*ForCausalLM``: SmolLM2 through the vlm adapter's text-only path)."""


def export_info(model: torch.nn.Module, name_or_path: str, *, pipeline_tag: str, tiny_module: str) -> dict:
    """What the model card says about an export of ``model`` (unwrapped; a peft model or a transformers model).

    ``built_in`` is set when ``name_or_path`` is one of mmgrpo's built-in tiny models (loaded from another
    directory than the name and not a path on disk): how to rebuild it, since no hub holds it. A real model
    (:mod:`~mmgrpo.modalities.real_models`) is no built-in: its ``base_model`` is its directory
    (:func:`exported_base`), ``origin`` / ``hub_id`` say where its weights came from. ``pipeline_tag`` is the
    family's, except ``text-generation`` for a text-only causal LM.
    """
    from . import real_models

    lora = hasattr(model, "peft_config")
    base = model.get_base_model() if lora else model
    loaded = str(getattr(base, "name_or_path", "") or "")
    real = real_models.canonical(name_or_path)
    built_in = real is None and loaded != name_or_path and not Path(name_or_path).exists()
    causal_lm = type(base).__name__.endswith("ForCausalLM")
    return {
        "base_model": name_or_path if built_in else exported_base(model, name_or_path),
        "library": "transformers",
        "model_class": type(base).__name__,
        "lora": lora,
        "pipeline_tag": TEXT_GENERATION if causal_lm else pipeline_tag,
        "built_in": {"module": tiny_module, "function": "resolve_model_path"} if built_in else None,
        "origin": real_models.MODELS[real].origin if real else None,
        "hub_id": real_models.MODELS[real].hub_id if real else None,
        "real_name": real,
    }
