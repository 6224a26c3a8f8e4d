"""Video LLM policies: video (+ text, + images) → text; the action units are generated tokens.

Covers the Qwen2-VL / Qwen2.5-VL video path (and any processor that takes ``videos=`` with ``video_metadata``).
:class:`VideoAdapter` is the token policy of :mod:`mmgrpo.modalities.vlm` composed with two media encoders,
``[ImageEncoder, VideoEncoder]`` (:mod:`mmgrpo.modalities.tokens.media`, :mod:`mmgrpo.modalities.tokens.video`),
so sampling, log-probs, the reference policy, LoRA and warm-up are the token policy's, unchanged. Frame
sampling, the time axis (``second_per_grid_ts`` from the really sampled fps) and the decode cache are the video
encoder's; see its module.

T-GRPO temporal contrast (Video-R1, Feng et al. 2025, arXiv 2503.21776 §3.2; tulerfeng/Video-R1
``grpo_trainer.py``). With ``temporal_contrast.enabled``, every video prompt also gets ``num_shuffled``
(default G/2) completions sampled on its frames permuted along time (a uniformly random permutation from
torch's global RNG, redrawn if it is the identity; the timestamps and ``second_per_grid_ts`` stay those of the
ordered clip, as in Video-R1, which re-processes the permuted tensor).
They are sampled without gradient and are *not* part of the rollout: they have no log-probs, no mask, no
advantage. Only their decoded text reaches the rewards, in the ``shuffled_completions`` column, where the
``temporal_contrast`` reward (:mod:`mmgrpo.rewards.video`) scores them with the target reward and turns the two
accuracies into the T-GRPO bonus. Departure from Video-R1: the statistics are computed by a reward, so the
target reward, μ, α and the correctness threshold are configuration rather than "reward column 0, 0.8, 0.3, 0.1".

With ``rollout.engine: vllm`` the ordered rollouts are sampled by the vLLM server, which gets the encoder's very
frames and their sampling metadata (the token policy's ``_engine_prompts``, docs/scale.md); a clip whose text-after-
video positions differ between transformers and vLLM is refused (:meth:`VideoAdapter._check_engine_positions`). The
shuffled-frame rollouts stay native.

Extra reward columns (``Rollout.extras``, B values each): ``group_id`` (the prompt of each sample: video
prompts share their question text, so "equal prompts" cannot identify a group), ``sample_fps``,
``frame_timestamps`` (seconds of the frames the model saw), ``duration`` (the row's own, else the decoded
clip's ``total / video_fps``), and ``shuffled_completions`` when the contrast is on (``None`` for rows without
video).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from mmgrpo import noise
from mmgrpo.config import ConfigError, RolloutConfig
from mmgrpo.plugins import ADAPTERS, AdapterSpec, BuildContext, Inputs, serves
from mmgrpo.types import Answer, Rollout

from .. import model_names
from ..tokens.engine import EngineError, EnginePrompt
from ..tokens.media import ImageEncoder
from ..tokens.video import Clip, VideoEncoder, VideoSampling, decode_clip, fetch_video, shuffle_frames
from ..vlm.adapter import VLMAdapter, VLMArgs, load_vlm_model
from ..vlm.tiny import NAMES, resolve_model_path

SHUFFLED_NOISE = 0x5F1E
"""Tag mixed into the seed of the T-GRPO shuffled rollouts' keyed noise (apart from the ordered rollouts')."""


@dataclass
class TemporalContrastArgs:
    """T-GRPO extra rollouts on frame-shuffled video (Video-R1 §3.2); the bonus itself is the
    ``temporal_contrast`` reward, which holds μ, α, the threshold and the target reward."""

    enabled: bool = False
    """Sample completions on frame-shuffled clips and put their text in the shuffled_completions column."""
    num_shuffled: int | None = None
    """Shuffled completions per video prompt; None = G // 2 (Video-R1)."""


@dataclass
class VideoArgs(VLMArgs):
    """Options under ``model.args`` for ``model.adapter: video`` (all of ``vlm``'s, plus these)."""

    video: VideoSampling = field(default_factory=VideoSampling)
    """Frame sampling and resizing."""
    temporal_contrast: TemporalContrastArgs = field(default_factory=TemporalContrastArgs)
    """T-GRPO shuffled-frame rollouts (statistics only)."""
    decode_cache_mb: float = 1024.0
    """Memory for decoded file clips kept across steps (LRU, uint8 frames; 0 = decode every step)."""


