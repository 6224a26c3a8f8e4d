"""mmgrpo vs TRL's GRPOTrainer, side by side, on the same tiny-but-not-trivial Qwen2.5-VL.

    python benchmarks/vs_trl.py --out runs/bench

What is compared. One GRPO training step of each toolkit — sample G completions for each of P prompts, score
them, compute advantages, one forward/backward over the B = P·G samples, one AdamW step — on the same model
directory (built here by ``build_tiny_qwen25_vl`` with the sizes below), the same synthetic ``shapes`` rows, the
same chat template and processor, fp32, SDPA attention, no vLLM, gradient checkpointing off in both, G = 8,
μ = 1 (``num_iterations=1`` / ``epochs=1``), β = 0, one optimizer step per generation batch
(TRL ``per_device_train_batch_size = P·G``, ``num_generations = G``; mmgrpo ``prompts_per_step = P``,
``minibatch_size = P·G``), temperature 1, no top-k/top-p, the same suppressed media tokens, and fixed-length
completions (``min_new_tokens = max_new_tokens = T``, so both do identical sampling work). TRL skips the old-log-prob
forward when μ = 1; mmgrpo runs with its defaults (``old_logprobs: recompute``, i.e. one extra no-grad log-prob
forward), so the comparison does not favour mmgrpo there.

The prefix:completion ratio L/T is swept by the image side (Qwen2.5-VL gives (side/28)² image tokens); L is the
prompt length both toolkits actually feed (checked equal in every run).

How it is measured. A driver launches one subprocess per (toolkit, ratio, repeat), alternating which toolkit runs
first, so both see the same machine load. Each subprocess imports the same libraries (torch, transformers, trl,
datasets, mmgrpo) before loading anything, so import overhead does not differ; it runs ``--warmup`` untimed steps,
then ``--steps`` timed ones, then (first repeat only) one more under ``torch.utils.flop_counter.FlopCounterMode``
to count the FLOPs of a step. It reports per step: ``step`` (wall time of the whole optimizer step), ``rollout``
(the sampling call: TRL ``_generate_single_turn``, mmgrpo ``VLMAdapter._sample``) and ``logprob+update`` (step − rollout: processor,
rewards, advantages, log-prob forwards, backward, optimizer), plus peak resident memory (``ru_maxrss``, before the
FLOP-counting step; ``working set`` = that peak minus the RSS after imports). A plain fp32 matmul benchmark runs in
its own subprocess after every pair of runs, and achieved FLOP/s (FLOPs counted in the first repeat / median step
time) is reported as a fraction of its median. Ratios are TRL / mmgrpo per repeat; the table
gives their median over repeats. Writes ``vs_trl.json`` and ``vs_trl.png`` under ``--out`` and prints one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Sizes of the benchmark model: the real Qwen2.5-VL architecture, small enough for a 2-core CPU, large enough that
# matmuls (not Python overhead) dominate a step.
MODEL_SIZES = dict(
    text_hidden=128,
    text_layers=4,
    text_heads=4,
    text_kv_heads=2,
    text_intermediate=512,
    vision_hidden=64,
    vision_depth=4,
    vision_heads=2,
    vision_intermediate=256,
)
MROPE_SECTION = [4, 6, 6]  # head_dim 32 → 16 rotary frequencies split over (t, h, w)
QUESTIONS = ["colour", "shape"]


@dataclass
class RunSpec:
    """One worker run (one toolkit, one prompt length)."""

    toolkit: str  # trl | mmgrpo | mmgrpo_naive
    model_dir: str
    image_size: int
    completion_tokens: int
    prompts: int
    group_size: int
    warmup: int
    steps: int
    threads: int
    seed: int
    result: str
    flops: bool = True
    mmgrpo_args: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ model


def build_model(directory: Path, seed: int) -> Path:
    """The benchmark model: ``build_tiny_qwen25_vl`` with MODEL_SIZES, mRoPE sections for head_dim 64, and a
    processor that keeps images up to 1024 merged tokens (the tiny default caps them at 112×112 pixels)."""
    from transformers import AutoProcessor

    from mmgrpo.modalities.vlm.tiny import TinySizes, build_tiny_qwen25_vl

    if (directory / "config.json").is_file():
        return directory
    tmp = directory.with_name(directory.name + ".build")
    build_tiny_qwen25_vl(tmp, seed=seed, sizes=TinySizes(**MODEL_SIZES))
    config = json.loads((tmp / "config.json").read_text())
    for node in (config, config.get("text_config", {})):
        rope = node.get("rope_parameters") or node.get("rope_scaling")
        if isinstance(rope, dict) and "mrope_section" in rope:
            rope["mrope_section"] = MROPE_SECTION
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    processor = AutoProcessor.from_pretrained(tmp)
    ip = processor.image_processor
    ip.min_pixels, ip.max_pixels = 28 * 28, 1024 * 28 * 28
    if isinstance(getattr(ip, "size", None), dict):
        ip.size = {"shortest_edge": ip.min_pixels, "longest_edge": ip.max_pixels}
    processor.save_pretrained(tmp)
    os.replace(tmp, directory)
    return directory


def prompt_length(model_dir: Path, image_size: int) -> int:
    """Tokens of the longest benchmark prompt at this image size (as both toolkits encode it)."""
    from transformers import AutoProcessor

    from mmgrpo.tasks.shapes import QUESTIONS as TEXT
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    processor = AutoProcessor.from_pretrained(model_dir)
    row = ShapesTask(ShapesArgs(questions=QUESTIONS, image_size=image_size, train_size=1, eval_size=1)).train_rows()[0]
    lengths = []
    for q in QUESTIONS:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": TEXT[q]}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        lengths.append(processor(text=[text], images=[row["image"]], return_tensors="pt")["input_ids"].shape[1])
    return max(lengths)


def image_side_for(model_dir: Path, ratio: float, completion_tokens: int) -> tuple[int, int]:
    """Image side (a multiple of 28) whose prompt length L is closest to ``ratio · T``; returns (side, L)."""
    text_only = prompt_length(model_dir, 28) - 1  # one merged image token at 28×28
    k = max(1, round(math.sqrt(max(1.0, ratio * completion_tokens - text_only))))
    side = 28 * k
    return side, prompt_length(model_dir, side)


# ----------------------------------------------------------------------------------------------- worker


def _rows(spec: RunSpec) -> list[dict]:
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    n = max(16, 4 * spec.prompts * (spec.warmup + spec.steps + 1))
    task = ShapesTask(ShapesArgs(questions=QUESTIONS, image_size=spec.image_size, train_size=n, eval_size=1))
    return task.train_rows()


def bench_reward(completions, **kwargs) -> list[float]:
    """Fraction of letters in the completion text: cheap, varies across a group, identical for both toolkits."""
    from mmgrpo.rewards.parsing import completion_text

    texts = [completion_text(c) for c in completions]
    return [sum(ch.isalpha() for ch in t) / max(1, len(t)) for t in texts]


def _suppressed_ids(tokenizer) -> list[int]:
    vocab = tokenizer.get_vocab()
    media = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    return sorted(vocab[t] for t in media if t in vocab)


class _Clock:
    """Per-step wall times: ``step`` and the time spent inside the wrapped sampling call."""

    def __init__(self):
        self.step: list[float] = []
        self.rollout: list[float] = []
        self._t0 = 0.0
        self._in_rollout = 0.0

    def begin(self) -> None:
        self._t0, self._in_rollout = time.perf_counter(), 0.0

    def end(self) -> None:
        self.step.append(time.perf_counter() - self._t0)
        self.rollout.append(self._in_rollout)

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._in_rollout += time.perf_counter() - t

        return timed


def _run_trl(spec: RunSpec, clock: _Clock, flop_box: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    B, T = spec.prompts * spec.group_size, spec.completion_tokens
    model = AutoModelForImageTextToText.from_pretrained(spec.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    processor = AutoProcessor.from_pretrained(spec.model_dir, padding_side="left")
    from mmgrpo.tasks.shapes import QUESTIONS as TEXT

    rows = [
        {
            "prompt": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": TEXT[r["question_type"]]}]}
            ],
            "image": r["image"],
            "answer": r["answer"],
        }
        for r in _rows(spec)
    ]
    total = spec.warmup + spec.steps + (1 if spec.flops else 0)
    args = GRPOConfig(
        output_dir=str(Path(spec.result).parent / f"trl_out_{os.getpid()}"),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=1,
        num_generations=spec.group_size,
        max_completion_length=T,
        num_iterations=1,
        beta=0.0,
        learning_rate=1e-5,
        max_grad_norm=1.0,
        epsilon=0.2,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        generation_kwargs={"min_new_tokens": T, "suppress_tokens": _suppressed_ids(processor.tokenizer)},
        max_steps=total,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        bf16=False,
        fp16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        disable_tqdm=True,
        seed=spec.seed,
        log_completions=False,
    )
    flop_step = spec.warmup + spec.steps if spec.flops else -1

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == flop_step:
                flop_box["rss_kb"] = _maxrss_kb()
                flop_box["mode"] = _flop_mode().__enter__()
            clock.begin()

        def on_step_end(self, args, state, control, **kw):
            clock.end()
            if "mode" in flop_box and state.global_step == flop_step + 1:
                mode = flop_box.pop("mode")
                mode.__exit__(None, None, None)
                flop_box["flops"] = mode.get_total_flops()

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[bench_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=processor,
        callbacks=[Timer()],
    )
    trainer._generate_single_turn = clock.wrap(trainer._generate_single_turn)
    seen: dict = {}
    tokenize = trainer._tokenize_prompts

    def tokenize_and_record(prompts):
        out = tokenize(prompts)
        seen.setdefault("prompt_lengths", sorted({len(ids) for ids in out[0]}))
        return out

    trainer._tokenize_prompts = tokenize_and_record
    trainer.train()
    return {"prompt_lengths": seen.get("prompt_lengths")}


def _run_mmgrpo(spec: RunSpec, clock: _Clock, flop_box: dict) -> dict:
    from mmgrpo.config import TrainConfig, from_dict, validate
    from mmgrpo.rewards.registry import REWARDS, register_reward
    from mmgrpo.trainer import Trainer

    if "bench_letters" not in REWARDS:
        register_reward("bench_letters", "benchmark reward: fraction of letters")(bench_reward)
    B, T = spec.prompts * spec.group_size, spec.completion_tokens
    total = spec.warmup + spec.steps + (1 if spec.flops else 0)
    model_args = {
        "name_or_path": spec.model_dir,
        "max_new_tokens": T,
        "min_new_tokens": T,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "forward_batch_size": B,
        "max_pixels": 1024 * 28 * 28,
        **spec.mmgrpo_args,
    }
    cfg = from_dict(
        TrainConfig,
        {
            "output_dir": str(Path(spec.result).parent / f"mmgrpo_out_{os.getpid()}"),
            "seed": spec.seed,
            "steps": total,
            "model": {"adapter": "vlm", "args": model_args, "dtype": "float32"},
            "task": {
                "name": "shapes",
                "args": {
                    "questions": QUESTIONS,
                    "image_size": spec.image_size,
                    "train_size": len(_rows(spec)),
                    "eval_size": 1,
                },
            },
            "rewards": [{"name": "bench_letters"}],
            "algorithm": {
                "group_size": spec.group_size,
                "prompts_per_step": spec.prompts,
                "minibatch_size": B,
                "beta": 0.0,
                "epochs": 1,
                "clip_low": 0.2,
                "clip_high": 0.2,
            },
            "optim": {"lr": 1e-5, "max_grad_norm": 1.0},
            "eval": {"before": False, "after": False},
            "logging": {"trackers": [], "progress": False, "plot": False},
            "checkpoint": {"every": 0, "save_final": False},
        },
        "benchmark",
    )
    validate(cfg)
    trainer = Trainer(cfg)
    adapter = trainer.adapter
    seen: dict = {}
    encode = adapter._encode_prompt

    def encode_and_record(row, *a, **k):
        enc = encode(row, *a, **k)
        seen.setdefault("prompt_lengths", set()).add(int(enc["input_ids"].shape[1]))
        return enc

    adapter._encode_prompt = encode_and_record
    adapter._sample = clock.wrap(adapter._sample)
    for step in range(total):
        counting = step == total - 1 and spec.flops
        if counting:
            flop_box["rss_kb"] = _maxrss_kb()
            mode = _flop_mode().__enter__()
        clock.begin()
        trainer.train_step(step)
        clock.end()
        if counting:
            mode.__exit__(None, None, None)
            flop_box["flops"] = mode.get_total_flops()
    return {"prompt_lengths": sorted(seen.get("prompt_lengths", []))}


def _flop_mode():
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


def _maxrss_kb() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


T_START = time.perf_counter()


def worker(spec: RunSpec) -> None:
    import datasets  # noqa: F401  (the same imports in every worker: equal baseline memory)
    import torch
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import mmgrpo.modalities
    import mmgrpo.rewards  # noqa: F401

    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    clock, flop_box = _Clock(), {}
    rss_start = _maxrss_kb()
    if spec.toolkit == "trl":
        info = _run_trl(spec, clock, flop_box)
    else:
        info = _run_mmgrpo(spec, clock, flop_box)
    n_timed = spec.warmup + spec.steps
    steps, rollouts = clock.step[spec.warmup : n_timed], clock.rollout[spec.warmup : n_timed]
    result = {
        "spec": asdict(spec),
        "wall_s": time.perf_counter() - T_START,
        "step_s": steps,
        "rollout_s": rollouts,
        "update_s": [s - r for s, r in zip(steps, rollouts)],
        "peak_rss_mb": flop_box.get("rss_kb", _maxrss_kb()) / 1024,
        "rss_after_imports_mb": rss_start / 1024,
        "flops_per_step": flop_box.get("flops"),
        **info,
    }
    Path(spec.result).write_text(json.dumps(result, indent=1))


def matmul_worker(threads: int, result: str, n: int = 1024, reps: int = 20) -> None:
    """Plain fp32 matmul throughput with the same thread count: the ceiling the steps are compared against."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    flops_per_s = 2 * n**3 / statistics.median(times)
    Path(result).write_text(json.dumps({"flops_per_s": flops_per_s, "n": n, "threads": threads}))


