"""``mmgrpo.credit.CREDITS`` (issue 49 item 3): the credit modes as a registry with one signature and a typed options
dataclass each; ``algorithm.credit`` / ``credit_args`` checked against it at load (one-line errors); hand-worked
values through the registry equal the math functions called directly."""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path

import pytest
import torch

from mmgrpo import advantage_steps, credit, multiturn, shaping
from mmgrpo.cli import main
from mmgrpo.config import AlgorithmConfig, ConfigError
from mmgrpo.credit import CREDITS, GiGPOOptions, MTGRPOOptions, TurnInputs
from mmgrpo.loader import load_config
from tests.test_multiturn import _rollout

TOOLS = Path(__file__).resolve().parents[1] / "configs" / "zoom_tools.yaml"
ROLLOUT_FED = {"invalid", "episode_rewards"}  # keyword parameters of gigpo_advantages the rollout fills


def T(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_the_registered_credits_and_their_options():
    assert CREDITS.names() == ["gigpo", "igpo", "mt_grpo", "trajectory", "tree_grpo"]  # + issue 50 items 2, 3
    assert CREDITS.options_class("gigpo") is GiGPOOptions
    assert CREDITS.options_class("mt_grpo") is MTGRPOOptions
    assert CREDITS.options_class("trajectory") is shaping.NoOptions
    for name in CREDITS:
        cls = CREDITS.options_class(name)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
        params = list(inspect.signature(CREDITS.get(name)).parameters)
        assert params == ["advantages", "outcome", "turns", "options"], name  # one signature
    with pytest.raises(KeyError, match=r"unknown credit 'gipgo'; valid: gigpo, igpo, mt_grpo, trajectory, tree_grpo"):
        CREDITS.get("gipgo")


@pytest.mark.parametrize(
    "cls, fn, extra",
    [(GiGPOOptions, credit.gigpo_advantages, ["outcome_on_last_turn"]), (MTGRPOOptions, credit.mt_grpo_advantages, [])],
    ids=["gigpo", "mt_grpo"],
)
def test_options_are_the_math_functions_keyword_parameters(cls, fn, extra):
    """The dataclass's fields are the function's keyword parameters (those the rollout does not fill), in order and
    with the same defaults, plus the credit function's own (``extra``); each field has a docstring."""
    from mmgrpo.config import field_docs

    params = [p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    params = [p for p in params if p.name not in ROLLOUT_FED]
    fields = dataclasses.fields(cls)
    assert [f.name for f in fields] == [p.name for p in params] + extra
    assert [f.default for f in fields[: len(params)]] == [p.default for p in params]
    assert set(field_docs(cls)) == {f.name for f in fields}


def _turns() -> TurnInputs:
    """One group, G = 2. Trajectory 0: two turns, turn rewards (0.2, 0), turn 0 invalid, anchors (s, t);
    trajectory 1: one turn, reward 0, anchor s."""
    return TurnInputs(
        turn_mask=T([[1, 1], [1, 0]]),
        turn_rewards=T([[0.2, 0.0], [0.0, 0.0]]),
        invalid=T([[1, 0], [0, 0]]),
        anchors=[["s", "t"], ["s"]],
        first_result_turn=torch.tensor([1, -1]),
        group=torch.tensor([0, 0]),
    )


def test_gigpo_through_the_registry_hand_worked_and_equal_to_the_direct_call():
    """Outcome (1, 0) on the last turns: rewards (0.2, 1.0) and (0.0). γ = 0.5, c = 0.1, ω = 1, mean_norm.
    Returns: G_01 = 1.0, G_00 = 0.2 + 0.5·1.0 − 0.1 = 0.6; G_10 = 0. R = (1.2, 0); episode rows (1.1, 1.2, 0.0),
    mean 2.3/3: A^E = (1.1 − 2.3/3, 1.2 − 2.3/3, −2.3/3). Anchor s: {0.6, 0} → A^S = ±0.3; anchor t alone: 0."""
    opts = GiGPOOptions(gamma=0.5)
    adv, metrics = CREDITS.get("gigpo")(torch.zeros(1, 2), T([1.0, 0.0]), _turns(), opts)
    m = 2.3 / 3
    want = T([[1.1 - m + 0.3, 1.2 - m], [-m - 0.3, 0.0]])
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-6)
    assert float(metrics["credit/anchor_clusters"]) == 2

    direct, direct_metrics = credit.gigpo_advantages(
        T([[0.2, 1.0], [0.0, 0.0]]), _turns().turn_mask, _turns().anchors, torch.tensor([0, 0]),
        invalid=_turns().invalid, gamma=0.5,
    )  # fmt: skip
    assert torch.equal(adv, direct)
    assert metrics.keys() == direct_metrics.keys()
    assert all(torch.equal(metrics[k], direct_metrics[k]) for k in metrics)

    no_outcome = dataclasses.replace(opts, outcome_on_last_turn=False)
    kept_out, _ = CREDITS.get("gigpo")(torch.zeros(1, 2), T([1.0, 0.0]), _turns(), no_outcome)
    direct_out, _ = credit.gigpo_advantages(
        _turns().turn_rewards, _turns().turn_mask, _turns().anchors, torch.tensor([0, 0]), invalid=_turns().invalid,
        gamma=0.5,
    )  # fmt: skip
    assert torch.equal(kept_out, direct_out) and not torch.equal(kept_out, adv)


def test_mt_grpo_through_the_registry_hand_worked_and_equal_to_the_direct_call():
    """r^O = (1, 0), r^T = (0.2, 0) (summed turn rewards). Trajectory 0's result comes after turn 0: turn 0 gets
    Â^O + Â^T, turn 1 Â^O; trajectory 1 has none: the normalised r^O + r^T = (1.2, 0) on its turn (aae, λ = 1)."""
    adv, metrics = CREDITS.get("mt_grpo")(torch.zeros(1, 2), T([1.0, 0.0]), _turns(), MTGRPOOptions())

    def z(d: float) -> float:  # (x − mean) / (unbiased std + 1e-4) of the pair (d, 0), for the larger one
        return (d / 2) / (d / math.sqrt(2) + 1e-4)

    want = T([[z(1.0) + z(0.2), z(1.0)], [-z(1.2), 0.0]])
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-5)
    direct, direct_metrics = credit.mt_grpo_advantages(
        T([1.0, 0.0]), T([0.2, 0.0]), torch.tensor([1, -1]), _turns().turn_mask, torch.tensor([0, 0])
    )
    assert torch.equal(adv, direct)
    assert all(torch.equal(metrics[k], direct_metrics[k]) for k in direct_metrics)