class VideoAdapter(VLMAdapter):
    """The token policy with ``[ImageEncoder, VideoEncoder]`` and the T-GRPO shuffled-frame rollouts."""

    PIPELINE_TAG = "video-text-to-text"

    args: VideoArgs

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        args: VideoArgs,
        reference: torch.nn.Module | None,
        rollout: RolloutConfig | None = None,
    ):
        if getattr(processor, "video_processor", None) is None:
            raise ConfigError(
                f"model.args.name_or_path {args.name_or_path!r}: its processor {type(processor).__name__} has no "
                "video_processor; the video adapter needs a video-capable processor (Qwen2-VL, Qwen2.5-VL...)"
            )
        self.video = VideoEncoder(processor, args.video, args.decode_cache_mb)
        image_size = getattr(getattr(processor, "image_processor", None), "size", None)
        encoders = [ImageEncoder(args.min_pixels, args.max_pixels, image_size), self.video]
        super().__init__(model, processor, args, reference, encoders=encoders, rollout=rollout)

    def _engine_prompts(self, prompts: list[dict], encodings: list[dict[str, Tensor]]) -> list[EnginePrompt]:
        """The token policy's engine requests, after checking that vLLM would place each prompt as the trainer does."""
        for i, enc in enumerate(encodings):
            self._check_engine_positions(i, enc)
        return super()._engine_prompts(prompts, encodings)

    def _check_engine_positions(self, i: int, enc: dict[str, Tensor]) -> None:
        """Refuse a clip whose text-after-video positions differ between the trainer and vLLM (docs/scale.md).

        Qwen2/2.5-VL's mRoPE gives temporal grid step k the position ``int(k · second_per_grid_ts ·
        tokens_per_second)`` in both. The text after the video then starts, in transformers 5.x (the trainer), at the
        video's start + max(h, w) (merged grid), and in vLLM (as in Qwen's reference) at the largest video position +
        1. Both agree while the last temporal position is below max(h, w); past it the engine samples with every later
        token shifted, off-policy. Checked for Qwen2-VL and Qwen2.5-VL (one grid per video).
        """
        config = self._unwrapped().config
        if "video_grid_thw" not in enc or config.model_type not in ("qwen2_vl", "qwen2_5_vl"):
            return  # other families (Qwen3-VL: a grid per frame, timestamps in the text) are not checked here
        vision = getattr(config, "vision_config", None)
        merge = int(getattr(vision, "spatial_merge_size", 2))
        per_second = float(getattr(vision, "tokens_per_second", 1.0))
        seconds = enc.get("second_per_grid_ts", torch.ones(len(enc["video_grid_thw"])))
        for (t, h, w), s in zip(enc["video_grid_thw"].tolist(), seconds.reshape(-1).tolist()):
            step = s * per_second if "second_per_grid_ts" in enc else 1.0
            last, spatial = int((t - 1) * step), max(h, w) // merge
            if last >= spatial:
                raise EngineError(
                    f"prompt {i}: a video of {t} temporal steps on a {h // merge}x{w // merge} token grid (last "
                    f"temporal position {last} >= {spatial}): transformers and vLLM place the text after it "
                    "differently, so the engine would sample off-policy; use larger frames (model.args.video.min_pixels"
                    " / max_pixels), fewer frames or a lower fps, or rollout.engine: native (docs/scale.md)"
                )

    def augment_video(self, row: dict, std: float, seed: int) -> dict:
        """DeepVideo-R1's noise on an easy row (:class:`mmgrpo.augmentation.VideoAugment`): its frames get
        N(0, std²) per pixel value from a generator seeded by ``seed`` when the video encoder reads them."""
        if row.get("video") is None:
            return row
        return {**row, "video_noise_std": float(std), "video_noise_seed": int(seed)}

    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        with self._media_scope():  # the shuffled rollouts reuse the clips the ordered ones decoded
            rollout = super().rollout(prompts, group_size, keys)
            if self.args.temporal_contrast.enabled:
                shuffled = self._shuffled_completions(prompts, group_size, keys)
                rollout.extras["shuffled_completions"] = [s for s in shuffled for _ in range(group_size)]
                rollout.validate()
        return rollout

    @torch.no_grad()
    def evaluate(self, prompts: list[dict]) -> list[Answer]:
        """One greedy answer per prompt (:class:`Answer`, with the rollout's reward columns); with the temporal
        contrast on, ``shuffled_completions`` is None: a held-out answer has no shuffled samples, so the
        ``temporal_contrast`` reward does not apply to it (None) instead of missing its column."""
        outputs = super().evaluate(prompts)
        if self.args.temporal_contrast.enabled:
            for output in outputs:
                output.columns.setdefault("shuffled_completions", None)
        return outputs

    @torch.no_grad()
    def _shuffled_completions(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None) -> list:
        """T-GRPO statistics rollouts: ``num_shuffled`` completions per video prompt on permuted frames.

        No gradient, no log-probs: only the decoded texts are returned (``None`` for rows without video).
        """
        n = self.args.temporal_contrast.num_shuffled or max(1, group_size // 2)
        video_rows = [i for i, row in enumerate(prompts) if row.get("video") is not None]
        out: list = [None] * len(prompts)
        if not video_rows:
            return out
        # Under the trainer's keyed rollout noise the shuffled rollouts get keys of their own (mmgrpo/noise.py):
        # the video prompts' global positions, n samples each, under a seed apart from the ordered rollouts'; the
        # permutation of each prompt comes from its group-shared generator. Otherwise both use the global RNG.
        if keys is not None:
            keys = noise.NoiseKeys(
                noise.mix(keys.seed, SHUFFLED_NOISE), keys.step, tuple(keys.positions[i] for i in video_rows), n
            )
        orders = keys.generators(shared=True) if keys is not None else [None] * len(video_rows)
        encodings = []
        for i, generator in zip(video_rows, orders, strict=True):
            clip = self.video.clip(prompts[i])  # pinned: no decode
            shuffled, _ = shuffle_frames(clip.frames, generator)
            encodings.append(
                self._encode_prompt(prompts[i], media={"video": [VideoEncoder.with_frames(clip, shuffled)]})
            )
        texts = self._decode(self._sample(encodings, n, False, keys)[0])  # [len(video_rows)·n]
        for j, i in enumerate(video_rows):
            out[i] = texts[j * n : (j + 1) * n]
        return out


def _load_video(a: VideoArgs, ctx: BuildContext) -> VideoAdapter:
    """The ``video`` family's loader (:class:`~mmgrpo.plugins.AdapterSpec`).

    The video options are checked first; the model, processor, LoRA and reference come from the ``vlm`` family's
    :func:`~..vlm.adapter.load_vlm_model` (with the options it knows), so both adapters load and validate the shared
    options the same way.
    """
    v = a.video
    if v.nframes is None and (v.fps is None or v.fps <= 0):
        raise ConfigError(f"model.args.video.fps: must be > 0 when nframes is not set, got {v.fps}")
    if v.nframes is not None and v.nframes < 2:
        raise ConfigError(f"model.args.video.nframes: must be >= 2 (frames come in temporal pairs), got {v.nframes}")
    if v.min_frames > v.max_frames:
        raise ConfigError(f"model.args.video.min_frames ({v.min_frames}) must be <= max_frames ({v.max_frames})")
    if v.min_pixels > v.max_pixels:
        raise ConfigError(f"model.args.video.min_pixels ({v.min_pixels}) must be <= max_pixels ({v.max_pixels})")
    n = a.temporal_contrast.num_shuffled
    if n is not None and n < 1:
        raise ConfigError(f"model.args.temporal_contrast.num_shuffled: must be >= 1 or null (G // 2), got {n}")
    shared = {f.name: getattr(a, f.name) for f in fields(VLMArgs)}
    model, processor, reference = load_vlm_model(VLMArgs(**shared), ctx)
    return VideoAdapter(model, processor, a, reference, rollout=ctx.rollout)


build_video_adapter = ADAPTERS.register("video")(
    AdapterSpec(
        args=VideoArgs,
        cls=VideoAdapter,
        load=_load_video,
        inputs=Inputs(media=("image", "video")),
        engine_model=serves(resolve_model_path, max_videos=1),
        load_check=lambda a: model_names.name_problem(a.name_or_path, "vlm", NAMES),  # loads through the vlm family
    )
)

__all__ = [
    "Clip",
    "TemporalContrastArgs",
    "VideoAdapter",
    "VideoArgs",
    "VideoSampling",
    "build_video_adapter",
    "decode_clip",
    "fetch_video",
    "shuffle_frames",
]
