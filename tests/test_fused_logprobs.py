"""The fused linear log-prob (modalities/tokens/logprobs.py, ``linear_token_logprobs``) against today's path:
``token_logprobs`` of the logits ``hidden @ weight.T (+ bias)``.

Tolerances come from the computation (tests/numerics.py): both paths sum the same terms in another order. Here
the longest reduction is the softmax normaliser over V, stacked on the H-term logits (depth 2; the backward doubles
it); for a tiny model the budget is its config's (``model_reductions``). Values are compared on the log-prob scale,
gradients relative to the tensor's largest entry: each gradient element sums V terms, and a small element is a
cancellation whose rounding is that of its terms.
A dispatch-mode test records every tensor the fused forward and backward create and shows that none has n·T·V
elements.
"""

import contextlib
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmgrpo.modalities.tokens.logprobs import (
    banned_mask,
    fusable_head,
    head_outputs_hidden,
    linear_token_logprobs,
    token_logprobs,
)
from tests.numerics import Reductions, gradient_scales, logprob_scale, model_reductions

N, T, H, V = 3, 5, 16, 1000
KERNEL = Reductions(terms=V, depth=2)  # logits (H terms), then the normaliser (V terms)


def _inputs(seed=0, dtype=torch.float32, bias=False, tied=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, T, H, generator=g).to(dtype).requires_grad_()  # [n, T, H]
    weight = (torch.randn(V, H, generator=g) / math.sqrt(H) * 3).to(dtype).requires_grad_()  # [V, H]
    b = torch.randn(V, generator=g).to(dtype).requires_grad_() if bias else None  # [V]
    tokens = torch.randint(0, V, (N, T), generator=g)  # [n, T]
    tokens[2, 0] = 1  # banned at step 0 below: log π = −inf
    return hidden, weight, b, tokens


def _close_grad(got, want, budget=KERNEL, factor=1.0):
    """Gradients of two summation orders: the backward's budget, relative to the tensor's largest entry."""
    b = budget.backward()
    torch.testing.assert_close(got, want, rtol=0, atol=factor * b.tol(float(want.abs().max())))


def _grads(out, inputs, weights):
    finite = torch.isfinite(out)
    return torch.autograd.grad((out[finite] * weights[finite]).sum(), [x for x in inputs if x is not None])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("rows,chunk", [(1024, 4096), (4, 128), (7, 37)])  # one block; uneven; odd sizes
