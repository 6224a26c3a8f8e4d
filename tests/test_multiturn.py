"""mmgrpo/multiturn.py: a multi-turn rollout's columns → per-turn credit → per-token advantages, by hand."""

import pytest
import torch

from mmgrpo import advantage_steps, multiturn
from mmgrpo.config import AlgorithmConfig
from mmgrpo.types import Rollout


def _rollout() -> Rollout:
    """One prompt, G = 2. Trajectory 0: turn 0 crops (a good observation), turn 1 answers right (outcome 1);
    trajectory 1: answers at once, wrong (outcome 0). Tokens: [turn 0, turn 0, observation, turn 1, turn 1]."""
    turn = torch.tensor([[0, 0, -1, 1, 1], [0, 0, -1, -1, -1]])  # [B, T]
    mask = (turn >= 0).float()
    return Rollout(
        outputs=["a", "b"],
        old_logprobs=torch.zeros(2, 5),
        mask=mask,
        group_size=2,
        prompt_index=torch.tensor([0, 0]),
        truncated=torch.tensor([False, False]),
        state=None,
        turn_of_token=turn,
        extras={
            "num_turns": [2, 1],
            "turn_rewards": [[0.0, 0.0], [0.0]],
            "turn_invalid": [[False, False], [False]],
            "anchors": [["prompt", "crop"], ["prompt"]],
            "tool_calls": [1, 0],
            "tool_errors": [0, 0],
        },
    )


def _advantages(credit: str, **args) -> tuple[torch.Tensor, dict]:
    rollout = _rollout()
    rewards = torch.tensor([[1.0, 0.0]])  # [P, G] combined outcome rewards
    a = AlgorithmConfig(group_size=2, credit=credit, credit_args=args)
    advantages = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)  # [P, G]
    state = advantage_steps.AdvantageState(advantages, rewards, rollout.mask, rollout, adapter=None)
    advantage_steps.run(advantage_steps.build(a), state)  # the trainer's pipeline: credit step or shaper
    return state.unit, state.metrics


def test_gigpo_puts_the_outcome_on_the_last_turn_and_groups_turn_0_by_the_shared_prompt():
    """R = (1, 0); returns G = (0.95, 1) and (0); episode rows (1, 1, 0): A^E = (1/3, 1/3, −2/3); the turn-0 anchor
    cluster {0.95, 0}: A^S = ±0.475; the crop's cluster is a singleton: A^S = 0 (mean_norm, γ = 0.95, ω = 1)."""
    adv, metrics = _advantages("gigpo", gamma=0.95, step_advantage_w=1.0)
    a0, a1, b0 = 1 / 3 + 0.475, 1 / 3, -2 / 3 - 0.475
    want = torch.tensor([[a0, a0, 0.0, a1, a1], [b0, b0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-6)
    assert float(metrics["credit/anchor_clusters"]) == 2


def test_mt_grpo_gives_the_turn_before_the_tool_result_the_turn_advantage():
    """r^O = (1, 0), r^T = (0, 0): Â^O = ±0.5 / (0.70711 + 1e-4); trajectory 0's result comes after turn 0, so turn 0
    gets Â^O + λ·Â^T (Â^T = 0), turn 1 Â^O; trajectory 1 has no result: the normalised r^O + r^T."""
    adv, _ = _advantages("mt_grpo", turn_advantage_coef=1.0)
    z = 0.5 / (2**-0.5 + 1e-4)
    want = torch.tensor([[z, z, 0.0, z, z], [-z, -z, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-5)


def test_trajectory_credit_is_the_shaped_group_advantage_on_every_action_token():
    adv, _ = _advantages("trajectory")
    z = 0.5 / (2**-0.5 + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([[z, z, 0.0, z, z], [-z, -z, 0.0, 0.0, 0.0]]), rtol=0, atol=1e-5)


def test_first_tool_result_skips_failed_calls_and_the_last_turn():
    rollout = _rollout()
    rollout.extras["num_turns"] = [3, 2]
    rollout.extras["turn_rewards"] = [[0.0, 0.0, 0.0], [0.0, 0.0]]
    rollout.extras["turn_invalid"] = [[True, False, False], [True, False]]
    first = multiturn.turn_inputs(rollout).first_result_turn
    assert first.tolist() == [2, -1]  # trajectory 0: turn 1's call gave the first result; trajectory 1: none


def test_a_single_turn_rollout_is_refused_for_per_turn_credit():
    rollout = _rollout()
    rollout.turn_of_token = None
    with pytest.raises(ValueError, match="multi-turn rollout"):
        multiturn.turn_inputs(rollout)
