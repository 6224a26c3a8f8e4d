"""What only a CUDA device shows (skipped without one; CI has none): the trainer's placement of every module it runs.

On the CPU every tensor is on one device, so a module left behind by ``accelerator.prepare`` (which moves the policy
only) cannot fail there. On an NVIDIA H200 lent to a session (2026-11-26; docs/scale.md, "On a CUDA machine") the
quickstart and the zoom and Sokoban configs failed at their first GRPO step until ``Trainer`` moved the frozen
reference copy to the accelerator's device (``ref_logprobs`` ran the CPU copy on CUDA token ids: every full fine-tune
with β > 0); these tests keep that fixed.

Run on a CUDA machine: ``pytest tests/test_gpu.py``.
"""

import json
import math
from pathlib import Path

import pytest
import torch

from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer, train
from mmgrpo.types import frozen_reference

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["logging.trackers=[]", "logging.progress=false", "eval.every=0"]


def test_full_finetune_keeps_its_frozen_reference_beside_the_policy_and_trains(tmp_path, mmgrpo_cache):
    """The quickstart (full fine-tune, β = 0.05: a frozen reference copy) on CUDA: the policy and its reference on
    the accelerator's device, and two GRPO steps with finite rewards and KL."""
    cfg = load_config(
        ROOT / "configs/quickstart.yaml",
        QUIET
        + [
            f"output_dir={tmp_path / 'run'}",
            "steps=2",
            "warmup.steps=3",
            "task.args.train_size=32",
            "task.args.eval_size=8",
            "algorithm.prompts_per_step=2",
            "algorithm.group_size=4",
            "algorithm.minibatch_size=4",
        ],
    )
    trainer = Trainer(cfg)
    reference = frozen_reference(trainer.adapter)
    assert reference is not None, "the quickstart is a full fine-tune with beta > 0: it keeps a frozen copy"
    assert next(trainer.adapter.model.parameters()).device.type == "cuda"
    assert {p.device.type for p in reference.parameters()} == {"cuda"}
    summary = trainer.run()
    assert summary["train/steps"] == 2, summary
    rows = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "kl/mean" in r]
    assert len(rows) == 2 and all(math.isfinite(r["reward/mean"]) and math.isfinite(r["kl/mean"]) for r in rows)


def test_multi_turn_tool_rollouts_train_on_cuda(tmp_path, mmgrpo_cache):
    """The zoom task's two-turn crop rollouts (tool observations are images processed on the host) train on CUDA:
    the warm-up teaches the call, and the GRPO steps run the multi-turn log-prob forward over the observations."""
    cfg = load_config(
        ROOT / "configs/zoom_tools.yaml",
        QUIET
        + [
            f"output_dir={tmp_path / 'zoom'}",
            "steps=2",
            "warmup.steps=4",
            "task.args.train_size=32",
            "task.args.eval_size=8",
            "algorithm.prompts_per_step=2",
            "algorithm.group_size=4",
            "algorithm.minibatch_size=8",
        ],
    )
    summary = train(cfg)
    assert summary["train/steps"] == 2, summary
    assert 0.0 <= summary["eval/after/tool_call_rate"] <= 1.0, summary
