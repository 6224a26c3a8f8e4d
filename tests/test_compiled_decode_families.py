"""The compiled decode step of Whisper (modalities/speech/compiled_step.py) and of the CFG image-token generator
(modalities/ar_image/compiled_step.py), ``model.args.compile_decode``, against each family's eager loop: the same
keyed tokens, sampler log-probs within fp32 rounding, bounded recompilation, one-line refusal and fallback.

The static-cache logic (prefill copied G-expanded into bucketed static caches, Whisper's cross-attention cache and
positions, the CFG rows and left-padded masks) is checked with torch.compile's ``eager`` backend (Dynamo traces the
step, nothing is code-generated: seconds); inductor's code once on the tiny Whisper (slow).
"""

import contextlib
import logging

import pytest
import torch

from mmgrpo import noise
from mmgrpo.config import ConfigError
from mmgrpo.modalities.ar_image.adapter import build_ar_image_adapter
from mmgrpo.modalities.speech.adapter import build_whisper_adapter
from mmgrpo.modalities.tokens import compiled_decode, prefix_sharing
from tests import adapter_cases
from tests.numerics import adapter_reductions

AR_ROWS = [{"prompt": "a red circle"}, {"prompt": "a big blue square on the right of a small green triangle"}]


def _compiled(adapter, backend: str = "eager", bucket: int = compiled_decode.BUCKET) -> None:
    """Turn ``compile_decode`` on with a fresh decoder (its own graphs, caches and count)."""
    torch._dynamo.reset()
    adapter.args.compile_decode = True
    adapter.compiled = compiled_decode.CompiledDecoder(backend=backend, bucket=bucket)


def _whisper_pair(adapter, rows, G, keys, backend="eager"):
    """Sampled ids and sampler log-probs [B, T] of the eager loop, then of the compiled step."""
    adapter.args.compile_decode = False
    cache = adapter._audio_cache(rows)
    eager = adapter._sample(cache, G, False, keys)
    _compiled(adapter, backend)
    return eager, adapter._sample(cache, G, False, keys)


def _ar_pair(adapter, rows, G, keys, backend="eager"):
    """Image tokens and sampler log-probs [B, T] of the eager loop, then of the compiled step."""
    adapter.args.compile_decode = False
    ids = [adapter._encode(r) for r in rows]
    eager = adapter._sample(ids, G, False, keys=keys)
    _compiled(adapter, backend)
    return eager, adapter._sample(ids, G, False, keys=keys)


def _assert_same_draws(adapter, eager, compiled, factor: float = 1.0):
    assert torch.equal(compiled[0], eager[0])
    adapter_reductions(adapter).assert_logprobs_close(compiled[1], eager[1], factor=factor)


@pytest.mark.parametrize("lora", [False, True])
def test_whisper_static_step_draws_the_eager_tokens(lora):
    """Keyed Whisper rollouts over the static self-/cross-attention caches (eager backend): the eager loop's tokens,
    transcripts and log-probs; one graph, none per step."""
    adapter = adapter_cases.build("whisper", lora=lora, temperature=0.9, max_new_tokens=8)
    rows = adapter_cases.CASES["whisper"].rows()
    keys = noise.NoiseKeys(0, 3, (0, 1), 3)
    eager, compiled = _whisper_pair(adapter, rows, 3, keys)
    _assert_same_draws(adapter, eager, compiled)
    assert (eager[0] != adapter.eos_id).sum() > 6  # tokens were drawn, not only end-of-text
    assert adapter.compiled.compilations == 1
    rollout = adapter.rollout(rows, 3, keys)  # the rollout path: the same tokens again, no new graph
    assert torch.equal(rollout.state.completion_ids, eager[0]) and adapter.compiled.compilations == 1
    greedy = adapter.evaluate(rows)  # B = P rows: a graph of its own
    assert adapter.compiled.compilations == 2
    adapter.args.compile_decode = False
    assert adapter.evaluate(rows) == greedy


@pytest.mark.parametrize("guidance_scale", [3.0, 1.0])
def test_ar_image_static_step_draws_the_eager_tokens(guidance_scale):
    """Keyed CFG image tokens (both branches in one static cache, left-padded prompts of two lengths; and without
    guidance, one branch): the eager loop's tokens and guided log-probs; one graph."""
    adapter = adapter_cases.build("ar_image", lora=True, guidance_scale=guidance_scale)
    keys = noise.NoiseKeys(0, 5, (0, 1), 3)
    eager, compiled = _ar_pair(adapter, AR_ROWS, 3, keys)
    _assert_same_draws(adapter, eager, compiled, factor=guidance_scale)
    assert adapter.compiled.compilations == 1 and len(adapter.compiled.caches) == 1
    rollout = adapter.rollout(AR_ROWS, 3, keys)
    assert torch.equal(rollout.state.image_tokens, eager[0]) and adapter.compiled.compilations == 1


def test_ar_image_recompilation_is_bounded_by_length_buckets():
    """Rollouts of prompts of five lengths inside one bucket of L + T: one graph; a prompt past it compiles once
    more, and a second prompt in that bucket does not."""
    adapter = build_ar_image_adapter({"name_or_path": "tiny-janus", "guidance_scale": 2.0}, seed=0)
    _compiled(adapter, bucket=64)
    lengths = []
    for i, words in enumerate([0, 2, 4, 6, 9]):
        rows = [{"prompt": "a circle " + "very " * words}, {"prompt": "a square"}]
        lengths.append(max(len(adapter._encode(r)) for r in rows))
        adapter.rollout(rows, 2, noise.NoiseKeys(0, i, (0, 1), 2))
    assert len(set(lengths)) == 5 and max(lengths) + adapter.T <= 64, lengths
    assert adapter.compiled.compilations == 1
    for words in (40, 44):  # L + T in the next bucket
        adapter.rollout([{"prompt": "a circle " + "very " * words}], 2, noise.NoiseKeys(0, 9, (0,), 2))
    assert adapter.compiled.compilations == 2 and len(adapter.compiled.caches) == 2


