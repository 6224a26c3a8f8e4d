"""The compiled decode step (modalities/tokens/compiled_decode.py, ``model.args.compile_decode``) against the eager
loop: the same keyed tokens, log-probs within fp32 rounding, bounded recompilation, one-line refusals/fallbacks.

The static-cache logic (prefix copied G-expanded into a bucketed ``StaticCache``, the ``[B, S]`` mask, continued
rope positions) is checked with torch.compile's ``eager`` backend (Dynamo traces the step, nothing is code-generated:
seconds); inductor's code is checked once on the tiny Qwen2.5-VL (slow: one compilation, ~40-80 s on 2 busy cores).
"""

import logging

import pytest
import torch

from mmgrpo import noise
from mmgrpo.config import ConfigError
from mmgrpo.modalities.tokens import compiled_decode
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask
from tests import adapter_cases
from tests.numerics import model_reductions
from tests.test_prefix_sharing import TEXT_ARCHITECTURES, TEXT_ROWS, _text_adapter


def _image_rows(n: int = 2):
    """``n`` shapes prompts with images (the tiny Qwen2.5-VL's task); the second one longer."""
    rows = ShapesTask(ShapesArgs(train_size=n, eval_size=1, image_size=56)).train_rows()[:n]
    return [rows[0]] + [dict(r, prompt="Look closely at the image. " + r["prompt"]) for r in rows[1:]]


def _eager_and_compiled(adapter, rows, G, keys, backend):
    """Keyed rollouts of ``rows`` with the eager loop and with the compiled step (``backend``), sampler log-probs."""
    adapter.args.old_logprobs = "sampler"
    adapter.args.compile_decode = False
    eager = adapter.rollout(rows, G, keys)
    adapter.args.compile_decode = True
    adapter.compiled = compiled_decode.CompiledDecoder(backend=backend)
    compiled = adapter.rollout(rows, G, keys)
    return eager, compiled


def _assert_same_draws(adapter, eager, compiled):
    assert torch.equal(compiled.state.completion_ids, eager.state.completion_ids)
    assert compiled.outputs == eager.outputs
    model_reductions(adapter._unwrapped()).assert_logprobs_close(compiled.old_logprobs, eager.old_logprobs)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "gemma"])
def test_static_cache_step_draws_the_eager_tokens_text(model_type):
    """Text decoders: keyed rollouts over the bucketed static cache (eager backend) equal the eager loop's."""
    torch._dynamo.reset()
    adapter = _text_adapter(model_type, **TEXT_ARCHITECTURES[model_type])
    adapter.args.min_new_tokens, adapter.args.temperature = 2, 0.9
    eager, compiled = _eager_and_compiled(adapter, TEXT_ROWS, 3, noise.NoiseKeys(0, 2, (0, 1), 3), "eager")
    _assert_same_draws(adapter, eager, compiled)
    assert adapter.compiled.compilations == 1 and len(adapter.compiled.caches) == 1


def test_static_cache_step_draws_the_eager_tokens_vlm(tiny_vlm_path):
    """The tiny Qwen2.5-VL (images, left-padded prompts, mRoPE positions continued): the eager loop's tokens."""
    torch._dynamo.reset()
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 12, "temperature": 0.8})
    eager, compiled = _eager_and_compiled(adapter, _image_rows(), 4, noise.NoiseKeys(0, 1, (0, 1), 4), "eager")
    _assert_same_draws(adapter, eager, compiled)
    compilations = adapter.compiled.compilations
    greedy_compiled = adapter.evaluate(_image_rows())  # B = P rows: a graph of its own
    assert adapter.compiled.compilations == compilations + 1
    adapter.args.compile_decode = False
    assert adapter.evaluate(_image_rows()) == greedy_compiled


@pytest.mark.parametrize(
    ("case", "lora"),
    [("video", False), ("audio_llm", False), ("vlm_idefics3", False), ("vlm_llava", False), ("vlm", True)],
)
def test_static_cache_step_draws_the_eager_tokens_every_vlm_family(case, lora):
    """The adapters built on the VLM one (video, audio LLM), other media layouts (SmolVLM, LLaVA) and a LoRA-wrapped
    policy: the compiled step (eager backend) draws the eager loop's keyed tokens."""
    torch._dynamo.reset()
    adapter = adapter_cases.build(case, lora=lora, temperature=0.9)
    rows = adapter_cases.CASES[case].rows()[:2]
    eager, compiled = _eager_and_compiled(adapter, rows, 3, noise.NoiseKeys(0, 4, tuple(range(len(rows))), 3), "eager")
    _assert_same_draws(adapter, eager, compiled)
    assert adapter.compiled.compilations >= 1


