"""The video media encoder: a row's ``video`` (a file or a list of frames) → sampled frames → processor inputs.

Frames (Qwen2.5-VL's sampling, as ``qwen_vl_utils.fetch_video`` implements it: QwenLM/Qwen3-VL
``qwen-vl-utils/src/qwen_vl_utils/vision_process.py``). A row's ``video`` is decoded with
``qwen_vl_utils.fetch_video``: the backend is torchcodec, else decord, else torchvision
(``FORCE_QWENVL_VIDEO_READER`` picks one); the frame count is ``nframes`` or
``clip(total/video_fps·fps, min_frames, max_frames)`` floored to an even number; the indices are
``linspace(start, end, n).round()``; each frame is resized with ``smart_resize`` into
``[min_pixels, min(max_pixels, total_pixels/n·2)]``. The sampling rate is qwen-vl-utils'
``sample_fps = n / total · video_fps`` and the frame timestamps are ``index / video_fps`` seconds.

The time axis. Qwen2.5-VL's mRoPE puts temporal grid step k of a video at position
``k · second_per_grid_ts · tokens_per_second``, with ``second_per_grid_ts = temporal_patch_size / sample_fps``.
Video-R1 never passed the sampled fps and deleted ``second_per_grid_ts`` before the log-prob pass
(tulerfeng/Video-R1 ``src/r1-v/src/open_r1/trainer/grpo_trainer.py``), so its time axis ignored the real
sampling rate. Here the processor gets ``video_metadata`` (native fps, sampled frame indices, total frames) and
``do_sample_frames=False``, and the resulting encoding — ``pixel_values_videos``, ``video_grid_thw``,
``second_per_grid_ts`` — is the one cached object that both sampling and the training forward read; ``check``
verifies the value that arrives (transformers 5.x ignores qwen-vl-utils' own ``fps`` kwarg when frames are not
re-sampled, leaving the processor's 24 fps default).

Decoding happens once per prompt per batch (clips are pinned until ``reset``) and decoded clips of file videos
are kept in an LRU cache across steps (``decode_cache_mb``). A file that is missing, empty or cannot be decoded
raises :class:`~mmgrpo.types.DataError` with one line naming it (qwen-vl-utils would otherwise fall back from
decord to a torchvision reader that recent torchvision no longer has, and report that instead).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmgrpo.types import DataError


@dataclass
class VideoSampling:
    """How frames are sampled from a video (qwen-vl-utils' ``fetch_video`` keys)."""

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
            total_num_frames=self.total_frames,
            fps=self.video_fps,
            width=W,
            height=H,
            duration=self.duration,
            frames_indices=list(self.frame_indices),
        )


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


def decode_clip(
    video: Any,
    sampling: VideoSampling,
    *,
    image_patch_size: int = 14,
    start: float | None = None,
    end: float | None = None,
    frames_fps: float = 2.0,
) -> Clip:
    """Decode and sample one video (a path, or a list of PIL images / HWC arrays at ``frames_fps``)."""
    ele: dict[str, Any] = {"min_pixels": sampling.min_pixels, "max_pixels": sampling.max_pixels}
    if sampling.total_pixels is not None:
        ele["total_pixels"] = sampling.total_pixels
    if isinstance(video, (str, Path)):
        path = str(video)
        if not path.startswith(("http://", "https://", "file://")) and not Path(path).is_file():
            raise DataError(f"row 'video': no video file at {path!r} (relative paths resolve against media_root)")
        if not path.startswith(("http://", "https://")) and Path(path.removeprefix("file://")).stat().st_size == 0:
            raise DataError(f"row 'video': video file {path!r} is empty (0 bytes)")
        ele["video"] = path
        if sampling.nframes is not None:
            ele["nframes"] = sampling.nframes
        else:
            ele.update(fps=sampling.fps, min_frames=sampling.min_frames, max_frames=sampling.max_frames)
        if start is not None:
            ele["video_start"] = float(start)
        if end is not None:
            ele["video_end"] = float(end)
        try:
            frames, meta, sample_fps = fetch_video(ele, image_patch_size)
        except Exception as e:  # decord/torchcodec failed (and qwen-vl-utils' fallback reader may not exist)
            raise DataError(f"row 'video': video file {path!r} cannot be decoded ({_decode_reason(path, e)})") from None
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


