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
datasets, mmgrpo) before loading anything, so import overhead does not differ (``--own-imports``: only its own
toolkit's, as a user's process does); it runs ``--warmup`` untimed steps, then ``--steps`` timed ones, then (first
repeat only) one more under ``torch.utils.flop_counter.FlopCounterMode`` to count the FLOPs of a step. It reports per
step: ``step`` (wall time of the whole optimizer step), ``rollout`` (the sampling call: TRL ``_generate_single_turn``,
mmgrpo ``VLMAdapter._sample``) and ``logprob+update`` (step − rollout: processor, rewards, advantages, log-prob
forwards, backward, optimizer), plus peak resident memory (the worker's own ``VmHWM``, before the FLOP-counting step;
``working set`` = that peak minus the RSS after imports). A plain fp32 matmul benchmark runs in its own subprocess
after every pair of runs, and achieved FLOP/s (FLOPs counted in the first repeat / median step time) is reported as a
fraction of its median. Ratios are TRL / mmgrpo per repeat; the table gives their median over repeats. Writes
``vs_trl.json`` and ``vs_trl.png`` under ``--out`` and prints one line.

Options beyond the sweep. ``--vocab real`` resizes the model's tied embedding / lm_head to Qwen2.5-VL's 151,936
rows (``VOCABS``). ``--checkpointing`` adds both toolkits with gradient checkpointing on (TRL
``gradient_checkpointing=True``, mmgrpo ``model.args.gradient_checkpointing: true``). ``--trl-fused-head compact``
makes TRL's fused lm_head score only the completion positions, the rule it follows on CUDA/XPU (on CPU it scores
every position: ``add_fused_lm_head`` in huggingface/trl ``trl/trainer/utils.py``). ``--profile`` replaces the
sweep by one ``torch.profiler`` step of each toolkit at the first ratio, with ``record_function`` scopes around
the same calls in both (``PROFILE_SCOPES``), written to ``profile.json``.

