"""Learning test: each flow variant improves the held-out reward of the shipped base without losing quality.

The same settings as ``benchmarks/flow_variants.py`` (the docs/flow.md table), shortened to 60 steps and one seed.
"""

from pathlib import Path

import pytest

from mmgrpo.loader import load_config
from mmgrpo.trainer import train

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

VARIANTS = ["grpo", "chunk", "temporal", "value_anchored"]


@pytest.mark.slow
def test_flow_variants_beat_the_base_model(tmp_path):
    results = {}
    for name in VARIANTS:
        cfg = load_config(CONFIGS / f"flow_{name}.yaml", [f"output_dir={tmp_path / name}", "steps=60", "seed=0"])
        s = train(cfg)
        results[name] = s
        before, after = s["eval/before/reward"], s["eval/after/reward"]
        assert after > before + 0.03, f"{name}: held-out reward {before:.3f} -> {after:.3f}"
        assert s["eval/after/realism"] > s["eval/before/realism"] - 0.05, f"{name}: quality proxy collapsed"
    assert len({round(r["eval/before/reward"], 6) for r in results.values()}) == 1  # same base, same eval noise
