"""Decode tokens/s of the compiled static-cache step against the eager loop (issue 52 item 1), side by side.

    OMP_NUM_THREADS=1 python benchmarks/compiled_decode.py --repeats 5 --out runs/compiled_decode.json

One process; per model, the VLM adapter's KV-expanded sampler on P = 2 prompts × G = 8 rows, T new tokens each
(``min_new_tokens = T``: every row decodes T tokens), keyed noise, once with ``model.args.compile_decode`` off (the
eager loop, :class:`mmgrpo.modalities.tokens.prefix_sharing.PrefixStepper`) and once on
(:mod:`mmgrpo.modalities.tokens.compiled_decode`), alternating (the order flips every repeat). Each repeat takes the
next of three prompt pairs of different lengths, so the recompile count shows whether a new prompt length compiles
again (one compilation per 64-token bucket of L + T is expected; ``buckets`` lists them). The first compiled call
(compilation) is timed apart and not counted. Reports the median sampling time (prefill + T steps), tokens/s =
B·T / time, the ratio, the compilations and whether the keyed tokens agree (per repeat, in how many of the B rows).
Models: the tiny Qwen2.5-VL (images) and, when it is set up here, SmolLM2-135M-Instruct (text); the other token
families' steps the same way: ``tiny-whisper`` (the whisper adapter, :mod:`mmgrpo.modalities.speech.compiled_step`:
three pairs of spoken-digit clips, one decoder-prompt length; end-of-text banned in both arms so every row decodes T
tokens; ``whisper-tiny.en`` the same on the real weights when scripts/setup_real_models.sh has converted them) and
``tiny-janus`` (the ar_image adapter with guidance 5, :mod:`mmgrpo.modalities.ar_image.compiled_step`: 2B CFG rows,
T fixed by the model, three prompt pairs of different lengths).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mmgrpo import noise
from mmgrpo.modalities.tokens import compiled_decode
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

_PADS = ["", "Please answer. ", "Please look carefully and answer in one word. "]
"""Prefixes that make three prompt pairs of different lengths."""
TEXT = ["What is 5 plus 7?", "Name a colour.", "Why is the sky blue? Answer briefly.", "Count to three."]


def _prompt_pairs(image: bool) -> list[list[dict]]:
    """Three pairs of prompts whose padded lengths differ (a longer question each time)."""
    if image:
        rows = ShapesTask(ShapesArgs(train_size=2, eval_size=1, image_size=56)).train_rows()[:2]
    else:
        rows = [{"prompt": p} for p in TEXT[:2]]
    return [[dict(r, prompt=pad + r["prompt"]) for r in rows] for pad in _PADS]


ARMS = ["eager", "compiled"]
"""The arms timed side by side; ``--guarded-arm`` adds ``guarded``: the compiled step with its Dynamo guards evaluated
on every call (``compiled_decode.SKIP_GUARDS = False``), against ``compiled``'s first call of each signature only."""


def _set_arm(adapter, arm: str) -> None:
    adapter.args.compile_decode = arm != "eager"
    compiled_decode.SKIP_GUARDS = arm != "guarded"


def _side_by_side(adapter, sample: Callable, inputs: list, repeats: int) -> tuple[float, dict, list[int]]:
    """Time ``sample(inputs[i])`` (seconds, tokens) in each of :data:`ARMS` (eager: ``compile_decode`` off;
    compiled: on), alternating: the first compiled call (compilation) apart, the order rotated every repeat. Returns
    the first compiled call's seconds, the times of each arm and, per repeat, how many rows drew the same tokens in
    the eager and the compiled arm."""
    for arm in ARMS:
        _set_arm(adapter, arm)
        if arm != "guarded":
            first = sample(inputs[0])[0]  # eager: warm-up; compiled: compiles
    times: dict[str, list[float]] = {k: [] for arm in ARMS for k in (arm, f"{arm}_steps")}
    same = []
    for r in range(repeats):
        out = {}
        for arm in ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]:
            _set_arm(adapter, arm)
            STEP_SECONDS.clear()
            seconds, out[arm] = sample(inputs[r % len(inputs)])
            times[arm].append(seconds)
            times[f"{arm}_steps"] += STEP_SECONDS
        a, b = out["eager"], out["compiled"]
        rows_equal = (a == b).all(-1) if a.shape == b.shape else torch.zeros(1)
        same.append(int(rows_equal.sum()))  # tokens [B, T] -> rows whose T tokens all agree
    _set_arm(adapter, "compiled")
    return first, times, same


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


STEP_SECONDS: list[float] = []
"""Seconds of each decoding step (``Stepper.step``: the model's forward over one token per row, compiled or eager)
of the sampling call being timed, the device synchronised around it: a token's time without the prefill and the
sampler's own bookkeeping."""


