"""The training forward + backward in three layouts, side by side, with each one's matmul FLOP rate (issue 52, 2).

    OMP_NUM_THREADS=1 python benchmarks/training_forward.py --shape smollm2 --repeats 4

One process, the layouts alternating every repeat (the first repeat is a warm-up and is not counted), on a
``LlamaForCausalLM`` built from config with random weights (the timing does not depend on the weights) of the shape
of ``--shape``: ``llama`` is vs_trl.py's benchmark Llama (``bench_archs.BENCH_TEXT``, SmolLM2-135M's FLOP mix),
``smollm2`` SmolLM2-135M-Instruct's own sizes (hidden 576, 30 layers, MLP 1536, 9 / 3 heads, V = 49,152). U prompts of
L tokens, G completions of T tokens each; each layout computes the completion tokens' log-probabilities, sums them and
runs the backward:

- ``repeated``: every row is [prompt ; completion], the prompt repeated G times (the layout of TRL's ``GRPOTrainer``
  and of mmgrpo's naive path), scoring the last T + 1 positions only (TRL's rule for the lm_head on a GPU);
- ``cache``: mmgrpo's split-attention forward (``prefix_sharing.completion_logits``): the U prompts once, then the
  completions continuing their prompt's KV cache;
- ``packed``: the same attention pattern in one cache-free forward, each prompt and its completions packed into one
  row with a block mask (``prefix_sharing.packed_completion_logits``, the gradient-checkpointing path).

It prints each layout's median seconds, the matmul FLOPs and the matmul kernels' own rate (``torch.profiler`` with
``with_flops`` over one extra step of each: FLOPs of ``aten::mm``/``addmm``/``bmm`` over their self CPU time), and the
largest difference of the three layouts' log-probabilities.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import matmul_rate

from mmgrpo.modalities.tokens import prefix_sharing

SHAPES = {
    "llama": dict(hidden_size=192, num_hidden_layers=4, intermediate_size=512, num_attention_heads=6,
                  num_key_value_heads=2, vocab_size=2192),
    "smollm2": dict(hidden_size=576, num_hidden_layers=30, intermediate_size=1536, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152),
}  # fmt: skip


def build(shape: str, seed: int) -> torch.nn.Module:
    """A ``LlamaForCausalLM`` of ``SHAPES[shape]`` (tied embeddings, sdpa), random weights of ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**SHAPES[shape], tie_word_embeddings=True, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def layouts(model: torch.nn.Module, U: int, G: int, L: int, T: int, seed: int) -> dict:
    """The three layouts as functions returning the completion log-probs [U·G, T] (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    prompts = torch.randint(5, V, (U, L), generator=gen)  # [U, L]
    completions = torch.randint(5, V, (U * G, T), generator=gen)  # [n, T]
    rows = torch.arange(U).repeat_interleave(G)  # [n]
    batch = {"input_ids": prompts, "attention_mask": torch.ones(U, L, dtype=torch.long)}
    ones = torch.ones(U * G, T, dtype=torch.long)

    def logprobs(logits: torch.Tensor) -> torch.Tensor:  # [n, T, V] → [n, T]
        return torch.log_softmax(logits.float(), -1).gather(-1, completions[..., None]).squeeze(-1)

    def repeated() -> torch.Tensor:
        full = torch.cat([prompts[rows], completions], dim=1)  # [n, L + T]
        logits = model(input_ids=full, attention_mask=torch.ones_like(full), logits_to_keep=T + 1).logits
        return logprobs(logits[:, :-1])

    return {
        "repeated": repeated,
        "cache": lambda: logprobs(prefix_sharing.completion_logits(model, batch, rows, completions, ones)),
        "packed": lambda: logprobs(prefix_sharing.packed_completion_logits(model, batch, rows, completions, ones)),
    }


def step(model: torch.nn.Module, fn) -> float:
    """Seconds of one forward + backward of ``fn``'s summed log-probs."""
    start = time.perf_counter()
    fn().sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama")
    p.add_argument("--prompts", type=int, default=4, help="U")
    p.add_argument("--group-size", type=int, default=8, help="G")
    p.add_argument("--prompt-tokens", type=int, default=127, help="L (vs_trl.py's 8:1 with T = 16)")
    p.add_argument("--completion-tokens", type=int, default=16, help="T")
    p.add_argument("--repeats", type=int, default=4, help="alternating repeats (the first one not counted)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="also write the results as JSON here")
    a = p.parse_args(argv)
    model = build(a.shape, a.seed)
    fns = layouts(model, a.prompts, a.group_size, a.prompt_tokens, a.completion_tokens, a.seed)
    with torch.no_grad():
        values = {k: f() for k, f in fns.items()}
    spread = max((values[k] - values["repeated"]).abs().max().item() for k in values)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for rep in range(a.repeats):
        for k in list(fns) if rep % 2 == 0 else list(fns)[::-1]:
            times[k].append(step(model, fns[k]))
    result = {"settings": vars(a), "max_abs_logprob_difference": spread, "layouts": {}}
    for k, f in fns.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as prof:
            step(model, f)
        rate = matmul_rate(prof.key_averages())
        result["layouts"][k] = {"median_s": statistics.median(times[k][1:] or times[k]), "matmul": rate}
    base = result["layouts"]["repeated"]
    print(f"{a.shape}: U = {a.prompts}, G = {a.group_size}, L = {a.prompt_tokens}, T = {a.completion_tokens}; "
          f"max |Δ log-prob| {spread:.1e}")  # fmt: skip
    for k, r in result["layouts"].items():
        mm = r["matmul"]
        print(
            f"  {k:9s} {r['median_s']:7.3f} s ({base['median_s'] / r['median_s']:.2f}x repeated)  matmuls "
            f"{mm['gflop']:7.1f} GFLOP in {mm['self_s']:6.2f} s = {mm['gflop_per_s']:5.1f} GFLOP/s"
        )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
