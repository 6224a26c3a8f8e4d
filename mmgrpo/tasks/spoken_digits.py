"""A synthetic speech task with real speech: digit strings spoken by ``espeak-ng``, with speaker, speed, pitch
and noise variation, written once as 16 kHz wav files.

``transcribe`` (ASR, for ``whisper``): the audio says e.g. "three seven one"; the answer is that transcript and
the ``wer`` reward scores it. ``second_word`` (spoken question answering, for ``audio_llm``): "Which word was
said second?"; the answer is one word inside ``<answer></answer>`` tags, scored by ``accuracy``.

Each utterance draws a voice (an espeak-ng language + voice variant: male/female, several timbres), a speed
(words per minute), a pitch and a word gap, then white noise at a random SNR is added to the synthesised signal;
the result is resampled to 16 kHz by ``soxr``. Files go under ``audio_dir`` (default
``$MMGRPO_CACHE/spoken_digits/<hash of the options>``), never into the repository. Train and eval rows come
from different seeds (eval utterances are new digit strings in new voice/speed/noise draws).

``warmup_rows`` gives supervised targets for a short warm-up, from the first ``warmup_size`` train rows only:
the true transcript for ``transcribe`` (a short SFT stage before GRPO, as GRPO for ASR starts from a supervised
model — arXiv 2509.01939; SARI likewise warms Qwen2-Audio up with SFT before GRPO, arXiv 2504.15900); for
``second_word`` either the true ``<answer>word</answer>`` or (``warmup_targets: format``) a random word in
the answer format (the format, not the skill, as the ``shapes`` task does).

``espeak-ng`` is a Debian/Ubuntu package (``apt-get install -y espeak-ng``; ``scripts/setup_env.sh`` installs it
when missing). Without it, building the task raises a one-line error saying so.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from mmgrpo.cache import cache_dir, publish_dir
from mmgrpo.config import ConfigError
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
VOICES = ["en-us+m1", "en-us+m3", "en-us+m7", "en-us+f1", "en-us+f3", "en+m2", "en+f2", "en-gb+m4", "en-gb+f4"]
QUESTIONS = {
    "transcribe": "Transcribe the audio.",
    "second_word": "Which word was said second? Answer with <answer>word</answer>.",
}
SAMPLING_RATE = 16000
RENDER_VERSION = 1  # part of the cache key: bump when the synthesis changes


@dataclass
class SpokenDigitsArgs:
    """Options under ``task.args`` for ``task.name: spoken_digits``."""

    question: Literal[tuple(QUESTIONS)] = "transcribe"
    """transcribe (ASR: the answer is the transcript) | second_word (spoken QA: the answer is the second word)."""
    words: list[str] = field(default_factory=lambda: list(DIGITS))
    """Vocabulary the utterances are drawn from."""
    min_words: int = 2
    """Fewest words per utterance."""
    max_words: int = 3
    """Most words per utterance."""
    voices: list[str] = field(default_factory=lambda: list(VOICES))
    """espeak-ng voices (language+variant), drawn uniformly per utterance."""
    speed: list[int] = field(default_factory=lambda: [140, 200])
    """Speaking rate range, words per minute."""
    pitch: list[int] = field(default_factory=lambda: [30, 70])
    """Pitch range (espeak-ng 0-99)."""
    snr_db: list[float] = field(default_factory=lambda: [15.0, 30.0])
    """Range of the signal-to-noise ratio of the added white noise, dB."""
    train_size: int = 800
    """Rows in the train split."""
    eval_size: int = 100
    """Rows in the held-out split."""
    warmup_size: int = 800
    """Train rows the warm-up targets come from (the first ones)."""
    warmup_targets: Literal["auto", "answer", "format"] = "auto"
    """answer (the true transcript / answer word) | format (second_word only: a random word in the answer format,
    teaching the format but not the skill) | auto (answer for transcribe, format for second_word)."""
    seed: int = 1234
    """Base seed (train and eval use different derived seeds)."""
    audio_dir: str | None = None
    """Where the wav files go; None = $MMGRPO_CACHE/spoken_digits/<hash of these options>."""


def espeak_binary() -> str:
    """The espeak-ng executable, or a one-line error saying how to install it."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError(
            "spoken_digits needs the espeak-ng program to synthesise speech and it is not on PATH: install it with "
            "`apt-get install -y espeak-ng` (scripts/setup_env.sh does this)"
        )
    return exe


def synthesise(text: str, voice: str, speed: int, pitch: int, gap: int) -> tuple[np.ndarray, int]:
    """espeak-ng's waveform of ``text`` (float32 mono [N]) and its sampling rate."""
    import soundfile as sf

    cmd = [espeak_binary(), "-v", voice, "-s", str(speed), "-p", str(pitch), "-g", str(gap), "--stdout", text]
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=60)
    data, rate = sf.read(io.BytesIO(out.stdout), dtype="float32")
    return data.reshape(len(data), -1).mean(axis=1), int(rate)