def _timing_steps(decode: Callable) -> Callable:
    """``decode`` (the one decode loop) with its stepper's ``step`` timed into :data:`STEP_SECONDS`."""

    def timed(stepper, *args, **kwargs):
        inner = stepper.step

        def step(tokens, t):
            _sync()
            start = time.perf_counter()
            out = inner(tokens, t)
            _sync()
            STEP_SECONDS.append(time.perf_counter() - start)
            return out

        stepper.step = step
        return decode(stepper, *args, **kwargs)

    return timed


def time_steps() -> None:
    """Time every decoding step of the token families' samplers (patches the adapters' ``decode``)."""
    from mmgrpo.modalities.ar_image import adapter as ar_image
    from mmgrpo.modalities.speech import adapter as speech
    from mmgrpo.modalities.vlm import adapter as vlm

    for module in (vlm, speech, ar_image):
        module.decode = _timing_steps(module.decode)


def _timed(fn: Callable, *args, **kwargs) -> tuple[float, torch.Tensor]:
    """Seconds of ``fn(*args, **kwargs)`` and the first tensor it returns (the drawn tokens), the device synchronised
    before and after."""
    _sync()
    start = time.perf_counter()
    tokens = fn(*args, **kwargs)[0]
    _sync()
    return time.perf_counter() - start, tokens


def copy_bandwidth(device: torch.device) -> float | None:
    """Bytes/s of a large device-to-device copy on CUDA (bytes read + written, median of 10 after 3 warm-ups); None on
    the CPU. The ceiling a decode step's weight reads are held against."""
    if device.type != "cuda":
        return None
    src = torch.randn(2**28, device=device)  # 1 GiB of fp32
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() * src.element_size() / statistics.median(times)


def _cudagraph_skips() -> int:
    """Graphs inductor has run without CUDA graphs so far in this process (the reason: the perf_hints log)."""
    return torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)


def _place(adapter, device: torch.device, dtype: torch.dtype) -> None:
    """The policy on ``device`` in ``dtype`` (eval mode)."""
    adapter._unwrapped().to(device=device, dtype=dtype).eval()


def _weights_read(adapter, row: dict, bandwidth: float | None) -> dict:
    """The decode token against the time to read the weights once (bytes of the parameters / ``bandwidth``): a decode
    step at batch ``rows`` reads every weight at least once, so this is its floor (issue 52: within 3x on a GPU)."""
    if bandwidth is None:
        return row
    weight_bytes = sum(p.numel() * p.element_size() for p in adapter._unwrapped().parameters())  # tied ones once
    read_ms = weight_bytes / bandwidth * 1e3
    best = min(row["eager_step_ms"], row["compiled_step_ms"])
    return row | {
        "weights_mb": round(weight_bytes / 2**20, 1),
        "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1),
        "weights_read_ms": round(read_ms, 4),
        "eager_token_ms": round(row["eager_s"] / row["new_tokens"] * 1e3, 3),
        "compiled_token_ms": round(row["compiled_s"] / row["new_tokens"] * 1e3, 3),
        "best_step_over_weights_read": round(best / read_ms, 2),
    }


def _row(name: str, adapter, rows: int, T: int, lengths: list[int], first: float, times: dict, same: list) -> dict:
    """The result row of one model (the module docstring)."""
    tokens = rows * T
    eager, comp = statistics.median(times["eager"]), statistics.median(times["compiled"])
    steps = {arm: statistics.median(times[f"{arm}_steps"]) * 1e3 for arm in ARMS}
    return {
        "model": name,
        "rows": rows,
        "new_tokens": T,
        "prompt_lengths": lengths,
        "eager_s": round(eager, 4),
        "compiled_s": round(comp, 4),
        "eager_tok_s": round(tokens / eager, 1),
        "compiled_tok_s": round(tokens / comp, 1),
        "speedup": round(eager / comp, 3),
        "eager_step_ms": round(steps["eager"], 3),  # one decoding step alone (STEP_SECONDS), median
        "compiled_step_ms": round(steps["compiled"], 3),
        **({"guarded_step_ms": round(steps["guarded"], 3)} if "guarded" in steps else {}),  # guards every call
        "first_compiled_call_s": round(first, 2),
        "buckets": sorted({compiled_decode.bucket_length(n + T) for n in lengths}),
        "compilations": adapter.compiled.compilations,
        "same_tokens": all(n == rows for n in same),
        "same_rows_per_repeat": same,
    }