Other architectures (``--arch``, ``bench_archs.py``). ``llama``: a text-only ``LlamaForCausalLM`` with
SmolLM2-135M's per-token FLOP mix; ``smollm2``: the real SmolLM2-135M-Instruct (scripts/setup_real_models.sh);
``idefics3``: SmolVLM (``Idefics3ForConditionalGeneration``, images split into tiles as SmolVLM's processor does)
with SmolVLM-256M's mix. Their rows are one JSONL file of conversational prompts that mmgrpo reads through its
``dataset`` task and TRL through ``datasets``; filler words before the shapes question set L (the image is fixed).
TRL loads them through ``AutoModelForCausalLM`` / ``AutoModelForImageTextToText``; everything else is as above.
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
# The text side's vocabulary: "small" keeps the tiny BPE tokenizer's ~600 rows; "real" resizes the (tied) embedding
# and lm_head to Qwen2.5-VL's 151,936 rows (``vocab_size`` in Qwen/Qwen2.5-VL-3B-Instruct's config.json), so the
# lm_head (19.4M parameters at hidden size 128, 20× the 4 decoder layers) and the [B, V] logits of every decoding
# step weigh as they do in the real model. The tokenizer is unchanged: ids past it decode to nothing, in both
# toolkits alike.
VOCABS = {"small": None, "real": 151_936}
# The real-FLOP-mix model (``--model real-mix``): widths, depth and vocabulary chosen so that the per-token FLOPs of
# the lm_head, the decoder and the vision encoder (``cost_model.flop_mix``: one text position through the decoder, one
# scored position through the lm_head, one image token through the ViT and merger) are within 5 points of
# Qwen2.5-VL-3B's (5.5% / 49.1% / 45.4%; its config in cost_model.QWEN25_VL_3B). The decoder keeps Qwen2.5-VL's
# proportions (MLP 5.375× the hidden size, 3:1 query to KV heads here, 8:1 there), the ViT its MLP/hidden ratio
# (3420 / 1280); the vocabulary is the tokenizer's, resized to REAL_MIX_VOCAB rows (ids past the tokenizer decode to
# nothing, in both toolkits alike).
REAL_MIX_SIZES = dict(
    text_hidden=192,
    text_layers=4,
    text_heads=6,
    text_kv_heads=2,
    text_intermediate=1024,
    vision_hidden=128,
    vision_depth=2,
    vision_heads=2,
    vision_intermediate=344,
)
REAL_MIX_VOCAB = 1600
MODELS = {"default": MODEL_SIZES, "real-mix": REAL_MIX_SIZES}


@dataclass
class RunSpec:
    """One worker run (one toolkit, one prompt length)."""

    toolkit: str  # trl | mmgrpo | mmgrpo_naive | trl_ckpt | mmgrpo_ckpt (…_ckpt: gradient checkpointing on)
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
    profile: str = ""  # a path: profile the last timed step (torch.profiler) and write a summary there
    trl_fused_head: str = "compact"  # compact (TRL's CUDA/XPU rule: score labelled rows only) | device (as on CPU)
    own_imports: bool = False  # True: the mmgrpo worker imports what mmgrpo needs only (no trl, no datasets)
    arch: str = "qwen2_5_vl"  # qwen2_5_vl | llama | idefics3 (bench_archs.py)
    data: str = ""  # llama / idefics3: the rows' JSONL file (bench_archs.write_rows), read by both toolkits


# ------------------------------------------------------------------------------------------------ model


def build_model(directory: Path, seed: int, sizes: dict | None = None) -> Path:
    """The benchmark model: ``build_tiny_qwen25_vl`` with ``sizes`` (MODEL_SIZES by default), mRoPE sections for
    head_dim 32, and a processor that keeps images up to 1024 merged tokens (the tiny default caps them at 112×112
    pixels)."""
    from transformers import AutoProcessor

    from mmgrpo.modalities.vlm.tiny import TinySizes, build_tiny_qwen25_vl

    if (directory / "config.json").is_file():
        return directory
    tmp = directory.with_name(directory.name + ".build")
    build_tiny_qwen25_vl(tmp, seed=seed, sizes=TinySizes(**(sizes or MODEL_SIZES)))
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


def resize_vocab(model_dir: Path, vocab: int) -> Path:
    """A copy of the benchmark model whose tied embedding / lm_head has ``vocab`` rows (new rows: the model's
    normal init), built once under ``<model_dir>_v<vocab>``."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    directory = model_dir.with_name(f"{model_dir.name}_v{vocab}")
    if (directory / "config.json").is_file():
        return directory
    tmp = directory.with_name(directory.name + ".build")
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.resize_token_embeddings(vocab, mean_resizing=False)
    model.save_pretrained(tmp)
    AutoProcessor.from_pretrained(model_dir).save_pretrained(tmp)
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


def _row_count(spec: RunSpec) -> int:
    return max(16, 4 * spec.prompts * (spec.warmup + spec.steps + 1))


def _rows(spec: RunSpec) -> list[dict]:
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    n = _row_count(spec)
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
    """Per-step wall times: ``step`` and the time spent inside the wrapped sampling call; optionally one step
    (``profile_step``) under ``torch.profiler``, summarised into ``profile_path``."""

    def __init__(self, profile_step: int = -1, profile_path: str = ""):
        self.step: list[float] = []
        self.rollout: list[float] = []
        self._t0 = 0.0
        self._in_rollout = 0.0
        self.profile_step, self.profile_path, self._prof = profile_step, profile_path, None

    def begin(self) -> None:
        if len(self.step) == self.profile_step:
            import torch

            self._prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_flops=True
            )
            self._prof.__enter__()
        self._t0, self._in_rollout = time.perf_counter(), 0.0

    def end(self) -> None:
        self.step.append(time.perf_counter() - self._t0)
        self.rollout.append(self._in_rollout)
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            _write_profile(self._prof, self.step[-1], self.rollout[-1], self.profile_path)
            self._prof = None

    def wrap(self, fn):
        def timed(*args, **kwargs):
            from torch.profiler import record_function

            t = time.perf_counter()
            try:
                with record_function("bench/sampling"):
                    return fn(*args, **kwargs)
            finally:
                self._in_rollout += time.perf_counter() - t

        return timed


# Regions of a step named in the profile (record_function scopes around the same calls in both toolkits).
PROFILE_SCOPES = (
    "bench/sampling",
    "bench/lm_head",
    "bench/logprob_forward",
    "bench/token_logprobs",
    "bench/backward",
    "bench/optimizer",
    "bench/processor",
)


def _scoped(fn, name: str):
    def scoped(*args, **kwargs):
        from torch.profiler import record_function

        with record_function(name):
            return fn(*args, **kwargs)

    return scoped


def _annotate_for_profile() -> None:
    """Wrap the calls both toolkits share (backward, AdamW step, the Qwen2.5-VL processor, the lm_head module) and
    each toolkit's log-prob forward in ``record_function`` scopes; called in a profiling worker only."""
    import torch
    import trl.trainer.grpo_trainer as trl_grpo
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl, processing_qwen2_5_vl

    from mmgrpo.modalities.tokens import logprobs as mm_logprobs
    from mmgrpo.modalities.vlm.adapter import VLMAdapter

    torch.autograd.backward = _scoped(torch.autograd.backward, "bench/backward")
    torch.optim.AdamW.step = _scoped(torch.optim.AdamW.step, "bench/optimizer")
    proc = processing_qwen2_5_vl.Qwen2_5_VLProcessor
    proc.__call__ = _scoped(proc.__call__, "bench/processor")
    trl_cls = trl_grpo.GRPOTrainer
    trl_cls._get_per_token_logps_and_entropies = _scoped(
        trl_cls._get_per_token_logps_and_entropies, "bench/logprob_forward"
    )
    VLMAdapter._token_logprobs = _scoped(VLMAdapter._token_logprobs, "bench/logprob_forward")
    mm_logprobs._TokenLogProbs.apply = _scoped(mm_logprobs._TokenLogProbs.apply, "bench/token_logprobs")
    linear = mm_logprobs._LinearTokenLogProbs  # the fused lm_head + log-prob (its matmuls included)
    linear.apply = _scoped(linear.apply, "bench/token_logprobs")
    cls = modeling_qwen2_5_vl.Qwen2_5_VLForConditionalGeneration
    init = cls.__init__

    def init_and_scope(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.lm_head.forward = _scoped(self.lm_head.forward, "bench/lm_head")

    cls.__init__ = init_and_scope


def _write_profile(prof, step_s: float, rollout_s: float, path: str) -> None:
    """Scope totals and the top operators (self CPU time) of one profiled step, as JSON."""
    events = prof.key_averages()
    scopes = {e.key: e.cpu_time_total / 1e6 for e in events if e.key in PROFILE_SCOPES}
    ops = sorted((e for e in events if not e.key.startswith("bench/")), key=lambda e: -e.self_cpu_time_total)
    top = [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count} for e in ops[:25]]
    by_shape = sorted(
        (e for e in prof.key_averages(group_by_input_shape=True) if not e.key.startswith("bench/")),
        key=lambda e: -e.self_cpu_time_total,
    )
    shapes = [
        {"op": e.key, "shapes": str(e.input_shapes)[:200], "self_s": e.self_cpu_time_total / 1e6, "calls": e.count}
        for e in by_shape[:25]
    ]
    out = {"step_s": step_s, "rollout_s": rollout_s, "scopes_s": scopes, "top_ops": top, "top_ops_by_shape": shapes}
    Path(path).write_text(json.dumps({**out, "matmul": matmul_rate(events)}, indent=1))


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")  # the kernels (aten::matmul dispatches here)


def matmul_rate(events) -> dict:
    """The matmul kernels' own FLOP rate in a profiled step: the FLOPs torch.profiler counts (``with_flops``) for
    the matrix-multiply operators over their self CPU time — the rate of the GEMMs themselves, with the step's other
    operators (copies, fills, softmax, the optimizer) left out, which the FLOPs-over-step-time share mixes in."""
    mm = [e for e in events if e.key in MATMUL_OPS and e.flops]
    flops = sum(e.flops for e in mm)
    seconds = sum(e.self_cpu_time_total for e in mm) / 1e6
    return {"gflop": flops / 1e9, "self_s": seconds, "gflop_per_s": flops / 1e9 / seconds if seconds else None}


def _run_trl(spec: RunSpec, clock: _Clock, flop_box: dict) -> dict:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl_side import grpo_trainer, record_prompt_ids, use_gpu_head_rule

    B, T = spec.prompts * spec.group_size, spec.completion_tokens
    if spec.trl_fused_head == "compact":
        use_gpu_head_rule()  # to see what TRL's GPU rule for its lm_head costs it here
    if spec.arch == "qwen2_5_vl":
        model = AutoModelForImageTextToText.from_pretrained(
            spec.model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
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
        suppressed = _suppressed_ids(processor.tokenizer)
    else:
        rows, model, processor, suppressed = _trl_arch(spec)
    total = spec.warmup + spec.steps + (1 if spec.flops else 0)
    config = dict(
        output_dir=str(Path(spec.result).parent / f"trl_out_{os.getpid()}"),
        per_device_train_batch_size=B,
        num_generations=spec.group_size,
        max_completion_length=T,
        num_iterations=1,
        beta=0.0,
        learning_rate=1e-5,
        max_grad_norm=1.0,
        temperature=1.0,
        generation_kwargs={"min_new_tokens": T, "suppress_tokens": suppressed},
        max_steps=total,
        logging_steps=10_000,
        use_cpu=True,
        gradient_checkpointing=spec.toolkit == "trl_ckpt",
        dataloader_pin_memory=False,
        seed=spec.seed,
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

    trainer = grpo_trainer(model, processor, bench_reward, rows, Timer(), **config)
    trainer._generate_single_turn = clock.wrap(trainer._generate_single_turn)
    seen: dict = {}
    record_prompt_ids(trainer, lambda prompts, ids: seen.setdefault("prompt_lengths", sorted({len(x) for x in ids})))
    trainer.train()
    return {"prompt_lengths": seen.get("prompt_lengths")}


def _trl_arch(spec: RunSpec) -> tuple[list[dict], object, object, list[int]]:
    """TRL's rows, model, processing class and suppressed ids for ``--arch llama | idefics3``: the rows of the
    JSONL file mmgrpo reads too (images opened), the model through the Auto class TRL's docs use for it."""
    import bench_archs
    import torch
    from PIL import Image
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    path = Path(spec.data)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows:
        if "image" in r:
            with Image.open(path.parent / r["image"]) as im:
                r["image"] = im.convert("RGB")
    kwargs = {"dtype": torch.float32, "attn_implementation": "sdpa"}
    if spec.arch in ("llama", "smollm2"):
        model = AutoModelForCausalLM.from_pretrained(spec.model_dir, **kwargs)
        processor = AutoTokenizer.from_pretrained(spec.model_dir, padding_side="left")
        return rows, model, processor, bench_archs.suppressed_ids(processor)
    model = AutoModelForImageTextToText.from_pretrained(spec.model_dir, **kwargs)
    processor = AutoProcessor.from_pretrained(spec.model_dir, padding_side="left")
    return rows, model, processor, bench_archs.suppressed_ids(processor.tokenizer)


def _run_mmgrpo(spec: RunSpec, clock: _Clock, flop_box: dict) -> dict:
    from mmgrpo import on_policy
    from mmgrpo.config import TrainConfig, from_dict
    from mmgrpo.loader import validate
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
        **({"max_pixels": 1024 * 28 * 28} if spec.arch == "qwen2_5_vl" else {}),
        **spec.mmgrpo_args,
    }
    if spec.arch == "qwen2_5_vl":
        shapes = {"questions": QUESTIONS, "image_size": spec.image_size, "train_size": _row_count(spec), "eval_size": 1}
        task = {"name": "shapes", "args": shapes}
    else:  # the JSONL rows TRL reads, through the dataset task; the last row is the (unused) held-out one
        task = {"name": "dataset", "args": {"train": spec.data, "eval": spec.data, "max_rows": _row_count(spec)}}
    cfg = from_dict(
        TrainConfig,
        {
            "output_dir": str(Path(spec.result).parent / f"mmgrpo_out_{os.getpid()}"),
            "seed": spec.seed,
            "steps": total,
            "model": {"adapter": "vlm", "args": model_args, "dtype": "float32"},
            "task": task,
            "rewards": [{"name": "bench_letters"}],
            "algorithm": {
                "group_size": spec.group_size,
                "prompts_per_step": spec.prompts,
                "minibatch_size": B,
                "beta": 0.0,
                "epochs": 1,
                "surrogate_args": {"clip_low": 0.2, "clip_high": 0.2},
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
    on_policy.configure(trainer.adapter, cfg)  # as Trainer.run: at μ = 1 no old-log-prob forward (mmgrpo/on_policy.py)
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
    """This process's peak resident memory (kB): ``VmHWM`` of ``/proc/self/status``.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: on Linux that high-water mark survives ``fork`` + ``exec`` (the
    kernel carries the parent's into the child's signal struct), so every worker would start from the driver's RSS
    at launch (~770 MB here, after it imported torch and built the model) and both toolkits' peaks would be floored
    there. ``VmHWM`` belongs to the process's own address space, which ``exec`` makes new. Elsewhere: ru_maxrss.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


T_START = time.perf_counter()


def worker(spec: RunSpec) -> None:
    if spec.toolkit.startswith("trl") or not spec.own_imports:
        import datasets  # noqa: F401  (by default the same imports in every worker: equal baseline memory)
        import trl  # noqa: F401
    import torch
    import transformers  # noqa: F401

    import mmgrpo.modalities
    import mmgrpo.rewards  # noqa: F401

    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    if spec.profile:
        _annotate_for_profile()
    clock = _Clock(spec.warmup + spec.steps - 1 if spec.profile else -1, spec.profile)
    flop_box = {}
    rss_start = _maxrss_kb()
    if spec.toolkit.startswith("trl"):
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
        "loaded_trl_datasets": ["trl" in sys.modules, "datasets" in sys.modules],  # at the end of the run
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
        row["image_tokens"] = (key[0] // 28) ** 2  # Qwen2.5-VL: one merged token per 28×28 pixels
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
            if tk in ("trl", "trl_cpu"):
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
        if "trl_cpu" in toolkits:  # TRL's CPU rule against mmgrpo (adjacent runs), the second, labelled row
            per_rep = {m: [] for m in ("step_s", "rollout_s", "update_s", "peak_rss_mb")}
            for a, b in zip(by["trl_cpu"], by["mmgrpo"]):
                for m in per_rep:
                    x = _median(a[m]) if isinstance(a[m], list) else a[m]
                    y = _median(b[m]) if isinstance(b[m], list) else b[m]
                    per_rep[m].append(x / y)
            row["trl_cpu_over_mmgrpo"] = {m: _median(v) for m, v in per_rep.items()}
        table.append(row)
    return table


def plot(table: list[dict], toolkits: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    x = [r["ratio"] for r in table]
    for tk in toolkits:
        if tk not in ("mmgrpo", "mmgrpo_naive"):
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
    _ratio_axes(ax1, x, "TRL / mmgrpo", "TRL ÷ mmgrpo (>1: mmgrpo better)")
    for tk in toolkits:
        ax2.plot(x, [r[tk]["fraction_of_matmul"] for r in table], marker="o", label=tk)
    _ratio_axes(ax2, x, "achieved FLOP/s ÷ matmul FLOP/s", "hardware efficiency (counted FLOPs / step time)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _ratio_axes(ax, x: list[float], ylabel: str, title: str) -> None:
    """A plot over the prefix:completion ratios (log x axis, one tick per ratio), with its legend."""
    ax.set(xscale="log", xlabel="prefix : completion (L / T)", ylabel=ylabel, title=title)
    ax.set_xticks(x, [f"{v:.0f}:1" for v in x])
    ax.minorticks_off()
    ax.legend(fontsize=7)


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
            f"| {r['ratio']:.1f}:1 | {r['prompt_tokens']} | {r['completion_tokens']} "
            f"| {t['step_s']:.2f} | {m['step_s']:.2f} "
            f"| {q['step_s']:.2f} | {q['rollout_s']:.2f} | {q['update_s']:.2f} | {t['peak_rss_mb']:.0f} "
            f"| {m['peak_rss_mb']:.0f} | {r['mmgrpo_memory_saving']:.0%} "
            f"| {t['working_set_mb']:.0f} / {m['working_set_mb']:.0f} "
            f"| {t['flops_per_step'] / 1e9:.1f} / {m['flops_per_step'] / 1e9:.1f} | {t['fraction_of_matmul']:.3f} "
            f"| {m['fraction_of_matmul']:.3f} |"
        )
    if "mmgrpo_ckpt" in toolkits:
        lines += [
            "",
            "| L:T | gradient checkpointing | step TRL (s) | step mmgrpo (s) | step × | peak RSS TRL (MB) "
            "| peak RSS mmgrpo (MB) | peak RSS saved | working set TRL / mmgrpo (MB) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in table:
            for label, t_key, m_key in (("off", "trl", "mmgrpo"), ("on", "trl_ckpt", "mmgrpo_ckpt")):
                t, m = r[t_key], r[m_key]
                lines.append(
                    f"| {r['ratio']:.1f}:1 | {label} | {t['step_s']:.2f} | {m['step_s']:.2f} "
                    f"| {t['step_s'] / m['step_s']:.2f} | {t['peak_rss_mb']:.0f} | {m['peak_rss_mb']:.0f} "
                    f"| {1 - m['peak_rss_mb'] / t['peak_rss_mb']:.0%} "
                    f"| {t['working_set_mb']:.0f} / {m['working_set_mb']:.0f} |"
                )
    if "trl_cpu" in toolkits:
        lines += [
            "",
            "| L:T | TRL's rule | step TRL (s) | step × | rollout × | log-prob+update × | peak RSS TRL (MB) "
            "| peak RSS saved | GFLOP/step TRL |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in table:
            for label, key, q in (
                ("GPU (compact head)", "trl", r["trl_over_mmgrpo"]),
                ("CPU (every position)", "trl_cpu", r["trl_cpu_over_mmgrpo"]),
            ):
                t = r[key]
                lines.append(
                    f"| {r['ratio']:.1f}:1 | {label} | {t['step_s']:.2f} | {q['step_s']:.2f} | {q['rollout_s']:.2f} "
                    f"| {q['update_s']:.2f} | {t['peak_rss_mb']:.0f} | {1 - 1 / q['peak_rss_mb']:.0%} "
                    f"| {t['flops_per_step'] / 1e9:.1f} |"
                )
    for tk, label in ROW_LABELS.items():
        if tk not in toolkits:
            continue
        lines += ["", f"| L:T | step × (TRL / mmgrpo, {label}) | rollout × | peak RSS × |", "|---|---|---|---|"]
        for r in table:
            q = r[f"trl_over_{tk}"]
            lines.append(f"| {r['ratio']:.1f}:1 | {q['step_s']:.2f} | {q['rollout_s']:.2f} | {q['peak_rss_mb']:.2f} |")
    if "mmgrpo_naive" in toolkits:
        lines += ["", "| L:T | step × (TRL / mmgrpo naive path) | peak RSS × |", "|---|---|---|"]
        for r in table:
            q = r["trl_over_mmgrpo_naive"]
            lines.append(f"| {r['ratio']:.1f}:1 | {q['step_s']:.2f} | {q['peak_rss_mb']:.2f} |")
    return "\n".join(lines)


ROW_LABELS = {
    "mmgrpo_sampler": "old_logprobs: sampler",
    "mmgrpo_compiled": "compile_decode",
    "mmgrpo_packed": "packed_training",
    "mmgrpo_expanded": "shared_prefix_attention: false",
}  # the extra mmgrpo rows (--sampler-row, --compiled-row, --packed-row, --expanded-row), each a table of its own
TRL_HEAD = {"trl_cpu": "device"}  # the second TRL row: TRL's CPU rule (its fused head scores every position)
MMGRPO_ARGS = {
    "mmgrpo_naive": {"prefix_sharing": False, "kv_expand_rollout": False},
    "mmgrpo_sampler": {"old_logprobs": "sampler"},  # no extra no-grad forward: TRL's saving at μ = 1
    "mmgrpo_compiled": {"compile_decode": True},  # the compiled static-cache decode step (compiled_decode.py)
    "mmgrpo_packed": {"packed_training": True},  # the packed cache-free training forward (prefix_sharing.py)
    "mmgrpo_expanded": {"shared_prefix_attention": False},  # decode over the G-expanded prompt cache (before Hydragen)
    "mmgrpo_ckpt": {"gradient_checkpointing": True},
}


def run_worker(a, toolkit: str, model_dir: Path, image_size: int, result: Path, **fields) -> None:
    """One worker run (:class:`RunSpec`) of ``toolkit`` in a subprocess, with the command line's (``a``) completion
    length, batch, warm-up, threads and TRL head rule; ``fields`` set the rest (steps, seed, ...)."""
    spec = RunSpec(
        toolkit=toolkit,
        model_dir=str(model_dir),
        image_size=image_size,
        completion_tokens=a.completion_tokens,
        prompts=a.prompts,
        group_size=a.group_size,
        warmup=a.warmup,
        threads=a.threads,
        result=str(result),
        **{"trl_fused_head": a.trl_fused_head, "own_imports": a.own_imports, **fields},
    )
    _launch(["--worker", "run", "--spec", json.dumps(asdict(spec))], a.threads, a.timeout)


def profile(a, model_dir: Path, point: tuple, raw: Path, out: Path) -> int:
    """One warm-up step, then one step of each toolkit under torch.profiler (one thread, as in the sweep);
    ``point`` is a sweep point (key, L, the worker's fields)."""
    side, L, fields = point
    image_size = side if not fields else 256  # bench_archs.IMAGE_SIDE
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "prompt_tokens": L, "toolkits": {}}
    for tk in ("trl", "mmgrpo"):
        path = raw / f"profile_{tk}.json"
        result = raw / f"profiled_{tk}.json"
        run_worker(a, tk, model_dir, image_size, result, steps=1, seed=a.seed, flops=False, profile=str(path), **fields)
        report["toolkits"][tk] = json.loads(path.read_text())
        scopes = report["toolkits"][tk]["scopes_s"]
        mm = report["toolkits"][tk]["matmul"]
        print(
            f"profile {tk}: step {report['toolkits'][tk]['step_s']:.2f}s, matmuls {mm['gflop']:.1f} GFLOP in "
            f"{mm['self_s']:.2f}s = {mm['gflop_per_s']:.1f} GFLOP/s " + json.dumps(scopes),
            flush=True,
        )
    (out / "profile.json").write_text(json.dumps(report, indent=1))
    return 0


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
    p.add_argument(
        "--sampler-row",
        action="store_true",
        help="also run mmgrpo with model.args.old_logprobs: sampler (the sampling loop's log-probs as π_old, no "
        "extra forward, as TRL skips its old-log-prob forward at μ = 1), reported as its own row",
    )
    p.add_argument(
        "--compiled-row",
        action="store_true",
        help="also run mmgrpo with model.args.compile_decode: true (the static-cache decode step under torch.compile, "
        "inductor on CPU), reported as its own row",
    )
    p.add_argument(
        "--packed-row",
        action="store_true",
        help="also run mmgrpo with model.args.packed_training: true (one packed cache-free training forward per "
        "minibatch), reported as its own row",
    )
    p.add_argument(
        "--expanded-row",
        action="store_true",
        help="also run mmgrpo with model.args.shared_prefix_attention: false (decoding over the G-expanded prompt "
        "cache instead of the shared one), reported as its own row",
    )
    p.add_argument(
        "--vocab", choices=sorted(VOCABS), default="small", help="text vocabulary: small (~600) | real (151,936)"
    )
    p.add_argument("--checkpointing", action="store_true", help="also run both toolkits with gradient checkpointing on")
    p.add_argument(
        "--trl-fused-head",
        choices=["device", "compact"],
        default="compact",
        help="compact (default): the rule TRL's fused lm_head follows on CUDA/XPU, only the completion positions | "
        "device: TRL as shipped on CPU (it scores every prompt position too)",
    )
    p.add_argument(
        "--own-imports",
        action="store_true",
        help="each worker imports only its own toolkit's modules (mmgrpo's: no trl, no datasets), as a user's "
        "process does; by default every worker imports both, so that the RSS after imports is the same",
    )
    p.add_argument(
        "--trl-cpu-row",
        action="store_true",
        help="also run TRL with its CPU rule (every position scored), reported as a second, labelled row",
    )
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="default",
        help="default: hidden 128, 4 layers (lm_head-heavy at --vocab real) | real-mix: Qwen2.5-VL-3B's per-token "
        "FLOP mix of lm_head / decoder / vision (REAL_MIX_SIZES, vocabulary REAL_MIX_VOCAB)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="instead of the sweep: one torch.profiler step of each toolkit at the first ratio → profile.json",
    )
    p.add_argument(
        "--arch",
        choices=["qwen2_5_vl", "llama", "idefics3", "smollm2"],
        default="qwen2_5_vl",
        help="qwen2_5_vl: the Qwen2.5-VL models above | llama: a text-only Llama with SmolLM2-135M's FLOP mix | "
        "idefics3: SmolVLM (Idefics3) with SmolVLM-256M's FLOP mix | smollm2: the real SmolLM2-135M-Instruct "
        "(scripts/setup_real_models.sh) (bench_archs.py; --model/--vocab do not apply)",
    )
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
        toolkits += [tk for tk in ROW_LABELS if f"trl_over_{tk}" in report["table"][0]]
        toolkits += ["trl_ckpt", "mmgrpo_ckpt"] if "trl_ckpt" in report["table"][0] else []
        toolkits += ["trl_cpu"] if "trl_cpu" in report["table"][0] else []
        (out / "vs_trl.md").write_text(markdown(report["table"], toolkits) + "\n")
        plot(report["table"], toolkits, out / "vs_trl.png")
        return 0
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    toolkits = ["trl", "mmgrpo"] + (["mmgrpo_naive"] if a.naive else [])
    toolkits += [tk for tk, on in zip(ROW_LABELS, (a.sampler_row, a.compiled_row, a.packed_row, a.expanded_row)) if on]
    toolkits += ["trl_ckpt", "mmgrpo_ckpt"] if a.checkpointing else []
    toolkits += ["trl_cpu"] if a.trl_cpu_row else []
    T = a.completion_tokens
    if a.arch == "qwen2_5_vl":
        sizes = MODELS[a.model]
        model_dir = build_model(out / ("model" if a.model == "default" else f"model_{a.model}"), a.seed, sizes)
        vocab = VOCABS[a.vocab] or (REAL_MIX_VOCAB if a.model == "real-mix" else None)
        if vocab:
            model_dir = resize_vocab(model_dir, vocab)
        mixes = flop_mixes(model_dir, sizes)
        model_info = {**sizes, "name": a.model, "vocab": _vocab_size(model_dir)}
        # (key, L, the worker's fields): the image side sets L
        points = [(side, L, {}) for side, L in (image_side_for(model_dir, float(r), T) for r in a.ratios.split(","))]
    else:
        import bench_archs

        model_dir = bench_archs.build_model(out / f"model_{a.arch}", a.arch, a.seed)
        mixes = bench_archs.flop_mixes(a.arch)
        model_info = {"name": a.arch, "text": asdict(bench_archs.BENCH_TEXT)}
        if a.arch == "idefics3":
            model_info["vision"] = asdict(bench_archs.BENCH_VISION)
        n = max(16, 4 * a.prompts * (a.warmup + a.steps + 1))  # _row_count's
        points = []
        for r in a.ratios.split(","):  # filler words before the question set L (the image is fixed)
            words, L = bench_archs.filler_for(model_dir, a.arch, float(r), T)
            data = bench_archs.write_rows(out / "data", a.arch, n, words, seed=1234)
            points.append((words, L, {"arch": a.arch, "data": str(data.resolve())}))
    for name, mix in mixes.items():
        print(f"per-token FLOP mix, {name}: " + ", ".join(f"{k} {v:.1%}" for k, v in mix.items()), flush=True)
    if a.profile:
        return profile(a, model_dir, points[0], raw, out)
    t_start = time.perf_counter()
    runs, matmul = [], []
    for rep in range(a.repeats):
        for i, (side, L, fields) in enumerate(points):
            order = toolkits if (rep + i) % 2 == 0 else toolkits[::-1]
            for tk in order:
                result = raw / (
                    f"{tk}_side{side}_rep{rep}.json" if not fields else f"{tk}_{a.arch}{side}_rep{rep}.json"
                )
                run_worker(
                    a,
                    tk,
                    model_dir,
                    side if not fields else bench_archs.IMAGE_SIDE,
                    result,
                    **fields,
                    steps=a.steps,
                    seed=a.seed + rep,
                    flops=rep == 0,
                    mmgrpo_args=MMGRPO_ARGS.get(tk, {}),
                    trl_fused_head=TRL_HEAD.get(tk, a.trl_fused_head),
                )
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
    if a.arch != "qwen2_5_vl":
        for row in table:  # the key's first field is the filler word count, not an image side
            row["filler_words"] = row.pop("image_size")
            row["image_tokens"] = None
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": vars(a),
        "model_sizes": model_info,
        "flop_mix": mixes,
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
        f"vs_trl: at {at8['ratio']:.1f}:1 mmgrpo's step is {q['step_s']:.2f}x faster than TRL's "
        f"(rollout {q['rollout_s']:.2f}x, "
        f"log-prob+update {q['update_s']:.2f}x), peak RSS {at8['mmgrpo_memory_saving']:.0%} lower; step speed-up "
        f"{min(span):.2f}x..{max(span):.2f}x over {table[0]['ratio']:.0f}:1..{table[-1]['ratio']:.0f}:1; "
        f"{out / 'vs_trl.json'}"
    )
    return 0


def _vocab_size(model_dir: Path) -> int:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(config.get("text_config", config).get("vocab_size") or config["vocab_size"])


def flop_mixes(model_dir: Path, sizes: dict) -> dict[str, dict[str, float]]:
    """Per-token FLOP shares (lm_head / decoder / vision, ``cost_model.flop_mix``) of the benchmark model beside
    Qwen2.5-VL-3B's and -7B's."""
    import cost_model as cm

    text = cm.TextConfig(sizes["text_hidden"], sizes["text_layers"], sizes["text_intermediate"], sizes["text_heads"],
                         sizes["text_kv_heads"], _vocab_size(model_dir))  # fmt: skip
    vision = cm.VisionConfig(sizes["vision_hidden"], sizes["vision_depth"], sizes["vision_intermediate"],
                             sizes["vision_heads"])  # fmt: skip
    bench = cm.ModelConfig("benchmark", text, vision)
    return {
        "benchmark model": cm.flop_mix(bench),
        **{m.name: cm.flop_mix(m) for m in (cm.QWEN25_VL_3B, cm.QWEN25_VL_7B)},
    }


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