@pytest.mark.parametrize("with_ban", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_the_logits_path(temperature, rows, chunk, with_ban, bias):
    hidden, weight, b, tokens = _inputs(bias=bias)
    banned = banned_mask(V, always=[5, 17, 999], early=[0, 1], early_steps=2, steps=T) if with_ban else None
    weights = torch.randn(N, T, generator=torch.Generator().manual_seed(1))  # a loss that weights each token
    logits = torch.nn.functional.linear(hidden, weight, b)  # [n, T, V]
    ref = token_logprobs(logits, tokens, temperature=temperature, banned=banned)
    out = linear_token_logprobs(
        hidden, weight, tokens, bias=b, temperature=temperature, banned=banned, rows=rows, chunk=chunk
    )
    assert out.dtype == torch.float32 and out.shape == (N, T)
    KERNEL.assert_logprobs_close(out, ref)
    assert bool(torch.isinf(out[2, 0])) == with_ban
    for got, want in zip(_grads(out, (hidden, weight, b), weights), _grads(ref, (hidden, weight, b), weights)):
        _close_grad(got, want)


def test_tied_head_gradient_sums_both_uses():
    """A tied head (the input embedding is the lm_head): the weight's gradient adds the embedding's."""
    hidden, weight, _, tokens = _inputs()
    ids = torch.randint(0, V, (N, T), generator=torch.Generator().manual_seed(2))

    def loss(fn):
        h = hidden + torch.nn.functional.embedding(ids, weight)  # [n, T, H] the weight used twice
        return fn(h).sum()

    ref = loss(lambda h: token_logprobs(h @ weight.T, tokens, temperature=0.9))
    out = loss(lambda h: linear_token_logprobs(h, weight, tokens, temperature=0.9, rows=4, chunk=100))
    KERNEL.assert_logprobs_close(out, ref)
    (g_ref,) = torch.autograd.grad(ref, weight)
    (g_out,) = torch.autograd.grad(out, weight)
    _close_grad(g_out, g_ref)


def test_bf16_weights_give_the_log_probs_of_the_fp32_logits():
    """bf16 hidden states and weight: fp32 accumulation, so the result is that of the upcast operands."""
    hidden, weight, _, tokens = _inputs(dtype=torch.bfloat16)
    out = linear_token_logprobs(hidden, weight, tokens, temperature=0.7, rows=4, chunk=100)
    h32 = hidden.detach().float().requires_grad_()
    w32 = weight.detach().float().requires_grad_()
    ref = token_logprobs(h32 @ w32.T, tokens, temperature=0.7)
    KERNEL.assert_logprobs_close(out, ref)
    gh, gw = torch.autograd.grad(out.sum(), (hidden, weight))
    assert gh.dtype == gw.dtype == torch.bfloat16
    rh, rw = torch.autograd.grad(ref.sum(), (h32, w32))
    for got, want in ((gh, rh), (gw, rw)):  # fp32 accumulation, rounded to bf16 once: half a bf16 ulp
        torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=KERNEL.backward().tol(float(want.abs().max())))
    # the bf16 logits path differs by bf16's rounding of the logits; round_to=bf16 reproduces it
    bf = token_logprobs(hidden @ weight.T, tokens, temperature=0.7)
    assert (out - bf).abs().max() > 1e-4
    rounded = linear_token_logprobs(hidden, weight, tokens, temperature=0.7, rows=4, chunk=100, round_to=torch.bfloat16)
    KERNEL.assert_logprobs_close(rounded, bf)
    gh, gw = torch.autograd.grad(rounded.sum(), (hidden, weight))  # fp32 backward through the rounding
    torch.testing.assert_close(gh.float(), rh, rtol=2**-7, atol=1e-2 * float(rh.abs().max()))
    torch.testing.assert_close(gw.float(), rw, rtol=2**-7, atol=1e-2 * float(rw.abs().max()))


