"""FLOPs and peak memory of one GRPO step, mmgrpo's algorithm vs TRL's, as functions of the model and the batch.

    python benchmarks/cost_model.py                         # the predicted ratios for Qwen2.5-VL-3B and -7B
    python benchmarks/cost_model.py --validate runs/bench   # against a vs_trl.json (measured GFLOP/step, peak)

What each toolkit does in one step (P prompts of L tokens, I of them image tokens, G completions of T tokens each,
B = P·G rows, μ = 1, β = 0), as ``benchmarks/vs_trl.py`` runs them:

* **TRL** (``GRPOTrainer``, HF ``generate``): every row is its own [prompt ; completion] (``RepeatSampler``).
  Rollout: a prefill of B·L tokens (vision encoder B times per prompt image) and T − 1 decoding steps of B rows.
  Loss forward: B·(L + T) tokens, the vision encoder B times, the lm_head on the labelled rows (its GPU rule:
  B·T positions) or on every position (its CPU rule: B·(L + T)); no old-log-prob forward at μ = 1. Backward
  over all of it.
* **mmgrpo** (prompt sharing, ``modalities/tokens/prefix_sharing.py``): rollout prefills P·L tokens (the vision
  encoder once per prompt), then the same B-row decoding; the old-log-prob forward (no grad, ``old_logprobs:
  recompute``) and the training forward each run P·L prompt tokens + B·(T − 1) completion tokens and the fused
  lm_head log-prob on B·T positions (``modalities/tokens/logprobs.py``: its backward recomputes the logits; for a
  trained tied head the weight gradient is computed after the rest of the backward, recomputing them once more).

FLOPs are counted as ``torch.utils.flop_counter.FlopCounterMode`` counts them (what ``vs_trl.py`` measures): 2
per multiply-add of every matmul and convolution, attention (sdpa) as the full q × k score and value products
(no causal discount), backward = 2 × forward for a layer whose weight is trained (input and weight gradients), 1 ×
for a frozen one, only the weight gradient for the first layer (patch embedding); element-wise work is not counted.

Memory (bytes, the model's dtype, fp32 by default) is the working set of the step: weights, gradients and AdamW's
two moments of the trained parameters, the activations the training forward keeps for the backward, the decoding
KV cache, and the lm_head's logits where they are materialised. Activations per token and decoder layer follow
the tensors a Qwen2 layer saves (Korthikanti et al. 2022, arXiv 2205.05198, §4 count them for GPT): 8·H + 3·kv +
4·I values (norm inputs and outputs, q/k/v before and after rope, attention output, the SwiGLU's gate, up, product
and activation); a vision block 9·h_v + 4·i_v per patch. With gradient checkpointing only each layer's input is
kept (H per token and layer) plus one layer's activations during its recomputation. The peak is the larger of the
rollout's (weights + optimizer state + KV cache + sampling logits) and the update's (weights + gradients + optimizer
state + activations + logits; mmgrpo's tied-head gradient is not held with the activations). It is a model of the
algorithms, not of the allocator: ``--validate`` states how far it is from the measured peak RSS.

Configurations are those of the released checkpoints' ``config.json`` (Qwen/Qwen2.5-VL-3B-Instruct: hidden 2048,
36 layers, intermediate 11008, 16 heads / 2 KV heads, vocabulary 151,936, tied; Qwen/Qwen2.5-VL-7B-Instruct:
hidden 3584, 28 layers, intermediate 18944, 28 heads / 4 KV heads, vocabulary 152,064, untied; both: a 32-block
ViT of hidden size 1280, MLP 3420, 16 heads, 14-pixel patches, 2×2 merge, window 112 pixels, full attention in
blocks 7, 15, 23, 31 — the depth, MLP size, heads, patch, merge, window and full-attention blocks are also
transformers' ``Qwen2_5_VLVisionConfig`` defaults).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

BYTES = 4  # fp32


@dataclass(frozen=True)
class TextConfig:
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = True

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        """Matmul weights of one decoder layer: q, o [H, H]; k, v [kv, H]; gate, up, down (SwiGLU)."""
        H = self.hidden
        return 2 * H * H + 2 * H * self.kv_dim + 3 * H * self.intermediate

    @property
    def params(self) -> int:
        """Matmul weights + embedding (+ an untied lm_head); norms and biases are negligible and left out."""
        embed = self.vocab * self.hidden
        return self.layers * self.layer_params + embed * (1 if self.tied else 2)


@dataclass(frozen=True)
class VisionConfig:
    hidden: int
    depth: int
    intermediate: int
    heads: int
    patch: int = 14
    merge: int = 2
    temporal_patch: int = 2
    window: int = 112  # pixels: window attention over (window / patch)² patches
    full_blocks: int = 4  # blocks with full attention over the image

    def block_params(self) -> int:
        h = self.hidden
        return 4 * h * h + 3 * h * self.intermediate  # qkv, proj, SwiGLU MLP

    def params(self, text_hidden: int) -> int:
        m2 = self.merge**2
        embed = 3 * self.temporal_patch * self.patch**2 * self.hidden
        merger = (m2 * self.hidden) ** 2 + m2 * self.hidden * text_hidden
        return self.depth * self.block_params() + embed + merger


@dataclass(frozen=True)
class ModelConfig:
    name: str
    text: TextConfig
    vision: VisionConfig


QWEN25_VL_VISION = VisionConfig(hidden=1280, depth=32, intermediate=3420, heads=16)
QWEN25_VL_3B = ModelConfig(
    "Qwen2.5-VL-3B", TextConfig(2048, 36, 11008, 16, 2, 151_936, tied=True), QWEN25_VL_VISION
)  # fmt: skip
QWEN25_VL_7B = ModelConfig(
    "Qwen2.5-VL-7B", TextConfig(3584, 28, 18944, 28, 4, 152_064, tied=False), QWEN25_VL_VISION
)  # fmt: skip


# ------------------------------------------------------------------------------------------- per token


def per_token_flops(model: ModelConfig) -> dict[str, float]:
    """Forward matmul FLOPs of one token through each part (attention scores, which grow with the context, left
    out): ``decoder`` for a text position, ``lm_head`` for a scored position, ``vision`` for one image token
    (merge² patches through the ViT, the patch embedding and the merger)."""
    t, v = model.text, model.vision
    m2 = v.merge**2
    per_patch = v.depth * v.block_params() + 3 * v.temporal_patch * v.patch**2 * v.hidden
    merger = (m2 * v.hidden) ** 2 + m2 * v.hidden * t.hidden
    return {
        "lm_head": 2.0 * t.hidden * t.vocab,
        "decoder": 2.0 * t.layers * t.layer_params,
        "vision": 2.0 * (m2 * per_patch + merger),
    }


def flop_mix(model: ModelConfig) -> dict[str, float]:
    """Shares of :func:`per_token_flops` (they sum to 1)."""
    f = per_token_flops(model)
    total = sum(f.values())
    return {k: v / total for k, v in f.items()}


# ------------------------------------------------------------------------------------------------ step


@dataclass(frozen=True)
class Workload:
    """One step. ``image_tokens`` of the ``prompt_tokens`` are one image's merged tokens (I); ``minibatch`` rows
    per backward (B = all rows by default); ``trl_head``: compact (TRL's GPU rule) | all (its CPU rule)."""

    prompt_tokens: int
    image_tokens: int
    completion_tokens: int
    group_size: int = 8
    prompts: int = 4
    minibatch: int = 0
    lora_params: int = 0  # 0: full fine-tuning; else the LoRA parameters trained (the rest frozen)
    checkpointing: bool = False
    old_logprobs: bool = True  # mmgrpo's default old_logprobs: recompute (TRL skips it at μ = 1)
    trl_head: str = "compact"

    @property
    def rows(self) -> int:
        return self.prompts * self.group_size


def _attention(model_layers: int, hidden: int, queries: float, keys: float) -> float:
    """Score and value products of ``queries`` × ``keys`` over every layer (full rectangle)."""
    return 4.0 * model_layers * queries * keys * hidden


def _vision_forward(v: VisionConfig, text_hidden: int, image_tokens: int, attention: bool = True) -> float:
    """One image of I merged tokens through the ViT (linear layers, window and full attention) and the merger."""
    m2 = v.merge**2
    patches = m2 * image_tokens
    window = min(patches, (v.window // v.patch) ** 2)
    linear = 2.0 * patches * (v.depth * v.block_params() + 3 * v.temporal_patch * v.patch**2 * v.hidden)
    attn = attention * 4.0 * v.hidden * patches * (v.full_blocks * patches + (v.depth - v.full_blocks) * window)
    merger = 2.0 * image_tokens * ((m2 * v.hidden) ** 2 + m2 * v.hidden * text_hidden)
    return linear + attn + merger


def _vision_backward(v: VisionConfig, text_hidden: int, image_tokens: int, trained: bool, attention: bool) -> float:
    """2× forward when trained (1× when frozen: input gradients only), minus the patch embedding's input grad."""
    fwd = _vision_forward(v, text_hidden, image_tokens, attention)
    embed = 2.0 * v.merge**2 * image_tokens * 3 * v.temporal_patch * v.patch**2 * v.hidden
    return (2.0 if trained else 1.0) * fwd - embed


def step_flops(model: ModelConfig, w: Workload, toolkit: str, attention: bool = True) -> dict[str, float]:
    """FLOPs of one step by phase, for ``toolkit`` in mmgrpo | trl. See the module docstring for the algorithms.

    ``attention=False`` leaves the attention score and value products out, as ``FlopCounterMode`` does on CPU:
    it has no formula for ``aten._scaled_dot_product_flash_attention_for_cpu`` (nor its backward), the kernel SDPA
    runs there (torch/utils/flop_counter.py registers the CUDA kernels only)."""
    t, v = model.text, model.vision
    att = _attention if attention else (lambda *args: 0.0)
    L, I, T, P, B = w.prompt_tokens, w.image_tokens, w.completion_tokens, w.prompts, w.rows
    d, lm = 2.0 * t.layers * t.layer_params, 2.0 * t.hidden * t.vocab
    vision = _vision_forward(v, t.hidden, I, attention)
    trained = w.lora_params == 0
    bwd = 2.0 if trained else 1.0  # input + weight gradients, or input gradients only (LoRA's are negligible)
    # decoding: T − 1 steps of B rows after the prefill, query 1 against L + t + 1 keys
    decode = B * (T - 1) * (d + lm) + sum(att(t.layers, t.hidden, B, L + s + 1) for s in range(T - 1))
    if toolkit == "trl":
        rollout = B * vision + B * L * d + att(t.layers, t.hidden, B * L, L) + B * lm + decode
        S = L + T
        scored = B * T if w.trl_head == "compact" else B * S
        body = B * vision + B * S * d + att(t.layers, t.hidden, B * S, S)
        head = scored * lm
        out = {"rollout": rollout, "old_logprobs": 0.0, "forward": body + head}
        out["backward"] = (
            bwd * (body - B * vision) + B * _vision_backward(v, t.hidden, I, trained, attention) + bwd * head
        )
    elif toolkit == "mmgrpo":
        rollout = P * vision + P * L * d + att(t.layers, t.hidden, P * L, L) + P * lm + decode
        body = P * vision + (P * L + B * (T - 1)) * d
        body += att(t.layers, t.hidden, P * L, L) + att(t.layers, t.hidden, B * (T - 1), L + T - 1)
        head = B * T * lm  # the fused log-prob: forward once, its backward recomputes the logits (+1)
        late = 1.0 if _late_head_gradient(model, w) else 0.0  # a tied head's weight gradient recomputes them again
        out = {"rollout": rollout, "old_logprobs": (body + head) if w.old_logprobs else 0.0, "forward": body + head}
        out["backward"] = (
            bwd * (body - P * vision)
            + P * _vision_backward(v, t.hidden, I, trained, attention)
            + (1 + bwd + late) * head
        )
    else:
        raise ValueError(f"toolkit: {toolkit!r} not allowed; choose mmgrpo | trl")
    if w.checkpointing:  # the recomputed forward of every checkpointed layer (decoder and vision blocks)
        out["recompute"] = body
    out["total"] = sum(out.values())
    return out


def _activations(model: ModelConfig, decoder_tokens: float, patches: float, checkpointing: bool) -> float:
    """Values the training forward keeps for the backward (see the module docstring)."""
    t, v = model.text, model.vision
    per_dec = 8 * t.hidden + 3 * t.kv_dim + 4 * t.intermediate
    per_vis = 9 * v.hidden + 4 * v.intermediate
    if checkpointing:  # layer inputs, plus one layer's activations while it is recomputed
        return decoder_tokens * (t.layers * t.hidden + per_dec) + patches * (v.depth * v.hidden + per_vis)
    return decoder_tokens * t.layers * per_dec + patches * v.depth * per_vis


LATE_GRADIENT_MIN_BYTES = 32 * 2**20  # modalities/tokens/logprobs.py's threshold


def _late_head_gradient(model: ModelConfig, w: Workload) -> bool:
    """mmgrpo computes a trained tied head's weight gradient of at least ``LATE_GRADIENT_MIN_BYTES`` at the end of
    the backward (``TiedGrad``, modalities/tokens/logprobs.py): not held beside the activations, for one more pass
    over the logits."""
    t = model.text
    return t.tied and w.lora_params == 0 and t.vocab * t.hidden * BYTES >= LATE_GRADIENT_MIN_BYTES


def step_memory(model: ModelConfig, w: Workload, toolkit: str) -> dict[str, float]:
    """Peak working set of one step (bytes) by part, for ``toolkit`` in mmgrpo | trl."""
    t, v = model.text, model.vision
    L, I, T, B = w.prompt_tokens, w.image_tokens, w.completion_tokens, w.rows
    n = w.minibatch or B
    weights = t.params + v.params(t.hidden)
    trained = w.lora_params or weights
    state = {"weights": weights * BYTES, "optimizer": 2 * trained * BYTES}
    kv_cache = t.layers * 2 * t.kv_dim * B * (L + T) * BYTES  # G copies of every prompt (both toolkits)
    sampling_logits = 2 * B * t.vocab * BYTES  # a decoding step's fp32 logits and scores [B, V]
    patches = v.merge**2 * I
    if toolkit == "trl":
        acts = _activations(model, n * (L + T), n * patches, w.checkpointing)
        scored = n * (T if w.trl_head == "compact" else L + T)
        logits = min(scored, 4096) * t.vocab * BYTES * 2  # TRL's chunked fused head: a chunk of rows at a time
    elif toolkit == "mmgrpo":
        U = max(1, n // w.group_size)
        acts = _activations(model, U * L + n * (T - 1), U * patches, w.checkpointing)
        logits = 0.0  # the fused log-prob: [rows, chunk] blocks only
    else:
        raise ValueError(f"toolkit: {toolkit!r} not allowed; choose mmgrpo | trl")
    rollout = state["weights"] + state["optimizer"] + kv_cache + sampling_logits
    late = t.vocab * t.hidden if toolkit == "mmgrpo" and _late_head_gradient(model, w) else 0
    held = max(trained - late + acts, trained)  # gradients and activations held together (a late one: after them)
    update = state["weights"] + state["optimizer"] + held * BYTES + logits
    return {
        **state,
        "gradients": trained * BYTES,
        "activations": acts * BYTES,
        "logits": logits,
        "kv_cache": kv_cache,
        "peak": max(rollout, update),
    }


# ---------------------------------------------------------------------------------------------- report


def ratios(model: ModelConfig, w: Workload) -> dict[str, float]:
    """TRL / mmgrpo for FLOPs and peak memory."""
    f = {tk: step_flops(model, w, tk)["total"] for tk in ("trl", "mmgrpo")}
    m = {tk: step_memory(model, w, tk)["peak"] for tk in ("trl", "mmgrpo")}
    return {
        "flops_trl": f["trl"],
        "flops_mmgrpo": f["mmgrpo"],
        "flops_ratio": f["trl"] / f["mmgrpo"],
        "peak_trl": m["trl"],
        "peak_mmgrpo": m["mmgrpo"],
        "memory_saving": 1 - m["mmgrpo"] / m["trl"],
    }


def prediction_table(
    T: int = 256, image_fraction: float = 0.9, prompts: int = 4, group_size: int = 8, minibatch: int = 8
) -> str:
    """Predicted TRL / mmgrpo ratios for Qwen2.5-VL-3B and -7B at 2:1, 8:1 and 32:1 (full fine-tuning, fp32
    bytes, ``minibatch`` rows per backward in both); ``image_fraction`` of the prompt is the image."""
    lines = [
        f"T = {T}, G = {group_size}, P = {prompts}, minibatch {minibatch} rows, image = {image_fraction:.0%} of the "
        "prompt, full fine-tuning, fp32, TRL's GPU rule",
        "| model | L:T | L | TFLOP/step TRL / mmgrpo | FLOP ratio | peak GB TRL / mmgrpo | memory saved |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in (QWEN25_VL_3B, QWEN25_VL_7B):
        for r in (2, 8, 32):
            L = r * T
            w = Workload(L, int(image_fraction * L), T, group_size, prompts, minibatch=minibatch)
            q = ratios(model, w)
            lines.append(
                f"| {model.name} | {r}:1 | {L} | {q['flops_trl'] / 1e12:.0f} / {q['flops_mmgrpo'] / 1e12:.0f} "
                f"| {q['flops_ratio']:.2f} | {q['peak_trl'] / 1e9:.0f} / {q['peak_mmgrpo'] / 1e9:.0f} "
                f"| {q['memory_saving']:.0%} |"
            )
    return "\n".join(lines)


def validate(report_path: Path) -> str:
    """Predicted vs measured GFLOP/step and working set for every row of a ``vs_trl.json``."""
    report = json.loads(report_path.read_text())
    model = model_from_report(report)
    s = report["settings"]
    lines = [
        f"{report_path}: {model.name}",
        "| L:T | toolkit | GFLOP/step measured / predicted | error | working set MB measured / predicted | error |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["table"]:
        for tk in ("trl", "mmgrpo"):
            if tk not in row:
                continue
            w = Workload(
                row["prompt_tokens"],
                row["image_tokens"],
                row["completion_tokens"],
                s["group_size"],
                s["prompts"],
                trl_head=s["trl_fused_head"] if s["trl_fused_head"] == "compact" else "all",
            )
            f = step_flops(model, w, tk, attention=False)["total"]  # as FlopCounterMode counts on CPU
            m = step_memory(model, w, tk)["peak"]
            mf, mm = row[tk]["flops_per_step"], row[tk]["working_set_mb"] * 2**20
            lines.append(
                f"| {row['ratio']:.1f}:1 | {tk} | {mf / 1e9:.1f} / {f / 1e9:.1f} | {f / mf - 1:+.0%} "
                f"| {mm / 2**20:.0f} / {m / 2**20:.0f} | {m / mm - 1:+.0%} |"
            )
    return "\n".join(lines)


def model_from_report(report: dict) -> ModelConfig:
    """The benchmark model of a ``vs_trl.json`` (its ``model_sizes``)."""
    z = report["model_sizes"]
    vocab = z["vocab"] if isinstance(z["vocab"], int) else z.get("tokenizer_vocab", 0)
    text = TextConfig(z["text_hidden"], z["text_layers"], z["text_intermediate"], z["text_heads"],
                      z["text_kv_heads"], vocab)  # fmt: skip
    vision = VisionConfig(
        z["vision_hidden"], z["vision_depth"], z["vision_intermediate"], z["vision_heads"], window=56, full_blocks=1
    )  # fmt: skip  (build_tiny_qwen25_vl's window and full block)
    return ModelConfig(f"benchmark model ({z.get('name', 'vs_trl')})", text, vision)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--validate", nargs="*", default=[], help="vs_trl.py output directories (their vs_trl.json)")
    p.add_argument("--completion-tokens", type=int, default=256, help="T of the prediction table")
    a = p.parse_args(argv)
    for name, model in (("Qwen2.5-VL-3B", QWEN25_VL_3B), ("Qwen2.5-VL-7B", QWEN25_VL_7B)):
        mix = flop_mix(model)
        print(f"{name}: per-token FLOP mix " + ", ".join(f"{k} {v:.1%}" for k, v in mix.items()))
    print(prediction_table(T=a.completion_tokens))
    for d in a.validate:
        print(validate(Path(d) / "vs_trl.json"))
    return 0


__all__ = ["ModelConfig", "TextConfig", "VisionConfig", "Workload", "flop_mix", "per_token_flops", "replace"]

if __name__ == "__main__":
    sys.exit(main())
