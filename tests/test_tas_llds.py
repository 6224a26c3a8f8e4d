"""Issue 51, items 1 and 2: AVATAR's Temporal Advantage Shaping (``shaping: tas``, mmgrpo/tas.py) and the LLDS
likelihood-preserving regulariser (``loss_terms: {llds: ...}``, mmgrpo/llds.py), each on a hand-worked example of its
equation, the combinations refused at load, and the loss-term seam leaving the loss unchanged when off."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mmgrpo import losses
from mmgrpo.config import ConfigError
from mmgrpo.llds import llds_gate, llds_penalty, run_ids
from mmgrpo.loader import load_config
from mmgrpo.shaping import ShapingInputs, shape_advantages
from mmgrpo.tas import tas_weights, unit_positions

ROOT = Path(__file__).resolve().parents[1]


# --- TAS -----------------------------------------------------------------------------------------------------

# three samples: 5 valid units, 2 valid units, 1 valid unit (at position 1)
MASK = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.float32)


def test_tas_positions_and_weights_by_hand():
    u = unit_positions(MASK)
    torch.testing.assert_close(u[0], torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 0.0]))
    torch.testing.assert_close(u[1], torch.tensor([0.0, 1.0, 0, 0, 0, 0]))
    torch.testing.assert_close(u[2], torch.tensor([0.0, 0.0, 0, 0, 0, 0]))  # one unit: u = 0 (0 / max(0, 1))
    # w = 1 + 0.5 (2u - 1)^2: (2u-1)^2 = 1, 1/4, 0, 1/4, 1 on the first row
    raw = tas_weights(MASK, alpha=0.5, normalize=False)
    torch.testing.assert_close(raw[0], torch.tensor([1.5, 1.125, 1.0, 1.125, 1.5, 0.0]))
    torch.testing.assert_close(raw[1], torch.tensor([1.5, 1.5, 0, 0, 0, 0]))
    torch.testing.assert_close(raw[2], torch.tensor([0.0, 1.5, 0, 0, 0, 0]))
    # normalised: the first row's mean is 6.25 / 5 = 1.25 -> 1.2, 0.9, 0.8, 0.9, 1.2; the others' rows are all 1
    norm = tas_weights(MASK, alpha=0.5, normalize=True)
    torch.testing.assert_close(norm[0], torch.tensor([1.2, 0.9, 0.8, 0.9, 1.2, 0.0]))
    torch.testing.assert_close(norm[1:], (MASK[1:] > 0).float())


def test_tas_shaper_scales_the_broadcast_advantage():
    adv = torch.tensor([[2.0, -1.0, 0.5]])  # [P = 1, G = 3]
    inputs = ShapingInputs(MASK, torch.zeros(1, 3))
    out = shape_advantages("tas", adv, inputs, {"alpha": 0.5, "normalize": False})
    torch.testing.assert_close(out[0], torch.tensor([3.0, 2.25, 2.0, 2.25, 3.0, 0.0]))  # 2 * w
    torch.testing.assert_close(out[1], torch.tensor([-1.5, -1.5, 0, 0, 0, 0]))
    torch.testing.assert_close(out[2], torch.tensor([0.0, 0.75, 0, 0, 0, 0]))  # 0.5 * 1.5
    # alpha = 0 is GRPO's broadcast
    grpo = shape_advantages("none", adv, inputs, {})
    torch.testing.assert_close(shape_advantages("tas", adv, inputs, {"alpha": 0.0}), grpo)
    # normalised: each sample's total advantage over its tokens is GRPO's
    tas = shape_advantages("tas", adv, inputs, {"alpha": 0.5, "normalize": True})
    torch.testing.assert_close(tas.sum(1), grpo.sum(1))
    # the authors' defaults (lambda 0.3, no normalisation): w = 1.3, 1.075, 1, 1.075, 1.3 on the five-unit row
    authors = shape_advantages("tas", adv, inputs, {})
    torch.testing.assert_close(authors[0], 2.0 * torch.tensor([1.3, 1.075, 1.0, 1.075, 1.3, 0.0]))


def test_tas_config_refusals():
    cfg = ROOT / "configs/variant_tas.yaml"
    assert load_config(cfg).algorithm.shaping == "tas"
    with pytest.raises(ConfigError, match=r"shaping: tas .* surrogate gmpo uses one advantage per sequence"):
        load_config(cfg, ["algorithm.surrogate=gmpo"])
    with pytest.raises(ConfigError, match="alpha"):
        load_config(cfg, ["algorithm.shaping_args={alpha: -1}"])
    with pytest.raises(ConfigError, match=r"shaping_args\.beta"):
        load_config(cfg, ["algorithm.shaping_args={beta: 1}"])


# --- LLDS ----------------------------------------------------------------------------------------------------

# sample 0: two turns (units 0-1 and 3-4; unit 2 an observation, mask 0), advantage +1
# sample 1: one turn of two units, advantage -1 (outside the preserving set)
LL_MASK = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float32)
LL_ADV = torch.tensor([[1.0] * 5, [-1.0] * 5])
# d = log pi_old - log pi_theta: sample 0 [0.4, -0.1, (0.9 masked), 0.3, -0.5]; sample 1 [-0.5, 0.2]
LL_D = torch.tensor([[0.4, -0.1, 0.9, 0.3, -0.5], [-0.5, 0.2, 0.0, 0.0, 0.0]])
LL_OLD = torch.full((2, 5), -1.0)


def _logp():
    return (LL_OLD - LL_D).clone().requires_grad_(True)


def test_llds_actions_are_the_runs_of_the_preserving_set():
    ids = run_ids(torch.tensor([[1, 1, 0, 1, 1, 0, 1], [0, 0, 0, 0, 0, 0, 0]]))
    assert ids.tolist() == [[1, 1, 0, 2, 2, 0, 3], [0] * 7]


def test_llds_action_gate_by_hand():
    # turn 1: 0.4 - 0.1 = 0.3 > 0 -> fires; turn 2: 0.3 - 0.5 = -0.2 -> not; sample 1: advantage < 0 -> never
    logp = _logp()
    loss, m = llds_penalty(logp, LL_OLD, LL_ADV, LL_MASK, coef=0.2, gate="action")
    expect = torch.tensor([[0.2 * 0.4, 0.0, 0.0, 0.0, 0.0], [0.0] * 5])  # max(0, d) only where d > 0
    torch.testing.assert_close(loss, expect)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -torch.tensor([[0.2, 0, 0, 0, 0], [0.0] * 5]))  # d/dlogp of 0.2 (old - logp)
    # metrics: Σ d·m = 0.1 + (-0.3) over 6 valid units; sample 0 fell (0.1 > 0), sample 1 did not (-0.3)
    assert float(m["llds/displacement"]) == pytest.approx(-(0.1 - 0.3) / 6)
    assert float(m["llds/displacement_preserved"]) == pytest.approx(-0.1 / 4)
    assert float(m["llds/fell_fraction"]) == pytest.approx(0.5)
    assert float(m["llds/active_fraction"]) == pytest.approx(1 / 4)  # unit 0 of the 4 preserving-set units


def test_llds_response_gate_by_hand():
    # the whole trajectory: 0.4 - 0.1 + 0.3 - 0.5 = 0.1 > 0 -> fires on every unit whose likelihood fell (0 and 3)
    loss, m = llds_penalty(_logp(), LL_OLD, LL_ADV, LL_MASK, coef=0.2, gate="response")
    torch.testing.assert_close(loss, torch.tensor([[0.08, 0.0, 0.0, 0.06, 0.0], [0.0] * 5]))
    assert float(m["llds/active_fraction"]) == pytest.approx(2 / 4)
    g = llds_gate(LL_D, LL_MASK * (LL_ADV >= 0).float(), "response")
    torch.testing.assert_close(g, torch.tensor([[1.0, 1, 0, 1, 1], [0.0] * 5]))


def test_llds_is_zero_on_policy_and_through_the_seam():
    old = torch.randn(3, 4)
    logp = old.clone().requires_grad_(True)
    mask, adv = torch.ones(3, 4), torch.randn(3, 4)
    loss, _ = llds_penalty(logp, old, adv, mask, coef=0.2, gate="action")
    loss.sum().backward()
    assert float(loss.detach().abs().sum()) == 0.0 and float(logp.grad.abs().sum()) == 0.0
    # through the seam: token_mean of the hand-worked action-gate loss = 0.08 / 6 valid units
    logp = _logp()
    inputs = losses.LossTermInputs(logp, LL_OLD, LL_ADV, LL_MASK)
    opts = losses.LOSS_TERMS.options_class("llds")(coef=0.2, gate="action")
    total, mets = losses.apply_loss_terms({"llds": opts}, inputs, losses.token_mean, losses.TokenMeanOptions())
    assert float(total.detach()) == pytest.approx(0.08 / 6) and float(mets["loss/llds"]) == pytest.approx(0.08 / 6)
    # no terms: an exact zero without grad, so the loss is unchanged
    none, mets = losses.apply_loss_terms({}, inputs, losses.token_mean, losses.TokenMeanOptions())
    assert float(none) == 0.0 and not none.requires_grad and mets == {}


def test_llds_config_refusals():
    cfg = ROOT / "configs/variant_llds.yaml"
    a = load_config(cfg).algorithm
    assert a.loss_terms == {"llds": {"coef": 0.2, "gate": "action"}} and a.updates_per_epoch == 2
    with pytest.raises(ConfigError, match=r"one optimizer update per step .* LLDS never fires"):
        load_config(cfg, ["algorithm.updates_per_epoch=1"])
    with pytest.raises(ConfigError, match=r"llds.gate: 'turn' is not allowed"):
        load_config(cfg, ["algorithm.loss_terms.llds.gate=turn"])
    with pytest.raises(ConfigError, match=r"llds.coef"):
        load_config(cfg, ["algorithm.loss_terms.llds.coef=-1"])
    with pytest.raises(ConfigError, match="unknown loss term 'lld'"):
        load_config(cfg, ["algorithm.loss_terms={lld: {}}"])
    with pytest.raises(ConfigError, match="surrogate dgpo's units are DSM losses"):
        load_config(
            ROOT / "configs/variant_dgpo.yaml", ["algorithm.loss_terms={llds: {}}", "algorithm.updates_per_epoch=2"]
        )


@dataclass(frozen=True)
class NLLOptions:
    """A test loss term's options."""

    coef: float = 1.0


