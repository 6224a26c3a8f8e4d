"""Tests marked ``cuda``: what only a CUDA device shows, run by ``scripts/gpu_check.sh`` (``pytest -m cuda``).

Each is skipped without CUDA (CI has none; ``tests/test_gpu.py`` holds the placement tests, marked ``cuda`` too):
- every token family (VLM, video, Whisper, audio LLM, AR image) and the flow family trains 2 GRPO steps on CUDA under
  accelerate's bf16 mixed precision (fp32 master weights and optimizer, bf16 autocast: the documented GPU setting,
  docs/benchmarks.md "On a GPU"), with finite losses;
- a keyed rollout draws the same tokens on CUDA as on the CPU (the noise keys are device-independent: mmgrpo/noise.py),
  with fp32 matmuls on both (TF32 off);
- the fused linear log-prob head (modalities/tokens/logprobs.py) equals the logits path on CUDA, values and gradients;
- the vLLM engine colocated in the training process (``rollout.vllm_mode: colocate``) trains 2 steps, when vllm
  imports in this environment.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs a CUDA device (scripts/gpu_check.sh)")]

TWO_STEPS = [
    "steps=2",
    "warmup.steps=4",
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "logging.trackers=[]",
    "logging.progress=false",
    "logging.every=1",
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=4",
    "checkpoint.every=0",
]
"""Two small GRPO steps of a shipped config after 4 warm-up steps (a reward signal): P = 2, G = 4, no evaluation
or intermediate checkpoint."""

FAMILIES = {
    "vlm": ("quickstart", ["model.args.max_new_tokens=8", "task.args.train_size=16", "task.args.eval_size=4"]),
    "video": ("video_motion", ["model.args.max_new_tokens=8", "task.args.train_size=16", "task.args.eval_size=4"]),
    "whisper": (
        "speech_whisper_asr",
        ["model.args.max_new_tokens=8", "task.args.train_size=8", "task.args.eval_size=2"],
    ),
    "audio_llm": (
        "speech_qwen2audio_qa",
        ["model.args.max_new_tokens=8", "task.args.train_size=8", "task.args.eval_size=2"],
    ),
    "ar_image": ("ar_image_grpo", ["warmup.steps=0"]),  # no supervised warm-up for image generators
    "flow": ("flow_grpo", ["warmup.steps=0", "model.args.num_steps=4", "model.args.eval_num_steps=2"]),
}
"""Family -> (shipped config, its extra overrides for a short run)."""


def two_bf16_steps(config: str, extra: list[str], out: Path) -> list[dict]:
    """Train ``configs/<config>.yaml`` for 2 steps under accelerate's bf16 mixed precision; the logged step rows."""
    from accelerate.state import AcceleratorState

    from mmgrpo.loader import load_config
    from mmgrpo.trainer import Trainer

    os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16"  # as `accelerate launch --mixed_precision bf16` sets it
    AcceleratorState._reset_state()  # an earlier Accelerator (mixed_precision "no") would be reused
    try:
        trainer = Trainer(load_config(ROOT / f"configs/{config}.yaml", [*TWO_STEPS, *extra, f"output_dir={out}"]))
        assert trainer.acc.mixed_precision == "bf16"
        assert {p.dtype for p in trainer.adapter.trainable_parameters()} == {torch.float32}  # fp32 master weights
        assert trainer.acc.device.type == ("cuda" if CUDA else "cpu")
        trainer.run()
    finally:
        os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
        AcceleratorState._reset_state()  # later tests must not inherit bf16
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss/policy" in r]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_trains_two_bf16_steps_on_cuda(family, tmp_path, mmgrpo_cache):
    if family in ("whisper", "audio_llm") and shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    config, extra = FAMILIES[family]
    steps = two_bf16_steps(config, extra, tmp_path / "run")
    assert len(steps) == 2, steps
    assert all(math.isfinite(s["loss/policy"]) and math.isfinite(s["reward/mean"]) for s in steps), steps


@pytest.mark.parametrize("name", ["vlm", "video", "ar_image", "whisper", "audio_llm"])
def test_keyed_rollout_on_cuda_draws_the_cpu_tokens(name, mmgrpo_cache):
    from mmgrpo import noise
    from tests.adapter_cases import CASES, build

    if name in ("whisper", "audio_llm") and shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 on both devices
    try:
        case = CASES[name]
        rows, G = case.rows(), 4
        keys = noise.NoiseKeys(0, 1, (0, 1), G)
        adapter = build(name, lora=False)
        on_cpu = adapter.rollout(rows, G, keys)
        adapter._unwrapped().to("cuda")
        on_cuda = adapter.rollout(rows, G, keys)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    a, b = getattr(on_cpu.state, case.drawn).cpu(), getattr(on_cuda.state, case.drawn).cpu()  # [B, T]
    same = (a == b).all(dim=1)  # [B] a flip near a CDF boundary changes the rest of that sample only
    assert float(same.float().mean()) >= 0.75, (a, b)
    close = same[:, None] & (on_cpu.mask > 0) & (on_cuda.mask.cpu() > 0)  # [B, T]
    diff = (on_cpu.old_logprobs - on_cuda.old_logprobs.cpu()).abs()[close]
    assert diff.numel() > 0 and float(diff.max()) < 1e-3, float(diff.max())


def test_fused_head_equals_the_logits_path_on_cuda():
    from mmgrpo.modalities.tokens.logprobs import linear_token_logprobs, token_logprobs

    g = torch.Generator().manual_seed(0)
    n, T, H, V = 4, 16, 64, 49_152  # SmolLM2's vocabulary
    hidden = torch.randn(n, T, H, generator=g).cuda().requires_grad_()  # [n, T, H]
    weight = (torch.randn(V, H, generator=g) / math.sqrt(H) * 3).cuda().requires_grad_()  # [V, H]
    tokens = torch.randint(0, V, (n, T), generator=g).cuda()  # [n, T]
    w = torch.randn(n, T, generator=g).cuda()  # [n, T] a loss weighting each token
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        out = linear_token_logprobs(hidden, weight, tokens, temperature=0.7, rows=8, chunk=8192)  # [n, T]
        ref = token_logprobs(hidden @ weight.T, tokens, temperature=0.7)  # [n, T] via the [n, T, V] logits
        got = torch.autograd.grad((out * w).sum(), (hidden, weight))
        want = torch.autograd.grad((ref * w).sum(), (hidden, weight))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert out.is_cuda and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5 * float(y.abs().max()))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm does not import in this environment")
def test_colocated_vllm_engine_trains_two_steps(tmp_path, mmgrpo_cache):
    run = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "mmgrpo", "train", "configs/quickstart.yaml",
        "model.args.name_or_path=tiny-qwen2.5-vl-engine", "rollout.engine=vllm", "rollout.vllm_mode=colocate",
        "rollout.vllm_gpu_memory_utilization=0.3", *TWO_STEPS, f"output_dir={run}",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "engine/logprob_abs_diff" in s]
    assert len(steps) == 2 and all(math.isfinite(s["loss/policy"]) for s in steps), steps