def test_trajectory_credit_equals_the_shaper_the_pipeline_runs_for_it():
    """``trajectory`` has no credit step: the pipeline broadcasts through the shaper (``none``), which on a
    multi-turn rollout gives what the registered trajectory function gives, turn by turn onto the tokens."""
    rollout = _rollout()
    rewards = T([[1.0, 0.0]])  # [P, G]
    advantages = T([[0.7, -0.7]])  # [P, G]
    steps = advantage_steps.build(AlgorithmConfig(group_size=2))
    assert [s.kind for s in steps] == ["shaping"]
    state = advantage_steps.AdvantageState(advantages, rewards, rollout.mask, rollout, adapter=None)
    advantage_steps.run(steps, state)
    inputs = shaping.ShapingInputs(rollout.mask, rewards)
    via_registry = multiturn.unit_advantages("trajectory", shaping.NoOptions(), advantages, inputs, rollout, {})
    assert torch.equal(state.unit, via_registry)
    assert torch.equal(state.unit, T([[0.7, 0.7, 0.0, 0.7, 0.7], [-0.7, -0.7, 0.0, 0.0, 0.0]]))


def test_the_credit_step_gets_resolved_options():
    a = AlgorithmConfig(credit="mt_grpo", credit_args={"turn_advantage_coef": 2, "advantage_est": "cae"})
    (step,) = advantage_steps.build(a)
    assert (step.kind, step.name) == ("credit", "mt_grpo")
    assert step.options == MTGRPOOptions(turn_advantage_coef=2.0, advantage_est="cae")
    assert isinstance(step.options.turn_advantage_coef, float)


def _load(tmp_path, *extra):
    return load_config(TOOLS, [f"output_dir={tmp_path}", *extra])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm.credit=gipgo"],
            r"algorithm\.credit: 'gipgo' is not allowed; choose one of: gigpo, igpo, mt_grpo, trajectory, tree_grpo",
        ),
        (
            ["algorithm.credit=gigpo", "algorithm.credit_args={gama: 0.9}"],
            r"unknown field 'algorithm\.credit_args\.gama'; allowed: gamma, step_advantage_w, mode, invalid_penalty, "
            r"eps, similarity_thresh, outcome_on_last_turn; did you mean 'gamma'\?",
        ),
        (
            ["algorithm.credit=gigpo", "algorithm.credit_args={invalid: 1}"],
            r"unknown field 'algorithm\.credit_args\.invalid'; allowed: gamma,",  # filled from the rollout
        ),
        (
            ["algorithm.credit=gigpo", "algorithm.credit_args={mode: std}"],
            r"algorithm\.credit_args\.mode: 'std' is not allowed; choose one of: mean_norm, mean_std_norm",
        ),
        (
            ["algorithm.credit=gigpo", "algorithm.credit_args={similarity_thresh: 1.5}"],
            r"algorithm\.credit_args\.similarity_thresh: must be .*< 1",
        ),
        (
            ["algorithm.credit=mt_grpo", "algorithm.credit_args={advantage_est: gae}"],
            r"algorithm\.credit_args\.advantage_est: 'gae' is not allowed; choose one of: aae, cae",
        ),
        (
            ["algorithm.credit_args={gamma: 0.9}"],
            r"unknown field 'algorithm\.credit_args\.gamma'; allowed: \(none\)",  # trajectory has no options
        ),
    ],
    ids=["name", "option", "rollout_fed", "mode", "range", "estimator", "trajectory"],
)
def test_credit_config_errors_are_one_line_naming_the_allowed(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match="^" + message) as err:
        _load(tmp_path, *overrides)
    assert "\n" not in str(err.value)


def test_credit_options_load_and_dry_run(tmp_path, capsys):
    cfg = _load(tmp_path, "algorithm.credit=gigpo", "algorithm.credit_args={gamma: 0.9, similarity_thresh: 0.9}")
    assert cfg.algorithm.credit_args == {"gamma": 0.9, "similarity_thresh": 0.9}
    code = main(["train", str(TOOLS), f"output_dir={tmp_path}", "algorithm.credit=mt_grp", "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [err]
    assert (
        "algorithm.credit: 'mt_grp' is not allowed; choose one of: gigpo, igpo, mt_grpo, trajectory, tree_grpo" in err
    )


def test_the_dead_names_are_gone():
    """One registry: no hand-counted parameter skips or parallel dicts of credit functions remain."""
    for module, name in [
        (credit, "CREDIT_MODES"),
        (multiturn, "CREDIT_FUNCTIONS"),
        (multiturn, "CREDIT_ARG_SKIP"),
        (multiturn, "_ROLLOUT_FED"),
        (multiturn, "OUTCOME_OPTION"),
    ]:
        assert not hasattr(module, name), f"{module.__name__}.{name}"
