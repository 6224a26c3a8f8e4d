"""Audio in: a row's ``audio`` (path, array, ``{"array", "sampling_rate"}``) → mono float32 at the model's rate.

Files are decoded by ``soundfile`` (libsndfile: wav, flac, ogg, mp3 with libsndfile ≥ 1.1) and resampled by
``soxr`` (high quality), never by hand. Multi-channel audio is averaged to mono, as Whisper's and Qwen2-Audio's
feature extractors expect one channel (R1-AQA takes channel 0, xiaomi-research/r1-aqa ``src/dataset/dataset.py``;
qwen-vl-utils' ``fetch_audio`` returns 16 kHz mono).

Every user mistake is one line naming the row and the file: a missing or undecodable file, an empty signal,
a silent one (peak amplitude below ``silence_threshold``), or non-finite samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mmgrpo.types import DataError


class AudioError(DataError):
    """A row's audio cannot be used (the message names the row, the file and the fix); the trainer skips such a
    row as any unreadable row (``data/skipped_rows``)."""


def describe(audio: Any) -> str:
    """A short name for an audio value in error messages (the path, or the array's shape)."""
    if isinstance(audio, (str, Path)):
        return repr(str(audio))
    if isinstance(audio, dict):
        return f"dict with keys {sorted(audio)}"
    shape = getattr(audio, "shape", None)
    return f"array of shape {tuple(shape)}" if shape is not None else type(audio).__name__


def decode(audio: Any, *, where: str, default_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Decode ``audio`` to ``(samples [N] float32 mono, sampling rate)`` without resampling.

    ``audio`` is a file path, a ``{"array": ..., "sampling_rate": ...}`` dict (the ``datasets`` Audio feature),
    an ``(array, rate)`` pair, or an array / tensor at ``default_rate``.
    """
    if isinstance(audio, (str, Path)):
        import soundfile as sf

        path = Path(audio)
        if not path.is_file():
            raise AudioError(f"{where}: no audio file at {str(path)!r}; fix the path or the dataset's audio column")
        try:
            data, rate = sf.read(str(path), dtype="float32", always_2d=True)  # [N, channels]
        except Exception as e:  # libsndfile's errors name no file: add it
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AudioError(
                f"{where}: cannot decode audio file {str(path)!r} ({msg}); use wav, flac, ogg or mp3"
            ) from None
        return data.mean(axis=1).astype(np.float32), int(rate)
    if isinstance(audio, dict):
        if "array" not in audio or "sampling_rate" not in audio:
            raise AudioError(f"{where}: an audio dict needs 'array' and 'sampling_rate', got keys {sorted(audio)}")
        array, rate = audio["array"], audio["sampling_rate"]
    elif isinstance(audio, tuple) and len(audio) == 2:
        array, rate = audio
    else:
        array, rate = audio, default_rate
    if rate is None:
        raise AudioError(
            f"{where}: an audio array needs its sampling rate: pass {{'array': ..., 'sampling_rate': ...}}"
        )
    if hasattr(array, "detach"):
        array = array.detach().cpu().numpy()
    data = np.asarray(array, dtype=np.float32)
    if data.ndim == 2:  # [channels, N] (torchaudio) or [N, channels] (soundfile): average the shorter axis
        data = data.mean(axis=0 if data.shape[0] <= data.shape[1] else 1)
    if data.ndim != 1:
        raise AudioError(f"{where}: audio must be 1-D (or 2-D with channels), got shape {tuple(data.shape)}")
    return data, int(rate)


def load_audio(
    audio: Any, sampling_rate: int, *, where: str = "row 'audio'", silence_threshold: float = 1e-4
) -> np.ndarray:
    """Mono float32 samples of ``audio`` at ``sampling_rate`` (resampled with ``soxr`` when needed).

    Raises :class:`AudioError` (one line) for missing/undecodable files, empty, silent or non-finite audio.

    Shape: returns [N] float32.
    """
    if audio is None:
        raise AudioError(f"{where}: the row has no audio; every prompt of a speech adapter needs one")
    data, rate = decode(audio, where=where, default_rate=sampling_rate)
    name = describe(audio)
    if data.size == 0:
        raise AudioError(f"{where}: audio {name} is empty (0 samples)")
    if not np.isfinite(data).all():
        raise AudioError(f"{where}: audio {name} has NaN or infinite samples")
    peak = float(np.abs(data).max())
    if peak <= silence_threshold:
        raise AudioError(
            f"{where}: audio {name} is silent (peak {peak:.2g} <= silence_threshold {silence_threshold:g}); "
            "check the file or lower model.args.silence_threshold"
        )
    if rate != sampling_rate:
        import soxr

        data = soxr.resample(data, rate, sampling_rate, quality="HQ").astype(np.float32)
    return data


class AudioEncoder:
    """The audio of a token policy's prompts: a row's ``audio`` → ``processor(audio=[waveform], sampling_rate=)``.

    Shaped as a media encoder of a token policy (``kind``, ``load``, ``processor_kwargs``, ``check``,
    ``columns``, ``reset``): the policy renders one ``{"type": "audio"}`` chat part per loaded item and passes
    these keyword arguments to the model's processor (Qwen2-Audio: ``audio=``, ``sampling_rate=``, as R1-AQA calls
    it — xiaomi-research/r1-aqa ``src/trainer/grpo_trainer.py``). Decoded waveforms are pinned per batch, so the
    rollout's reward columns reuse them without decoding again.
    """

    kind = "audio"

    def __init__(self, sampling_rate: int, silence_threshold: float = 1e-4, required: bool = False):
        self.sampling_rate = sampling_rate
        self.silence_threshold = silence_threshold
        self.required = required  # a row without audio is an error (audio-only prompts), not a text prompt
        self._pinned: dict[int, np.ndarray] = {}  # id(row) → waveform, for the current batch

    def load(self, row: dict, where: str = "row") -> list[np.ndarray]:
        """The row's decoded waveform (one item), or [] when the row has no ``audio``. Raises :class:`AudioError`."""
        if row.get("audio") is None:
            if self.required:
                raise AudioError(f"{where} 'audio': the row has no audio; every prompt of this adapter needs one")
            return []
        if id(row) not in self._pinned:
            self._pinned[id(row)] = load_audio(
                row["audio"], self.sampling_rate, where=f"{where} 'audio'", silence_threshold=self.silence_threshold
            )
        return [self._pinned[id(row)]]

    def processor_kwargs(self, media: list[np.ndarray]) -> dict[str, Any]:
        return {"audio": media, "sampling_rate": self.sampling_rate}

    def check(self, encoding: dict[str, Any], media: list[np.ndarray]) -> None:
        """The processor expanded the audio slots and returned the features' frame mask."""
        if "input_features" not in encoding or "feature_attention_mask" not in encoding:
            keys = sorted(encoding)
            raise ValueError(f"the processor returned no audio features (keys {keys}); is it audio-capable?")
        if encoding["input_ids"].shape[1] == encoding["feature_attention_mask"].shape[1]:  # the collate pads by length
            raise ValueError("prompt length equals the mel frame count; add a word to the prompt")

    def columns(self, rows: list[dict]) -> dict[str, list[Any]]:
        """``audio_array`` (the waveform the model heard, or None) and ``sampling_rate``, one value per row."""
        arrays = [self.load(row)[0] if row.get("audio") is not None else None for row in rows]
        return {"audio_array": arrays, "sampling_rate": [self.sampling_rate] * len(rows)}

    def reset(self) -> None:
        self._pinned = {}
