"""Decode tokens/s of the compiled static-cache step against the eager loop (issue 52 item 1), side by side.

    OMP_NUM_THREADS=1 python benchmarks/compiled_decode.py --repeats 5 --out runs/compiled_decode.json

One process; per model, the VLM adapter's KV-expanded sampler on P = 2 prompts × G = 8 rows, T new tokens each
(``min_new_tokens = T``: every row decodes T tokens), keyed noise, once with ``model.args.compile_decode`` off (the
eager loop, :class:`mmgrpo.modalities.tokens.prefix_sharing.PrefixStepper`) and once on
(:mod:`mmgrpo.modalities.tokens.compiled_decode`), alternating (the order flips every repeat). Each repeat takes the
next of three prompt pairs of different lengths, so the recompile count shows whether a new prompt length compiles
again (one compilation per 64-token bucket of L + T is expected; ``buckets`` lists them). The first compiled call
(compilation) is timed apart and not counted. Reports the median sampling time (prefill + T steps), tokens/s =
B·T / time, the ratio, the compilations and whether the keyed tokens agree. Models: the tiny Qwen2.5-VL (images)
and, when it is set up here, SmolLM2-135M-Instruct (text).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from mmgrpo import noise
from mmgrpo.modalities.tokens import compiled_decode
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

TEXT = ["What is 5 plus 7?", "Name a colour.", "Why is the sky blue? Answer briefly.", "Count to three."]


def _prompt_pairs(image: bool) -> list[list[dict]]:
    """Three pairs of prompts whose padded lengths differ (a longer question each time)."""
    if image:
        rows = ShapesTask(ShapesArgs(train_size=2, eval_size=1, image_size=56)).train_rows()[:2]
    else:
        rows = [{"prompt": p} for p in TEXT[:2]]
    pads = ["", "Please answer. ", "Please look carefully and answer in one word. "]
    return [[dict(r, prompt=pad + r["prompt"]) for r in rows] for pad in pads]


def _sample(adapter, encodings, G: int, keys, compiled: bool) -> tuple[float, torch.Tensor]:
    """Seconds of one keyed KV-expanded sampling call, and its tokens."""
    adapter.args.compile_decode = compiled
    start = time.perf_counter()
    ids, _ = adapter.sample(encodings, G, False, keys)
    return time.perf_counter() - start, ids


def measure(name: str, repeats: int, T: int, G: int) -> dict:
    """Eager vs compiled sampling of ``name`` (the module docstring)."""
    adapter = build_vlm_adapter({"name_or_path": name, "max_new_tokens": T, "min_new_tokens": T})
    adapter._unwrapped().eval()
    pairs = _prompt_pairs(adapter.is_multimodal)
    encs = [[adapter.encode_prompt(r) for r in rows] for rows in pairs]
    lengths = [adapter.collate(e)["input_ids"].shape[1] for e in encs]
    keys = noise.NoiseKeys(0, 0, (0, 1), G)
    _sample(adapter, encs[0], G, keys, False)  # warm-up of the eager path
    first, _ = _sample(adapter, encs[0], G, keys, True)  # compiles
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    same = True
    for r in range(repeats):
        e = encs[r % len(encs)]
        order = [False, True] if r % 2 == 0 else [True, False]
        out = {}
        for compiled in order:
            seconds, out[compiled] = _sample(adapter, e, G, keys, compiled)
            times["compiled" if compiled else "eager"].append(seconds)
        same = same and torch.equal(out[False], out[True])
    tokens = 2 * G * T
    eager, comp = statistics.median(times["eager"]), statistics.median(times["compiled"])
    return {
        "model": name,
        "rows": 2 * G,
        "new_tokens": T,
        "prompt_lengths": lengths,
        "eager_s": round(eager, 4),
        "compiled_s": round(comp, 4),
        "eager_tok_s": round(tokens / eager, 1),
        "compiled_tok_s": round(tokens / comp, 1),
        "speedup": round(eager / comp, 3),
        "first_compiled_call_s": round(first, 2),
        "buckets": sorted({compiled_decode.bucket_length(n + T) for n in lengths}),
        "compilations": adapter.compiled.compilations,
        "same_tokens": same,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--models", nargs="+", default=["tiny-qwen2.5-vl", "smollm2-135m-instruct"])
    p.add_argument("--out", default="runs/compiled_decode.json")
    a = p.parse_args()
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, compiler: "
        f"{compiled_decode.compiler_problem(torch.device('cpu')) or 'ok'}"
    )
    results = []
    for name in a.models:
        try:
            results.append(measure(name, a.repeats, a.new_tokens, a.group))
        except Exception as err:  # a real model not set up here: say so, measure the others
            print(f"{name}: skipped ({type(err).__name__}: {str(err).splitlines()[0]})")
            continue
        print(json.dumps(results[-1]))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