def test_recompilation_is_bounded_by_length_buckets():
    """Several rollouts with prompts of different lengths: one graph per (B, bucket of L + T), none per step or per
    prompt length inside a bucket; a new bucket compiles once more."""
    torch._dynamo.reset()
    adapter = _text_adapter("qwen2")
    adapter.args.compile_decode, adapter.args.max_new_tokens = True, 6
    adapter.compiled = compiled_decode.CompiledDecoder(backend="eager", bucket=64)
    G, lengths = 2, []
    for i, words in enumerate([0, 1, 3, 5, 7]):  # prompt lengths within one 64-token bucket
        rows = [{"prompt": "Why " + "really " * words + "?"}, {"prompt": "What colour?"}]
        lengths.append(adapter.collate([adapter._encode_prompt(r) for r in rows])["input_ids"].shape[1])
        adapter.rollout(rows, G, noise.NoiseKeys(0, i, (0, 1), G))
    assert len(set(lengths)) == 5 and max(lengths) + 6 <= 64, lengths
    assert adapter.compiled.compilations == 1
    adapter.rollout([{"prompt": "Why " + "really " * 14 + "?"}], G, noise.NoiseKeys(0, 9, (0,), G))  # a new bucket
    adapter.rollout([{"prompt": "Why " + "really " * 16 + "?"}], G, noise.NoiseKeys(0, 9, (0,), G))  # the same one
    assert adapter.compiled.compilations == 2 and len(adapter.compiled.caches) == 2


def test_static_caches_kept_are_bounded_least_recently_used_first():
    """Prompts over three buckets: at most ``MAX_CACHES`` static caches are kept, the least recently used dropped
    first; a bucket met again gets a fresh cache and still draws the eager loop's tokens."""
    torch._dynamo.reset()
    adapter = _text_adapter("qwen2")
    adapter.args.compile_decode, adapter.args.max_new_tokens, adapter.args.old_logprobs = True, 4, "sampler"
    adapter.compiled = compiled_decode.CompiledDecoder(backend="eager", bucket=16)
    rows = {n: [{"prompt": "Why " + "really " * n + "?"}] for n in (1, 14, 30)}  # three buckets of 16
    G, seen = 2, []
    for i, n in enumerate([1, 14, 30, 14, 1]):
        adapter.rollout(rows[n], G, noise.NoiseKeys(0, i, (0,), G))
        seen.append(sorted(key[2] for key in adapter.compiled.caches))  # S of the caches kept
    a, (b, c) = seen[0][0], seen[2]  # the three cache lengths (S), short to long
    assert compiled_decode.MAX_CACHES == 2 and a < b < c, seen
    assert seen == [[a], [a, b], [b, c], [b, c], [a, b]], seen  # the least recently used went each time
    keys = noise.NoiseKeys(0, 7, (0,), G)
    compiled = adapter.rollout(rows[30], G, keys)  # its cache went at the last rollout: made again
    adapter.args.compile_decode = False
    _assert_same_draws(adapter, adapter.rollout(rows[30], G, keys), compiled)


def test_signature_tells_apart_what_the_guards_would():
    """:func:`compiled_decode.signature`: equal for the next token's call (same model, cache, shapes, modes); not
    for a new shape, another cache object, grad mode, the model's training flag or another number."""
    model, cache, other = torch.nn.Linear(2, 2), object(), object()
    tokens, mask = torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 64)
    base = compiled_decode.signature((model, cache, tokens, mask, 5.0))
    assert compiled_decode.signature((model, cache, tokens + 1, mask * 0, 5.0)) == base  # values are not guarded
    assert compiled_decode.signature((model, cache, tokens, torch.ones(4, 128), 5.0)) != base  # a new bucket
    assert compiled_decode.signature((model, other, tokens, mask, 5.0)) != base
    assert compiled_decode.signature((model, cache, tokens, mask, 3.0)) != base
    assert compiled_decode.signature((model, cache, tokens, mask.double(), 5.0)) != base
    with torch.no_grad():
        assert compiled_decode.signature((model, cache, tokens, mask, 5.0)) != base
    model.eval()
    assert compiled_decode.signature((model, cache, tokens, mask, 5.0)) != base


