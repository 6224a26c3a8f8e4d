"""Share the prompt across the group: one prefill per prompt when sampling, split attention when training.

In VLM GRPO the prompt (hundreds of image tokens and the question) is far longer than the completion, and the G
samples of a prompt share it. The naive path — and TRL's ``GRPOTrainer``, which repeats every row G times
(TRL's ``RepeatSampler`` in ``trl/trainer/grpo_trainer.py``) — runs the vision encoder and the prompt forward G
times per prompt, when sampling and again in every training forward. This module does that work once per prompt:

* **KV-expanded sampling** (:class:`PrefixStepper`). The P prompts are prefilled once (vision encoder included);
  the prompt KV cache and the last-position logits are expanded G ways along the batch, and the one decode loop
  (:func:`.decode.decode`) draws the G continuations. The logits processing is that of HF ``generate``
  in its order — min-new-tokens EOS ban, suppressed tokens, temperature, top-k, top-p — followed by one categorical
  draw per row and step (:func:`.decode.draw_token`): either ``torch.multinomial`` over the softmax, the same draws as
  ``generate(num_return_sequences=G)`` (a fixed seed gives the same tokens unless float rounding moves a draw
  across a boundary of the cumulative distribution), or inverse-CDF sampling from one uniform per row, the same
  distribution at a fraction of the cost on CPU at a real vocabulary. The loop also returns each token's
  log-probability under the sampling distribution (before top-k/top-p truncation, as the training forward
  computes it), as ``scores[token] − logsumexp(scores)``. Only the arguments given here shape the
  distribution; a checkpoint's ``generation_config`` extras (repetition penalty...) do not silently change it.
* **Split-attention training forward** (:func:`completion_logits`), the idea of Prefix Grouper (Liu et al. 2025, arXiv
  2506.05433; in verl since PR #4368, ``verl/trainer/ppo/prefix_grouper_utils.py``). The U distinct prompts of a
  minibatch are encoded once — vision encoder, prompt self-attention, MLPs — *with* autograd, keeping their per-layer
  keys/values; each of the n completions then runs over its own tokens only, its queries attending to [its prompt's
  K/V ; its own causal K/V]. The prompt K/V reach the completions through ``index_select``, so a prompt's hidden
  states receive the summed gradient of every completion that attends to them: the gradient of the naive path's G
  copies. verl patches the attention functions and needs FSDP without remove-padding; here the split is expressed
  through the model's own KV-cache interface (prefill, then continue with the returned cache:
  ``modalities/_hf.kv_cache``), so the model's layers, attention kernels (sdpa/eager), LoRA layers and left-padded
  prompt batches are used unchanged.

Positions. Qwen2/2.5-VL use 3-D mRoPE: image tokens get (t, h, w) positions, and text after the image continues
from the rope index reached at the end of the prompt. That continuation is read from the model's
``get_rope_index`` on each prompt followed by one text token, so completion positions are exactly those of the
naive [prompt ; completion] forward. (For a video whose temporal index outruns its spatial index, HF ``generate``
continues from max+1 instead; sampling here follows the training forward's rule, so old and new log-probs agree.)

Work per prompt, prompt length L and completion length T: the naive training forward runs G·(L+T) tokens
through every projection and MLP and G vision encoders; the shared one L + G·T tokens and one vision encoder;
attention scores G·(L+T)²/2 → L²/2 + G·T·(L + T/2). The cost is the expanded prompt K/V, G·L keys and values
per layer (2·L·d_kv each, small beside the G·L hidden states of the naive path).

Gradient checkpointing. transformers' checkpointed layers (``GradientCheckpointingLayer``) turn the KV cache off
in training, so under checkpointing the training forward does not go through the cache: each prompt and the
completions that continue it are packed into one row, [prompt ; completion 1 ; … ; completion k], and a 4-D
attention mask lets each completion attend to its prompt and causally to itself only, with rope positions that
continue the prompt's (:func:`packed_completion_logits`; the layout of Prefix Grouper, arXiv 2506.05433, §3). One
checkpointable forward, no cache; the vision encoder and the prompt tokens still run once per prompt.

Coverage, written once against transformers' decoder interface (a forward taking ``position_ids`` and a KV cache,
the ``DynamicCache`` the model builds for its config): every decoder-only model with 1-D positions — Llama, Mistral,
Qwen2/3, Phi-3, Gemma, OLMo-2, Granite, SmolLM3, Qwen2-MoE; Gemma 2 and Gemma 3 with their sliding-window and global
layers (``SLIDING_MODEL_TYPES``: the cache keeps each sliding layer's window, and the packed form below gives those
layers their own windowed mask) — the media models of ``MULTIMODAL_MODEL_TYPES`` whose features fill placeholder
tokens of a 1-D-position decoder: Qwen2-Audio, SmolVLM / Idefics3, LLaVA, LLaVA-OneVision (anyres tiles, a different
tile count per image), InternVL and Gemma 3 (its image tokens attend to each other both ways: the prompt's
prefill does so as the naive forward does, and the packed mask adds those blocks, :func:`_image_blocks`) — and the
mRoPE families Qwen2-VL, Qwen2.5-VL, Qwen3-VL (Qwen3-VL's DeepStack features touch prompt positions only), whose
positions come from their ``get_rope_index``; under gradient checkpointing the same models with the ``sdpa`` or
``eager`` attention kernel (those that take a custom 4-D mask as given). Each is tested against the naive path on a
tiny model of its real architecture (tests/test_prefix_sharing.py; docs/architecture.md, "Architectures and the fast
path"). One window over every layer (Mistral with ``sliding_window`` set), the sliding layers of other families,
bidirectional decoders, encoder-decoder models, other models with their own multimodal rope positions, other media
models (LLaVA-NeXT, Mllama, PaliGemma...: their layouts are not tested here) and checkpointing with another kernel
fall back to the naive path with a one-time warning that names the reason (:func:`unsupported_reason`).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``U`` distinct prompts in a minibatch, ``n`` rows
of a minibatch, ``L`` padded prompt length, ``T`` completion tokens, ``V`` vocabulary, ``R`` rope sections
(3 for mRoPE, 1 for 1-D RoPE).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from mmgrpo.compat import attn_implementation

from .. import _hf
from .decode import SamplingSpec, reserve_cache, sampling_scores

logger = logging.getLogger(__name__)

MROPE_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl"})  # positions from get_rope_index; others 1-D
# Media models tested here (any text decoder is covered too).
MULTIMODAL_MODEL_TYPES = MROPE_MODEL_TYPES | {
    "qwen2_audio",
    "idefics3",
    "llava",
    "llava_onevision",
    "internvl",
    "gemma3",
}
# Text model types with sliding-window and global layers whose decoder takes one mask per layer type (tested here).
SLIDING_MODEL_TYPES = frozenset({"gemma2", "gemma3_text"})
# Media models whose image tokens attend to each other both ways within an image (token_type_ids marks them).
BIDIRECTIONAL_IMAGE_MODEL_TYPES = frozenset({"gemma3"})
PACKED_KERNELS = frozenset({"sdpa", "eager"})  # attention kernels that take a custom 4-D mask as given
_warned: set[str] = set()
_told: set[str] = set()  # messages said once at INFO level (:func:`info_once`)


def core_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DDP/accelerate and peft wrappers (:func:`mmgrpo.modalities._hf.unwrap`)."""
    return _hf.unwrap(model, peft=True)


