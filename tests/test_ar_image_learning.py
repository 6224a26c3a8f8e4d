"""Learning test: GRPO with exact CFG log-probs improves the held-out reward of the shipped tiny Janus base without
collapsing the realism proxy (the settings of benchmarks/ar_image_variants.py, one seed, fewer steps)."""

from pathlib import Path

import pytest

from mmgrpo.config import load_config
from mmgrpo.modalities.ar_image.tiny import SHIPPED
from mmgrpo.trainer import train

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.slow
@pytest.mark.skipif(
    not (SHIPPED["tiny-janus-shapes"] / "config.json").is_file(),
    reason="tiny-janus-shapes not built: python examples/pretrain_tiny_janus.py",
)
def test_ar_image_grpo_beats_the_base_model(tmp_path):
    cfg = load_config(CONFIGS / "ar_image_grpo.yaml", [f"output_dir={tmp_path}", "seed=0"])
    s = train(cfg)
    before, after = s["eval/before/reward"], s["eval/after/reward"]
    assert after > before + 0.02, f"held-out reward {before:.3f} -> {after:.3f}"
    assert s["eval/after/realism"] > s["eval/before/realism"] - 0.1, "realism proxy collapsed"
