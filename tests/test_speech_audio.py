"""Audio loading (soundfile + soxr), its one-line errors, the speech rewards and the spoken_digits task."""

import shutil

import numpy as np
import pytest
import soundfile as sf

from mmgrpo.modalities.speech.audio import AudioError, load_audio
from mmgrpo.rewards import load_reward
from mmgrpo.rewards.speech import corpus_wer


def _tone(rate, seconds=0.5, freq=440.0):
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "OGG", "MP3"])
def test_files_are_decoded_and_resampled_to_the_model_rate(tmp_path, fmt):
    path = tmp_path / f"tone.{fmt.lower()}"
    stereo = np.stack([_tone(22050), _tone(22050)], axis=1)  # [N, 2]
    sf.write(str(path), stereo, 22050, format=fmt)
    out = load_audio(str(path), 16000)
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(len(out) - 8000) <= 0.02 * 8000  # 0.5 s at 16 kHz (mp3 adds encoder padding)
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 16000 / len(out) - 440) < 10  # the tone survived the resampling


def test_arrays_dicts_and_pairs(tmp_path):
    wave = _tone(8000)
    assert len(load_audio({"array": wave, "sampling_rate": 8000}, 16000)) == 8000
    assert len(load_audio((wave, 8000), 16000)) == 8000
    assert load_audio(_tone(16000), 16000).shape == (8000,)  # a bare array is taken at the model's rate


@pytest.mark.parametrize(
    "audio, message",
    [
        ("/no/such/file.wav", "no audio file at '/no/such/file.wav'"),
        (np.zeros(0, dtype=np.float32), "is empty"),
        (np.zeros(16000, dtype=np.float32), "is silent"),
        (np.full(100, np.nan, dtype=np.float32), "NaN or infinite"),
        (None, "has no audio"),
        ({"array": [0.1]}, "needs 'array' and 'sampling_rate'"),
    ],
)
def test_bad_audio_gives_a_one_line_error_naming_the_row(audio, message):
    with pytest.raises(AudioError) as e:
        load_audio(audio, 16000, where="row 3 'audio'")
    text = str(e.value)
    assert text.startswith("row 3 'audio': ") and message in text and "\n" not in text


def test_undecodable_file_names_the_file(tmp_path):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF not really a wave file")
    with pytest.raises(AudioError) as e:
        load_audio(str(bad), 16000, where="row 0 'audio'")
    assert "cannot decode audio file" in str(e.value) and str(bad) in str(e.value) and "\n" not in str(e.value)


def test_adapter_error_names_the_row(mmgrpo_cache, tmp_path):
    from mmgrpo.modalities.speech.adapter import build_whisper_adapter

    adapter = build_whisper_adapter({"max_new_tokens": 2})
    good = tmp_path / "ok.wav"
    sf.write(str(good), _tone(16000), 16000)
    silent = tmp_path / "silent.wav"
    sf.write(str(silent), np.zeros(16000), 16000)
    rows = [{"prompt": "x", "audio": str(good)}, {"prompt": "x", "audio": str(silent)}]
    with pytest.raises(AudioError, match=r"^row 1 'audio': audio '.*silent.wav' is silent"):
        adapter.rollout(rows, group_size=2)


def test_hallucination_penalty_counts_inserted_words():
    f = load_reward("hallucination")
    refs = ["three one five", "two four", "one two", None]
    hyps = ["three one five", "two four two four two four", "one", "x"]
    # insertions: 0; 4 inserted words over 2 (capped at 1); deletions are not hallucinations; not applicable
    assert f(hyps, answer=refs) == [0.0, -1.0, 0.0, None]
    assert f(["one nine two"], answer=["one two"]) == [-0.5]  # one inserted word over two reference words
    assert f(["nine two"], answer=["one two"]) == [0.0]  # a substitution is not an insertion
    assert f(["Nine, two!  Three."], answer=["nine two"], mode="length") == [-0.5]