def test_whisper_recompilation_is_bounded_by_length_buckets():
    """Whisper's decoder prompt has one length and the encoder one window, so the graph depends on (B, bucket of
    Lp + T): other clips and completion budgets inside a bucket reuse it; a budget past it compiles once more."""
    adapter = adapter_cases.build("whisper", lora=False, temperature=0.9)
    rows = adapter_cases.CASES["whisper"].rows()
    _compiled(adapter, bucket=16)
    Lp = adapter.prefix.shape[0]
    for i, (rows_i, T) in enumerate([(rows, 6), (rows[::-1], 9), (rows, 16 - Lp)]):
        adapter.args.max_new_tokens = T
        adapter.rollout(rows_i, 2, noise.NoiseKeys(0, i, (0, 1), 2))
    assert adapter.compiled.compilations == 1
    adapter.args.max_new_tokens = 17 - Lp  # Lp + T = 17: the 32-position bucket
    adapter.rollout(rows, 2, noise.NoiseKeys(0, 7, (0, 1), 2))
    adapter.args.max_new_tokens = 20
    adapter.rollout(rows, 2, noise.NoiseKeys(0, 8, (0, 1), 2))
    assert adapter.compiled.compilations == 2
    assert {key[0] for key in adapter.compiled.caches} == {"self", "cross"}


def test_compile_decode_is_refused_at_load_where_torch_compile_cannot_run(monkeypatch):
    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    with pytest.raises(ConfigError, match=r"model.args.compile_decode: torch.compile is not supported.*false"):
        build_ar_image_adapter({"name_or_path": "tiny-janus", "compile_decode": True}, seed=0)
    with pytest.raises(ConfigError, match=r"model.args.compile_decode: torch.compile is not supported.*false"):
        build_whisper_adapter({"name_or_path": "tiny-whisper", "compile_decode": True})


def test_missing_compiler_falls_back_to_the_eager_loop(monkeypatch, caplog):
    """Without a C++ compiler (CPU inductor) sampling runs the eager loop, warns once with the reason, and compiles
    nothing; the tokens are the eager loop's."""
    adapter = build_ar_image_adapter({"name_or_path": "tiny-janus", "guidance_scale": 2.0}, seed=0)
    monkeypatch.setattr(compiled_decode.shutil, "which", lambda name: None)
    monkeypatch.setattr(prefix_sharing, "_warned", set())  # warned once per process: this test's own "once"
    with caplog.at_level(logging.WARNING):
        eager, compiled = _ar_pair(adapter, AR_ROWS, 2, noise.NoiseKeys(0, 0, (0, 1), 2), backend="inductor")
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    assert adapter.compiled.compilations == 0 and "C++ compiler" in caplog.text


@pytest.mark.slow
def test_inductor_step_draws_the_eager_tokens_on_the_tiny_whisper():
    """Inductor's generated code (CPU) on the tiny Whisper: the eager loop's keyed tokens, one compilation."""
    if compiled_decode.compiler_problem(torch.device("cpu")):
        pytest.skip("no C++ compiler for inductor")
    adapter = adapter_cases.build("whisper", lora=False, temperature=0.9, max_new_tokens=8)
    rows = adapter_cases.CASES["whisper"].rows()
    eager, compiled = _whisper_pair(adapter, rows, 3, noise.NoiseKeys(0, 3, (0, 1), 3), backend="inductor")
    _assert_same_draws(adapter, eager, compiled)
    assert adapter.compiled.compilations == 1


@contextlib.contextmanager
def _fp32_matmuls():
    """TF32 off in the block (both arms in fp32, as tests/test_cuda.py compares), restored after."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.mark.cuda
def test_cuda_graph_step_draws_the_eager_tokens_whisper():
    """On CUDA (inductor with CUDA graphs, fp32 matmuls): the tiny Whisper's eager keyed tokens."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    adapter = adapter_cases.build("whisper", lora=False, temperature=0.9, max_new_tokens=8)
    adapter.model.cuda()
    rows = adapter_cases.CASES["whisper"].rows()
    with _fp32_matmuls():
        eager, compiled = _whisper_pair(adapter, rows, 4, noise.NoiseKeys(0, 3, (0, 1), 4), backend="inductor")
    _assert_same_draws(adapter, eager, compiled)


@pytest.mark.cuda
def test_cuda_graph_step_draws_the_eager_tokens_ar_image():
    """On CUDA (inductor with CUDA graphs, fp32 matmuls): the tiny Janus's eager keyed CFG image tokens."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    adapter = build_ar_image_adapter({"name_or_path": "tiny-janus", "guidance_scale": 3.0}, seed=0)
    adapter.model.cuda()
    with _fp32_matmuls():
        eager, compiled = _ar_pair(adapter, AR_ROWS, 4, noise.NoiseKeys(0, 5, (0, 1), 4), backend="inductor")
    _assert_same_draws(adapter, eager, compiled, factor=3.0)
