"""Optional adapter capabilities (mmgrpo.types) are checked at config load, before any model is built."""

from pathlib import Path

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.modalities.flow.adapter import FlowAdapter
from mmgrpo.modalities.speech.adapter import WhisperAdapter
from mmgrpo.modalities.speech.audio_llm import AudioLLMAdapter
from mmgrpo.modalities.video.adapter import VideoAdapter
from mmgrpo.modalities.vlm.adapter import VLMAdapter
from mmgrpo.types import ExactKL, RatioNormInputs, SupervisedLoss, SyncReference, capabilities

ROOT = Path(__file__).resolve().parents[1]


def test_declared_capabilities_of_the_builtin_adapters():
    assert capabilities(VLMAdapter) == {
        "supervised_loss",
        "sync_reference",
        "use_engine",
        "multi_turn",
    }  # vLLM: text + images
    assert capabilities(VideoAdapter) == {
        "supervised_loss",
        "sync_reference",
        "use_engine",
        "multi_turn",
    }  # vLLM: + videos
    assert capabilities(AudioLLMAdapter) == {
        "supervised_loss",
        "sync_reference",
        "use_engine",
        "multi_turn",
    }  # vLLM: + audio
    assert capabilities(WhisperAdapter) == {"supervised_loss", "sync_reference", "use_engine"}  # vLLM: enc-dec
    assert capabilities(FlowAdapter) == {"exact_kl", "ratio_norm_inputs"}
    assert issubclass(FlowAdapter, ExactKL) and issubclass(FlowAdapter, RatioNormInputs)
    assert issubclass(VLMAdapter, SupervisedLoss) and issubclass(VLMAdapter, SyncReference)
    assert not issubclass(VLMAdapter, ExactKL)


@pytest.mark.parametrize(
    "config, overrides, message",
    [
        ("quickstart.yaml", ["algorithm.kl=gaussian_exact"], "gaussian_exact needs an adapter with exact_kl()"),
        (
            "quickstart.yaml",
            ["algorithm.ratio_norm=true"],
            "ratio_norm: true needs an adapter with ratio_norm_inputs()",
        ),
        ("flow_grpo.yaml", ["warmup.steps=2"], "warmup.steps > 0 needs an adapter with supervised_loss()"),
    ],
)
def test_missing_capability_is_a_one_line_config_error(config, overrides, message, tmp_path, monkeypatch):
    monkeypatch.setenv("MMGRPO_CACHE", str(tmp_path))  # nothing may be built: the cache stays empty
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / config, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_warmup_needs_a_task_with_warmup_rows():
    overrides = ["model.adapter=vlm", "model.args={}", "task.name=t2i_prompts", "task.args={}", "warmup.steps=2"]
    with pytest.raises(
        ConfigError, match=r"task .t2i_prompts. has no warm-up rows of its own; set warmup\.target_column"
    ):
        load_config(ROOT / "configs/quickstart.yaml", overrides)


def test_needed_capabilities_that_exist_load():
    load_config(ROOT / "configs/flow_temporal.yaml", ["algorithm.ratio_norm=true"])
    load_config(ROOT / "configs/quickstart.yaml", ["warmup.steps=2"])