def add_noise(signal: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """``signal`` + white noise with power ``mean(signal²) / 10^(snr/10)``."""
    power = float(np.mean(signal**2)) / 10 ** (snr_db / 10)
    return (signal + rng.normal(0.0, np.sqrt(power), size=signal.shape)).astype(np.float32)


class SpokenDigitsTask:
    """See the module docstring."""

    def __init__(self, args: SpokenDigitsArgs):
        self._metrics = EvalRewards(
            [{"name": "exact_match", "kwargs": {"require_tags": False}}]
            if args.question == "transcribe"
            else [{"name": "accuracy"}, {"name": "format", "kwargs": {"think": False}}],
            "spoken_digits",
        )
        if len(args.words) < 2:
            raise ConfigError(f"task.args.words: need at least 2 words, got {args.words}")
        low = 2 if args.question == "second_word" else 1
        if not low <= args.min_words <= args.max_words:
            raise ConfigError(
                f"task.args.min_words/max_words: need {low} <= min_words <= max_words, "
                f"got {args.min_words}, {args.max_words}"
            )
        for name in ("speed", "pitch", "snr_db"):
            r = getattr(args, name)
            if len(r) != 2 or r[0] > r[1]:
                raise ConfigError(f"task.args.{name}: expected a range [low, high] with low <= high, got {r}")
        if args.warmup_targets == "format" and args.question == "transcribe":
            raise ConfigError("task.args.warmup_targets: format targets exist for second_word only; use answer or auto")
        if not args.voices:
            raise ConfigError("task.args.voices: need at least one espeak-ng voice, e.g. en-us+m1")
        self.args = args
        self.audio_dir = Path(args.audio_dir) if args.audio_dir else self._default_dir()
        self._train, self._eval = self._build()

    def _default_dir(self) -> Path:
        content = {
            k: v
            for k, v in asdict(self.args).items()
            if k not in ("audio_dir", "question", "warmup_size", "warmup_targets")
        }
        content["render_version"] = RENDER_VERSION
        digest = hashlib.sha1(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]
        return cache_dir() / "spoken_digits" / digest

    def _specs(self, n: int, seed: int, split: str) -> list[dict]:
        a, rng = self.args, random.Random(seed)
        specs = []
        for k in range(n):
            words = [rng.choice(a.words) for _ in range(rng.randint(a.min_words, a.max_words))]
            specs.append(
                dict(
                    words=words,
                    voice=rng.choice(a.voices),
                    speed=rng.randint(*a.speed),
                    pitch=rng.randint(*a.pitch),
                    gap=rng.randint(0, 6),
                    snr_db=rng.uniform(*a.snr_db),
                    noise_seed=rng.getrandbits(32),
                    path=str(self.audio_dir / f"{split}_{k:05d}.wav"),
                )
            )
        return specs

    def _render(self, spec: dict, path: Path) -> None:
        import soundfile as sf
        import soxr

        wave, rate = synthesise(" ".join(spec["words"]), spec["voice"], spec["speed"], spec["pitch"], spec["gap"])
        wave = soxr.resample(wave, rate, SAMPLING_RATE, quality="HQ")
        wave = add_noise(wave, spec["snr_db"], np.random.default_rng(spec["noise_seed"]))
        sf.write(str(path), np.clip(wave, -1.0, 1.0), SAMPLING_RATE, subtype="PCM_16")

    def _build(self) -> tuple[list[dict], list[dict]]:
        a = self.args
        train = self._specs(a.train_size, a.seed * 2 + 1, "train")
        evals = self._specs(a.eval_size, a.seed * 2 + 2, "eval")
        if not (self.audio_dir / "complete.json").is_file():
            espeak_binary()

        def write(tmp: Path) -> None:
            # one espeak-ng process per clip, waited on in threads: the clips are independent and each is drawn from
            # its own spec (seeded noise), so the files are those of a sequential build, in a fraction of its time
            specs = train + evals
            with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
                list(pool.map(lambda spec: self._render(spec, tmp / Path(spec["path"]).name), specs))

        publish_dir(self.audio_dir, write, asdict(a))
        return [self._row(s) for s in train], [self._row(s) for s in evals]

    def _row(self, spec: dict) -> dict:
        q = self.args.question
        answer = " ".join(spec["words"]) if q == "transcribe" else spec["words"][1]
        return {
            "prompt": QUESTIONS[q],
            "audio": spec["path"],
            "answer": answer,
            "transcript": " ".join(spec["words"]),
            "question_type": q,
            "voice": spec["voice"],
        }

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def warmup_rows(self, seed: int) -> list[dict]:
        """Targets for the first ``warmup_size`` train rows: the true transcript / ``<answer>word</answer>``, or
        (``warmup_targets: format``) a random word in the answer format."""
        rows = self._train[: self.args.warmup_size]
        mode = self.args.warmup_targets
        if mode == "auto":
            mode = "answer" if self.args.question == "transcribe" else "format"
        if mode == "answer":
            wrap = "{}" if self.args.question == "transcribe" else "<answer>{}</answer>"
            return [dict(r, target=wrap.format(r["answer"])) for r in rows]
        rng = random.Random(seed)
        return [dict(r, target=f"<answer>{rng.choice(self.args.words)}</answer>") for r in rows]

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """transcribe: ``wer`` (corpus-level word error rate, normalised text), ``exact`` (utterance accuracy).
        second_word: ``accuracy``, ``format`` and the ``chance`` level 1/|words|."""
        from mmgrpo.rewards.speech import corpus_wer

        if self.args.question == "transcribe":
            exact = self._metrics.score(outputs, rows)["exact_match"]
            return {"wer": corpus_wer(outputs, [r["answer"] for r in rows]), "exact": exact}
        return {**self._metrics.score(outputs, rows), "chance": 1 / len(set(self.args.words))}


build_spoken_digits_task = TASKS.register("spoken_digits")(
    TaskSpec(args=SpokenDigitsArgs, cls=SpokenDigitsTask, load=lambda a, seed: SpokenDigitsTask(a))
)
