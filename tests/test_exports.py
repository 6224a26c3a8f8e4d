"""Saved models outside mmgrpo: every family's export generates with the stock transformers / diffusers classes,
the model card tells a full fine-tune from a LoRA adapter and names the base model as the config did, and every
shipped config saves a final model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image

from mmgrpo.config import LoraConfig
from mmgrpo.loader import load_builtins, load_config
from mmgrpo.plugins import ADAPTERS
from mmgrpo.trainer import train

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TINY_RUN = [
    "steps=1",
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=2",
    "algorithm.minibatch_size=4",
    "model.args.max_new_tokens=4",
    "task.args.train_size=4",
    "task.args.eval_size=2",
    "warmup.steps=0",
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "logging.trackers=[]",
    "logging.progress=false",
    "logging.plot=false",
]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_saves_a_final_model(path):
    """`mmgrpo demo` needs checkpoints/final (or a step checkpoint) from every shipped config's run."""
    cfg = load_config(path)
    assert cfg.checkpoint.save_final, f"{path.name}: set checkpoint.save_final: true"


# ------------------------------------------------------------------------------------------- model card


@pytest.fixture(scope="module")
def quickstart_runs(tmp_path_factory, mmgrpo_cache):
    """checkpoints/final/model of a one-step quickstart run, full fine-tune and LoRA."""
    out = {}
    for kind, extra in (("full", []), ("lora", ["model.lora.enabled=true", "model.lora.r=4"])):
        run = tmp_path_factory.mktemp(kind) / "run"
        train(load_config(ROOT / "configs/quickstart.yaml", [f"output_dir={run}", *TINY_RUN, *extra]))
        out[kind] = run / "checkpoints/final/model"
    return out


