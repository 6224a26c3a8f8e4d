"""CTranslate2 Whisper (``model.bin`` + ``tokenizer.json`` + ``config.json``) → a transformers
``WhisperForConditionalGeneration`` directory (safetensors, processor, generation config).

The file format, as read here (binary version 6; written by ``ModelSpec._serialize`` in OpenNMT/CTranslate2
``python/ctranslate2/specs/model_spec.py``, read by ``src/models/model.cc``), little-endian throughout::

    uint32 binary version | string spec name | uint32 spec revision | uint32 N
    N × (string name | uint8 rank | rank × uint32 dim | uint8 dtype | uint32 byte count | bytes)
    uint32 A | A × (string alias | string target)           aliases: a name that reuses another's array
    string = uint16 length (NUL included) | UTF-8 bytes | NUL
    dtype: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16

Scalars (rank 0) are the spec's options (``decoder/num_heads``, ``decoder/activation``, ...). The Whisper names
(``WhisperSpec`` in ``python/ctranslate2/specs/whisper_spec.py``) map onto transformers' ``modeling_whisper.py``:

- ``*/self_attention/linear_0`` is the fused Q, K, V projection [3D, D] (split in three, in that order);
  ``linear_1`` the output projection. The decoder's cross-attention ``attention/linear_0`` is Q, ``linear_1`` the
  fused K, V [2D, D], ``linear_2`` the output. Whisper's K projection has no bias; a K bias would add one constant
  to every score of a query, which softmax ignores, so dropping it is exact whatever it holds.
- ``layer_norm/gamma``/``beta`` are ``weight``/``bias``; ``ffn/linear_0``/``linear_1`` are ``fc1``/``fc2``, whose
  pre-norm ``ffn/layer_norm`` is ``final_layer_norm``; ``position_encodings/encodings`` are ``embed_positions``.
- ``decoder/projection/weight`` is an alias of the token embedding: ``proj_out`` is tied to ``embed_tokens``.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mmgrpo.compat import keep_generation_fields

BINARY_VERSION = 6
DTYPES = {0: torch.float32, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.float16, 5: torch.bfloat16}
GELU = 3  # CTranslate2's ActivationType: ReLU, GELUTanh, Swish, GELU, ...


@dataclass
class Ct2Model:
    """The arrays of a CTranslate2 ``model.bin``, by name (aliases resolved to the same tensor)."""

    spec: str
    """Spec class name, e.g. ``WhisperSpec``."""
    revision: int
    """Spec revision."""
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    """Name → tensor in the stored dtype (scalars are 0-dimensional)."""

    def scalar(self, name: str) -> int:
        return int(self.arrays[name].item())


class _Reader:
    def __init__(self, data: bytes, path: str):
        self.data, self.offset, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if self.offset + n > len(self.data):
            raise ValueError(f"{self.path}: truncated CTranslate2 file (needs {n} bytes at offset {self.offset})")
        chunk = self.data[self.offset : self.offset + n]
        self.offset += n
        return chunk

    def int(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.int("H"))[:-1].decode("utf-8")


def read_ct2(path: str | os.PathLike) -> Ct2Model:
    """Parse a CTranslate2 ``model.bin`` (module docstring); errors name the file and what is wrong."""
    data = Path(path).read_bytes()
    r = _Reader(data, str(path))
    version = r.int("I")
    if version != BINARY_VERSION:
        raise ValueError(f"{path}: CTranslate2 binary version {version}, this reader knows {BINARY_VERSION}")
    model = Ct2Model(spec=r.string(), revision=r.int("I"))
    for _ in range(r.int("I")):
        name = r.string()
        shape = [r.int("I") for _ in range(r.int("B"))]
        dtype_id, nbytes = r.int("B"), r.int("I")
        if dtype_id not in DTYPES:
            raise ValueError(f"{path}: array {name!r} has unknown dtype id {dtype_id} (known: {sorted(DTYPES)})")
        raw = r.take(nbytes)
        tensor = torch.frombuffer(bytearray(raw), dtype=DTYPES[dtype_id]) if nbytes else torch.empty(0)
        if tensor.numel() != (n := int(torch.tensor(shape).prod())):
            raise ValueError(f"{path}: array {name!r} holds {tensor.numel()} values for shape {shape} ({n})")
        model.arrays[name] = tensor.reshape(shape)
    for _ in range(r.int("I")):
        alias, target = r.string(), r.string()
        model.arrays[alias] = model.arrays[target]
    if r.offset != len(data):
        raise ValueError(f"{path}: {len(data) - r.offset} unread bytes after the aliases (not a CTranslate2 file?)")
    return model


def _linear(sd: dict, hf: str, ct: Ct2Model, name: str, bias: bool = True) -> None:
    sd[f"{hf}.weight"] = ct.arrays[f"{name}/weight"]
    if bias:
        sd[f"{hf}.bias"] = ct.arrays[f"{name}/bias"]


def _norm(sd: dict, hf: str, ct: Ct2Model, name: str) -> None:
    sd[f"{hf}.weight"], sd[f"{hf}.bias"] = ct.arrays[f"{name}/gamma"], ct.arrays[f"{name}/beta"]


def _split(sd: dict, hf: str, ct: Ct2Model, name: str, parts: list[str]) -> None:
    """A fused projection [k·D, D] split into ``parts`` projections (K without a bias: module docstring)."""
    weights = ct.arrays[f"{name}/weight"].chunk(len(parts))  # k × [D, D]
    biases = ct.arrays[f"{name}/bias"].chunk(len(parts))  # k × [D]
    for part, w, b in zip(parts, weights, biases):
        sd[f"{hf}.{part}.weight"] = w
        if part != "k_proj":
            sd[f"{hf}.{part}.bias"] = b


def _layers(ct: Ct2Model, side: str) -> int:
    return len({m[1] for k in ct.arrays if (m := re.match(rf"{side}/layer_(\d+)/", k))})


def whisper_state_dict(ct: Ct2Model) -> tuple[dict, dict[str, torch.Tensor]]:
    """(``WhisperConfig`` sizes, transformers state dict) of a parsed ``WhisperSpec`` (tensors in the stored
    dtype; ``proj_out.weight`` is left to the tied embedding)."""
    if ct.spec != "WhisperSpec":
        raise ValueError(f"expected a CTranslate2 WhisperSpec, got {ct.spec!r}")
    for side in ("encoder", "decoder"):
        if f"{side}/activation" in ct.arrays and ct.scalar(f"{side}/activation") != GELU:
            raise ValueError(f"{side}/activation is {ct.scalar(f'{side}/activation')}, Whisper's is GELU ({GELU})")
    sd: dict[str, torch.Tensor] = {}
    for side in ("encoder", "decoder"):
        hf = f"model.{side}"
        sd[f"{hf}.embed_positions.weight"] = ct.arrays[f"{side}/position_encodings/encodings"]
        _norm(sd, f"{hf}.layer_norm", ct, f"{side}/layer_norm")
        for i in range(_layers(ct, side)):
            h, c = f"{hf}.layers.{i}", f"{side}/layer_{i}"
            _norm(sd, f"{h}.self_attn_layer_norm", ct, f"{c}/self_attention/layer_norm")
            _split(sd, f"{h}.self_attn", ct, f"{c}/self_attention/linear_0", ["q_proj", "k_proj", "v_proj"])
            _linear(sd, f"{h}.self_attn.out_proj", ct, f"{c}/self_attention/linear_1")
            _norm(sd, f"{h}.final_layer_norm", ct, f"{c}/ffn/layer_norm")
            _linear(sd, f"{h}.fc1", ct, f"{c}/ffn/linear_0")
            _linear(sd, f"{h}.fc2", ct, f"{c}/ffn/linear_1")
            if side == "decoder":
                _norm(sd, f"{h}.encoder_attn_layer_norm", ct, f"{c}/attention/layer_norm")
                _linear(sd, f"{h}.encoder_attn.q_proj", ct, f"{c}/attention/linear_0")
                _split(sd, f"{h}.encoder_attn", ct, f"{c}/attention/linear_1", ["k_proj", "v_proj"])
                _linear(sd, f"{h}.encoder_attn.out_proj", ct, f"{c}/attention/linear_2")
    _linear(sd, "model.encoder.conv1", ct, "encoder/conv1")
    _linear(sd, "model.encoder.conv2", ct, "encoder/conv2")
    sd["model.decoder.embed_tokens.weight"] = ct.arrays["decoder/embeddings/weight"]
    vocab, d_model = sd["model.decoder.embed_tokens.weight"].shape
    sizes = dict(
        vocab_size=vocab,
        d_model=d_model,
        num_mel_bins=sd["model.encoder.conv1.weight"].shape[1],
        encoder_layers=_layers(ct, "encoder"),
        decoder_layers=_layers(ct, "decoder"),
        encoder_attention_heads=ct.scalar("encoder/num_heads"),
        decoder_attention_heads=ct.scalar("decoder/num_heads"),
        encoder_ffn_dim=sd["model.encoder.layers.0.fc1.weight"].shape[0],
        decoder_ffn_dim=sd["model.decoder.layers.0.fc1.weight"].shape[0],
        max_source_positions=sd["model.encoder.embed_positions.weight"].shape[0],
        max_target_positions=sd["model.decoder.embed_positions.weight"].shape[0],
    )
    return sizes, sd


def _tokenizer(tokenizer_json: Path, chunk_length: int):
    """A ``WhisperTokenizer`` over the shipped ``tokenizer.json`` with the timestamp tokens ``<|0.00|>`` …
    ``<|30.00|>`` added after the specials (the shipped file stops at ``<|notimestamps|>``; transformers' Whisper
    tokenizers carry them, and the adapter bans them by name)."""
    import tempfile

    from transformers import AddedToken, WhisperTokenizer

    with tempfile.TemporaryDirectory() as tmp:  # from_pretrained reads tokenizer.json from a directory
        (Path(tmp) / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
        tok = WhisperTokenizer.from_pretrained(tmp)
    timestamps = [f"<|{i * 0.02:.2f}|>" for i in range(chunk_length * 50 + 1)]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in timestamps])
    return tok


def convert_whisper(source: str | os.PathLike, directory: str | os.PathLike) -> Path:
    """Write the CTranslate2 Whisper in ``source`` (``model.bin``, ``tokenizer.json``, ``config.json``) to
    ``directory`` as a transformers model (fp32 safetensors), ``WhisperProcessor`` and generation config.

    The generation config is the one transformers' Whisper ``generate`` reads (the fields of the hub's
    ``openai/whisper-*`` ``generation_config.json``): English-only when the vocabulary is under 51,865 tokens
    (transformers' rule: ``is_multilingual = vocab_size >= 51865``), whose decoder prompt is then
    ``<|startoftranscript|><|notimestamps|>`` with no language or task token; ``suppress_tokens`` and
    ``begin_suppress_tokens`` from CTranslate2's ``config.json`` (``suppress_ids``, ``suppress_ids_begin``).
    """
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperProcessor
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    source, directory = Path(source), Path(directory)
    sizes, sd = whisper_state_dict(read_ct2(source / "model.bin"))
    extra = json.loads((source / "config.json").read_text())
    chunk_length = 30  # Whisper's window: 3000 mel frames, max_source_positions = 1500
    tok = _tokenizer(source / "tokenizer.json", chunk_length)
    if len(tok) != sizes["vocab_size"]:
        raise ValueError(f"{source}/tokenizer.json: {len(tok)} tokens with timestamps, the model has {sizes}")
    ids = tok.convert_tokens_to_ids
    eot, sot = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    multilingual = sizes["vocab_size"] >= 51865
    config = WhisperConfig(
        **sizes,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=sot,
        suppress_tokens=extra["suppress_ids"],
        begin_suppress_tokens=extra["suppress_ids_begin"],
        tie_word_embeddings=True,
    )
    model = WhisperForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if unexpected or set(missing) != {"proj_out.weight"}:
        raise ValueError(f"{source}/model.bin: missing {missing}, unexpected {unexpected} transformers weights")
    model.tie_weights()
    g = model.generation_config
    g.decoder_start_token_id, g.eos_token_id, g.pad_token_id, g.bos_token_id = sot, eot, eot, eot
    g.is_multilingual = multilingual
    if multilingual:
        vocab = tok.get_vocab()  # Whisper before large-v3 has 99 languages of transformers' 100 (no <|yue|>)
        g.lang_to_id = {f"<|{c}|>": vocab[f"<|{c}|>"] for c in LANGUAGES if f"<|{c}|>" in vocab}
        g.task_to_id = {"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")}
        g.task = "transcribe"  # else generate() leaves the task token out of the prompt the model was trained on
    g.no_timestamps_token_id = ids("<|notimestamps|>")
    g.prev_sot_token_id = ids("<|startofprev|>")
    g.max_initial_timestamp_index = 50
    g.max_length = sizes["max_target_positions"]
    g.suppress_tokens = list(extra["suppress_ids"])
    g.begin_suppress_tokens = list(extra["suppress_ids_begin"])
    g.alignment_heads = [list(h) for h in extra.get("alignment_heads", [])]
    keep_generation_fields(g)  # keep these fields when loading (else regenerated from the model config)
    fe = WhisperFeatureExtractor(feature_size=sizes["num_mel_bins"], sampling_rate=16000, hop_length=160)
    processor = WhisperProcessor(feature_extractor=fe, tokenizer=tok)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