def test_guards_run_on_each_signature_first_call_only(monkeypatch):
    """The compiled step evaluates its Dynamo guards on the first call of a signature and skips them after (a stance
    asked for on every later call), so a new bucket is still told apart: its first call is guarded and compiles,
    and the keyed tokens stay the eager loop's."""
    torch._dynamo.reset()
    stances = []
    set_stance = torch.compiler.set_stance
    monkeypatch.setattr(
        torch.compiler,
        "set_stance",
        lambda *a, **k: stances.append(k.get("skip_guard_eval_unsafe")) or set_stance(*a, **k),
    )
    adapter = _text_adapter("qwen2")
    adapter.args.max_new_tokens, G = 5, 2
    short, long = [{"prompt": "Why?"}], [{"prompt": "Why " + "really " * 14 + "?"}]
    keys = noise.NoiseKeys(0, 0, (0,), G)
    eager = {n: _eager_and_compiled(adapter, rows, G, keys, "eager")[0] for n, rows in (("s", short), ("l", long))}
    adapter.args.compile_decode = True
    adapter.compiled = compiled_decode.CompiledDecoder(backend="eager", bucket=16)
    for i, (rows, name) in enumerate(((short, "s"), (long, "l"), (short, "s"), (long, "l"))):
        stances.clear()
        drawn = adapter.rollout(rows, G, keys)
        _assert_same_draws(adapter, eager[name], drawn)
        # 4 steps: a bucket's first rollout guards its first step (a new static cache); later ones reuse the cache
        assert stances == [True] * (3 if i < 2 else 4), (i, stances)
    assert adapter.compiled.compilations == 2  # one per bucket, though guards were skipped between


def test_bucket_length():
    assert [compiled_decode.bucket_length(n, 64) for n in (1, 63, 64, 65, 200)] == [64, 64, 64, 128, 256]


def test_compile_decode_without_the_kv_expanded_sampler_is_refused_in_one_line(tiny_vlm_path):
    with pytest.raises(ConfigError, match=r"compile_decode.*kv_expand_rollout: true"):
        build_vlm_adapter({"name_or_path": tiny_vlm_path, "compile_decode": True, "kv_expand_rollout": False})


def test_missing_compiler_and_sliding_layers_fall_back_to_the_eager_loop(monkeypatch, caplog):
    """Without a C++ compiler (CPU inductor) or with sliding-window layers, sampling runs the eager loop and warns
    once with the reason; the tokens are the eager loop's."""
    adapter = _text_adapter("gemma3_text", **TEXT_ARCHITECTURES["gemma3_text"])
    assert "sliding" in compiled_decode.unsupported_reason(adapter.model)
    adapter = _text_adapter("qwen2")
    monkeypatch.setattr(compiled_decode.shutil, "which", lambda name: None)
    keys = noise.NoiseKeys(0, 0, (0, 1), 2)
    with caplog.at_level(logging.WARNING):
        eager, compiled = _eager_and_compiled(adapter, TEXT_ROWS, 2, keys, "inductor")
    assert torch.equal(eager.state.completion_ids, compiled.state.completion_ids)
    assert adapter.compiled.compilations == 0 and "C++ compiler" in caplog.text


@pytest.mark.slow
def test_inductor_step_draws_the_eager_tokens_on_the_tiny_vlm(tiny_vlm_path):
    """Inductor's generated code (CPU) on the tiny Qwen2.5-VL: the eager loop's keyed tokens, one compilation."""
    if compiled_decode.compiler_problem(torch.device("cpu")):
        pytest.skip("no C++ compiler for inductor")
    torch._dynamo.reset()
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 10, "temperature": 0.8})
    eager, compiled = _eager_and_compiled(adapter, _image_rows(), 4, noise.NoiseKeys(0, 1, (0, 1), 4), "inductor")
    _assert_same_draws(adapter, eager, compiled)
    assert adapter.compiled.compilations == 1


def _cuda_llama():
    """The tiny Llama on CUDA with fresh compilation state (skips without CUDA)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch._dynamo.reset()
    adapter = _text_adapter("llama")
    adapter.model.cuda()
    return adapter


def _cudagraph_skips() -> int:
    """Graphs inductor has run without CUDA graphs so far in this process."""
    return torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)


@pytest.mark.cuda
def test_cuda_graph_step_draws_the_eager_tokens():
    """On CUDA (inductor with CUDA graphs): the eager loop's keyed tokens on a tiny text decoder."""
    adapter, skips = _cuda_llama(), _cudagraph_skips()
    eager, compiled = _eager_and_compiled(adapter, TEXT_ROWS, 4, noise.NoiseKeys(0, 2, (0, 1), 4), "inductor")
    _assert_same_draws(adapter, eager, compiled)
    assert _cudagraph_skips() == skips, "the step ran without CUDA graphs (perf_hints log says why)"


def test_auto_asks_for_the_compiled_step_on_cuda_only(monkeypatch):
    """``compile_decode: auto`` (the default): compiled where the policy is on CUDA and torch.compile runs; ``true``
    anywhere; ``false`` nowhere."""
    monkeypatch.setattr(compiled_decode, "dynamo_supported", lambda: True)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert [compiled_decode.wanted("auto", d) for d in (cpu, cuda)] == [False, True]
    assert [compiled_decode.wanted(True, d) for d in (cpu, cuda)] == [True, True]
    assert [compiled_decode.wanted(False, d) for d in (cpu, cuda)] == [False, False]
    monkeypatch.setattr(compiled_decode, "dynamo_supported", lambda: False)
    assert not compiled_decode.wanted("auto", cuda)
    compiled_decode.check_args("auto")  # auto where torch.compile cannot run: the eager loop, no refusal
    with pytest.raises(ConfigError, match=r"compile_decode: torch.compile is not supported.*false"):
        compiled_decode.check_args(True)