class _Sizes(TorchDispatchMode):
    """Records the element count of every tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.numels = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numels.append(t.numel())
        return out


def test_no_tensor_of_n_t_v_elements_is_created():
    """Forward and backward (default block sizes, V larger than one chunk) never create n·T·V elements; the
    logits path does."""
    v, h = 5000, 8  # v > the default chunk of 4096 columns; h < n·T, so the weight is smaller than n·T·V
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, T, h, generator=g, requires_grad=True)
    weight = (torch.randn(v, h, generator=g) / 4).requires_grad_()
    tokens = torch.randint(0, v, (N, T), generator=g)
    banned = banned_mask(v, always=[3], early=[0], early_steps=1, steps=T)
    with _Sizes() as fused:
        linear_token_logprobs(hidden, weight, tokens, temperature=0.8, banned=banned).sum().backward()
    assert max(fused.numels) < N * T * v and N * T * v not in fused.numels
    assert max(fused.numels) == max(v * h, N * T * 4096)  # one [n·T, chunk] block, or the weight's gradient
    with _Sizes() as plain:
        token_logprobs(hidden @ weight.T, tokens, temperature=0.8, banned=banned).sum().backward()
    assert N * T * v in plain.numels  # the check can fail: the logits path creates them


def test_head_outputs_hidden_bypasses_only_a_plain_linear_head():
    from mmgrpo.modalities.vlm.tiny import build_tiny_qwen25_vl  # noqa: F401  (import check only)

    lin = torch.nn.Linear(4, 9, bias=False)
    x = torch.randn(2, 4)
    with head_outputs_hidden(lin):
        assert torch.equal(lin(x), x)
    assert lin(x).shape == (2, 9)  # restored
    model = torch.nn.Module()
    model.get_output_embeddings = lambda: lin
    assert fusable_head(model) is lin
    model.get_output_embeddings = lambda: torch.nn.Sequential(lin)
    assert fusable_head(model) is None


def _one_trainer_step(tmp_path, monkeypatch, fused: bool) -> tuple[dict, dict, Reductions]:
    """One GRPO step of the quickstart config (tiny Qwen2.5-VL, β > 0): its metrics, the gradients the
    optimizer stepped with, and the model's rounding budget."""
    import mmgrpo.modalities.tokens.policy as vlm  # the token policies take their fusable head from here
    from mmgrpo.loader import load_config
    from mmgrpo.trainer import Trainer
    from tests.test_trainer import QUICK, SMALL

    if not fused:
        monkeypatch.setattr(vlm, "fusable_head", lambda model, head=None: None)
    cfg = load_config(QUICK, SMALL + [f"output_dir={tmp_path}", "steps=1", "warmup.steps=0"])
    trainer = Trainer(cfg)
    assert (vlm.fusable_head(trainer.adapter.model) is not None) == fused
    runner = trainer.rewards  # the untrained model scores 0 everywhere: add the completion's length, for a gradient

    class WithLength:
        weights, names = runner.weights, runner.names

        def __call__(self, outputs, prompts, columns, **trainer_kwargs):
            scores, metrics = runner(outputs, prompts, columns, **trainer_kwargs)  # [B, K]
            return scores + torch.tensor([[len(o) / 10] for o in outputs], dtype=scores.dtype), metrics

    trainer.rewards = WithLength()
    grads = {}

    def keep(optimizer, args, kwargs):
        grads.update({n: p.grad.clone() for n, p in trainer.adapter.model.named_parameters() if p.grad is not None})

    getattr(trainer.optimizer, "optimizer", trainer.optimizer).register_step_pre_hook(keep)
    metrics = trainer.train_step(0)
    monkeypatch.undo()
    return metrics, grads, model_reductions(trainer.adapter.model)


def test_trainer_step_equals_the_logits_path(tmp_path, monkeypatch, mmgrpo_cache):
    """A whole VLM trainer step (rollout, old/ref log-probs, loss, backward) with the fused head and with the
    logits path: same loss, KL and gradients within the model's rounding budget (the loss and KL: the forward's,
    on a scale of at least 1; gradients: the backward's, relative to each tensor's largest entry)."""
    fused, g_fused, budget = _one_trainer_step(tmp_path / "fused", monkeypatch, True)
    plain, g_plain, _ = _one_trainer_step(tmp_path / "plain", monkeypatch, False)
    for key in ("loss/policy", "kl/mean"):
        assert key in plain and abs(fused[key] - plain[key]) <= budget.tol(max(1.0, abs(plain[key]))), key
    grad_norm = plain["optim/grad_norm"]
    assert abs(fused["optim/grad_norm"] - grad_norm) <= budget.backward().tol(grad_norm)
    assert g_fused.keys() == g_plain.keys() and grad_norm > 1e-2  # a step with a gradient
    for name, want in g_plain.items():
        _close_grad(g_fused[name], want, budget)


def _parity(monkeypatch, module, adapter, state, index, factor=1.0):
    """The adapter's training log-probs and their gradients with the fused head and, ``fusable_head`` switched
    off in ``module``, with the logits path: within the model's rounding budget (``factor`` times it), values on
    the log-prob scale, gradients relative to their tensor's largest entry."""
    budget = model_reductions(adapter.model)
    names, params = zip(*[(n, p) for n, p in adapter.model.named_parameters() if p.requires_grad])
    weights = torch.randn(index.shape[0], 1, generator=torch.Generator().manual_seed(3))  # [n, 1]

    def run():
        logp = adapter._token_logprobs(adapter.model, state, index)  # [n, T]
        return logp.detach(), torch.autograd.grad((logp * weights).sum(), params, allow_unused=True)

    fused, g_fused = run()
    with monkeypatch.context() as m:
        m.setattr(module, "fusable_head", lambda model, head=None: None)
        plain, g_plain = run()
    torch.testing.assert_close(fused, plain, rtol=0, atol=factor * budget.tol(logprob_scale(plain)))
    assert sum(g is not None for g in g_plain) > len(params) // 2
    scales = gradient_scales(dict(zip(names, g_plain)))  # a key bias's gradient is 0 up to rounding
    for name, got, want in zip(names, g_fused, g_plain):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=factor * budget.backward().tol(scales[name]), msg=name)


