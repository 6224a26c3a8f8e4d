"""Every private or version-fragile touchpoint of vLLM, diffusers, transformers, tensorboard (and torch) in one list.

A touchpoint is a name the code reaches that its library does not promise to keep: an underscore attribute, a
module path below the package's public namespace, a class we subclass, an argument we pass by name, an environment
variable we set. Each :class:`Touchpoint` says where it is used, what breaks without it and the fallback if there
is one; ``tests/test_compat.py`` checks every one against the installed version (vLLM's in the engine's own
environment, where this file runs as a script: ``python mmgrpo/compat.py vllm``), and checks that every private
attribute and deep import of those libraries in the source is listed here. Upgrading a dependency is then one test
run: a touchpoint that disappeared fails by name, before a user's run hits it.

A private attribute (``x._name``, read or set) is reached only through the named function of this module its
touchpoint names (``accessor``: :func:`no_split_modules`, :func:`attn_implementation`,
:func:`set_attn_implementation`, :func:`has_forward_hooks`, :func:`graph_task_id`, :func:`dynamo_supported`,
:func:`mark_static_address`, :func:`flux_pack_latents`, :func:`flux_latent_image_ids`, :func:`tensorboard_file_writer`,
:func:`keep_generation_fields`):
``tests/test_compat.py`` fails on a library's private attribute, or on any ``getattr(x, "_name")`` string, anywhere
else in ``mmgrpo/``, ``modalities/``, ``rewards/`` and ``tools/``.

Standard library only (it runs in ``.venv-vllm``, where mmgrpo is not installed); it imports no part of mmgrpo, so
the core may list the modalities' touchpoints without importing them (docs/architecture.md's dependency rule).
Sources: each library's own files at the versions the setup scripts install (transformers 5.x, diffusers 0.3x,
vLLM 0.32, tensorboard 2.x, torch 2.x).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Touchpoint:
    """One name a library does not promise to keep.

    ``target`` is ``module:attribute.path``; a ``Name()`` step instantiates with no arguments (an attribute set in
    ``__init__``). ``parameter``: the callable at ``target`` must accept an argument of that name. ``env``: the name
    must be one of the library's documented environment variables (``module:dict`` holding them). ``accessor``: the
    function of this module the code reaches a private attribute through (every private attribute has one)."""

    library: str
    target: str
    used_in: str
    why: str
    parameter: str | None = None
    accessor: str | None = None

    @property
    def name(self) -> str:
        """The last attribute of the target (what ``tests/test_compat.py`` matches source against)."""
        return self.target.replace(":", ".").rsplit(".", 1)[-1].removesuffix("()")


TOUCHPOINTS: tuple[Touchpoint, ...] = (
    # ------------------------------------------------------------------------------------------- transformers
    Touchpoint(
        "transformers",
        "transformers.cache_utils:DynamicLayer.update",
        "modalities/tokens/decode.py (ReservedLayer subclasses it; keys/values/is_initialized read)",
        "the preallocated KV cache of the native decode loop; without it every decode step re-copies the cache",
    ),
    Touchpoint(
        "transformers",
        "transformers.cache_utils:DynamicLayer().is_initialized",
        "modalities/tokens/decode.py",
        "ReservedLayer's swap-in checks that a layer is an initialised plain DynamicLayer",
    ),
    Touchpoint(
        "transformers",
        "transformers.cache_utils:EncoderDecoderCache",
        "modalities/tokens/decode.py",
        "Whisper's decode cache (self-attention + cross-attention)",
    ),
    Touchpoint(
        "transformers",
        "transformers.core_model_loading:revert_weight_conversion",
        "modalities/tokens/engine.py (_checkpoint_names)",
        "pushed tensors under save_pretrained's names (Qwen2-Audio's language_model.model.*); without it the names "
        "are the model's own (fallback on ImportError), which vLLM refuses for converted models",
    ),
    Touchpoint(
        "transformers",
        "transformers:GenerationConfig()._from_model_config",
        "modalities/speech/tiny.py, modalities/speech/ct2_convert.py, modalities/ar_image/tiny.py, "
        "modalities/ar_image/adapter.py",
        "set False so a saved generation config keeps its fields (else regenerated from the model config on load)",
        accessor="keep_generation_fields",
    ),
    Touchpoint(
        "transformers",
        "transformers:LlamaForCausalLM.forward",
        "modalities/_hf.py (CACHE_FIELD, kv_cache)",
        "the KV cache is passed by this keyword (the one helper that names it)",
        parameter="past_key_values",
    ),
    Touchpoint(
        "transformers",
        "transformers.modeling_outputs:BaseModelOutputWithPast",
        "modalities/_hf.py (_cache_field)",
        "the version branch of the cache keyword: its field is ``cache`` in newer transformers, else "
        "``past_key_values`` (the one place that decides CACHE_FIELD)",
    ),
    Touchpoint(
        "transformers",
        "transformers:PretrainedConfig()._attn_implementation",
        "modalities/tokens/prefix_sharing.py",
        "the attention kernel the shared-prefix forward must mask for (eager adds the mask itself)",
        accessor="attn_implementation",
    ),
    Touchpoint(
        "transformers",
        "transformers:PretrainedConfig()._attn_implementation",
        "modalities/tokens/shared_attention.py (kernel)",
        "the switch of the text layers to the shared-prefix kernel and back, per decode step and per log-prob "
        "forward; missing: the kernel reads as unsupported and the expanded layout runs",
        accessor="set_attn_implementation",
    ),
    Touchpoint(
        "transformers",
        "transformers:PreTrainedModel._no_split_modules",
        "mmgrpo/sharding.py (block_classes)",
        "the blocks FSDP's transformer-based wrap policy shards separately; missing: no class named, accelerate's "
        "default wrapping",
        accessor="no_split_modules",
    ),
    Touchpoint(
        "transformers",
        "transformers.models.gemma3.modeling_gemma3:get_block_sequence_ids_for_mask",
        "modalities/tokens/prefix_sharing.py",
        "Gemma 3's image-block ids for its bidirectional image attention (deep module path)",
    ),
    Touchpoint(
        "transformers",
        "transformers.models.qwen3_vl.video_processing_qwen3_vl:Qwen3VLVideoProcessor",
        "modalities/vlm/tiny.py",
        "the tiny Qwen3-VL's video processor (a module path below transformers' public namespace)",
    ),
    Touchpoint(
        "transformers",
        "transformers.models.janus.configuration_janus:JanusVisionConfig",
        "modalities/ar_image/tiny.py",
        "the tiny Janus's vision config (deep module path)",
    ),
    Touchpoint(
        "transformers",
        "transformers.models.janus.configuration_janus:JanusVQVAEConfig",
        "modalities/ar_image/tiny.py",
        "the tiny Janus's VQ-VAE config (deep module path)",
    ),
    Touchpoint(
        "transformers",
        "transformers.models.whisper.tokenization_whisper:LANGUAGES",
        "modalities/speech/tiny.py, modalities/speech/ct2_convert.py",
        "Whisper's language tokens, in the order the tokenizer numbers them",
    ),
    Touchpoint(
        "transformers",
        "transformers.utils:get_json_schema",
        "tools/base.py (FunctionTool, function_schema)",
        "a plain function's OpenAI tool schema from its signature and Google docstring (transformers.utils path)",
    ),
    Touchpoint(
        "transformers",
        "transformers.video_utils:VideoMetadata",
        "modalities/tokens/video.py",
        "the sampled frames' metadata the processor turns into second_per_grid_ts",
    ),
    # ---------------------------------------------------------------------------------------------- diffusers
    Touchpoint(
        "diffusers",
        "diffusers:FluxPipeline._pack_latents",
        "modalities/flow/adapter.py (the FLUX forward)",
        "FLUX's 2x2 latent packing [n, c, h, w] -> [n, hw/4, 4c]",
        accessor="flux_pack_latents",
    ),
    Touchpoint(
        "diffusers",
        "diffusers:FluxPipeline._prepare_latent_image_ids",
        "modalities/flow/adapter.py (the FLUX forward)",
        "FLUX's latent position ids",
        accessor="flux_latent_image_ids",
    ),
    Touchpoint(
        "diffusers",
        "diffusers.pipelines.flux.pipeline_flux:calculate_shift",
        "modalities/flow/adapter.py",
        "FLUX's resolution-dependent timestep shift (deep module path)",
    ),
    # -------------------------------------------------------------------------------------------- tensorboard
    Touchpoint(
        "tensorboard",
        "torch.utils.tensorboard:SummaryWriter._get_file_writer",
        "mmgrpo/tracking.py (samples)",
        "a video sample is written as a GIF image summary through the writer's file writer",
        accessor="tensorboard_file_writer",
    ),
    Touchpoint(
        "tensorboard",
        "tensorboard.compat.proto.summary_pb2:Summary.Image",
        "mmgrpo/tracking.py (samples)",
        "the image summary proto of that GIF (tensorboard's compat path)",
    ),
    # --------------------------------------------------------------------------------------------------- torch
    Touchpoint(
        "torch",
        "torch:_C._current_graph_task_id",
        "modalities/tokens/logprobs.py (TiedGrad)",
        "tells backwards apart for the fused head's deferred tied gradient; missing: plain autograd (fallback)",
        accessor="graph_task_id",
    ),
    Touchpoint(
        "torch",
        "torch:_dynamo.is_dynamo_supported",
        "modalities/tokens/compiled_decode.py (check_args)",
        "refuses compile_decode at load where torch.compile cannot run; missing: the option fails at its first step",
        accessor="dynamo_supported",
    ),
    Touchpoint(
        "torch",
        "torch:_dynamo.mark_static_address",
        "modalities/tokens/compiled_decode.py (CompiledDecoder.static_buffer)",
        "keeps a pooled step input at the fixed address a CUDA graph replays from; missing: no compiled decode",
        accessor="mark_static_address",
    ),
    Touchpoint(
        "transformers",
        "transformers.integrations.sdpa_attention:use_gqa_in_sdpa",
        "modalities/tokens/compiled_decode.py (grouped_kv_sdpa)",
        "reads TRANSFORMERS_SDPA_FORCE_GQA, which the compiled CPU step sets so that SDPA takes grouped K/V heads as "
        "they are; missing: each step copies its static cache to the query heads again (same values, slower)",
    ),
    Touchpoint(
        "torch",
        "torch.nn:Module()._forward_hooks",
        "modalities/tokens/logprobs.py",
        "a head with hooks is not fused (its hooks would be skipped)",
        accessor="has_forward_hooks",
    ),
    Touchpoint(
        "torch",
        "torch.nn:Module()._forward_pre_hooks",
        "modalities/tokens/logprobs.py",
        "as _forward_hooks",
        accessor="has_forward_hooks",
    ),
    # ---------------------------------------------------------------------------------------------------- vLLM
    Touchpoint(
        "vllm",
        "vllm.v1.sample.logits_processor:AdapterLogitsProcessor",
        "modalities/tokens/vllm_server.py (EarlyBans)",
        "Whisper's first-step token bans as a per-request logits processor (v1 engine module path)",
    ),
    Touchpoint(
        "vllm",
        "vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod.process_weights_after_loading",
        "modalities/tokens/vllm_server.py (_repack_embeddings)",
        "re-packs a tied LM head on CPU after an in-place reload; without it the engine samples from old weights",
    ),
    Touchpoint(
        "vllm",
        "vllm:LLM.collective_rpc",
        "modalities/tokens/vllm_server.py (weight pushes)",
        "runs the reload in each engine worker",
    ),
    Touchpoint(
        "vllm",
        "vllm.v1.worker.gpu_worker:Worker.reload_weights",
        "modalities/tokens/vllm_server.py (_reload_weights_*)",
        "in-place weight reload that re-applies kernel-format processing (the CPU worker subclasses it)",
        parameter="weights_iterator",
    ),
    Touchpoint(
        "vllm",
        "vllm:LLM.reset_mm_cache",
        "modalities/tokens/vllm_server.py",
        "media caches dropped after a push",
    ),
    Touchpoint(
        "vllm",
        "vllm:LLM.reset_prefix_cache",
        "modalities/tokens/vllm_server.py",
        "prefix cache dropped after a push (cached KV of the old weights)",
    ),
    Touchpoint(
        "vllm",
        "vllm.v1.engine.llm_engine:LLMEngine.reset_encoder_cache",
        "modalities/tokens/vllm_server.py",
        "encoder cache dropped after a push (llm.llm_engine)",
    ),
    Touchpoint(
        "vllm",
        "vllm:LLM.sleep",
        "modalities/tokens/vllm_server.py (colocate mode)",
        "weights offloaded between rollouts (CUDA)",
        parameter="level",
    ),
    Touchpoint("vllm", "vllm:LLM.wake_up", "modalities/tokens/vllm_server.py", "the engine back before a push"),
    Touchpoint(
        "vllm",
        "vllm.distributed.utils:StatelessProcessGroup.create",
        "modalities/tokens/weight_sync.py, vllm_server.py (rollout.weight_sync: nccl)",
        "the trainer-engine process group of NCCL weight pushes (TRL's weight-sync extension does the same)",
    ),
    Touchpoint(
        "vllm",
        "vllm.distributed.device_communicators.pynccl:PyNcclCommunicator.broadcast",
        "modalities/tokens/weight_sync.py, vllm_server.py (rollout.weight_sync: nccl)",
        "the NCCL broadcast of each pushed bucket",
    ),
    Touchpoint(
        "vllm",
        "vllm.distributed.parallel_state:get_world_group",
        "modalities/tokens/vllm_server.py (the engine worker's device for NCCL pushes)",
        "the worker's world group (its device) when the NCCL channel opens",
    ),
    Touchpoint(
        "vllm",
        "vllm.engine.arg_utils:EngineArgs",
        "modalities/tokens/vllm_server.py (LLM(..., logprobs_mode=...))",
        "processed_logprobs: the log-probs of the distribution sampled from (importance weights)",
        parameter="logprobs_mode",
    ),
    Touchpoint(
        "vllm",
        "vllm.envs:environment_variables.VLLM_ENABLE_V1_MULTIPROCESSING",
        "modalities/tokens/colocate.py",
        "the engine core in the trainer's process (weights handed over without pickling)",
    ),
    Touchpoint(
        "vllm",
        "vllm.envs:environment_variables.VLLM_ALLOW_INSECURE_SERIALIZATION",
        "modalities/tokens/vllm_server.py",
        "collective_rpc may send a module-level function to the workers",
    ),
    Touchpoint(
        "vllm",
        "vllm.v1.worker.cpu_worker:CPUWorker",
        "modalities/tokens/colocate.py (the logger vllm.v1.worker.cpu_worker filtered)",
        "its set_num_threads warning is filtered by this logger name",
    ),
)


# --------------------------------------------------------------------------------------------------- accessors
# The one place the code reads or sets a private attribute of another library's object (each named by its
# touchpoint's ``accessor``). They take the object and touch nothing else: no import at module level.


def no_split_modules(model: Any) -> list[str]:
    """transformers' ``PreTrainedModel._no_split_modules``: the block class names a model (or any of the sub-models a
    composite may hold) declares unsplittable; [] where it lists none or is no transformers model."""
    return list(getattr(model, "_no_split_modules", None) or [])


def attn_implementation(config: Any) -> str | None:
    """The attention kernel a transformers config selects (``PretrainedConfig._attn_implementation``: ``eager``,
    ``sdpa``, ``flash_attention_2``, ...); None where the config has none."""
    return getattr(config, "_attn_implementation", None)


def set_attn_implementation(config: Any, name: str | None) -> None:
    """Select the attention kernel ``name`` on one transformers config (``PretrainedConfig._attn_implementation``), that
    config only: the shared-prefix decode step switches its text layers' kernel for the step and back."""
    config._attn_implementation = name