def measure_whisper(name: str, repeats: int, T: int, G: int) -> dict:
    """Eager vs compiled sampling of the Whisper ``name`` (``tiny-whisper`` or the real ``whisper-tiny.en``) on three
    pairs of spoken-digit clips (the module docstring)."""
    from mmgrpo.modalities.speech.adapter import build_whisper_adapter
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    adapter = build_whisper_adapter({"name_or_path": name, "max_new_tokens": T, "temperature": 0.9})
    adapter._unwrapped().eval()
    adapter.suppress_ids = sorted({*adapter.suppress_ids, adapter.eos_id})  # every row decodes T tokens
    rows = SpokenDigitsTask(SpokenDigitsArgs(train_size=6, eval_size=1)).train_rows()[:6]
    caches = [adapter._audio_cache(rows[i : i + 2]) for i in (0, 2, 4)]
    keys = noise.NoiseKeys(0, 0, (0, 1), G)
    first, times, same = _side_by_side(adapter, lambda c: _timed(adapter._sample, c, G, False, keys), caches, repeats)
    return _row(name, adapter, 2 * G, T, [adapter.prefix.shape[0]], first, times, same)


def measure_ar_image(repeats: int, G: int) -> dict:
    """Eager vs compiled sampling of the tiny Janus (CFG, guidance 5) on three prompt pairs (the module docstring)."""
    from mmgrpo.modalities.ar_image.adapter import build_ar_image_adapter

    adapter = build_ar_image_adapter({"name_or_path": "tiny-janus", "guidance_scale": 5.0}, seed=0)
    adapter._unwrapped().eval()
    pairs = [[{"prompt": pad + p} for p in ("a red circle", "a blue square")] for pad in _PADS]
    ids = [[adapter._encode(r) for r in rows] for rows in pairs]
    keys = noise.NoiseKeys(0, 0, (0, 1), G)
    first, times, same = _side_by_side(adapter, lambda i: _timed(adapter._sample, i, G, False, keys=keys), ids, repeats)
    lengths = [max(len(i) for i in pair) for pair in ids]
    return _row("tiny-janus (CFG)", adapter, 2 * G, adapter.T, lengths, first, times, same)


def measure(
    name: str, repeats: int, T: int, G: int, device: torch.device, dtype: torch.dtype, bandwidth: float | None
) -> dict:
    """Eager vs compiled sampling of ``name`` (the module docstring) on ``device`` in ``dtype`` (the Whisper and Janus
    rows: the CPU in fp32 only)."""
    if name in ("tiny-whisper", "whisper-tiny.en"):
        return measure_whisper(name, repeats, T, G)
    if name == "tiny-janus":
        return measure_ar_image(repeats, G)
    adapter = build_vlm_adapter({"name_or_path": name, "max_new_tokens": T, "min_new_tokens": T})
    _place(adapter, device, dtype)
    pairs = _prompt_pairs(adapter.is_multimodal)
    encs = [[adapter.encode_prompt(r) for r in rows] for rows in pairs]
    lengths = [adapter.collate(e)["input_ids"].shape[1] for e in encs]
    keys = noise.NoiseKeys(0, 0, (0, 1), G)
    first, times, same = _side_by_side(adapter, lambda e: _timed(adapter.sample, e, G, False, keys), encs, repeats)
    return _weights_read(adapter, _row(name, adapter, 2 * G, T, lengths, first, times, same), bandwidth)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument(
        "--models", nargs="+", default=["tiny-qwen2.5-vl", "smollm2-135m-instruct", "tiny-whisper", "tiny-janus"]
    )
    p.add_argument("--out", default="runs/compiled_decode.json")
    p.add_argument("--device", default="cpu", help="cpu | cuda: the text/VLM rows' device (Whisper, Janus: the CPU)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the text/VLM rows' weights and compute")
    p.add_argument("--guarded-arm", action="store_true", help="also time the compiled step guarded on every call")
    a = p.parse_args()
    if a.guarded_arm:
        ARMS.append("guarded")
    device, dtype = torch.device(a.device), {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is false here; use --device cpu")
    bandwidth = copy_bandwidth(device)
    time_steps()
    if device.type == "cuda":
        torch._logging.set_logs(perf_hints=True)  # why a graph runs without CUDA graphs, if one does
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {device}, {a.dtype}, compiler: "
        f"{compiled_decode.compiler_problem(device) or 'ok'}"
        + (f", copy bandwidth {bandwidth / 1e9:.0f} GB/s" if bandwidth else "")
    )
    results = []
    for name in a.models:
        skips = _cudagraph_skips()
        try:
            results.append(measure(name, a.repeats, a.new_tokens, a.group, device, dtype, bandwidth))
        except Exception as err:  # a real model not set up here: say so, measure the others
            print(f"{name}: skipped ({type(err).__name__}: {str(err).splitlines()[0]})")
            continue
        results[-1]["cudagraph_skips"] = _cudagraph_skips() - skips  # this model's graphs run without CUDA graphs
        print(json.dumps(results[-1]), flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=1))  # after each model: a step cut short keeps the rest


if __name__ == "__main__":
    main()