@pytest.mark.parametrize("cfg_logprob", ["guided", "cond", "scaled"])
def test_ar_image_cfg_logprobs_equal_the_logits_path(cfg_logprob, monkeypatch, mmgrpo_cache):
    """Janus's image head (proj_out → GELU → vision_head, with a bias): the fused path scores the guided
    combination of vision_head's input features. Tolerance s = 3 times the model's budget: ℓ_u + s·(ℓ_c − ℓ_u)
    scales the branches' rounding by s, and the two paths round before (features) and after (logits) the head."""
    import mmgrpo.modalities.ar_image.adapter as ar
    from tests.test_ar_image_adapter import _sampled_state, make

    adapter = make(lora=False, cfg_logprob=cfg_logprob, temperature=0.8)
    assert ar.fusable_head(adapter.model, adapter.family.image_head(adapter.model)) is not None
    state, _ = _sampled_state(adapter)
    _parity(monkeypatch, ar, adapter, state, torch.arange(4), factor=adapter.args.guidance_scale)


def test_whisper_logprobs_equal_the_logits_path(monkeypatch, mmgrpo_cache):
    import shutil

    import mmgrpo.modalities.tokens.policy as policy  # Whisper scores through TokenPolicy._token_logprobs
    from mmgrpo.modalities.speech.adapter import build_whisper_adapter
    from mmgrpo.modalities.speech.tiny import resolve_model_path
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    rows = SpokenDigitsTask(SpokenDigitsArgs(train_size=2, eval_size=1, warmup_size=2)).train_rows()
    adapter = build_whisper_adapter({"name_or_path": resolve_model_path("tiny-whisper"), "temperature": 0.8})
    assert policy.fusable_head(adapter.model) is adapter.model.proj_out
    rollout = adapter.rollout(rows, group_size=3)
    _parity(monkeypatch, policy, adapter, rollout.state, torch.arange(6))


class _Ops(TorchDispatchMode):
    """Records the name of every aten op run."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


_MATMULS = ("aten::mm", "aten::addmm", "aten::matmul", "aten::bmm")


def _buffer_allocations(fn, nbytes: int) -> tuple[list, list]:
    """The ops of ``fn()`` that allocate a buffer of exactly ``nbytes`` bytes, matmul outputs left out (the fused
    head's ``[chunk, H]`` products have a ``[V, H]``'s size when V <= chunk), and every event; torch.profiler's self
    CPU memory, not a dispatch mode, which would change how autograd sums gradients."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = list(prof.events())
    return [e for e in events if e.self_cpu_memory_usage == nbytes and e.name not in _MATMULS], events


