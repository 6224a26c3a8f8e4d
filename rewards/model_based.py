"""Model-based rewards: CLIP score (open_clip) and PickScore (transformers ``CLIPModel``).

Both are small classes with the reward ``__call__``: build once (weights load in ``__init__``), call per batch,
``close()`` to free the model. They score (image, text) pairs in batches of ``batch_size`` on ``device``:

- an **image generator**'s completions are images (PIL, ``HWC`` uint8 arrays or ``CHW`` float tensors in
  [0, 1]); the text is the prompt (or the ``text_key`` column);
- a **VLM**'s completions are text (e.g. captions); the image is the ``image_key`` column (default ``"image"``;
  the first image when a sample has a list).

A pair with no image or no text scores ``None``. The loading paths are the real ones
(``open_clip.create_model_and_transforms(name, pretrained=...)``, ``CLIPModel.from_pretrained(...)``); the
hubs must be reachable or the weights cached (tests build tiny models from config instead). Each registers a
``load_check`` (:func:`_clip_weights`, :func:`_pickscore_weights`) that the load-time check runs before any
model loads: weights that are neither a local path, nor in the cache, nor (not offline) on a hub that answers
stop the run there in one line naming the option to set (:mod:`mmgrpo.rewards.weights`).

Scaling used by each anchor (Flow-GRPO ``flow_grpo/pickscore_scorer.py`` and ``flow_grpo/clip_scorer.py``
(yifan123/flow_grpo); DanceGRPO (XueZeyue/DanceGRPO)):

===============  =====================================================================================
CLIP score       ``cosine`` = cos(e_I, e_T) (default); ``flow_grpo`` = exp(logit_scale)·cos / 30
                 (= 100·cos/30 for OpenAI CLIP, Flow-GRPO ``clip_scorer.py``); ``hessel`` =
                 2.5·max(cos, 0) (CLIPScore, Hessel et al. 2021); ``torchmetrics`` = 100·max(cos, 0)
PickScore        ``raw`` = exp(logit_scale)·cos (default; the papers' ~21–24 values, Kirstain et al. 2023);
                 ``flow_grpo`` = raw / 26 (Flow-GRPO ``pickscore_scorer.py``); ``cosine`` = cos
                 (DanceGRPO)
===============  =====================================================================================
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ._common import column
from .parsing import completion_text, prompt_text
from .registry import register_reward
from .weights import hf_offline, hub_weights_problem

_CLIP_SCALES = ("cosine", "flow_grpo", "hessel", "torchmetrics")
_PICK_SCALES = ("raw", "flow_grpo", "cosine")


def _is_image(x: Any) -> bool:
    return (
        (hasattr(x, "convert") and hasattr(x, "size"))
        or isinstance(x, torch.Tensor)
        or hasattr(x, "__array_interface__")
    )


def to_pil(x: Any):
    """A PIL RGB image from a PIL image, an ``HWC`` uint8 array or a ``CHW`` float tensor in [0, 1]."""
    from PIL import Image

    if hasattr(x, "convert"):
        return x.convert("RGB")
    if isinstance(x, torch.Tensor):
        from torchvision.transforms.functional import to_pil_image

        return to_pil_image(x.detach().float().clamp(0, 1).cpu()).convert("RGB")
    return Image.fromarray(x).convert("RGB")


def _pairs(completions: list, prompts: list | None, columns: dict, image_key: str, text_key: str | None, name: str):
    """``(images, texts)`` per sample (``None`` where missing), for generated images or generated text."""
    n = len(completions)
    if n and all(c is None or _is_image(c) for c in completions):
        if text_key is not None:
            texts = [None if t is None else str(t) for t in column(columns, text_key, name, n)]
        elif prompts is not None:
            texts = [None if p is None else prompt_text(p) for p in prompts]
        else:
            raise ValueError(f"reward {name!r} scores generated images against text: pass prompts or set text_key")
        return list(completions), texts
    images = list(column(columns, image_key, name, n))
    images = [im[0] if isinstance(im, (list, tuple)) and im else im for im in images]
    return images, [completion_text(c) for c in completions]


def _batched(
    images: list, texts: list, batch_size: int, score: Callable[[list, list], torch.Tensor]
) -> list[float | None]:
    out: list[float | None] = [None] * len(images)
    idx = [i for i, (im, t) in enumerate(zip(images, texts)) if im is not None and t is not None]
    for start in range(0, len(idx), batch_size):
        chunk = idx[start : start + batch_size]
        values = score([to_pil(images[i]) for i in chunk], [texts[i] for i in chunk])  # [n]
        for i, v in zip(chunk, values.tolist()):
            out[i] = float(v)
    return out


def _device(device: str | torch.device | None) -> torch.device:
    return torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _PairScorer:
    """What the CLIP-family scorers share: the call (image/text pairs from the batch, scored in batches under a
    lock) and ``close``. A subclass sets ``name``, ``image_key``, ``text_key``, ``batch_size``, ``model`` and
    ``_lock`` and defines ``_score(images, texts) -> Tensor[n]``."""

    name: str

    def __call__(self, completions: list, *, prompts: list | None = None, **columns: Any) -> list[float | None]:
        images, texts = _pairs(completions, prompts, columns, self.image_key, self.text_key, self.name)
        with self._lock:
            return _batched(images, texts, self.batch_size, self._score)

    def close(self) -> None:
        """Drop the model (and free its GPU memory)."""
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _defaults(cls: type, kwargs: dict) -> dict:
    """``kwargs`` over the defaults of ``cls.__init__``."""
    params = inspect.signature(cls.__init__).parameters
    return {**{n: p.default for n, p in params.items() if p.default is not p.empty}, **kwargs}


def _clip_weights(kwargs: dict) -> str | None:
    """Can :class:`CLIPScore` find its weights with ``kwargs``? (The registered ``load_check``.)"""
    o = _defaults(CLIPScore, kwargs)
    model_name, pretrained, cache_dir = str(o["model_name"]), o["pretrained"], o["cache_dir"]
    fix = "set kwargs.pretrained to a local open_clip checkpoint file, or fill the cache where the hub is reachable"
    if model_name.startswith("hf-hub:"):
        problem = hub_weights_problem(model_name[len("hf-hub:") :], cache_dir=cache_dir)
        return None if problem is None else f"model_name {problem}; {fix} (`hf download {model_name[7:]}`)"
    if not pretrained or Path(os.path.expanduser(str(pretrained))).is_file():
        return None  # random weights (tests), or a checkpoint file
    import open_clip

    cfg = open_clip.get_pretrained_cfg(model_name, str(pretrained))
    if not cfg:
        return (
            f"pretrained {pretrained!r} is neither a file nor a tag open_clip knows for model_name {model_name!r} "
            "(open_clip.list_pretrained() lists them); set kwargs.pretrained to one of those or to a checkpoint file"
        )
    if cfg.get("hf_hub"):
        repo, filename = os.path.split(cfg["hf_hub"])  # as open_clip: "org/model/" names its default file
        names = (filename,) if filename else ("open_clip_pytorch_model.bin", "open_clip_model.safetensors")
        problem = hub_weights_problem(repo, cache_dir=cache_dir, filenames=names)
        return None if problem is None else f"pretrained {pretrained!r}: {problem}; {fix} (`hf download {repo}`)"
    url = cfg.get("url", "")
    cached = Path(os.path.expanduser(cache_dir or "~/.cache/clip")) / os.path.basename(url)
    if url and not cached.is_file() and hf_offline():
        return f"pretrained {pretrained!r}: {cached} is not there and HF_HUB_OFFLINE is set; {fix} ({url})"
    return None


def _pickscore_weights(kwargs: dict) -> str | None:
    """Can :class:`PickScore` find its model and processor with ``kwargs``? (The registered ``load_check``.)"""
    o = _defaults(PickScore, kwargs)
    for option in ("model_name", "processor_name"):
        problem = hub_weights_problem(str(o[option]))
        if problem is not None:
            return (
                f"{option} {problem}; set kwargs.{option} to a local directory holding it, or fill the cache where "
                f"the hub is reachable (`hf download {o[option]}`)"
            )
    return None


@register_reward(
    "clip_score",
    "CLIP image-text similarity via open_clip (cosine by default; Flow-GRPO /30, Hessel 2.5*max(cos,0) scalings)",
    load_check=_clip_weights,
)
class CLIPScore(_PairScorer):
    """CLIP score of (image, text) pairs with open_clip.

    ``cos = ⟨e_I/‖e_I‖, e_T/‖e_T‖⟩`` from ``model.encode_image`` / ``encode_text``; the reward is ``cos`` scaled
    by ``scale`` (module docstring table).

    Source: Radford et al. 2021 (CLIP), Hessel et al. 2021 (CLIPScore, arXiv 2104.08718). Flow-GRPO uses
    ``openai/clip-vit-large-patch14`` with ``flow_grpo`` scaling; MixGRPO uses DFN5B ViT-H-14-384 via open_clip
    (Flow-GRPO ``flow_grpo/pickscore_scorer.py`` and ``flow_grpo/clip_scorer.py`` (yifan123/flow_grpo); DanceGRPO
    (XueZeyue/DanceGRPO)).

    Args:
        model_name: an open_clip model name (``open_clip.list_models()``), e.g. ``"ViT-L-14"``.
        pretrained: an open_clip pretrained tag or a checkpoint path (``"openai"``), or ``None`` for random
            weights (tests).
        scale: one of ``cosine``, ``flow_grpo``, ``hessel``, ``torchmetrics``.
        device: defaults to CUDA when available. batch_size: pairs per forward pass.
        precision: open_clip precision (``"fp32"``, ``"bf16"``, ``"fp16"``...).
        image_key / text_key: columns to read images (for text completions) or texts (for image completions;
            default: the prompts).
    """

    name = "clip_score"

    def __init__(
        self,
        model_name: str = "ViT-L-14",
        pretrained: str | None = "openai",
        *,
        scale: str = "cosine",
        device: str | torch.device | None = None,
        batch_size: int = 32,
        precision: str = "fp32",
        image_key: str = "image",
        text_key: str | None = None,
        cache_dir: str | None = None,
    ):
        import open_clip

        if scale not in _CLIP_SCALES:
            raise ValueError(f"CLIPScore: scale must be one of {_CLIP_SCALES}, got {scale!r}")
        self.scale, self.batch_size, self.image_key, self.text_key = scale, int(batch_size), image_key, text_key
        self.device = _device(device)
        model, _, preprocess = open_clip.create_model_and_transforms(
            model_name, pretrained=pretrained, device=self.device, precision=precision, cache_dir=cache_dir
        )
        self.model = model.eval().requires_grad_(False)
        self.preprocess = preprocess
        self.tokenizer = open_clip.get_tokenizer(model_name, cache_dir=cache_dir)
        self._lock = threading.Lock()  # one forward at a time if two runners share this object

    @torch.no_grad()
    def cosine(self, images: list, texts: list[str]) -> torch.Tensor:
        """Cosine similarity of each (PIL image, text) pair. Shape: ``[n]`` float32 on CPU."""
        dtype = next(self.model.parameters()).dtype
        pixels = torch.stack([self.preprocess(im) for im in images]).to(self.device, dtype)  # [n, 3, H, W]
        tokens = self.tokenizer(texts).to(self.device)  # [n, ctx]
        e_i = self.model.encode_image(pixels, normalize=True).float()  # [n, D]
        e_t = self.model.encode_text(tokens, normalize=True).float()  # [n, D]
        return (e_i * e_t).sum(-1).cpu()  # [n]

    def _score(self, images: list, texts: list[str]) -> torch.Tensor:
        cos = self.cosine(images, texts)  # [n]
        if self.scale == "cosine":
            return cos
        if self.scale == "flow_grpo":
            return self.model.logit_scale.exp().float().cpu() * cos / 30.0
        if self.scale == "hessel":
            return 2.5 * cos.clamp(min=0)
        return 100.0 * cos.clamp(min=0)


@register_reward(
    "pickscore",
    "PickScore human-preference score via transformers CLIPModel (raw exp(s)*cos ~21-24; Flow-GRPO /26)",
    load_check=_pickscore_weights,
)
class PickScore(_PairScorer):
    """PickScore of (image, prompt) pairs.

    Source: Kirstain et al. 2023, "Pick-a-Pic" (arXiv 2305.01569); Flow-GRPO ``pickscore_scorer.py`` and
    DanceGRPO scalings (Flow-GRPO ``flow_grpo/pickscore_scorer.py`` and ``flow_grpo/clip_scorer.py``
    (yifan123/flow_grpo); DanceGRPO (XueZeyue/DanceGRPO)).

    ``score = exp(logit_scale) · ⟨e_T/‖e_T‖, e_I/‖e_I‖⟩`` with ``CLIPModel`` ``yuvalkirstain/PickScore_v1`` and
    the processor of ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``; ``scale`` as in the module docstring table
    (``raw``; Flow-GRPO ``/26``; DanceGRPO ``cosine``).

    Args:
        model_name / processor_name: hub ids or local directories for ``from_pretrained``.
        scale: one of ``raw``, ``flow_grpo``, ``cosine``.
        device: defaults to CUDA when available. dtype: model dtype (e.g. ``torch.bfloat16``; default fp32).
        batch_size: pairs per forward pass. image_key / text_key: as for :class:`CLIPScore`.
    """

    name = "pickscore"

    def __init__(
        self,
        model_name: str = "yuvalkirstain/PickScore_v1",
        processor_name: str = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        *,
        scale: str = "raw",
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        batch_size: int = 16,
        image_key: str = "image",
        text_key: str | None = None,
    ):
        from transformers import AutoProcessor, CLIPModel

        if scale not in _PICK_SCALES:
            raise ValueError(f"PickScore: scale must be one of {_PICK_SCALES}, got {scale!r}")
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self.scale, self.batch_size, self.image_key, self.text_key = scale, int(batch_size), image_key, text_key
        self.device = _device(device)
        self.processor = AutoProcessor.from_pretrained(processor_name)
        model = CLIPModel.from_pretrained(model_name, dtype=dtype or torch.float32)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.max_length = int(self.model.config.text_config.max_position_embeddings)
        self._lock = threading.Lock()  # one forward at a time if two runners share this object

    @torch.no_grad()
    def cosine(self, images: list, texts: list[str]) -> torch.Tensor:
        """Cosine similarity of each (PIL image, text) pair. Shape: ``[n]`` float32 on CPU."""
        inputs = self.processor(
            images=images, text=texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        dtype = next(self.model.parameters()).dtype
        inputs = {
            k: (v.to(self.device, dtype) if k == "pixel_values" else v.to(self.device)) for k, v in inputs.items()
        }
        out = self.model(**inputs)
        e_i = torch.nn.functional.normalize(out.image_embeds.float(), dim=-1)  # [n, D]
        e_t = torch.nn.functional.normalize(out.text_embeds.float(), dim=-1)  # [n, D]
        return (e_i * e_t).sum(-1).cpu()  # [n]

    def _score(self, images: list, texts: list[str]) -> torch.Tensor:
        cos = self.cosine(images, texts)  # [n]
        if self.scale == "cosine":
            return cos
        raw = self.model.logit_scale.exp().float().cpu() * cos
        return raw if self.scale == "raw" else raw / 26.0
