"""Video LLM policies: video (+ text, + images) → text on the VLM core; the action units are generated tokens.

Covers the Qwen2-VL / Qwen2.5-VL video path (and any processor that takes ``videos=`` with ``video_metadata``).
:class:`VideoAdapter` is :class:`~mmgrpo.modalities.vlm.VLMAdapter` with its prompt encoding replaced, so
sampling, log-probs, the reference policy, LoRA and warm-up are the VLM adapter's, unchanged.

Frames (QwenLM/Qwen3-VL ``qwen-vl-utils/src/qwen_vl_utils/vision_process.py``). A row's ``video`` (a file path, or a
list of frames) is decoded with ``qwen_vl_utils.fetch_video``: the backend is torchcodec, else decord, else torchvision
(``FORCE_QWENVL_VIDEO_READER`` picks one); the frame count is ``nframes`` or
``clip(total/video_fps·fps, min_frames, max_frames)`` floored to an even number; the indices are
``linspace(start, end, n).round()``; each frame is resized with ``smart_resize`` into
``[min_pixels, min(max_pixels, total_pixels/n·2)]``. The sampling rate is qwen-vl-utils'
``sample_fps = n / total · video_fps`` and the frame timestamps are ``index / video_fps`` seconds.

The time axis. Qwen2.5-VL's mRoPE puts temporal grid step k of a video at position
``k · second_per_grid_ts · tokens_per_second``, with ``second_per_grid_ts = temporal_patch_size / sample_fps``.
Video-R1 never passed the sampled fps and deleted ``second_per_grid_ts`` before the log-prob pass
(tulerfeng/Video-R1 ``src/r1-v/src/open_r1/trainer/grpo_trainer.py``), so its time axis ignored the real
sampling rate. Here the processor gets
``video_metadata`` (native fps, sampled frame indices, total frames) and ``do_sample_frames=False``, and the
resulting encoding — ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts`` — is the one cached
object that both ``generate`` and the training forward read. In transformers 5.x, qwen-vl-utils' own
``video_kwargs`` (``fps=[...]``) no longer reach ``second_per_grid_ts``: a list is rejected, and a number is
ignored when frames are not re-sampled, leaving the processor's 24 fps default (2/24 s per grid step instead of
2/2 for a 2 fps clip). ``tests/test_video_adapter.py`` checks the value that arrives.

Decoding happens once per prompt per rollout (the G samples, the old/reference log-prob forwards and the
training forwards reuse one encoding) and decoded clips of file videos are kept in an LRU cache across steps
(``decode_cache_mb``).

T-GRPO temporal contrast (Video-R1, Feng et al. 2025, arXiv 2503.21776 §3.2; its ``grpo_trainer.py``). With
``temporal_contrast.enabled``, every video prompt also gets ``num_shuffled`` (default G/2) completions sampled on
its frames permuted along time (a uniformly random permutation from torch's global RNG, redrawn if it is the
identity; the timestamps and ``second_per_grid_ts`` stay those of the ordered clip, as in Video-R1, which
re-processes the permuted tensor).
They are sampled without gradient and are *not* part of the rollout: they have no log-probs, no mask, no
advantage. Only their decoded text reaches the rewards, in the ``shuffled_completions`` column, where the
``temporal_contrast`` reward (:mod:`mmgrpo.rewards.video`) scores them with the target reward and turns the two
accuracies into the T-GRPO bonus. Departure from Video-R1: the statistics are computed by a reward, so the
target reward, μ, α and the correctness threshold are configuration rather than "reward column 0, 0.8, 0.3, 0.1".

Extra reward columns (``Rollout.extras``, B values each): ``group_id`` (the prompt of each sample: video
prompts share their question text, so "equal prompts" cannot identify a group), ``sample_fps``,
``frame_timestamps`` (seconds of the frames the model saw), ``duration`` (the row's own, else the decoded
clip's ``total / video_fps``), and ``shuffled_completions`` when the contrast is on (``None`` for rows without
video).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmgrpo.config import ConfigError, from_dict
from mmgrpo.plugins import ADAPTERS
from mmgrpo.types import Rollout

from ..vlm.adapter import VLMAdapter, VLMArgs, _load_images, build_vlm_adapter


@dataclass
class VideoSampling:
    """How frames are sampled from a video (qwen-vl-utils' keys, ``vision_process.py``)."""

    fps: float | None = 2.0
    """Frames per second to sample (ignored when nframes is set). qwen-vl-utils' default is 2."""
    nframes: int | None = None
    """Exact frame count (rounded to an even number); overrides fps."""
    min_frames: int = 4
    """Fewest frames when sampling by fps."""
    max_frames: int = 16
    """Most frames when sampling by fps (Video-R1 trains with 16)."""
    min_pixels: int = 28 * 28
    """Smallest frame area after resizing (pixels)."""
    max_pixels: int = 112 * 112
    """Largest frame area after resizing (pixels); Video-R1 uses 128·28²."""
    total_pixels: int | None = None
    """Pixel budget of the whole clip: a frame gets at most total_pixels / n · 2 (None = qwen-vl-utils' default)."""


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


@dataclass(frozen=True)
class Clip:
    """Frames sampled from one video, with where they came from.

    Shape:
        frames: [F, C, H, W] uint8 (or float32 in [0, 255] if the resize produced non-integers), F even
    """

    frames: Tensor  # [F, C, H, W]
    video_fps: float  # native frame rate of the file (the sampling rate itself for frame lists)
    frame_indices: tuple[int, ...]  # F indices into the file
    total_frames: int  # frames in the decoded range of the file

    @property
    def sample_fps(self) -> float:
        """qwen-vl-utils' and transformers' ``sampled_fps``: F / total · video_fps."""
        return len(self.frame_indices) / self.total_frames * self.video_fps

    @property
    def timestamps(self) -> list[float]:
        """Seconds of each sampled frame in the file: index / video_fps."""
        return [i / self.video_fps for i in self.frame_indices]

    @property
    def duration(self) -> float:
        """Seconds covered by the decoded range: total / video_fps."""
        return self.total_frames / self.video_fps

    def metadata(self) -> Any:
        from transformers.video_utils import VideoMetadata

        _, _, H, W = self.frames.shape
        return VideoMetadata(
            total_num_frames=self.total_frames, fps=self.video_fps, width=W, height=H,
            duration=self.duration, frames_indices=list(self.frame_indices),
        )  # fmt: skip


def fetch_video(ele: dict, image_patch_size: int) -> tuple[Tensor, dict, float]:
    """``qwen_vl_utils.fetch_video`` with metadata and sample fps (module-level so tests can count calls)."""
    from qwen_vl_utils import fetch_video as qwen_fetch_video

    (frames, meta), sample_fps = qwen_fetch_video(
        ele, image_patch_size=image_patch_size, return_video_sample_fps=True, return_video_metadata=True
    )
    return frames, meta, sample_fps


def _compact(frames: Tensor) -> Tensor:
    """uint8 when lossless: qwen-vl-utils resizes uint8 frames (whole numbers in [0, 255]) and returns floats."""
    if frames.dtype == torch.uint8:
        return frames
    if bool((frames == frames.round()).all()) and frames.min() >= 0 and frames.max() <= 255:
        return frames.to(torch.uint8)
    return frames.float()


def decode_clip(video: Any, sampling: VideoSampling, *, image_patch_size: int = 14, start: float | None = None,
                end: float | None = None, frames_fps: float = 2.0) -> Clip:  # fmt: skip
    """Decode and sample one video (a path, or a list of PIL images / HWC arrays at ``frames_fps``)."""
    ele: dict[str, Any] = {"min_pixels": sampling.min_pixels, "max_pixels": sampling.max_pixels}
    if sampling.total_pixels is not None:
        ele["total_pixels"] = sampling.total_pixels
    if isinstance(video, (str, Path)):
        path = str(video)
        if not path.startswith(("http://", "https://", "file://")) and not Path(path).is_file():
            raise FileNotFoundError(f"row 'video': no video file at {path!r}")
        ele["video"] = path
        if sampling.nframes is not None:
            ele["nframes"] = sampling.nframes
        else:
            ele.update(fps=sampling.fps, min_frames=sampling.min_frames, max_frames=sampling.max_frames)
        if start is not None:
            ele["video_start"] = float(start)
        if end is not None:
            ele["video_end"] = float(end)
        frames, meta, sample_fps = fetch_video(ele, image_patch_size)
        indices = tuple(int(i) for i in meta["frames_indices"])
        clip = Clip(_compact(frames), float(meta["fps"]), indices, int(meta["total_num_frames"]))
    elif isinstance(video, (list, tuple)) and len(video) > 0:
        ele.update(video=list(video), sample_fps=float(frames_fps))
        frames, _, sample_fps = fetch_video(ele, image_patch_size)  # pads to an even count
        n = frames.shape[0]
        clip = Clip(_compact(frames), float(frames_fps), tuple(range(n)), n)
    else:
        raise TypeError(f"row 'video' must be a file path or a non-empty list of frames, got {type(video).__name__}")
    if abs(clip.sample_fps - sample_fps) > 1e-6 * max(1.0, sample_fps):
        raise RuntimeError(
            f"sampled fps disagree: qwen-vl-utils says {sample_fps}, the frame indices give {clip.sample_fps}"
        )
    return clip


def shuffle_frames(frames: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Frames permuted along time by a uniformly random permutation that is not the identity (F > 1).

    The permutation comes from ``generator``, by default torch's global RNG, which the trainer seeds per process
    and saves in its checkpoints, so a resumed run draws the permutations an uninterrupted one would.

    Shape: frames [F, C, H, W] → ([F, C, H, W], order [F]).
    """
    F = frames.shape[0]
    order = torch.randperm(F, generator=generator)  # [F]
    while F > 1 and torch.equal(order, torch.arange(F)):
        order = torch.randperm(F, generator=generator)
    return frames[order], order


class VideoAdapter(VLMAdapter):
    """:class:`VLMAdapter` whose prompts may hold a video; see the module docstring."""

    args: VideoArgs

    def __init__(self, model: torch.nn.Module, processor: Any, args: VideoArgs, reference: torch.nn.Module | None):
        super().__init__(model, processor, args, reference)
        vp = getattr(processor, "video_processor", None)
        if vp is None:
            raise ConfigError(
                f"model.args.name_or_path {args.name_or_path!r}: its processor {type(processor).__name__} has no "
                "video_processor; the video adapter needs a video-capable processor (Qwen2-VL, Qwen2.5-VL...)"
            )
        self.patch_size = int(getattr(vp, "patch_size", 14))
        self.temporal_patch_size = int(getattr(vp, "temporal_patch_size", 2))
        self._video_kwargs = {"do_sample_frames": False}
        if "cap_pixels_per_frame" in getattr(getattr(vp, "valid_kwargs", None), "__annotations__", {}):
            self._video_kwargs["cap_pixels_per_frame"] = True  # frames already obey qwen-vl-utils' per-frame cap
        self._lru: OrderedDict[tuple, Clip] = OrderedDict()
        self._lru_bytes = 0
        self._pinned: dict[Any, Clip] = {}  # clips of the current rollout: decoded once, whatever the LRU size
        self.decode_count = 0  # clips decoded so far (not served from a cache)

    # ------------------------------------------------------------------------------------------ frames

    def _clip_key(self, row: dict) -> Any:
        video = row["video"]
        if isinstance(video, (str, Path)):
            return (str(video), row.get("video_start"), row.get("video_end"))
        return ("frames", id(video))

    def _clip(self, row: dict) -> Clip:
        key = self._clip_key(row)
        clip = self._pinned.get(key)
        if clip is None and key in self._lru:
            clip = self._lru[key]
            self._lru.move_to_end(key)
        if clip is None:
            clip = decode_clip(
                row["video"], self.args.video, image_patch_size=self.patch_size, start=row.get("video_start"),
                end=row.get("video_end"), frames_fps=float(row.get("video_fps", 2.0)),
            )  # fmt: skip
            self.decode_count += 1
            budget = self.args.decode_cache_mb * 2**20
            size = clip.frames.numel() * clip.frames.element_size()
            if key[0] != "frames" and size <= budget:
                self._lru[key] = clip
                self._lru_bytes += size
                while self._lru_bytes > budget:
                    old = self._lru.popitem(last=False)[1].frames
                    self._lru_bytes -= old.numel() * old.element_size()
        self._pinned[key] = clip
        return clip

    # ------------------------------------------------------------------------------------------ prompts

    def _video_messages(self, row: dict, n_images: int, has_video: bool) -> list[dict]:
        prompt = row["prompt"]
        if isinstance(prompt, list):  # already conversational: it must hold its own {"type": "video"} part
            return prompt
        content = [{"type": "image"} for _ in range(n_images)]
        content += [{"type": "video"}] if has_video else []
        content += [{"type": "text", "text": str(prompt)}]
        messages = [{"role": "user", "content": content}]
        if self.args.system_prompt:
            messages.insert(0, {"role": "system", "content": self.args.system_prompt})
        return messages

    def _encode_prompt(self, row: dict, frames: Tensor | None = None) -> dict[str, Tensor]:
        """Processor outputs for one row; ``frames`` [F, C, H, W] replaces the clip's frames (shuffled copies)."""
        if "prompt" not in row:
            raise KeyError(f"prompt row has no 'prompt' key (keys: {sorted(row)}); the video adapter needs one")
        images = _load_images(row)
        clip = self._clip(row) if row.get("video") is not None else None
        messages = self._video_messages(row, len(images), clip is not None)
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        kwargs: dict[str, Any] = {}
        if images:
            kwargs["images"] = images
            for key in ("min_pixels", "max_pixels"):
                if getattr(self.args, key) is not None:
                    kwargs[key] = getattr(self.args, key)
        if clip is not None:
            kwargs.update(videos=[clip.frames if frames is None else frames], video_metadata=[clip.metadata()],
                          **self._video_kwargs)  # fmt: skip
        enc = dict(self.processor(text=[text], return_tensors="pt", **kwargs))
        enc.pop("video_metadata", None)  # not a model input
        if clip is not None and "second_per_grid_ts" in enc:
            expected = self.temporal_patch_size / clip.sample_fps
            got = float(enc["second_per_grid_ts"].reshape(-1)[0])
            if abs(got - expected) > 1e-5 * expected:
                raise RuntimeError(
                    f"the processor set second_per_grid_ts={got} for a clip sampled at {clip.sample_fps} fps "
                    f"(expected {expected}); this transformers version ignores video_metadata"
                )
        return enc

    # ------------------------------------------------------------------------------------------ rollout

    def rollout(self, prompts: list[dict], group_size: int) -> Rollout:
        self._pinned = {}
        rollout = super().rollout(prompts, group_size)  # encodes (and decodes) each prompt once
        clips = [self._clip(row) if row.get("video") is not None else None for row in prompts]  # pinned: no decode
        G = group_size
        per_prompt: dict[str, list] = {
            "group_id": list(range(len(prompts))),
            "sample_fps": [c.sample_fps if c else None for c in clips],
            "frame_timestamps": [c.timestamps if c else None for c in clips],
            "duration": [row.get("duration", c.duration if c else None) for row, c in zip(prompts, clips)],
        }
        if self.args.temporal_contrast.enabled:
            per_prompt["shuffled_completions"] = self._shuffled_completions(prompts, clips, G)
        rollout.extras.update({k: [v for v in col for _ in range(G)] for k, col in per_prompt.items()})
        rollout.validate()
        self._pinned = {}
        return rollout

    @torch.no_grad()
    def _shuffled_completions(self, prompts: list[dict], clips: list[Clip | None], group_size: int) -> list:
        """T-GRPO statistics rollouts: ``num_shuffled`` completions per video prompt on permuted frames.

        No gradient, no log-probs: only the decoded texts are returned (``None`` for rows without video).
        """
        n = self.args.temporal_contrast.num_shuffled or max(1, group_size // 2)
        video_rows = [i for i, c in enumerate(clips) if c is not None]
        out: list = [None] * len(prompts)
        if not video_rows:
            return out
        encodings = []
        for i in video_rows:
            shuffled, _ = shuffle_frames(clips[i].frames)
            encodings.append(self._encode_prompt(prompts[i], frames=shuffled))
        texts = self._decode(self._generate(encodings, n, greedy=False))  # [len(video_rows)·n]
        for j, i in enumerate(video_rows):
            out[i] = texts[j * n : (j + 1) * n]
        return out

    @torch.no_grad()
    def evaluate(self, prompts: list[dict]) -> list[str]:
        self._pinned = {}
        try:
            return super().evaluate(prompts)
        finally:
            self._pinned = {}

    def supervised_loss(self, rows: list[dict]) -> Tensor:
        self._pinned = {}
        try:
            return super().supervised_loss(rows)
        finally:
            self._pinned = {}


@ADAPTERS.register("video")
def build_video_adapter(
    args: dict, *, seed: int = 0, lora: Any = None, dtype: str = "float32", need_reference: bool = False
) -> VideoAdapter:
    """Build the adapter from ``model.args`` (validated against :class:`VideoArgs`).

    The video options are checked first; the model, processor, LoRA and reference come from the ``vlm`` builder
    (with the options it knows), so both adapters load and validate the shared options the same way.
    """
    a: VideoArgs = from_dict(VideoArgs, args, "model.args")
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
    shared = {f.name for f in fields(VLMArgs)}
    base = build_vlm_adapter(
        {k: val for k, val in (args or {}).items() if k in shared}, seed=seed, lora=lora, dtype=dtype,
        need_reference=need_reference,
    )  # fmt: skip
    return VideoAdapter(base.model, base.processor, a, base.reference)


build_video_adapter.args_class = VideoArgs
build_video_adapter.adapter_class = VideoAdapter  # its optional capabilities are checked at config load