def test_tied_embedding_and_head_share_one_gradient_made_last(monkeypatch, mmgrpo_cache):
    """The tiny Qwen2.5-VL ties its embedding to the lm_head. With the fused head its training forward's lookups
    and its head share one gradient (``tied_embedding_grad``): the backward allocates one ``[V, H]`` buffer (made at
    the end, becoming ``.grad``), where autograd's own path makes the head's plus one per lookup
    (``embedding_dense_backward``'s, or a sparse one summed out of place); every gradient equals the plain path's
    (1e-6 of scale), ``.grad`` is dense, and the embedding is left as it was (no hook, no ``forward`` override)."""
    import mmgrpo.modalities.tokens.logprobs as logprobs
    import mmgrpo.modalities.tokens.policy as policy
    from tests.adapter_cases import CASES, build

    monkeypatch.setattr(logprobs, "LATE_GRADIENT_MIN_BYTES", 0)  # the tiny head's gradient is below the threshold
    adapter = build("vlm", lora=False)
    model = adapter.model
    emb, head = model.get_input_embeddings(), policy.fusable_head(model)
    assert head is not None and emb.weight is head.weight  # tied: the case this is for
    V, H = emb.weight.shape
    assert sum(p.numel() == V * H for p in model.parameters()) == 1  # the byte count below names this tensor only
    rollout = adapter.rollout(CASES["vlm"].rows()[:2], group_size=2)
    params = [p for p in model.parameters() if p.requires_grad]

    def run():
        model.zero_grad(set_to_none=True)
        box = {}

        def step():
            logp = adapter._token_logprobs(model, rollout.state, torch.arange(4))  # [n, T]
            logp[torch.isfinite(logp)].sum().backward()
            box["logp"] = logp.detach()

        made, events = _buffer_allocations(step, V * H * emb.weight.element_size())
        return box["logp"], [None if p.grad is None else p.grad.clone() for p in params], made, events

    tied, g_tied, made, events = run()
    assert "forward" not in emb.__dict__ and not emb.weight._backward_hooks and emb.sparse is False
    with monkeypatch.context() as m:
        m.setattr(policy, "tied_embedding_grad", lambda model, head: contextlib.nullcontext())
        plain, g_plain, made_plain, _ = run()
    assert len(made) == 1 and len(made_plain) >= 2, (len(made), len(made_plain))
    # made last: after the head's backward and every lookup's backward had ended
    before = [e for e in events if e.name in ("_LinearTokenLogProbsBackward", "_TiedLookupBackward")]
    assert {e.name for e in before} == {"_LinearTokenLogProbsBackward", "_TiedLookupBackward"}
    assert made[0].time_range.start >= max(e.time_range.end for e in before)
    torch.testing.assert_close(tied, plain, rtol=0, atol=0)
    for got, want in zip(g_tied, g_plain):
        assert (got is None) == (want is None)
        if want is not None:
            assert not got.is_sparse
            _close_grad(got, want)