def test_auto_is_the_default_and_runs_the_eager_loop_on_the_cpu_without_a_word(tiny_vlm_path, caplog):
    """Every token family's default is ``auto``; on the CPU it samples with the eager loop (no compilation) and
    says nothing at WARNING level. ``kv_expand_rollout: false`` is refused with ``true`` only."""
    from mmgrpo.modalities.ar_image.adapter import ARImageArgs
    from mmgrpo.modalities.speech.adapter import WhisperArgs
    from mmgrpo.modalities.speech.audio_llm import AudioLLMArgs
    from mmgrpo.modalities.vlm.adapter import VLMArgs

    assert {cls.compile_decode for cls in (VLMArgs, WhisperArgs, ARImageArgs, AudioLLMArgs)} == {"auto"}
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 3})
    with caplog.at_level(logging.WARNING):
        adapter.rollout(_image_rows(), 2, noise.NoiseKeys(0, 0, (0, 1), 2))
    assert adapter.compiled.compilations == 0 and not caplog.records
    build_vlm_adapter({"name_or_path": tiny_vlm_path, "kv_expand_rollout": False})  # auto: no refusal


def test_compile_decode_takes_true_false_or_auto_in_a_config(tiny_vlm_path):
    """The option's values in a config: true, false and auto load; anything else is one line naming the choices."""
    from mmgrpo.config import from_dict
    from mmgrpo.modalities.vlm.adapter import VLMArgs

    for value in (True, False, "auto"):
        assert from_dict(VLMArgs, {"compile_decode": value}).compile_decode == value
    with pytest.raises(ConfigError, match=r"compile_decode: 'yes' is not allowed; choose one of: true, false, auto$"):
        from_dict(VLMArgs, {"compile_decode": "yes"})


@pytest.mark.cuda
def test_auto_takes_the_cuda_graph_step_on_cuda():
    """On CUDA the default (``auto``) samples with the compiled step: one compilation, as CUDA graphs, the eager
    loop's tokens."""
    adapter, skips = _cuda_llama(), _cudagraph_skips()
    adapter.args.old_logprobs = "sampler"
    keys = noise.NoiseKeys(0, 2, (0, 1), 4)
    assert adapter.args.compile_decode == "auto"
    auto = adapter.rollout(TEXT_ROWS, 4, keys)
    assert adapter.compiled.compilations == 1
    assert _cudagraph_skips() == skips, "the step ran without CUDA graphs (perf_hints log says why)"
    adapter.args.compile_decode = False
    eager = adapter.rollout(TEXT_ROWS, 4, keys)
    _assert_same_draws(adapter, eager, auto)


class _GraphKeeper(compiled_decode.CompiledDecoder):
    """The compiled decoder, keeping every graph it is given (eager backend)."""

    def _backend(self, graphs: bool):
        inner = super()._backend(graphs)
        self.graphs = []

        def keep(gm, example_inputs):
            self.graphs.append(gm)
            return inner(gm, example_inputs)

        return keep


def test_the_cpu_step_passes_grouped_kv_heads_to_sdpa_unexpanded():
    """A grouped-query decoder (Qwen2: 4 query / 2 K/V heads here): the compiled step's SDPA calls take the static
    cache's K/V heads as they are with ``enable_gqa`` (no per-step copy of the cache to the query heads), the switch
    is set only during the call, and the tokens stay the eager loop's."""
    import os

    adapter = _text_adapter("qwen2")
    text = adapter._unwrapped().config
    assert text.num_attention_heads > text.num_key_value_heads  # the case the expansion copied
    adapter.args.old_logprobs, adapter.args.compile_decode = "sampler", False
    keys = noise.NoiseKeys(0, 5, (0, 1), 3)
    eager = adapter.rollout(TEXT_ROWS, 3, keys)
    adapter.args.compile_decode = True
    adapter.compiled = _GraphKeeper(backend="eager")
    torch._dynamo.reset()
    compiled = adapter.rollout(TEXT_ROWS, 3, keys)
    assert compiled_decode.GQA_SWITCH not in os.environ  # restored after the call
    _assert_same_draws(adapter, eager, compiled)
    sdpa = [n for gm in adapter.compiled.graphs for n in gm.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert len(sdpa) == text.num_hidden_layers
    heads = {n.args[1].meta["example_value"].shape[1] for n in sdpa}  # the keys' head count
    assert heads == {text.num_key_value_heads} and all(n.kwargs.get("enable_gqa") for n in sdpa)
