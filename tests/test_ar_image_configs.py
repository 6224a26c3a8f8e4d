"""Every configs/ar_image_*.yaml loads and validates; the comparison variant differs only in cfg_logprob; the
Janus-Pro recipe carries T2I-R1's published defaults (loaded, nothing built)."""

from pathlib import Path

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config

CONFIGS = sorted(Path(__file__).resolve().parents[1].glob("configs/ar_image_*.yaml"))
DIR = Path(__file__).resolve().parents[1] / "configs"


def test_all_ar_image_configs_are_found():
    assert {"ar_image_grpo", "ar_image_cond", "ar_image_janus_pro_recipe"} <= {p.stem for p in CONFIGS}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_ar_image_config_loads_and_validates(path):
    cfg = load_config(path)
    assert cfg.model.adapter == "ar_image"


def test_cond_variant_differs_only_in_cfg_logprob():
    grpo, cond = load_config(DIR / "ar_image_grpo.yaml"), load_config(DIR / "ar_image_cond.yaml")
    assert (grpo.model.args["cfg_logprob"], cond.model.args["cfg_logprob"]) == ("guided", "cond")
    assert {k: v for k, v in cond.model.args.items() if k != "cfg_logprob"} == {
        k: v for k, v in grpo.model.args.items() if k != "cfg_logprob"
    }
    assert cond.algorithm == grpo.algorithm and cond.optim == grpo.optim and cond.model.lora == grpo.model.lora
    assert cond.task == grpo.task and cond.steps == grpo.steps and cond.seed == grpo.seed


def test_janus_pro_recipe_carries_t2i_r1_defaults():
    cfg = load_config(DIR / "ar_image_janus_pro_recipe.yaml")
    a = cfg.model.args
    assert (a["name_or_path"], a["guidance_scale"], a["temperature"]) == ("deepseek-community/Janus-Pro-7B", 5.0, 1.0)
    assert a["prompt_template"] == "<|User|>: {prompt}\n\n<|Assistant|>:"
    assert cfg.algorithm.group_size == 8 and cfg.algorithm.beta == 0.01 and cfg.algorithm.kl == "k3"
    assert cfg.optim.lr == 1e-6 and cfg.steps == 1600 and cfg.model.dtype == "bfloat16"


def test_bad_ar_image_args_fail_at_load():
    with pytest.raises(ConfigError, match=r"model.args"):
        load_config(DIR / "ar_image_grpo.yaml", ["model.args.guidance=3"])