@pytest.mark.parametrize("late", [True, False], ids=["late", "in-backward"])
def test_tied_gradient_matches_autograd_with_padding_bans_temperature_and_autograd_grad(monkeypatch, late):
    """:class:`TiedGrad` on a hand-built tied model: two lookups (one feeding the padding id three times), a nonlinear
    body and the fused head with banned tokens and a temperature give autograd's own loss and gradients (dense
    lookup gradient, head gradient in its backward), through ``backward`` and ``torch.autograd.grad``; the one
    ``[V, H]`` gradient is allocated after both lookups' backward ran (late: the size threshold set to 0) or in the
    head's backward (the threshold above it); a backward that never reaches the weight (``autograd.grad`` of the
    body only) leaves nothing that a later backward adds."""
    import mmgrpo.modalities.tokens.logprobs as logprobs
    from mmgrpo.modalities.tokens.logprobs import linear_token_logprobs, tied_embedding_grad

    monkeypatch.setattr(logprobs, "LATE_GRADIENT_MIN_BYTES", 0 if late else 2**40)

    torch.manual_seed(0)
    V, H = 300, 8
    budget = Reductions(terms=V, depth=3)  # lookup + body, logits, normaliser over V
    model = torch.nn.Module()
    model.emb = torch.nn.Embedding(V, H, padding_idx=3)
    model.body = torch.nn.Linear(H, H)
    model.get_input_embeddings = lambda: model.emb
    head = torch.nn.Linear(H, V, bias=False)
    head.weight = model.emb.weight
    ids_a, ids_b = torch.randint(0, V, (3, 5)), torch.tensor([[3, 7, 3], [9, 9, 1]])
    targets = torch.randint(5, V, (21,))
    banned = torch.zeros(V, dtype=torch.bool)
    banned[:5] = True

    def loss(tied: bool) -> torch.Tensor:
        with tied_embedding_grad(model, head) if tied else contextlib.nullcontext() as late:
            x = torch.cat([model.emb(ids_a).reshape(-1, H), model.emb(ids_b).reshape(-1, H)])  # [21, H]
            x = torch.tanh(model.body(x)) + x
        assert (late is not None) == tied
        logp = linear_token_logprobs(x, head.weight, targets, temperature=0.7, banned=banned, chunk=64, late=late)
        return (logp * torch.linspace(-1, 1, 21)).sum()

    params = list(model.parameters())
    want = torch.autograd.grad(loss(False), params)
    for got in (torch.autograd.grad(loss(True), params), None):
        if got is None:  # .backward(), timing the [V, H] allocation against the lookups' backward
            model.zero_grad(set_to_none=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as p:
                loss(True).backward()
            got = [q.grad for q in params]
            events = p.events()
            made = [e for e in events if e.self_cpu_memory_usage == V * H * 4 and e.name not in _MATMULS]
            lookups = [e for e in events if e.name == "_TiedLookupBackward"]
            assert len(made) == 1 and len(lookups) == 2
            after_lookups = made[0].time_range.start >= max(e.time_range.end for e in lookups)
            assert after_lookups == late
        for g, w in zip(got, want):
            _close_grad(g, w, budget)
    torch.autograd.grad(loss(True), [model.body.weight])  # the tied weight's accumulation never runs
    model.zero_grad(set_to_none=True)
    loss(True).backward()
    for q, w in zip(params, want):
        _close_grad(q.grad, w, budget)
    assert not model.emb.weight._backward_hooks  # each hook removed itself


def test_without_the_private_graph_task_id_the_tied_gradient_is_autograds(monkeypatch):
    """Where torch lacks ``torch._C._current_graph_task_id`` (private; forced here), ``tied_embedding_grad`` yields
    None — the lookups and the head leave the tied gradient to plain autograd — and the gradient is the same."""
    import mmgrpo.modalities.tokens.logprobs as logprobs
    from mmgrpo.modalities.tokens.logprobs import linear_token_logprobs, tied_embedding_grad

    monkeypatch.setattr(logprobs, "LATE_GRADIENT_MIN_BYTES", 0)
    torch.manual_seed(0)
    V, H = 300, 8
    model = torch.nn.Module()
    model.emb = torch.nn.Embedding(V, H)
    model.get_input_embeddings = lambda: model.emb
    head = torch.nn.Linear(H, V, bias=False)
    head.weight = model.emb.weight
    ids, targets = torch.randint(0, V, (21,)), torch.randint(0, V, (21,))

    def grad() -> tuple[torch.Tensor, bool]:
        model.zero_grad(set_to_none=True)
        with tied_embedding_grad(model, head) as late:
            x = torch.tanh(model.emb(ids))
        linear_token_logprobs(x, head.weight, targets, chunk=64, late=late).sum().backward()
        return model.emb.weight.grad.clone(), late is not None

    with_hook, used = grad()
    assert used and logprobs.graph_task_id() is not None
    monkeypatch.delattr(torch._C, "_current_graph_task_id")
    assert logprobs.graph_task_id() is None
    plain, used = grad()
    assert not used and not model.emb.weight._backward_hooks
    _close_grad(plain, with_hook, Reductions(terms=V, depth=3))


def test_untied_or_unfused_heads_keep_the_dense_lookup():
    """The in-place lookup gradient applies only to an embedding tied to a fused head: untied weights, no fused
    head, or weights without a gradient leave the embedding's forward alone."""
    from mmgrpo.modalities.tokens.logprobs import tied_embedding_grad

    emb, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    model = torch.nn.Module()
    model.get_input_embeddings = lambda: emb
    for h in (head, None):  # untied; no fused head
        with tied_embedding_grad(model, h):
            assert "forward" not in emb.__dict__
    head.weight = emb.weight
    with tied_embedding_grad(model, head):
        assert "forward" in emb.__dict__
    assert "forward" not in emb.__dict__
    emb.weight.requires_grad_(False)
    with tied_embedding_grad(model, head):
        assert "forward" not in emb.__dict__
