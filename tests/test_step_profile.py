"""benchmarks/step_profile.py on the CPU: the phases it marks add up inside the step, every decoding token is counted
once, and a variant runs in the same process. The model is SmolLM2-135M-Instruct's architecture and tokenizer
shrunk to 2 layers of width 32 (built from the real config, random weights), so a step takes a fraction of a second;
the tokenizer comes from ``bash scripts/setup_real_models.sh`` (skipped without it)."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from mmgrpo.modalities import real_models

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "step_profile.py"
SMALL = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture
def small_smollm2(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM

    real = real_models.root() / "smollm2-135m-instruct"
    if not (real / "config.json").exists():
        pytest.skip("run `bash scripts/setup_real_models.sh` first (SmolLM2's config and tokenizer)")
    dest = tmp_path / "real" / "smollm2-135m-instruct"
    config = AutoConfig.from_pretrained(real, **SMALL, head_dim=16)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(dest)
    for f in real.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors") and not f.name.endswith(".gguf"):
            shutil.copy(f, dest / f.name)
    monkeypatch.setenv("MMGRPO_REAL_MODELS", str(tmp_path / "real"))
    return dest


@pytest.fixture
def step_profile(monkeypatch):
    from mmgrpo.modalities.tokens import decode

    monkeypatch.setattr(decode, "draw_token", decode.draw_token)  # the profiler marks it: restored after the test
    sys.path.insert(0, str(PATH.parent))
    spec = importlib.util.spec_from_file_location("step_profile", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(PATH.parent))


def test_phases_add_up_inside_the_step_and_a_variant_runs_beside(small_smollm2, step_profile, tmp_path):
    out = tmp_path / "profile"
    args = ["--warmup", "1", "--steps", "1", "--out", str(out), "--variant", "packed:model.args.packed_training=true"]
    assert step_profile.main(args) == 0
    result = json.loads((out / "step_profile.json").read_text())
    assert set(result["variants"]) == {"default", "packed"}
    for name, v in result["variants"].items():
        p = v["phases"]
        assert p["rollout"]["calls"] == 1 and p["update"]["calls"] == 1, name
        step_ms = p["step"]["wall_ms_per_step"]
        assert p["rollout"]["wall_ms_per_step"] + p["update"]["wall_ms_per_step"] <= step_ms, name
        assert 0 < p["decode_step"]["calls"] <= 31 and p["sampling"]["calls"] == p["decode_step"]["calls"] + 1, name
        assert 0 < p["update"]["aten_ops"] < p["step"]["aten_ops"], name
        assert v["top_cpu"] and v["top_device"] == [], name  # the CPU: no device table
    default, packed = result["variants"]["default"]["phases"], result["variants"]["packed"]["phases"]
    assert packed["update"]["aten_ops"] < default["update"]["aten_ops"]  # one decoder pass, not prefill + completions