# ----------------------------------------------------------------------------------------------- driver


def _launch(args: list[str], threads: int, timeout: float) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    proc = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(args[:3])} failed:\n{proc.stderr[-4000:]}")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(runs: list[dict], matmul: list[float], toolkits: list[str]) -> list[dict]:
    """One table row per ratio: medians per toolkit and median-over-repeats TRL/mmgrpo ratios."""
    peak = _median(matmul)
    table = []
    for key in sorted({r["key"] for r in runs}, key=lambda k: k[1]):
        by = {tk: [r for r in runs if r["key"] == key and r["spec"]["toolkit"] == tk] for tk in toolkits}
        row = {"image_size": key[0], "prompt_tokens": key[1], "completion_tokens": key[2], "ratio": key[1] / key[2]}
        for tk, rs in by.items():
            step = _median([_median(r["step_s"]) for r in rs])
            flops = _median([r["flops_per_step"] for r in rs if r["flops_per_step"]])
            row[tk] = {
                "step_s": step,
                "rollout_s": _median([_median(r["rollout_s"]) for r in rs]),
                "update_s": _median([_median(r["update_s"]) for r in rs]),
                "peak_rss_mb": _median([r["peak_rss_mb"] for r in rs]),
                "working_set_mb": _median([r["peak_rss_mb"] - r["rss_after_imports_mb"] for r in rs]),
                "flops_per_step": flops,
                "flops_per_s": flops / step if step else float("nan"),
                "fraction_of_matmul": flops / step / peak if step and peak else float("nan"),
            }
        for tk in toolkits:
            if tk == "trl":
                continue
            ratios = {}
            for metric in ("step_s", "rollout_s", "update_s", "peak_rss_mb"):
                per_rep = []
                for a, b in zip(by["trl"], by[tk]):
                    x = _median(a[metric]) if isinstance(a[metric], list) else a[metric]
                    y = _median(b[metric]) if isinstance(b[metric], list) else b[metric]
                    per_rep.append(x / y)
                ratios[metric] = _median(per_rep)
            row[f"trl_over_{tk}"] = ratios
            row[f"{tk}_memory_saving"] = 1 - 1 / ratios["peak_rss_mb"]
        table.append(row)
    return table


