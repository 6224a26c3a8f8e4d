"""Issue 53, the export of a real-model run (``modalities/_hf.py`` ``export_info`` / ``save_policy``, the model card of
``mmgrpo/checkpoint.py``, ``TokenPolicy.sampling_settings``): the card names the architecture, the base model and a
text-only causal LM's pipeline tag (``text-generation``, not the VLM family's), its snippet imports no mmgrpo; the
LoRA adapter's ``base_model_name_or_path`` is the real model's directory, which ``AutoPeftModelForCausalLM`` loads;
``sampling_settings`` are those the run sampled with. No real weights: a tiny random Llama stands in the real-models
directory under the name ``smollm2-135m-instruct``."""

import json
from pathlib import Path

import pytest
import yaml

from mmgrpo.loader import load_config
from mmgrpo.modalities import real_models
from mmgrpo.plugins import ADAPTERS
from mmgrpo.run_dir import model_files
from tests.test_prefix_sharing import text_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_smollm2(tmp_path, monkeypatch):
    """``MMGRPO_REAL_MODELS`` with a tiny random Llama (and the tiny tokenizer) as ``smollm2-135m-instruct``."""
    monkeypatch.setenv("MMGRPO_REAL_MODELS", str(tmp_path / "real"))
    directory = tmp_path / "real" / "smollm2-135m-instruct"
    model, tok = text_model("llama")
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    (directory / "complete.json").write_text(json.dumps({"format": real_models.FORMAT}))
    return directory


def _cfg(tmp_path, lora: bool):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "adapter": "vlm",
                    "args": {"name_or_path": "SmolLM2-135M-Instruct", "temperature": 0.7, "max_new_tokens": 8},
                    "lora": {"enabled": lora, "r": 2, "alpha": 4},
                },
                "task": {"name": "arithmetic", "args": {"train_size": 8, "eval_size": 2}},
                "rewards": [{"name": "last_number"}],
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    return load_config(config)


def _adapter(cfg):
    return ADAPTERS.get("vlm")(cfg.model.args, lora=cfg.model.lora, dtype="float32")


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_export_of_a_real_model_run_describes_it_and_loads_outside_mmgrpo(fake_smollm2, tmp_path, lora):
    cfg = _cfg(tmp_path, lora)
    adapter = _adapter(cfg)
    out = tmp_path / "export"
    adapter.save_pretrained(str(out))
    files = model_files(cfg, adapter, step=3)
    card, sampling = files["README.md"], json.loads(files["mmgrpo_sampling.json"])
    header = yaml.safe_load(card.split("---")[1])
    assert header["pipeline_tag"] == "text-generation" and header["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "built-in tiny" not in card and "image-text-to-text" not in card
    usage = card.split("## Use")[1].split("## Sampling")[0]
    assert "import mmgrpo" not in usage and "from mmgrpo" not in usage  # plain transformers (+ peft)
    assert "LlamaForCausalLM" in usage and "AutoTokenizer" in usage
    assert str(fake_smollm2) in card and "smollm2-135m-instruct" in card
    assert sampling["sampling_settings"] == {
        "do_sample": True,
        "max_new_tokens": 8,
        "min_new_tokens": 0,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
    }
    assert "temperature=0.7" in card and "top_k=0" in card
    if lora:
        config = json.loads((out / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(fake_smollm2)
        from peft import AutoPeftModelForCausalLM

        loaded = AutoPeftModelForCausalLM.from_pretrained(str(out))  # the base resolves without mmgrpo
        assert type(loaded.get_base_model()).__name__ == "LlamaForCausalLM"


def test_a_built_in_tiny_model_keeps_its_card_and_a_local_path_is_made_absolute(tmp_path, monkeypatch):
    from mmgrpo.modalities._hf import exported_base

    cfg = load_config(ROOT / "configs" / "quickstart.yaml", ["model.lora.enabled=true", "model.lora.r=2"])
    adapter = ADAPTERS.get("vlm")(cfg.model.args, lora=cfg.model.lora)
    card = model_files(cfg, adapter, step=1)["README.md"]
    assert "pipeline_tag: image-text-to-text" in card and "built-in tiny" in card  # as before issue 53
    (tmp_path / "my_model").mkdir()
    monkeypatch.chdir(tmp_path)
    assert exported_base(adapter.model, "my_model") == str(tmp_path / "my_model")
    assert exported_base(adapter.model, "org/hub-model") == "org/hub-model"
