"""The trainer runs every flow variant end to end (tiny settings): chunk ratio, temporal, value-anchored, RatioNorm."""

import json
import math
from pathlib import Path

import pytest

from mmgrpo.loader import load_config
from mmgrpo.trainer import train

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

SMALL = [
    "steps=2",
    "algorithm.group_size=2",
    "algorithm.prompts_per_step=2",
    "algorithm.minibatch_size=2",
    "model.args.num_steps=4",
    "model.args.eval_num_steps=2",
    "eval.before=false",
    "eval.after=true",
    "eval.max_rows=2",
    "task.args.eval_seeds=1",
]


@pytest.mark.parametrize(
    "config,extra",
    [
        ("flow_grpo", []),
        ("flow_chunk", ["algorithm.chunk_sizes=[1, 1, 2]"]),
        ("flow_temporal", []),
        ("flow_value_anchored", []),
        ("flow_temporal", ["algorithm.ratio_norm=true", "algorithm.shaping_args.weights=inv_dt"]),
    ],
    ids=["grpo", "chunk", "temporal", "value_anchored", "grpo_guard"],
)
def test_flow_variant_trains(config, extra, tmp_path):
    cfg = load_config(CONFIGS / f"{config}.yaml", [f"output_dir={tmp_path}", *SMALL, *extra])
    summary = train(cfg)
    assert 0 <= summary["eval/after/reward"] <= 1
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss/policy"] for r in rows if "loss/policy" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