def has_forward_hooks(module: Any) -> bool:
    """A torch module with forward hooks or forward pre-hooks registered (``Module._forward_hooks``,
    ``Module._forward_pre_hooks``)."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def dynamo_supported() -> bool:
    """Whether ``torch.compile`` can run here (``torch._dynamo.is_dynamo_supported``: this Python and platform)."""
    import torch  # here, not at the top: this file runs in environments without torch (``.venv-vllm``'s check)

    return torch._dynamo.is_dynamo_supported()


def mark_static_address(tensor: Any) -> None:
    """Mark ``tensor``'s storage as a fixed address for compiled graphs (``torch._dynamo.mark_static_address``): a CUDA
    graph replays from it without copying it in."""
    import torch

    torch._dynamo.mark_static_address(tensor)


def graph_task_id() -> Callable[[], int] | None:
    """torch's ``torch._C._current_graph_task_id`` (called inside a backward: the id of the running one), or None where
    this torch has none."""
    import torch  # here, not at the top: this file runs in environments without torch (``.venv-vllm``'s check)

    return getattr(torch._C, "_current_graph_task_id", None)


def flux_pack_latents(pipe: Any, latents: Any, n: int, c: int, h: int, w: int) -> Any:
    """FLUX's 2x2 latent packing (diffusers' ``FluxPipeline._pack_latents``).

    Shape: latents [n, c, h, w] -> [n, hw/4, 4c]."""
    return pipe._pack_latents(latents, n, c, h, w)


def flux_latent_image_ids(pipe: Any, n: int, h: int, w: int, device: Any, dtype: Any) -> Any:
    """FLUX's position ids of an ``h x w`` grid of packed latents (diffusers'
    ``FluxPipeline._prepare_latent_image_ids``).

    Shape: [h·w, 3]."""
    return pipe._prepare_latent_image_ids(n, h, w, device, dtype)


def tensorboard_file_writer(writer: Any) -> Any:
    """The event-file writer of a ``torch.utils.tensorboard.SummaryWriter`` (``_get_file_writer``): summaries the
    writer has no method for (a GIF image summary) are added to it."""
    return writer._get_file_writer()


def keep_generation_fields(generation_config: Any) -> None:
    """Mark a transformers ``GenerationConfig`` standalone (``_from_model_config = False``): saved and loaded again,
    it keeps the fields set on it instead of being regenerated from the model config."""
    generation_config._from_model_config = False


def resolve(target: str) -> object:
    """The object at ``module:attr.path`` (``Name()`` instantiated; a ``dict`` entry by key); raises on a miss."""
    module, _, path = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in path.split(".") if path else []:
        if part.endswith("()"):
            obj = getattr(obj, part[:-2])()
        elif isinstance(obj, dict):
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    return obj


def problem(tp: Touchpoint) -> str | None:
    """None when ``tp`` is present in the installed library, else one line saying what is missing and why it
    matters."""
    try:
        obj = resolve(tp.target)
        if tp.parameter is not None:
            params = inspect.signature(obj).parameters
            if tp.parameter not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                raise TypeError(f"no parameter {tp.parameter!r}")
    except Exception as e:  # ImportError, AttributeError, KeyError, TypeError: all "gone or changed"
        return f"{tp.library} touchpoint {tp.target} is gone ({type(e).__name__}: {e}); used in {tp.used_in}: {tp.why}"
    return None


def problems(library: str) -> dict[str, str | None]:
    """``target -> problem`` of every touchpoint of ``library``."""
    return {tp.target: problem(tp) for tp in TOUCHPOINTS if tp.library == library}


if __name__ == "__main__":  # python mmgrpo/compat.py LIBRARY...: the problems as JSON (run in another environment)
    print(json.dumps({lib: problems(lib) for lib in sys.argv[1:]}))
