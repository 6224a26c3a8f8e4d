"""Every configs/flow_*.yaml loads and validates; the recipes carry the Flow-GRPO defaults."""

from pathlib import Path

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config

CONFIGS = sorted(Path(__file__).resolve().parents[1].glob("configs/flow_*.yaml"))


def test_all_flow_configs_are_found():
    names = {p.stem for p in CONFIGS}
    assert {
        "flow_grpo",
        "flow_chunk",
        "flow_temporal",
        "flow_value_anchored",
        "flow_sd35m_recipe",
        "flow_flux_dev_recipe",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_flow_config_loads_and_validates(path):
    cfg = load_config(path)  # as shipped, no overrides
    assert cfg.model.adapter == "flow"


def test_synthetic_variants_differ_only_in_their_own_keys():
    base = load_config(CONFIGS[0].parent / "flow_grpo.yaml")
    chunk = load_config(CONFIGS[0].parent / "flow_chunk.yaml")
    temporal = load_config(CONFIGS[0].parent / "flow_temporal.yaml")
    value = load_config(CONFIGS[0].parent / "flow_value_anchored.yaml")
    assert (chunk.algorithm.ratio_level, chunk.algorithm.chunk_sizes) == ("chunk", [2, 2, 4])
    assert sum(chunk.algorithm.chunk_sizes) == chunk.model.args["num_steps"]
    assert temporal.algorithm.shaping == "temporal" and value.algorithm.shaping == "value_anchored"
    assert value.model.args["value_rewards"] == [{"name": "flow_shape_match"}]
    for cfg in (chunk, temporal, value):
        assert cfg.optim == base.optim and cfg.steps == base.steps and cfg.seed == base.seed
        assert cfg.algorithm.surrogate_args == base.algorithm.surrogate_args and cfg.model.lora == base.model.lora
        assert {k: v for k, v in cfg.model.args.items() if k != "value_rewards"} == base.model.args


def test_recipes_carry_flow_grpo_defaults():
    sd3 = load_config(CONFIGS[0].parent / "flow_sd35m_recipe.yaml")  # as shipped; loading builds nothing
    a = sd3.model.args
    assert (sd3.algorithm.kl, a["kl_variant"], sd3.algorithm.beta) == ("gaussian_exact", "flow_grpo", 0.01)
    assert (a["num_steps"], a["eval_num_steps"], a["noise_level"], a["guidance_scale"]) == (10, 40, 0.7, 4.5)
    assert sd3.algorithm.group_size == 24 and sd3.algorithm.surrogate_args["clip_low"] == 1e-4 and sd3.optim.lr == 3e-4
    assert (sd3.model.lora.r, sd3.model.lora.alpha) == (32, 64)
    flux = load_config(CONFIGS[0].parent / "flow_flux_dev_recipe.yaml")
    f = flux.model.args
    got = (f["num_steps"], f["eval_num_steps"], f["noise_level"], f["flux_guidance"], f["cfg"])
    assert got == (6, 28, 0.9, 3.5, "none")
    assert flux.algorithm.beta == 0 and flux.model.dtype == "bfloat16"


def test_bad_flow_args_fail_at_load():
    with pytest.raises(ConfigError, match=r"model.args"):
        load_config(CONFIGS[0].parent / "flow_grpo.yaml", ["model.args.num_step=3"])