def test_corpus_wer_is_pooled_over_utterances():
    # 1 deletion over 3 words and 1 insertion over 1 word: pooled 2/4 (the mean of rates would be (1/3 + 1)/2)
    assert corpus_wer(["three one", "two four"], ["three one five", "two"]) == pytest.approx(2 / 4)
    assert corpus_wer(["Three, ONE five."], ["three one five"]) == 0.0


@pytest.fixture(scope="module")
def digits_task(mmgrpo_cache):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    return SpokenDigitsTask(SpokenDigitsArgs(train_size=12, eval_size=6, warmup_size=5))


def test_spoken_digits_writes_real_speech_with_disjoint_splits(digits_task):
    train, evals = digits_task.train_rows(), digits_task.eval_rows()
    assert len(train) == 12 and len(evals) == 6
    assert not {r["audio"] for r in train} & {r["audio"] for r in evals}
    for row in train[:3]:
        wave, rate = sf.read(row["audio"])
        assert rate == 16000 and 0.3 < len(wave) / rate < 3.0  # fits the tiny Whisper's 3 s window
        assert np.abs(wave).max() > 0.05
        assert 2 <= len(row["answer"].split()) <= 3 and row["audio"].startswith(str(digits_task.audio_dir))
    assert len({r["voice"] for r in train}) > 2  # speaker variation
    warm = digits_task.warmup_rows(0)
    assert len(warm) == 5 and all(r["target"] == r["answer"] for r in warm)


def test_spoken_digits_scores_wer_and_second_word(digits_task, mmgrpo_cache):
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    rows = digits_task.eval_rows()
    perfect = digits_task.score([r["answer"] for r in rows], rows)
    assert perfect == {"wer": 0.0, "exact": 1.0}
    qa = SpokenDigitsTask(SpokenDigitsArgs(question="second_word", train_size=12, eval_size=6))
    assert qa.audio_dir == digits_task.audio_dir  # same audio, another question
    rows = qa.eval_rows()
    assert all(r["answer"] == r["transcript"].split()[1] for r in rows)
    scores = qa.score([f"<answer>{r['answer']}</answer>" for r in rows], rows)
    assert scores["accuracy"] == 1.0 and scores["format"] == 1.0


def test_spoken_digits_args_are_validated(mmgrpo_cache):
    from mmgrpo.config import ConfigError, from_dict
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    with pytest.raises(ConfigError, match=r"task.args.question: 'summarise' is not allowed; choose one of: transcribe"):
        from_dict(SpokenDigitsArgs, {"question": "summarise"}, "task.args")
    with pytest.raises(ConfigError, match=r"task.args.speed"):
        SpokenDigitsTask(SpokenDigitsArgs(speed=[200, 100]))
    with pytest.raises(ConfigError, match="min_words"):
        SpokenDigitsTask(SpokenDigitsArgs(question="second_word", min_words=1))


def test_audio_encoder_decodes_each_row_once_per_batch(tmp_path, monkeypatch):
    import mmgrpo.modalities.speech.audio as audio_mod

    path = tmp_path / "a.wav"
    sf.write(str(path), _tone(22050), 22050)
    calls = []
    real = audio_mod.load_audio
    monkeypatch.setattr(audio_mod, "load_audio", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    enc = audio_mod.AudioEncoder(16000)
    row, silent_row = {"audio": str(path)}, {"prompt": "no audio"}
    assert enc.kind == "audio" and enc.load(silent_row) == []
    (wave,) = enc.load(row)
    assert enc.load(row)[0] is wave and len(calls) == 1  # pinned for the batch
    assert enc.processor_kwargs([wave]) == {"audio": [wave], "sampling_rate": 16000}
    cols = enc.columns([row, silent_row])
    assert cols["audio_array"][0] is wave and cols["audio_array"][1] is None and cols["sampling_rate"] == [16000] * 2
    enc.reset()
    enc.load(row)
    assert len(calls) == 2  # a new batch decodes again