def plot(table: list[dict], toolkits: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    x = [r["ratio"] for r in table]
    for tk in toolkits:
        if tk == "trl":
            continue
        style = "-" if tk == "mmgrpo" else ":"
        for metric, label in (
            ("step_s", "step time"),
            ("rollout_s", "rollout"),
            ("update_s", "log-prob+update"),
            ("peak_rss_mb", "peak RSS"),
        ):
            ax1.plot(x, [r[f"trl_over_{tk}"][metric] for r in table], style, marker="o", label=f"{label} ({tk})")
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.axhline(2.0, color="grey", lw=0.8, ls="--")
    ax1.set(
        xscale="log",
        xlabel="prefix : completion (L / T)",
        ylabel="TRL / mmgrpo",
        title="TRL ÷ mmgrpo (>1: mmgrpo better)",
    )
    ax1.set_xticks(x, [f"{v:.0f}:1" for v in x])
    ax1.minorticks_off()
    ax1.legend(fontsize=7)
    for tk in toolkits:
        ax2.plot(x, [r[tk]["fraction_of_matmul"] for r in table], marker="o", label=tk)
    ax2.set(
        xscale="log",
        xlabel="prefix : completion (L / T)",
        ylabel="achieved FLOP/s ÷ matmul FLOP/s",
        title="hardware efficiency (counted FLOPs / step time)",
    )
    ax2.set_xticks(x, [f"{v:.0f}:1" for v in x])
    ax2.minorticks_off()
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(table: list[dict], toolkits: list[str]) -> str:
    lines = [
        "| L:T | L | T | step TRL (s) | step mmgrpo (s) | step × | rollout × | log-prob+update × | peak RSS TRL (MB) "
        "| peak RSS mmgrpo (MB) | peak RSS saved | working set TRL / mmgrpo (MB) | GFLOP/step TRL / mmgrpo "
        "| FLOP/s ÷ matmul TRL | FLOP/s ÷ matmul mmgrpo |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        t, m, q = r["trl"], r["mmgrpo"], r["trl_over_mmgrpo"]
        lines.append(
            f"| {r['ratio']:.1f}:1 | {r['prompt_tokens']} | {r['completion_tokens']} | {t['step_s']:.2f} | {m['step_s']:.2f} "
            f"| {q['step_s']:.2f} | {q['rollout_s']:.2f} | {q['update_s']:.2f} | {t['peak_rss_mb']:.0f} "
            f"| {m['peak_rss_mb']:.0f} | {r['mmgrpo_memory_saving']:.0%} | {t['working_set_mb']:.0f} / {m['working_set_mb']:.0f} "
            f"| {t['flops_per_step'] / 1e9:.1f} / {m['flops_per_step'] / 1e9:.1f} | {t['fraction_of_matmul']:.3f} "
            f"| {m['fraction_of_matmul']:.3f} |"
        )
    if "mmgrpo_naive" in toolkits:
        lines += ["", "| L:T | step × (TRL / mmgrpo naive path) | peak RSS × |", "|---|---|---|"]
        for r in table:
            q = r["trl_over_mmgrpo_naive"]
            lines.append(f"| {r['ratio']:.1f}:1 | {q['step_s']:.2f} | {q['peak_rss_mb']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="runs/bench", help="output directory (vs_trl.json, vs_trl.png, vs_trl.md)")
    p.add_argument("--ratios", default="2,4,8,16,32", help="target prefix:completion ratios L/T")
    p.add_argument("--completion-tokens", type=int, default=16, help="T (fixed: min_new_tokens = max_new_tokens)")
    p.add_argument("--prompts", type=int, default=4, help="P prompts per step (batch B = P·G)")
    p.add_argument("--group-size", type=int, default=8, help="G")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--repeats", type=int, default=3, help="alternating TRL/mmgrpo runs per ratio")
    p.add_argument("--threads", type=int, default=1, help="torch threads in every worker (1: robust on a shared CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--naive", action="store_true", help="also run mmgrpo with prefix_sharing/kv_expand_rollout off")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per worker run")
    p.add_argument("--replot", action="store_true", help="only redraw vs_trl.png/.md from --out/vs_trl.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker == "run":
        worker(RunSpec(**json.loads(a.spec)))
        return 0
    if a.worker == "matmul":
        spec = json.loads(a.spec)
        matmul_worker(spec["threads"], spec["result"])
        return 0

    out = Path(a.out)
    if a.replot:
        report = json.loads((out / "vs_trl.json").read_text())
        toolkits = ["trl", "mmgrpo"] + (["mmgrpo_naive"] if "trl_over_mmgrpo_naive" in report["table"][0] else [])
        (out / "vs_trl.md").write_text(markdown(report["table"], toolkits) + "\n")
        plot(report["table"], toolkits, out / "vs_trl.png")
        return 0
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    model_dir = build_model(out / "model", a.seed)
    toolkits = ["trl", "mmgrpo"] + (["mmgrpo_naive"] if a.naive else [])
    T = a.completion_tokens
    points = [image_side_for(model_dir, float(r), T) for r in a.ratios.split(",")]
    t_start = time.perf_counter()
    runs, matmul = [], []
    for rep in range(a.repeats):
        for i, (side, L) in enumerate(points):
            order = toolkits if (rep + i) % 2 == 0 else toolkits[::-1]
            for tk in order:
                result = raw / f"{tk}_side{side}_rep{rep}.json"
                spec = RunSpec(
                    toolkit=tk,
                    model_dir=str(model_dir),
                    image_size=side,
                    completion_tokens=T,
                    prompts=a.prompts,
                    group_size=a.group_size,
                    warmup=a.warmup,
                    steps=a.steps,
                    threads=a.threads,
                    seed=a.seed + rep,
                    result=str(result),
                    flops=rep == 0,
                    mmgrpo_args={"prefix_sharing": False, "kv_expand_rollout": False} if tk == "mmgrpo_naive" else {},
                )
                _launch(["--worker", "run", "--spec", json.dumps(asdict(spec))], a.threads, a.timeout)
                r = json.loads(result.read_text())
                r["key"] = (side, L, T)
                if r.get("prompt_lengths") and max(r["prompt_lengths"]) != L:
                    raise RuntimeError(f"{tk} fed prompts of {r['prompt_lengths']} tokens, expected max {L}")
                runs.append(r)
                print(
                    f"[rep {rep}] {tk:13s} L:T={L}/{T} step {_median(r['step_s']):.2f}s "
                    f"rollout {_median(r['rollout_s']):.2f}s peak {r['peak_rss_mb']:.0f}MB",
                    flush=True,
                )
            mm = raw / f"matmul_rep{rep}_{i}.json"
            mm_spec = json.dumps({"threads": a.threads, "result": str(mm)})
            _launch(["--worker", "matmul", "--spec", mm_spec], a.threads, 600)
            matmul.append(json.loads(mm.read_text())["flops_per_s"])
    for r in runs:
        r["key"] = tuple(r["key"])
    table = summarize(runs, matmul, toolkits)
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": vars(a),
        "model_sizes": MODEL_SIZES,
        "environment": _environment(a.threads),
        "matmul_flops_per_s": matmul,
        "table": table,
        "runs": [dict(r.items()) for r in runs],
        "wall_s": time.perf_counter() - t_start,
    }
    (out / "vs_trl.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "vs_trl.md").write_text(markdown(table, toolkits) + "\n")
    plot(table, toolkits, out / "vs_trl.png")
    at8 = min((r for r in table if r["ratio"] >= 7.5), key=lambda r: r["ratio"], default=table[-1])
    q = at8["trl_over_mmgrpo"]
    span = [r["trl_over_mmgrpo"]["step_s"] for r in table]
    print(
        f"vs_trl: at {at8['ratio']:.1f}:1 mmgrpo's step is {q['step_s']:.2f}x faster than TRL's (rollout {q['rollout_s']:.2f}x, "
        f"log-prob+update {q['update_s']:.2f}x), peak RSS {at8['mmgrpo_memory_saving']:.0%} lower; step speed-up "
        f"{min(span):.2f}x..{max(span):.2f}x over {table[0]['ratio']:.0f}:1..{table[-1]['ratio']:.0f}:1; "
        f"{out / 'vs_trl.json'}"
    )
    return 0


def _environment(threads: int) -> dict:
    import torch
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": threads,
    }


if __name__ == "__main__":
    sys.exit(main())