def _generate_vlm(model, processor) -> torch.Tensor:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    enc = processor(text=[text], images=[Image.new("RGB", (56, 56), "red")], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    return out[:, enc["input_ids"].shape[1] :]


def test_full_fine_tune_card_and_plain_transformers_generate(quickstart_runs, mmgrpo_cache):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model_dir = quickstart_runs["full"]
    text = (model_dir / "README.md").read_text()
    card = ModelCard(text)
    assert "LoRA" not in text.split("## Training config")[0] and "the full fine-tuned model" in text
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "image-text-to-text"
    assert card.data.base_model is None  # a built-in tiny model is on no hub: no base_model metadata
    assert "`tiny-qwen2.5-vl`" in text and "resolve_model_path('tiny-qwen2.5-vl', seed=0)" in text
    assert str(mmgrpo_cache) not in text  # no path of this machine's cache
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    new = _generate_vlm(model, AutoProcessor.from_pretrained(model_dir))
    assert new.shape == (1, 3)


def test_lora_card_names_the_base_as_configured_and_loads_with_peft(quickstart_runs, mmgrpo_cache):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmgrpo.modalities.vlm.tiny import resolve_model_path

    model_dir = quickstart_runs["lora"]
    text = (model_dir / "README.md").read_text()
    card = ModelCard(text)
    assert "a LoRA adapter only" in text and card.data.library_name == "peft" and "lora" in card.data.tags
    assert json.loads((model_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-qwen2.5-vl"
    assert str(mmgrpo_cache) not in text and not (model_dir / "model.safetensors").exists()
    base = AutoModelForImageTextToText.from_pretrained(resolve_model_path("tiny-qwen2.5-vl", seed=0))
    model = PeftModel.from_pretrained(base, str(model_dir)).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    with_adapter = _generate_vlm(model, processor)
    merged = model.merge_and_unload()  # the documented route to plain transformers weights
    assert torch.equal(_generate_vlm(merged, processor), with_adapter)


def test_card_metadata_names_a_hub_base_model_and_a_users_path_as_given(tmp_path):
    from mmgrpo.checkpoint import model_card

    common = dict(task="dataset", step=3, seed=0, algorithm="grpo", rewards="`accuracy` × 1", sampling_call="")
    info = {"library": "transformers", "model_class": "Qwen2_5_VLForConditionalGeneration", "pipeline_tag": ""}
    hub = ModelCard(
        model_card({**info, "base_model": "Qwen/Qwen2.5-VL-3B-Instruct", "lora": True}, **common, config_text="")
    )
    assert hub.data.base_model == "Qwen/Qwen2.5-VL-3B-Instruct" and hub.data.library_name == "peft"
    assert "from_pretrained('Qwen/Qwen2.5-VL-3B-Instruct')" in hub.text
    mine = str(tmp_path / "my-model")
    local = ModelCard(model_card({**info, "base_model": mine, "lora": False}, **common, config_text=""))
    assert local.data.base_model is None and f"`{mine}` (path as the config named it)" in local.text


# ------------------------------------------------------------------------------- export per family


def _export(family: str, args: dict, directory: Path) -> Path:
    load_builtins()
    adapter = ADAPTERS.get(family)(args, seed=0, lora=LoraConfig(enabled=False))
    adapter.save_pretrained(str(directory))  # what checkpoint.save writes under model/
    return directory


def _speech_available() -> None:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")


def test_video_export_generates_from_a_video(mmgrpo_cache, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    d = _export("video", {"name_or_path": "tiny-qwen2.5-vl", "max_new_tokens": 4}, tmp_path / "video")
    model, processor = AutoModelForImageTextToText.from_pretrained(d).eval(), AutoProcessor.from_pretrained(d)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which way?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    frames = np.zeros((4, 56, 56, 3), dtype=np.uint8)
    enc = processor(text=[text], videos=[frames], return_tensors="pt")
    assert "pixel_values_videos" in enc
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, enc["input_ids"].shape[1] + 3)


def test_whisper_export_transcribes(mmgrpo_cache, tmp_path):
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    d = _export("whisper", {"name_or_path": "tiny-whisper"}, tmp_path / "whisper")
    model, processor = WhisperForConditionalGeneration.from_pretrained(d).eval(), AutoProcessor.from_pretrained(d)
    features = processor(np.zeros(16000, dtype=np.float32), sampling_rate=16000, return_tensors="pt").input_features
    out = model.generate(features, max_new_tokens=3, language="en", task="transcribe")
    assert out.shape[0] == 1 and out.shape[1] in (1, 2, 3)  # at most max_new_tokens, the decoder prompt stripped
    assert isinstance(processor.batch_decode(out, skip_special_tokens=True)[0], str)


def test_audio_llm_export_answers_from_audio(mmgrpo_cache, tmp_path):
    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

    d = _export("audio_llm", {"name_or_path": "tiny-qwen2-audio"}, tmp_path / "audio_llm")
    model, processor = Qwen2AudioForConditionalGeneration.from_pretrained(d).eval(), AutoProcessor.from_pretrained(d)
    messages = [{"role": "user", "content": [{"type": "audio", "audio_url": "a.wav"}, {"type": "text", "text": "?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    audio = np.zeros(16000, dtype=np.float32)
    enc = processor(text=[text], audio=[audio], sampling_rate=16000, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, enc["input_ids"].shape[1] + 3)


@pytest.mark.parametrize("name", ["tiny-janus", "tiny-janus-shapes"])
def test_janus_export_generates_an_image(name, mmgrpo_cache, tmp_path):
    """The export carries a JanusProcessor and a generation config Janus's image generate can read (also for the
    shipped model, saved without either)."""
    from transformers import AutoProcessor, JanusForConditionalGeneration

    d = _export("ar_image", {"name_or_path": name}, tmp_path / name)
    model, processor = JanusForConditionalGeneration.from_pretrained(d).eval(), AutoProcessor.from_pretrained(d)
    enc = processor(text=["a red circle top left"], generation_mode="image", return_tensors="pt")
    torch.manual_seed(0)
    tokens = model.generate(**enc, generation_mode="image", do_sample=True, guidance_scale=3.0)
    grid = model.config.vision_config.num_image_tokens
    assert tokens.shape == (1, grid)
    with torch.no_grad():
        decoded = model.decode_image_tokens(tokens).float()  # [1, H, W, 3] in [-1, 1]
    (pixels,) = processor.postprocess(list(decoded), return_tensors="pt")["pixel_values"]  # uint8
    size = model.config.vision_config.image_size
    assert pixels.dtype == torch.uint8 and size in pixels.shape and pixels.float().std() > 0


def test_flow_export_generates_in_diffusers(mmgrpo_cache, tmp_path):
    from diffusers import DiffusionPipeline

    d = _export("flow", {"name_or_path": "tiny-sd3", "resolution": 32, "device": "cpu"}, tmp_path / "flow")
    pipe = DiffusionPipeline.from_pretrained(d)
    image = pipe("a red circle", num_inference_steps=2, height=32, width=32).images[0]
    assert image.size == (32, 32)


def test_every_built_in_adapter_describes_its_export():
    load_builtins()
    for name in ADAPTERS.names():
        cls = ADAPTERS.get(name).cls
        assert callable(getattr(cls, "export_info", None)), f"{name}: {cls.__name__} has no export_info()"


def test_card_of_an_adapter_without_export_info_guesses_no_loader():
    from mmgrpo.checkpoint import model_card

    info = {"base_model": "org/model", "library": "", "model_class": "my_adapter", "lora": True, "pipeline_tag": ""}
    card = ModelCard(
        model_card(info, task="t", step=1, seed=0, algorithm="", rewards="", sampling_call="", config_text="")
    )
    assert card.data.library_name is None and "from transformers" not in card.text and "from diffusers" not in card.text
    assert "my_adapter adapter's save_pretrained()" in card.text and "# mmgrpo policy: t, 1 step\n" in card.text