def _nll_term(inputs: losses.LossTermInputs, options: NLLOptions):
    """coef · (−log π_θ) per token: a term that always has a gradient."""
    return -options.coef * inputs.logprobs, {}


if "test_nll" not in losses.LOSS_TERMS:
    losses.LOSS_TERMS.add("test_nll", losses.LossTerm(_nll_term), NLLOptions)


def test_loss_terms_seam_in_training_llds_coef_zero_is_grpo(tmp_path, mmgrpo_cache):
    """The seam: ``llds`` with ``coef: 0`` (the study's GRPO arm) gives GRPO's update bit for bit (the term adds + 0)
    and logs the displacement; a term with a gradient (``test_nll``) reaches the update."""
    import json

    from mmgrpo.trainer import train
    from tests.test_variants import SMALL

    def run(name: str, terms: str) -> dict:
        out = tmp_path / name
        reward = "rewards=[{name: 'tests.test_variants:length_reward'}]"  # varies within groups: a real update
        overrides = [*SMALL, "steps=1", "algorithm.updates_per_epoch=2", "algorithm.minibatch_size=8", reward, terms]
        train(load_config(ROOT / "configs/quickstart.yaml", [*overrides, f"output_dir={out}"]))
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if "loss/policy" in r][-1]

    grpo = run("grpo", "algorithm.loss_terms={}")
    zero = run("zero", "algorithm.loss_terms={llds: {coef: 0.0}}")
    nll = run("nll", "algorithm.loss_terms={test_nll: {coef: 1.0}}")
    for key in ("loss/policy", "optim/grad_norm", "reward/mean"):
        assert grpo[key] == zero[key], key
    assert zero["loss/llds"] == 0.0 and "llds/displacement" in zero and "loss/llds" not in grpo
    assert nll["reward/mean"] == grpo["reward/mean"]  # the same rollout
    assert nll["loss/test_nll"] > 0.0 and nll["optim/grad_norm"] != grpo["optim/grad_norm"]