def checkpointing(model: torch.nn.Module) -> bool:
    """Whether a training forward of ``model`` recomputes its layers (transformers' gradient checkpointing, which
    turns the KV cache off inside every checkpointed layer)."""
    core = core_model(model)
    return core.training and any(getattr(m, "gradient_checkpointing", False) is True for m in core.modules())


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Turn on transformers' non-reentrant activation checkpointing (``model.args.gradient_checkpointing``)."""
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers ≥ 5.x name
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when prompt sharing covers ``model``; otherwise why it falls back to the naive path (one line).

    Covered: the mRoPE families (``MROPE_MODEL_TYPES``, positions from their ``get_rope_index``) and every
    decoder-only model with 1-D positions whose forward takes ``position_ids`` and a KV cache — the standard
    transformers decoder interface (Llama, Mistral, Qwen2/3, Phi-3, Gemma, Gemma 2/3, OLMo-2, Granite, SmolLM3 and
    Qwen2-MoE are tested against the naive path in tests/test_prefix_sharing.py), sliding-window layers of
    ``SLIDING_MODEL_TYPES`` included. Not covered: one window over every layer (Mistral's ``sliding_window``), other
    families' sliding layers, bidirectional attention, encoder-decoder models, media models not in
    ``MULTIMODAL_MODEL_TYPES`` (their vision/audio layouts are not tested yet), and a forward without those
    arguments."""
    core = core_model(model)
    config = getattr(core, "config", None)
    model_type = getattr(config, "model_type", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return f"{type(core).__name__} is not a decoder-only model (its prompt is not a causal prefix)"
    inner = getattr(core, "model", core)
    if model_type in MROPE_MODEL_TYPES and not hasattr(inner, "get_rope_index"):
        return f"{type(core).__name__} has no get_rope_index"
    if model_type not in MROPE_MODEL_TYPES and hasattr(inner, "get_rope_index"):
        return f"model type {model_type!r} computes its own multimodal rope positions, which are not reproduced here"
    if model_type not in MULTIMODAL_MODEL_TYPES and any(hasattr(config, k) for k in ("vision_config", "audio_config")):
        return f"multimodal model type {model_type!r} is not yet tested against the naive path (text decoders are)"
    params = inspect.signature(core.forward).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):  # **kwargs passes them through
        missing = [name for name in ("position_ids", "use_cache") if name not in params]
        if missing or (_hf.CACHE_FIELD not in params and "past_key_values" not in params):
            return f"{type(core).__name__}.forward takes no {' / '.join(missing) or 'KV cache'} argument"
    text = config.get_text_config()
    if getattr(text, "use_bidirectional_attention", False):
        return f"model type {text.model_type!r} attends bidirectionally (its prompt is not a causal prefix)"
    sliding_layers = "sliding_attention" in (getattr(text, "layer_types", None) or [])
    if sliding_layers and text.model_type not in SLIDING_MODEL_TYPES:
        return (
            f"sliding-window attention layers of model type {text.model_type!r} are not yet tested against the naive "
            f"path (those of {', '.join(sorted(SLIDING_MODEL_TYPES))} are)"
        )
    window = getattr(text, "sliding_window", None)
    one_window = window is not None and getattr(text, "use_sliding_window", True) and not _all_full(text)
    if not sliding_layers and (one_window or getattr(text, "use_sliding_window", False)):  # Mistral with a window
        return f"sliding-window attention (window {window}) keeps a different cache (sliding_window: null shares)"
    kernel = unpacked_kernel(model)
    if checkpointing(model) and kernel is not None:
        return f"gradient checkpointing needs a custom attention mask, which {kernel!r} attention does not take"
    return None


def _all_full(text_config) -> bool:
    """Whether the config lists its layers and every one is full attention (Qwen3: a window size, never used)."""
    layer_types = getattr(text_config, "layer_types", None)
    return bool(layer_types) and all(t == "full_attention" for t in layer_types)


def info_once(log: logging.Logger, message: str) -> None:
    """Log ``message`` once per process at INFO level through ``log``: the fallbacks of shortcuts that are on by
    default (said, not warned)."""
    if message not in _told:
        _told.add(message)
        log.info(message)


def warn_fallback_once(what: str, reason: str) -> None:
    """Log once per (what, reason) that a shortcut falls back to the naive path."""
    key = f"{what}: {reason}"
    if key not in _warned:
        _warned.add(key)
        logger.warning("prefix sharing: %s uses the naive path because %s", what, reason)


# ------------------------------------------------------------------------------------------------- prefill


@dataclass
class PromptPrefix:
    """U prompts prefilled once: their KV cache, the logits that predict the first completion token, positions.

    Shape:
        cache: DynamicCache, per layer keys/values [U, H_kv, L, d]
        last_logits: [U, V] logits at the last prompt position
        attention_mask: [U, L] left-padded prompt mask
        next_position: [R, U] rope position of the first token after each prompt
    """

    cache: object
    last_logits: Tensor  # [U, V]
    attention_mask: Tensor  # [U, L]
    next_position: Tensor  # [R, U]

    def select(self, rows: Tensor) -> PromptPrefix:
        """Row ``rows[i]`` of every field for each i (differentiable; the cache is re-indexed in place)."""
        self.cache.reorder_cache(rows)
        return PromptPrefix(self.cache, self.last_logits[rows], self.attention_mask[rows], self.next_position[:, rows])


def prompt_positions(model: torch.nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Rope positions of left-padded prompts and of the first token after each prompt.

    mRoPE: the model's ``get_rope_index`` on [prompt ; one text token], so the continuation follows the rule of
    the full-sequence forward. 1-D RoPE: the count of real tokens before each one.

    Shape:
        batch["input_ids"], batch["attention_mask"]: [U, L]
        returns positions [R, U, L], next_position [R, U]
    """
    core = core_model(model)
    ids, mask = batch["input_ids"], batch["attention_mask"]  # [U, L]
    U, L = ids.shape
    if core.config.model_type not in MROPE_MODEL_TYPES:  # 1-D positions: the count of real tokens before each
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # [U, L]
        return positions[None], mask.long().sum(-1)[None]  # [1, U, L], [1, U]
    mm = batch.get("mm_token_type_ids")
    if mm is None:  # processors before transformers 5 did not return it: derive it from the placeholders
        cfg = core.config
        mm = (ids == cfg.image_token_id).long() + 2 * (ids == getattr(cfg, "video_token_id", -1)).long()
    extra = {k: batch[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in batch}
    positions, _ = getattr(core, "model", core).get_rope_index(
        torch.cat([ids, ids[:, -1:]], dim=1),  # [U, L+1], one more text token
        mm_token_type_ids=torch.cat([mm, mm.new_zeros((U, 1))], dim=1),
        attention_mask=torch.cat([mask, mask.new_ones((U, 1))], dim=1),
        **extra,
    )  # [3, U, L+1]
    return positions[..., :L], positions[..., L]  # [3, U, L], [3, U]


def position_arg(positions: Tensor) -> Tensor:
    """[R, n, t] → what the model's forward takes: [3, n, t] for mRoPE, [n, t] for 1-D RoPE."""
    return positions[0] if positions.shape[0] == 1 else positions


def prefill(model: torch.nn.Module, batch: dict[str, Tensor]) -> PromptPrefix:
    """Run the U prompts of ``batch`` (media included) once, keeping the KV cache (with grad if enabled)."""
    positions, next_position = prompt_positions(model, batch)
    out = model(**batch, position_ids=position_arg(positions), use_cache=True, logits_to_keep=1)
    return PromptPrefix(_hf.returned_cache(out), out.logits[:, -1], batch["attention_mask"], next_position)


def continue_prefix(
    model: torch.nn.Module, prefix: PromptPrefix, tokens: Tensor, attention_mask: Tensor, offset: int
) -> Tensor:
    """Logits of ``tokens`` continuing ``prefix`` (rows already selected); appends their K/V to the cache.

    Shape:
        tokens: [n, t], the tokens at completion positions offset .. offset+t-1
        attention_mask: [n, L + offset + t] (prompt mask, then 1/0 for every completion position so far)
        returns logits [n, t, V]
    """
    t = tokens.shape[1]
    steps = torch.arange(offset, offset + t, device=tokens.device)  # [t]
    positions = prefix.next_position[..., None] + steps  # [R, n, t]
    out = model(
        input_ids=tokens,
        attention_mask=attention_mask,
        position_ids=position_arg(positions),
        use_cache=True,
        **_hf.kv_cache(prefix.cache),
    )
    return out.logits  # [n, t, V]


# ---------------------------------------------------------------------------------------------- training


def completion_logits(
    model: torch.nn.Module,
    batch: dict[str, Tensor],
    rows: Tensor,
    completions: Tensor,
    completion_mask: Tensor,
    packed: bool | str = False,
) -> Tensor:
    """Logits that score ``completions``: the split-attention equivalent of the naive [prompt ; completion] forward.

    The U prompts in ``batch`` are encoded once; completion i continues prompt ``rows[i]``. The logit at the last
    prompt position predicts token 0; completion tokens 0..T-2 (attending to their prompt and causally to each
    other) predict tokens 1..T-1, so token T-1 is never fed. Under gradient checkpointing, or where ``packed``
    (``model.args.packed_training``: true | false | auto) packs (:func:`packs`), the same logits come from one
    packed cache-free forward (:func:`packed_completion_logits`): on a CPU faster when a prompt's G·T completion
    tokens are no longer than the prompt, slower beyond (docs/benchmarks.md, "The training forward in isolation").

    Shape:
        batch: left-padded prompts, input_ids/attention_mask [U, L] (+ media tensors)
        rows: [n] prompt row of each completion; completions, completion_mask: [n, T]
        returns logits [n, T, V] (the model's dtype)
    """
    if checkpointing(model) or packs(model, packed):
        return packed_completion_logits(model, batch, rows, completions, completion_mask)
    prefix = prefill(model, batch).select(rows)
    first = prefix.last_logits[:, None]  # [n, 1, V]
    T = completions.shape[1]
    if T == 1:
        return first
    mask = torch.cat([prefix.attention_mask, completion_mask[:, : T - 1].to(prefix.attention_mask.dtype)], dim=1)
    rest = continue_prefix(model, prefix, completions[:, : T - 1], mask, offset=0)  # [n, T-1, V]
    return torch.cat([first, rest], dim=1)  # [n, T, V]


def unpacked_kernel(model: torch.nn.Module) -> str | None:
    """None when ``model``'s attention kernel takes the packed forward's 4-D mask (``PACKED_KERNELS``); else its name
    (gradient checkpointing and ``packed_training`` both need the mask)."""
    kernel = attn_implementation(core_model(model).config.get_text_config())
    return None if kernel in PACKED_KERNELS else kernel


def packs(model: torch.nn.Module, setting: bool | str = True) -> bool:
    """Whether the split-attention log-prob forward packs (one cache-free forward, :func:`packed_completion_logits`)
    under ``model.args.packed_training`` = ``setting``: ``true`` where ``model``'s attention kernel takes the packed
    forward's 4-D mask (else the cache layout, warned once); ``auto`` the same where the policy sits on a CUDA device
    (said once at INFO level when the kernel takes no mask) and never on the CPU; ``false`` never.

    Why ``auto`` packs on CUDA only: a small model's training step there is launch-bound, and the cache layout runs the
    decoder twice (the prompts' prefill, then the completions over its cache), the packed forward once. On an H200
    with SmolLM2-135M (16 completions of 32 tokens to 2 prompts of ~40, fp32), the profiled update went from 335 to
    173 ms, its kernel launches from 9,488 to 4,795 (``benchmarks/step_profile.py``). On a 2-core CPU the cache layout
    is faster once a prompt's G·T completion tokens outnumber its own (docs/benchmarks.md, "The training forward in
    isolation")."""
    if setting is False or (setting == "auto" and next(model.parameters()).device.type != "cuda"):
        return False
    kernel = unpacked_kernel(model)
    if kernel is not None:
        reason = f"{kernel!r} attention takes no custom 4-D mask (sdpa or eager does)"
        if setting == "auto":
            info_once(logger, f"packed_training (auto) is not used: {reason}")
        else:
            warn_fallback_once("packed_training", reason)
    return kernel is None


def packed_completion_logits(
    model: torch.nn.Module, batch: dict[str, Tensor], rows: Tensor, completions: Tensor, completion_mask: Tensor
) -> Tensor:
    """:func:`completion_logits` in one cache-free forward, for gradient checkpointing (Prefix Grouper's layout).

    Row u of the forward packs prompt u and the completions that continue it, each in its own slot of T-1
    tokens: [prompt_u ; completion slot 0 ; … ; slot K-1]. A 4-D mask lets prompt tokens attend causally to the
    prompt, and a completion's tokens to its prompt and causally to its own slot only — the attention pattern of
    the cache path — and the positions of every slot continue the prompt's rope index (``prompt_positions``), so
    each completion token sees the keys, values and rotary phases it sees in the naive [prompt ; completion]
    forward. Slots a prompt does not fill (fewer completions than the fullest prompt) are padding. The cost over
    the cache path is the masked-out slot×slot score blocks, K·(T-1) keys per completion query.

    Shape:
        batch: left-padded prompts, input_ids/attention_mask [U, L] (+ media tensors)
        rows: [n] prompt row of each completion; completions, completion_mask: [n, T]
        returns logits [n, T, V] (the model's dtype)
    """
    ids, prompt_mask = batch["input_ids"], batch["attention_mask"]  # [U, L]
    U, L = ids.shape
    t = completions.shape[1] - 1  # completion tokens fed (the last one is only predicted)
    member = torch.nn.functional.one_hot(rows, U)  # [n, U]
    slot = ((member.cumsum(0) - 1) * member).sum(1)  # [n] rank of each completion among its prompt's
    K = int(slot.max()) + 1 if t > 0 else 0
    S = L + K * t
    tokens = ids.new_zeros((U, K, t))  # [U, K, t] (empty slots: token 0, never attended to)
    tokens[rows, slot] = completions[:, :t].to(ids.dtype)
    valid = torch.zeros((U, K, t), dtype=torch.bool, device=ids.device)  # [U, K, t]
    valid[rows, slot] = completion_mask[:, :t].bool()
    positions, next_position = prompt_positions(model, batch)  # [R, U, L], [R, U]
    steps = torch.arange(t, device=ids.device)  # [t]
    slot_positions = (next_position[..., None] + steps).repeat(1, 1, K)  # [R, U, K·t]
    segment = torch.cat([steps.new_full((L,), -1), torch.arange(K, device=ids.device).repeat_interleave(t)])  # [S]
    index = torch.arange(S, device=ids.device)  # [S]
    pattern = (index[None] <= index[:, None]) & ((segment[None] == -1) | (segment[None] == segment[:, None]))  # [S, S]
    keys = torch.cat([prompt_mask.bool(), valid.view(U, K * t)], dim=1)  # [U, S]
    allowed = (pattern & keys[:, None]) | torch.eye(S, dtype=torch.bool, device=ids.device)  # [U, S, S]
    # A query always sees itself, so a padding row is never all masked (NaN); no real query sees a padding key.
    all_positions = torch.cat([positions, slot_positions], dim=-1)  # [R, U, S]
    packed = dict(batch, input_ids=torch.cat([ids, tokens.view(U, K * t)], dim=1))  # [U, S]
    for key, value in batch.items():  # other sequence-aligned keys (mm_token_type_ids): text in the slots
        if key not in ("input_ids", "attention_mask") and value.dim() == 2 and value.shape == (U, L):
            packed[key] = torch.cat([value, value.new_zeros((U, K * t))], dim=1)
    blocks = _image_blocks(model, packed)  # [U, S] or None
    if blocks is not None:  # Gemma 3: the tokens of one image attend to each other both ways
        allowed = allowed | ((blocks[:, :, None] == blocks[:, None, :]) & (blocks[:, :, None] >= 0))  # [U, S, S]
    packed["attention_mask"] = _packed_mask(model, allowed, all_positions[0])
    position_ids = position_arg(all_positions)  # [R, U, S] or [U, S]
    logits = model(**packed, position_ids=position_ids, use_cache=False, logits_to_keep=S - L + 1).logits
    logits = logits[:, logits.shape[1] - (S - L + 1) :]  # (Qwen2-Audio ignores logits_to_keep)
    # logits [U, 1 + K·t, V]: index 0 is the last prompt position, 1 + k·t + a completion token a of slot k
    first = logits[rows, :1]  # [n, 1, V]
    if t == 0:
        return first
    rest = logits[rows[:, None], 1 + slot[:, None] * t + steps]  # [n, t, V]
    return torch.cat([first, rest], dim=1)  # [n, T, V]


def _image_blocks(model: torch.nn.Module, packed: dict[str, Tensor]) -> Tensor | None:
    """For a model whose image tokens attend to each other bidirectionally (``BIDIRECTIONAL_IMAGE_MODEL_TYPES``,
    Gemma 3: ``token_type_ids`` 1 marks them), each packed token's image block (0, 1, ... per image, -1 for text), as
    transformers' ``get_block_sequence_ids_for_mask`` (``modeling_gemma3.py``) numbers them for the naive forward's
    mask; None for other models.

    Shape:
        packed["token_type_ids"]: [U, S]; returns [U, S]
    """
    if core_model(model).config.model_type not in BIDIRECTIONAL_IMAGE_MODEL_TYPES or "token_type_ids" not in packed:
        return None
    from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask

    return get_block_sequence_ids_for_mask(packed["token_type_ids"])  # [U, S]


def _packed_mask(model: torch.nn.Module, allowed: Tensor, positions: Tensor) -> Tensor | dict[str, Tensor]:
    """The packed forward's 4-D attention mask in the form the model's kernel takes: boolean for ``sdpa`` (True =
    attend), additive for ``eager``. A decoder with sliding-window layers (``SLIDING_MODEL_TYPES``) gets one mask per
    layer type, as its forward takes them (``causal_mask_mapping`` in transformers' ``modeling_gemma3.py``): the
    sliding layers' also hide keys ``window`` or more positions behind the query. Packed positions are the naive
    row's, and in a left-padded naive row the index distance between two real tokens is their position distance,
    so this is transformers' ``sliding_window_overlay`` (``kv_idx > q_idx - window``) of the naive forward.

    Shape:
        allowed: [U, S, S] True where a query may attend a key; positions: [U, S] 1-D rope positions
        returns [U, 1, S, S], or {"full_attention": [U, 1, S, S], "sliding_attention": [U, 1, S, S]}
    """
    text = core_model(model).config.get_text_config()
    dtype = next(model.parameters()).dtype

    def kernel_form(mask: Tensor) -> Tensor:  # [U, S, S] → [U, 1, S, S]
        if attn_implementation(text) == "eager":  # eager adds the mask
            return torch.zeros(mask[:, None].shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask[:, None], torch.finfo(dtype).min
            )
        return mask[:, None]

    if "sliding_attention" not in (getattr(text, "layer_types", None) or []):
        return kernel_form(allowed)
    near = positions[:, :, None] - positions[:, None, :] < text.sliding_window  # [U, S, S] query − key < window
    diagonal = torch.eye(allowed.shape[-1], dtype=torch.bool, device=allowed.device)  # [S, S]
    return {"full_attention": kernel_form(allowed), "sliding_attention": kernel_form((allowed & near) | diagonal)}


# ---------------------------------------------------------------------------------------------- sampling


class PrefixStepper:
    """:class:`~.decode.Stepper` of a decoder-only model: one prefill per prompt (media included), the KV cache and
    last logits expanded G ways, then one token per row and step through :func:`continue_prefix`."""

    def __init__(self, model: torch.nn.Module, batch: dict[str, Tensor], reserve: int = 0):
        self.model, self.batch, self.reserve = model, batch, reserve

    def prefill(self, group_size: int) -> Tensor:
        prefix = prefill(self.model, self.batch)
        if self.reserve:  # in-place K/V writes, no per-step concatenation; reserved before the G-way expansion
            reserve_cache(prefix.cache, self.reserve)
        P = prefix.last_logits.shape[0]
        rows = torch.arange(P, device=prefix.last_logits.device).repeat_interleave(group_size)  # [B]
        self.prefix = prefix.select(rows)
        self.mask = self.prefix.attention_mask  # [B, L + t]
        return self.prefix.last_logits  # [B, V]

    def scores(self, logits: Tensor, step: int, spec: SamplingSpec) -> Tensor:
        return sampling_scores(logits, step, spec)

    def step(self, tokens: Tensor, step: int) -> Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((tokens.shape[0], 1))], dim=1)
        return continue_prefix(self.model, self.prefix, tokens[:, None], self.mask, offset=step)[:, -1]  # [B, V]