def _decode_reason(path: str, error: Exception) -> str:
    """The first line of the real decoder's complaint (decord's), not qwen-vl-utils' last fallback's."""
    try:
        import decord

        decord.VideoReader(path.removeprefix("file://"))
    except Exception as e:
        error = e
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]


def add_frame_noise(frames: Tensor, std: float, generator: torch.Generator | None = None) -> Tensor:
    """Frame-level Gaussian noise (DeepVideo-R1's augmentation of easy samples, :mod:`mmgrpo.augmentation`):
    frames + N(0, std²) per pixel value, clamped to [0, 255], rounded back for uint8 frames.

    Shape:
        frames: [F, C, H, W] (uint8, or float32 in [0, 255]) → [F, C, H, W], same dtype
    """
    eps = torch.randn(frames.shape, generator=generator, dtype=torch.float32)  # [F, C, H, W]
    noisy = (frames.float() + std * eps).clamp(0.0, 255.0)  # [F, C, H, W]
    return noisy.round().to(frames.dtype) if frames.dtype == torch.uint8 else noisy.to(frames.dtype)


def shuffle_frames(frames: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Frames permuted along time by a uniformly random permutation that is not the identity (F > 1).

    The permutation comes from ``generator``, by default torch's global RNG, which the trainer seeds per process
    and accelerate checkpoints, so a resumed run draws the permutations an uninterrupted one would.

    Shape: frames [F, C, H, W] → ([F, C, H, W], order [F]).
    """
    F = frames.shape[0]
    order = torch.randperm(F, generator=generator)  # [F]
    while F > 1 and torch.equal(order, torch.arange(F)):
        order = torch.randperm(F, generator=generator)
    return frames[order], order


class VideoEncoder:
    """A row's ``video`` → :class:`Clip` → ``processor(videos=..., video_metadata=...)`` (module docstring).

    Row keys: ``video`` (path or frame list), optional ``video_start`` / ``video_end`` (seconds),
    ``video_fps`` (rate of a frame list, default 2) and ``duration`` (reported instead of the clip's own);
    ``video_noise_std`` / ``video_noise_seed`` (set by the video adapter's ``augment_video``): Gaussian noise on the
    frames (:func:`add_frame_noise`).
    """

    kind = "video"

    def __init__(self, processor: Any, sampling: VideoSampling, decode_cache_mb: float = 1024.0):
        vp = getattr(processor, "video_processor", None)
        if vp is None:
            raise ValueError(f"processor {type(processor).__name__} has no video_processor")
        self.sampling = sampling
        self.decode_cache_mb = decode_cache_mb
        self.patch_size = int(getattr(vp, "patch_size", 14))
        self.temporal_patch_size = int(getattr(vp, "temporal_patch_size", 2))
        self.video_kwargs: dict[str, Any] = {"do_sample_frames": False}
        if "cap_pixels_per_frame" in getattr(getattr(vp, "valid_kwargs", None), "__annotations__", {}):
            self.video_kwargs["cap_pixels_per_frame"] = True  # frames already obey qwen-vl-utils' per-frame cap
        self.engine_kwargs = {"videos_kwargs": dict(self.video_kwargs)}  # vLLM's processor: no re-sampling either
        self.lru: OrderedDict[tuple, Clip] = OrderedDict()
        self.lru_bytes = 0
        self.pinned: dict[Any, Clip] = {}  # clips of the current batch: decoded once, whatever the LRU size
        self.decode_count = 0  # clips decoded so far (not served from a cache)

    def _key(self, row: dict) -> Any:
        video = row["video"]
        if isinstance(video, (str, Path)):
            return (str(video), row.get("video_start"), row.get("video_end"))
        return ("frames", id(video))

    def clip(self, row: dict) -> Clip:
        """The sampled clip of ``row`` (pinned for the batch, LRU-cached across batches for files), with the
        frame noise of ``video_noise_std`` / ``video_noise_seed`` when the row has them (pinned, never cached)."""
        std = row.get("video_noise_std")
        if not std:
            return self._clean_clip(row)
        key = (*self._key(row), "noise", float(std), int(row["video_noise_seed"]))
        if key not in self.pinned:
            clean = self._clean_clip(row)
            gen = torch.Generator().manual_seed(int(row["video_noise_seed"]))
            self.pinned[key] = self.with_frames(clean, add_frame_noise(clean.frames, float(std), gen))
        return self.pinned[key]

    def _clean_clip(self, row: dict, sampling: VideoSampling | None = None) -> Clip:
        """The clip of ``row`` sampled by ``sampling`` (default: the adapter's), pinned and LRU-cached by both."""
        key = self._key(row) if sampling is None else (*self._key(row), "sampling", repr(sampling))
        clip = self.pinned.get(key)
        if clip is None and key in self.lru:
            clip = self.lru[key]
            self.lru.move_to_end(key)
        if clip is None:
            clip = decode_clip(
                row["video"],
                sampling or self.sampling,
                image_patch_size=self.patch_size,
                start=row.get("video_start"),
                end=row.get("video_end"),
                frames_fps=float(row.get("video_fps", 2.0)),
            )
            self.decode_count += 1
            budget = self.decode_cache_mb * 2**20
            size = clip.frames.numel() * clip.frames.element_size()
            if key[0] != "frames" and size <= budget:
                self.lru[key] = clip
                self.lru_bytes += size
                while self.lru_bytes > budget:
                    old = self.lru.popitem(last=False)[1].frames
                    self.lru_bytes -= old.numel() * old.element_size()
        self.pinned[key] = clip
        return clip

    def span_frames(self, row: dict, start: float, end: float, n: int) -> tuple[list[Any], list[float]]:
        """``ToolContext.load_frames`` for ``select_frames`` (VITAL's dense sampling on demand): up to ``n`` frames
        whose time lies in ``[start, end]``, uniformly spread (:func:`mmgrpo.tools.video.pick_uniform`), taken from
        the row's file decoded at its native rate (every frame; an odd count loses one to qwen-vl-utils' even
        rounding) at the prompt's frame size, as PIL images with their times in seconds; none in the span: ``[]``.
        The dense clip is pinned and LRU-cached like the prompt's."""
        from PIL import Image

        from mmgrpo.tools.video import pick_uniform

        total = self._clean_clip(row).total_frames  # the prompt's clip knows the file's frame count
        clip = self._clean_clip(row, dataclasses.replace(self.sampling, nframes=max(2, total - total % 2)))
        inside = [i for i, t in enumerate(clip.timestamps) if start <= t <= end]
        chosen = [inside[j] for j in pick_uniform(len(inside), n)] if inside else []
        frames = [Image.fromarray(clip.frames[i].permute(1, 2, 0).clamp(0, 255).byte().numpy()) for i in chosen]
        return frames, [clip.timestamps[i] for i in chosen]

    def load(self, row: dict) -> list[Clip]:
        return [] if row.get("video") is None else [self.clip(row)]

    def processor_kwargs(self, media: list[Clip]) -> dict[str, Any]:
        return {
            "videos": [c.frames for c in media],
            "video_metadata": [c.metadata() for c in media],
            **self.video_kwargs,
        }

    def check(self, encoding: dict[str, Any], media: list[Clip]) -> None:
        encoding.pop("video_metadata", None)  # not a model input
        if "second_per_grid_ts" in encoding:
            for clip, got in zip(media, encoding["second_per_grid_ts"].reshape(-1).tolist()):
                expected = self.temporal_patch_size / clip.sample_fps
                if abs(got - expected) > 1e-5 * expected:
                    raise RuntimeError(
                        f"the processor set second_per_grid_ts={got} for a clip sampled at {clip.sample_fps} fps "
                        f"(expected {expected}); this transformers version ignores video_metadata"
                    )

    def columns(self, rows: list[dict]) -> dict[str, list[Any]]:
        """``group_id``, ``sample_fps``, ``frame_timestamps`` and ``duration`` per row (None without video)."""
        clips = [self.clip(row) if row.get("video") is not None else None for row in rows]  # pinned: no decode
        return {
            "group_id": list(range(len(rows))),
            "sample_fps": [c.sample_fps if c else None for c in clips],
            "frame_timestamps": [c.timestamps if c else None for c in clips],
            "duration": [row.get("duration", c.duration if c else None) for row, c in zip(rows, clips)],
        }

    def reset(self) -> None:
        self.pinned = {}

    @staticmethod
    def with_frames(clip: Clip, frames: Tensor) -> Clip:
        """``clip`` with its frames replaced (e.g. permuted along time), same metadata."""
        return dataclasses.replace(clip, frames=frames)


__all__ = ["Clip", "VideoEncoder", "VideoSampling", "add_frame_noise", "decode_clip", "fetch_video", "shuffle_frames"]
