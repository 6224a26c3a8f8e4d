"""CLIP score (open_clip) and PickScore (transformers CLIPModel) on tiny models built from config (no download).

The rewards' real loading paths run: ``open_clip.create_model_and_transforms(name, pretrained=...)`` with a
registered tiny config (and a local checkpoint file), and ``CLIPModel.from_pretrained`` /
``AutoProcessor.from_pretrained`` on a directory saved from a tiny config.
"""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from mmgrpo.rewards import CLIPScore, PickScore, RewardRunner, load_reward

TINY_OPEN_CLIP = "mmgrpo-test-tiny-clip"


def _images(n: int) -> list:
    rng = np.random.RandomState(0)
    return [Image.fromarray(rng.randint(0, 255, (24 + 4 * i, 40, 3), dtype=np.uint8)) for i in range(n)]


TEXTS = ["a red cat", "blue dog", "green tree", "a cat on a mat", "sky"]


@pytest.fixture(scope="module")
def tiny_open_clip(tmp_path_factory):
    import open_clip

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("open_clip_cfg")
    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (d / f"{TINY_OPEN_CLIP}.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(d)
    model = open_clip.create_model(TINY_OPEN_CLIP, pretrained=None)
    ckpt = d / "tiny.pt"
    torch.save(model.state_dict(), ckpt)
    return str(ckpt)


def test_clip_score_formula_scales_and_batching(tiny_open_clip):
    images = _images(5)
    scorer = CLIPScore(TINY_OPEN_CLIP, pretrained=tiny_open_clip, device="cpu", batch_size=2)
    # hand computation from the same model's normalised embeddings
    with torch.no_grad():
        pix = torch.stack([scorer.preprocess(im) for im in images])
        e_i = scorer.model.encode_image(pix, normalize=True)
        e_t = scorer.model.encode_text(scorer.tokenizer(TEXTS), normalize=True)
    cos = (e_i * e_t).sum(-1)
    got = scorer(images, prompts=TEXTS)
    assert got == pytest.approx(cos.tolist(), abs=1e-5)
    assert len({round(v, 6) for v in got}) == 5  # a real model: different pairs, different scores
    assert scorer(images, prompts=TEXTS) == pytest.approx(
        CLIPScore(TINY_OPEN_CLIP, pretrained=tiny_open_clip, device="cpu", batch_size=16)(images, prompts=TEXTS),
        abs=1e-5,
    )
    scale = scorer.model.logit_scale.exp().item()
    for name, fn in {
        "flow_grpo": lambda c: scale * c / 30,
        "hessel": lambda c: 2.5 * max(c, 0.0),
        "torchmetrics": lambda c: 100 * max(c, 0.0),
    }.items():
        scorer.scale = name
        assert scorer(images, prompts=TEXTS) == pytest.approx([fn(c) for c in cos.tolist()], abs=1e-4), name


def test_clip_score_image_or_text_completions_and_missing_pairs(tiny_open_clip):
    images = _images(3)
    scorer = CLIPScore(TINY_OPEN_CLIP, pretrained=tiny_open_clip, device="cpu")
    generated_images = scorer(images, prompts=TEXTS[:3])  # an image generator's samples vs prompts
    captions = scorer(TEXTS[:3], prompts=["q"] * 3, image=[[im] for im in images])  # a VLM's captions vs images
    assert generated_images == pytest.approx(captions, abs=1e-5)
    arrays = [np.array(im) for im in images]
    tensors = [torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in arrays]
    assert scorer(arrays, prompts=TEXTS[:3]) == pytest.approx(generated_images, abs=1e-5)
    assert scorer(tensors, prompts=TEXTS[:3]) == pytest.approx(generated_images, abs=1e-2)
    out = scorer([images[0], None], prompts=["a", "b"])
    assert out[1] is None and isinstance(out[0], float)
    assert scorer(images[:2], prompts=["a", None])[1] is None
    assert scorer(images[:1], prompts=["ignored"], caption=["a red cat"], text_key="caption") is not None
    with pytest.raises(KeyError, match="needs the column 'image'"):
        scorer(["caption"], prompts=["p"])
    with pytest.raises(ValueError, match="scale must be one of"):
        CLIPScore(TINY_OPEN_CLIP, pretrained=None, scale="x")


def test_clip_score_through_registry_and_runner(tiny_open_clip):
    runner = RewardRunner(
        [("clip_score", 1.0, {"model_name": TINY_OPEN_CLIP, "pretrained": tiny_open_clip, "device": "cpu"})]
    )
    rewards, metrics = runner(_images(2), TEXTS[:2], {})
    direct = load_reward("clip_score", model_name=TINY_OPEN_CLIP, pretrained=tiny_open_clip, device="cpu")(
        _images(2), prompts=TEXTS[:2]
    )
    assert rewards[:, 0].tolist() == pytest.approx(direct, abs=1e-5)
    assert "reward/clip_score" in metrics
    runner.close()
    assert runner._rewards[0].model is None


@pytest.fixture(scope="module")
def tiny_pickscore_dir(tmp_path_factory):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("pickscore")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz":
        vocab[ch] = len(vocab)
        vocab[ch + "</w>"] = len(vocab)
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer.from_pretrained(d, model_max_length=77)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(d)
    text = dict(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=77,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
    )
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(d)
    return str(d)


def test_pickscore_formula_scales_and_loading_path(tiny_pickscore_dir):
    from transformers import AutoProcessor, CLIPModel

    images = _images(5)
    scorer = PickScore(tiny_pickscore_dir, tiny_pickscore_dir, device="cpu", batch_size=2)
    model, proc = CLIPModel.from_pretrained(tiny_pickscore_dir), AutoProcessor.from_pretrained(tiny_pickscore_dir)
    with torch.no_grad():  # PickScore's reference computation: exp(logit_scale) · <e_T, e_I>, one pair at a time
        expected = []
        for im, t in zip(images, TEXTS):
            out = model(**proc(images=[im], text=[t], padding=True, return_tensors="pt"))
            e_i = out.image_embeds / out.image_embeds.norm(dim=-1, keepdim=True)
            e_t = out.text_embeds / out.text_embeds.norm(dim=-1, keepdim=True)
            expected.append((model.logit_scale.exp() * (e_i * e_t).sum()).item())
    raw = scorer(images, prompts=TEXTS)
    assert raw == pytest.approx(expected, abs=1e-4)  # batched with padding == one at a time
    scorer.scale = "flow_grpo"
    assert scorer(images, prompts=TEXTS) == pytest.approx([r / 26 for r in expected], abs=1e-5)
    scorer.scale = "cosine"
    cos = scorer(images, prompts=TEXTS)
    assert cos == pytest.approx([r / model.logit_scale.exp().item() for r in expected], abs=1e-5)
    assert all(-1 <= c <= 1 for c in cos) and not any(math.isnan(c) for c in cos)
    assert scorer([None], prompts=["a"]) == [None]
    scorer.close()
    assert scorer.model is None


def test_pickscore_through_registry(tiny_pickscore_dir):
    fn = load_reward(
        "pickscore",
        model_name=tiny_pickscore_dir,
        processor_name=tiny_pickscore_dir,
        device="cpu",
        scale="flow_grpo",
        dtype="float32",
    )
    assert isinstance(fn, PickScore)
    rewards, _ = RewardRunner([(fn, 1.0, {})])(_images(2), [[{"role": "user", "content": "a cat"}]] * 2, {})
    assert rewards.shape == (2, 1) and not torch.isnan(rewards).any()
    with pytest.raises(ValueError, match="scale must be one of"):
        PickScore(tiny_pickscore_dir, tiny_pickscore_dir, scale="hessel")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_model_rewards_on_cuda_match_cpu(tiny_open_clip, tiny_pickscore_dir):
    images = _images(3)
    for build in (
        lambda device: CLIPScore(TINY_OPEN_CLIP, pretrained=tiny_open_clip, device=device),
        lambda device: PickScore(tiny_pickscore_dir, tiny_pickscore_dir, device=device),
    ):
        gpu = build("cuda")
        assert next(gpu.model.parameters()).is_cuda
        assert gpu(images, prompts=TEXTS[:3]) == pytest.approx(build("cpu")(images, prompts=TEXTS[:3]), abs=1e-3)
