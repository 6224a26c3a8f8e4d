"""The adapter contract: the checklist every registered ``model.adapter`` passes (docs/architecture.md).

Adding a model family = one entry in ``CASES`` (``tests/adapter_cases.py``: tiny ``model.args``, two prompt rows,
LoRA targets); the first test fails for a registered adapter without an entry. Every check runs on a tiny real model
built from config.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mmgrpo.loader import load_builtins
from mmgrpo.plugins import ADAPTERS, AdapterSpec
from mmgrpo.types import PolicyAdapter, Rollout, capabilities
from tests.adapter_cases import CASES, adapter_of, build
from tests.numerics import adapter_reductions

G = 2  # samples per prompt


def test_every_registered_adapter_has_a_contract_case():
    load_builtins()
    missing = set(ADAPTERS.names()) - {adapter_of(n) for n in CASES}
    assert not missing, f"add a Case for {sorted(missing)} to CASES in tests/adapter_cases.py"


@pytest.fixture(scope="module", params=list(CASES))
def lora_run(request, mmgrpo_cache):
    """A LoRA adapter of family ``request.param`` and one rollout of 2 prompts × G samples, before any update."""
    name = request.param
    torch.manual_seed(0)
    adapter = build(name, lora=True)
    rows = CASES[name].rows()
    return name, adapter, rows, adapter.rollout(rows, G)


def _images_or_text(outputs: list) -> list:
    return [np.asarray(o) if hasattr(o, "size") and not isinstance(o, str) else o for o in outputs]


def test_builder_declares_its_class_and_capabilities(lora_run):
    name, adapter, _, _ = lora_run
    build = ADAPTERS.get(adapter_of(name))
    assert isinstance(adapter, PolicyAdapter)
    assert isinstance(build, AdapterSpec) and isinstance(adapter, build.cls) and dataclasses.is_dataclass(build.args)
    assert capabilities(type(adapter)) == capabilities(build.cls)  # the load-time check sees the truth


def test_rollout_shapes_and_group_major_order(lora_run):
    _, _, rows, ro = lora_run
    P, B = len(rows), len(rows) * G
    assert isinstance(ro, Rollout) and ro.group_size == G and len(ro.outputs) == B
    T = ro.old_logprobs.shape[1]
    assert T >= 1 and ro.old_logprobs.shape == ro.mask.shape == (B, T)
    assert ro.old_logprobs.dtype == torch.float32 and torch.isfinite(ro.old_logprobs).all()
    assert ro.truncated.shape == (B,) and ro.truncated.dtype == torch.bool
    assert torch.equal(ro.prompt_index, torch.arange(P).repeat_interleave(G))
    assert ro.mask.sum() > 0 and (ro.old_logprobs[ro.mask == 0] == 0).all()
    assert all(len(col) == B for col in ro.extras.values())
    shuffled = ro.prompt_index.flip(0)
    with pytest.raises(ValueError, match="group-major"):  # Rollout.validate rejects any other order
        Rollout(ro.outputs, ro.old_logprobs, ro.mask, G, shuffled, ro.truncated, ro.state)


def test_ratio_is_one_before_the_first_update(lora_run):
    _, adapter, _, ro = lora_run
    logp = adapter.logprobs(ro, torch.arange(ro.batch_size))
    assert logp.dtype == torch.float32 and logp.requires_grad
    m = ro.mask.bool()
    adapter_reductions(adapter).assert_logprobs_close(logp.detach().cpu()[m], ro.old_logprobs[m])  # ratio 1


def test_reference_equals_policy_at_lora_init(lora_run):
    _, adapter, _, ro = lora_run
    idx = torch.arange(ro.batch_size)
    ref = adapter.ref_logprobs(ro, idx).cpu()
    adapter_reductions(adapter).assert_logprobs_close(ref, adapter.logprobs(ro, idx).detach().cpu())


def test_evaluation_is_deterministic(lora_run):
    _, adapter, rows, _ = lora_run
    first, second = adapter.evaluate(rows), adapter.evaluate(rows)
    assert len(first) == len(rows)
    for a, b in zip(_images_or_text(first), _images_or_text(second)):
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_changes_parameters_and_save_pretrained_round_trips(name, mmgrpo_cache, tmp_path):
    """Full fine-tuning: one AdamW step moves the weights; the saved directory, loaded through the adapter's own
    ``name_or_path`` (the real ``from_pretrained`` path), gives the trained log-probs."""
    torch.manual_seed(0)
    adapter = build(name, lora=False)
    ro = adapter.rollout(CASES[name].rows(), G)
    idx = torch.arange(ro.batch_size)
    params = list(adapter.trainable_parameters())
    before = [p.detach().clone() for p in params]
    adv = torch.tensor([1.0, -1.0]).repeat(ro.batch_size // 2)[:, None]  # [B, 1]
    logp = adapter.logprobs(ro, idx)
    m = ro.mask.to(logp.device)
    loss = -(adv.to(logp.device) * logp * m).sum() / m.sum()
    loss.backward()
    opt = torch.optim.AdamW(params, lr=1e-3)
    opt.step()
    changed = sum(not torch.equal(b, p.detach()) for b, p in zip(before, params))
    assert changed > len(params) // 2, f"only {changed}/{len(params)} parameter tensors changed"

    trained = adapter.logprobs(ro, idx).detach().cpu()
    assert not torch.allclose(trained[ro.mask.bool()], ro.old_logprobs[ro.mask.bool()], atol=1e-6)
    adapter.save_pretrained(str(tmp_path / "saved"))
    reloaded = build(name, lora=False, name_or_path=str(tmp_path / "saved"))
    adapter_reductions(adapter).assert_logprobs_close(reloaded.logprobs(ro, idx).detach().cpu(), trained)


def _token_families() -> list[str]:
    """The registered adapters whose actions are tokens (their class is a ``TokenPolicy``)."""
    from mmgrpo.modalities.tokens.policy import TokenPolicy

    load_builtins()
    return [n for n in ADAPTERS.names() if issubclass(ADAPTERS.get(n).cls, TokenPolicy)]


def test_the_token_families_are_the_contract_cases_without_flow():
    assert set(_token_families()) == {adapter_of(n) for n in CASES if n != "flow"}


@pytest.mark.parametrize("name", [n for n in CASES if n != "flow"])
def test_token_rollouts_draw_through_the_one_decode_loop(name, mmgrpo_cache, monkeypatch):
    """Every token family's rollout draws its tokens in ``decode.decode`` (one draw per step for all B rows), with
    the keyed uniforms of the keys passed to ``rollout`` (modalities/tokens/decode.py)."""
    from mmgrpo import noise
    from mmgrpo.modalities.tokens import decode

    draws: list[tuple[int, bool]] = []
    real = decode.draw_token

    def counting(scores, spec, u=None, generator=None):
        draws.append((scores.shape[0], u is not None))
        return real(scores, spec, u, generator)

    monkeypatch.setattr(decode, "draw_token", counting)
    adapter = build(name, lora=False)
    rows = CASES[name].rows()
    rollout = adapter.rollout(rows, G, noise.NoiseKeys(0, 0, (0, 1), G))
    T = rollout.mask.shape[1]
    assert 1 <= len(draws) <= T  # one draw per decoding step; stops early only when every row has ended
    assert all(rows_ == len(rows) * G and keyed for rows_, keyed in draws), draws
    again = adapter.rollout(rows, G, noise.NoiseKeys(0, 0, (0, 1), G))
    assert again.outputs == rollout.outputs  # same keys, same samples


def test_only_the_decode_loop_draws_tokens():
    """No token-family module draws a categorical sample itself: ``torch.multinomial``, inversion draws and keyed
    uniforms appear in ``modalities/tokens/decode.py`` only (flow's step selector draws step indices, not tokens)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "modalities"
    pattern = re.compile(r"torch\.multinomial\(|draw_by_inversion\(|noise\.uniforms\(")
    allowed = {root / "tokens" / "decode.py", root / "flow" / "steps.py"}
    offenders = [
        f"{p.relative_to(root.parent)}:{i}"
        for p in sorted(root.rglob("*.py"))
        if p not in allowed
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line.split("#")[0])
    ]
    assert not offenders, f"token draws outside modalities/tokens/decode.py: {offenders}"
