"""mmgrpo.credit against hand-worked examples (every number below is computed by hand in the comments), and the
DeepEyes reward shape."""

from __future__ import annotations

import math

import pytest
import torch

from mmgrpo.credit import (
    anchor_clusters,
    gigpo_advantages,
    grouped_normalize,
    mt_grpo_advantages,
    pad_turns,
    step_discounted_returns,
    trajectory_turn_advantages,
    turn_to_token_advantages,
)
from mmgrpo.rewards import load_reward
from mmgrpo.rewards.agents import deepeyes_format

T = torch.tensor


def close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual, T(expected, dtype=torch.float32), rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------------- building blocks


def test_pad_turns():
    values, mask = pad_turns([[1, 2, 3], [4], []])
    close(values, [[1, 2, 3], [4, 0, 0], [0, 0, 0]])
    close(mask, [[1, 1, 1], [1, 0, 0], [0, 0, 0]])


def test_trajectory_advantage_is_broadcast_to_the_turns():
    close(trajectory_turn_advantages(T([0.5, -2.0]), T([[1, 1, 0], [1, 0, 0]])), [[0.5, 0.5, 0.0], [-2.0, 0.0, 0.0]])


def test_turn_advantages_onto_tokens():
    turn_adv = T([[1.0, 2.0], [3.0, 4.0]])
    #                  prompt  turn 0    tool obs  turn 1    pad
    turn_of_token = T([[-1, -1, 0, 0, 0, -1, -1, 1, 1, -1], [-1, 0, -1, 1, 1, 1, -1, -1, -1, -1]])
    close(
        turn_to_token_advantages(turn_adv, turn_of_token),
        [[0, 0, 1, 1, 1, 0, 0, 2, 2, 0], [0, 3, 0, 4, 4, 4, 0, 0, 0, 0]],
    )
    with pytest.raises(ValueError, match="turn_of_token must be"):
        turn_to_token_advantages(turn_adv, T([[0, 1]]))


def test_step_discounted_returns():
    # γ = 0.5. Row 0: r = [1, 0, 2] → G2 = 2, G1 = 0 + 0.5·2 = 1, G0 = 1 + 0.5·1 = 1.5.
    # Row 1: two turns, r = [0, 4] (the third is padding, its reward 9 ignored) → G1 = 4, G0 = 2.
    returns = step_discounted_returns(T([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]]), T([[1, 1, 1], [1, 1, 0]]), 0.5)
    close(returns, [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]])


def test_grouped_normalize_singletons_and_unbiased_std():
    x, g = T([1.0, 3.0, 5.0]), T([0, 0, 1])
    # group 0 = {1, 3}: mean 2, unbiased std √2 → ∓1/√2; group 1 = {5} alone
    out, size = grouped_normalize(x, g, std=True, eps=0.0)
    close(out, [-1 / math.sqrt(2), 1 / math.sqrt(2), 5.0])  # alone: mean 0, std 1 → keeps its value
    close(size, [2, 2, 1])
    close(grouped_normalize(x, g, std=True, eps=0.0, singleton="self")[0], [-1 / math.sqrt(2), 1 / math.sqrt(2), 0])
    close(grouped_normalize(x, g, std=False, eps=0.0, singleton="zero_std")[0], [-1.0, 1.0, 0.0])


def test_anchor_clusters_stay_inside_their_episode_group():
    keys = [["a", "b"], ["a", "c"], ["a", "b"]]
    ids = anchor_clusters(keys, T([0, 0, 1]), T([[1, 1], [1, 0], [1, 1]]))
    # sample 2's "a" is in another episode group: a new cluster; sample 1's turn 1 is masked
    assert ids.tolist() == [[0, 1], [0, -1], [2, 3]]
    with pytest.raises(ValueError, match="anchor_keys\\[0\\] has 1 keys but turn 1"):
        anchor_clusters([["a"]], T([0]), T([[1, 1]]))


def test_anchor_clusters_by_text_similarity():
    open_, opened = "You are in the kitchen. A red door is open.", "You are in the kitchen. A red door is opened."
    corridor = "A long corridor with no doors at all, dark."  # ratio to open_: 0.40; open_ ~ opened: 0.98
    keys = [[open_, corridor], [opened], [opened]]
    ids = anchor_clusters(keys, T([0, 0, 1]), T([[1, 1], [1, 0], [1, 0]]), similarity_thresh=0.9)
    assert ids.tolist() == [[0, 1], [0, -1], [2, -1]]  # sample 2 is in another episode group
    assert anchor_clusters(keys, T([0, 0, 1]), T([[1, 1], [1, 0], [1, 0]])).tolist() == [[0, 1], [2, -1], [3, -1]]
    with pytest.raises(ValueError, match="compares text anchors"):
        anchor_clusters([[("image", 1)]], T([0]), T([[1]]), similarity_thresh=0.9)
    with pytest.raises(ValueError, match="must be in \\(0, 1\\)"):
        anchor_clusters(keys, T([0, 0, 1]), T([[1, 1], [1, 0], [1, 0]]), similarity_thresh=1.0)


# ---------------------------------------------------------------------------------------------------- GiGPO

# One episode group of three trajectories, one group of one trajectory; γ = 0.5, c = 0.1, ω = 1.
TURN_REWARDS = T([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
TURN_MASK = T([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
ANCHORS = [["A", "B", "C"], ["A", "C"], ["A", "B", "D"], ["A"]]
INVALID = T([[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0]])
GROUPS = T([0, 0, 0, 1])


def test_gigpo_mean_norm_hand_worked():
    adv, metrics = gigpo_advantages(
        TURN_REWARDS, TURN_MASK, ANCHORS, GROUPS, invalid=INVALID, gamma=0.5, invalid_penalty=0.1
    )
    # Step returns G (γ = 0.5): traj 0: G2 = 1, G1 = 0.5, G0 = 0.25; traj 1: G1 = 1, G0 = 0.5; traj 2: all 0, then
    # the invalid turn 1 gets −0.1 (not propagated: G0 stays 0); traj 3: G0 = 2.
    # Episode scores R − c·invalid: traj 0: [1, 1, 1]; traj 1: [1, 1]; traj 2: [0, −0.1, 0]; traj 3: [2].
    # Group 0 has 8 step rows: mean = (3 + 2 − 0.1) / 8 = 0.6125 → A^E = 0.3875 for traj 0 and 1,
    # traj 2: [−0.6125, −0.7125, −0.6125]. Group 1 has one row: mean 0 → A^E = 2.
    # Anchor clusters in group 0: A = {0.25, 0.5, 0} mean 0.25 → A^S = [0, 0.25, −0.25];
    # B = {0.5, −0.1} mean 0.2 → [0.3, −0.3]; C = {1, 1} → [0, 0]; D = {0} alone → 0. Group 1's A is its own
    # cluster (another episode group), alone → 0.
    close(
        adv,
        [
            [0.3875 + 0.0, 0.3875 + 0.3, 0.3875 + 0.0],
            [0.3875 + 0.25, 0.3875 + 0.0, 0.0],
            [-0.6125 - 0.25, -0.7125 - 0.3, -0.6125 + 0.0],
            [2.0, 0.0, 0.0],
        ],
    )
    # 5 clusters (A, B, C, D in group 0; A in group 1) over 9 valid turns; D and group 1's A are singletons
    close(metrics["credit/anchor_clusters"], 5.0)
    close(metrics["credit/anchor_cluster_size"], 9 / 5)
    close(metrics["credit/anchor_singleton_fraction"], 2 / 5)


def test_gigpo_step_weight_and_episode_rewards():
    # ω = 2 doubles A^S; episode_rewards overrides R (traj 3 alone: A^E = R = 5)
    adv, _ = gigpo_advantages(
        TURN_REWARDS, TURN_MASK, ANCHORS, GROUPS, invalid=INVALID, gamma=0.5, step_advantage_w=2.0,
        episode_rewards=T([1.0, 1.0, 0.0, 5.0]),
    )  # fmt: skip
    close(adv[0], [0.3875, 0.3875 + 0.6, 0.3875])
    close(adv[3], [5.0, 0.0, 0.0])


def test_gigpo_mean_std_norm_hand_worked():
    # One group: traj 0 has one turn (r = 1, anchor A), traj 1 two turns (r = [0, 0], anchors A, B); γ = 0.5.
    # Episode rows E = [1 | 0, 0]: mean 1/3, deviations 2/3, −1/3, −1/3, squares sum 6/9, unbiased var
    # (6/9)/2 = 1/3, std 1/√3 = 0.577350 → A^E = 2/3·√3 = 1.154701 and −1/3·√3 = −0.577350.
    # Cluster A: G = {1, 0}: mean 0.5, std √0.5 = 0.707107 → A^S = ±0.707107; B alone → 0.
    adv, _ = gigpo_advantages(
        T([[1.0, 0.0], [0.0, 0.0]]), T([[1, 0], [1, 1]]), [["A"], ["A", "B"]], T([7, 7]), gamma=0.5,
        mode="mean_std_norm",
    )  # fmt: skip
    close(adv, [[1.154701 + 0.707107, 0.0], [-0.577350 - 0.707107, -0.577350]])


def test_gigpo_equal_scores_in_a_group_give_zero_with_std():
    # every row equal: (x − mean) / (0 + ε) = 0, not NaN
    adv, _ = gigpo_advantages(T([[1.0], [1.0]]), T([[1], [1]]), [["A"], ["A"]], T([0, 0]), mode="mean_std_norm")
    close(adv, [[0.0], [0.0]])


def test_gigpo_images_are_anchors_by_their_pixels():
    from PIL import Image

    from mmgrpo.tools import anchor_key

    red1, red2, blue = (Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (255, 0, 0), (0, 0, 255)))
    keys = [[anchor_key(red1)], [anchor_key(red2)], [anchor_key(blue)]]
    # returns 1, 0, 5 in one group; red1 and red2 are one state (mean 0.5), blue is alone
    adv, _ = gigpo_advantages(T([[1.0], [0.0], [5.0]]), T([[1], [1], [1]]), keys, T([0, 0, 0]), step_advantage_w=1.0)
    # A^E = r − 2 = [−1, −2, 3]; A^S = [0.5, −0.5, 0]
    close(adv, [[-0.5], [-2.5], [3.0]])


def test_gigpo_rejects_bad_inputs():
    with pytest.raises(ValueError, match="mode must be one of"):
        gigpo_advantages(TURN_REWARDS, TURN_MASK, ANCHORS, GROUPS, mode="mean")
    with pytest.raises(ValueError, match="invalid must have shape \\[4, 3\\]"):
        gigpo_advantages(TURN_REWARDS, TURN_MASK, ANCHORS, GROUPS, invalid=T([0, 0, 1, 0]))


# -------------------------------------------------------------------------------------------------- MT-GRPO

# One group of three: outcome r^O = [1, 0, 0], turn r^T = [1, 1, 0]; trajectories 0 and 1 got a tool result
# after turn 0 (first_result_turn = 1), trajectory 2 none (−1, and it has one turn).
OUTCOME, TURN, FIRST = T([1.0, 0.0, 0.0]), T([1.0, 1.0, 0.0]), T([1, 1, -1])
MT_MASK = T([[1, 1], [1, 1], [1, 0]])
# Â^O: mean 1/3, unbiased std 1/√3 = 0.5773503, + 1e-4 → 0.5774503: [2/3, −1/3, −1/3] / 0.5774503
A_O = [0.6666667 / 0.5774503, -0.3333333 / 0.5774503, -0.3333333 / 0.5774503]  # [1.154500, −0.577250, −0.577250]
# Â^T: mean 2/3, deviations [1/3, 1/3, −2/3], same std → [0.577250, 0.577250, −1.154500]
A_T = [0.3333333 / 0.5774503, 0.3333333 / 0.5774503, -0.6666667 / 0.5774503]
# Â^{O+T}: r^O + r^T = [2, 1, 0]: mean 1, std 1 → [1, 0, −1] / 1.0001
A_OT = [1 / 1.0001, 0.0, -1 / 1.0001]


def test_mt_grpo_aae_hand_worked():
    adv, metrics = mt_grpo_advantages(OUTCOME, TURN, FIRST, MT_MASK, T([0, 0, 0]), turn_advantage_coef=0.5)
    close(
        adv,
        [
            [A_O[0] + 0.5 * A_T[0], A_O[0]],  # turn 0 before the result: Â^O + λÂ^T; turn 1 after: Â^O
            [A_O[1] + 0.5 * A_T[1], A_O[1]],
            [A_OT[2], 0.0],  # no tool result: Â^{O+T}; turn 1 does not exist
        ],
    )
    close(metrics["credit/tool_result_fraction"], 2 / 3)
    close(metrics["credit/turn_adv_abs"], 0.5 * A_T[0])


def test_mt_grpo_cae_hand_worked():
    # cumulative r^T + δ·r^O with δ = 1 is r^O + r^T = [2, 1, 0] → Â^{O+T} before the result, Â^O after it
    adv, _ = mt_grpo_advantages(OUTCOME, TURN, FIRST, MT_MASK, T([0, 0, 0]), advantage_est="cae")
    close(adv, [[A_OT[0], A_O[0]], [A_OT[1], A_O[1]], [A_OT[2], 0.0]])


def test_mt_grpo_groups_are_separate_and_a_group_of_one_gets_zero():
    # two groups: {0, 1} and {2}. Group {0, 1}: r^O = [1, 0] → ±0.5 / (√0.5 + 1e-4) = ±0.707007; r^T = [1, 1] → 0.
    adv, _ = mt_grpo_advantages(OUTCOME, TURN, FIRST, MT_MASK, T([4, 4, 9]))
    d = 0.5 / (math.sqrt(0.5) + 1e-4)
    close(adv, [[d, d], [-d, -d], [0.0, 0.0]])
    with pytest.raises(ValueError, match="advantage_est must be one of"):
        mt_grpo_advantages(OUTCOME, TURN, FIRST, MT_MASK, T([0, 0, 0]), advantage_est="gae")


# ------------------------------------------------------------------------------------------------- DeepEyes


LONG = ("cat " * 300).strip()


def test_deepeyes_reward_hand_worked():
    reward = load_reward("deepeyes")
    completions = [
        "<think>zoom</think><tool_call>{}</tool_call><think>ok</think><answer>cat</answer>",  # right, 1 call
        "<think>sure</think><answer>cat</answer>",  # right, no call
        "<think>zoom</think><answer>dog</answer>",  # wrong, 2 calls
        "<think>unclosed<answer>cat</answer>",  # right, 1 call, unbalanced <think>
        "<answer>" + LONG + "</answer>",  # the right answer, but 1199 characters: acc 0, format −1, no bonus
        "<answer>cat</answer>",  # no ground truth: not applicable
    ]
    out = reward(
        completions, prompts=["q"] * 6, answer=["cat", "cat", "cat", "cat", LONG, None], tool_calls=[1, 0, 2, 1, 1, 0]
    )
    # 0.8·acc + 0.2·fmt + 1.2·tool, tool = 1 only with a call and acc > 0.5
    assert out == pytest.approx([0.8 + 1.2, 0.8, 0.0, 0.8 - 0.2 + 1.2, -0.2, None])
    weights = load_reward("deepeyes", acc_weight=1.0, format_weight=0.0, tool_weight=0.5)
    assert weights(completions[:1], prompts=["q"], answer=["cat"], tool_calls=[3]) == pytest.approx([1.5])
    with pytest.raises(KeyError, match="needs the column 'tool_calls'"):
        reward(completions[:1], prompts=["q"], answer=["cat"])


def test_deepeyes_format():
    assert deepeyes_format("<think>a</think><answer>b</answer>") == (0.0, False)
    assert deepeyes_format("<think>a</think><answer>b") == (-1.0, False)  # unclosed answer after </think>
    assert deepeyes_format("<think>a</think><tool_call>x<answer>b</answer>") == (-1.0, False)


# ------------------------------------------------------------------------------- parity with the step-row form


def _gigpo_step_rows(rewards, mask, anchors, groups, invalid, gamma, w, mode, c, eps):
    """verl-agent's algorithm on one row per step, written the way ``core_gigpo.py`` loops (dicts of lists)."""
    rows = []  # (group, traj, anchor, r, invalid)
    for b in range(len(anchors)):
        for s in range(mask.shape[1]):
            if mask[b, s]:
                rows.append((int(groups[b]), b, anchors[b][s], float(rewards[b, s]), float(invalid[b, s])))
    returns = [0.0] * len(rows)  # compute_step_discounted_returns, then apply_invalid_action_penalty
    for b in {row[1] for row in rows}:
        idx = [i for i, row in enumerate(rows) if row[1] == b]
        running = 0.0
        for i in reversed(idx):
            running = rows[i][3] + gamma * running
            returns[i] = running
    episode = {b: sum(row[3] for row in rows if row[1] == b) for b in {row[1] for row in rows}}
    scores = [episode[row[1]] - c * row[4] for row in rows]
    returns = [g - c * row[4] for g, row in zip(returns, rows)]

    def norm(values, keys, singleton_mean_zero):
        by = {}
        for v, k in zip(values, keys):
            by.setdefault(k, []).append(v)
        out = []
        for v, k in zip(values, keys):
            vals = torch.tensor(by[k], dtype=torch.float64)
            if len(vals) == 1:
                mean, std = (0.0 if singleton_mean_zero else float(vals[0])), 1.0
            else:
                mean, std = float(vals.mean()), float(vals.std())
            out.append(v - mean if mode == "mean_norm" else (v - mean) / (std + eps))
        return out

    a_e = norm(scores, [row[0] for row in rows], True)  # episode_norm_reward
    a_s = norm(returns, [(row[0], row[2]) for row in rows], False)  # build_step_group + step_norm_reward
    out = torch.zeros(mask.shape, dtype=torch.float64)
    i = 0
    for b in range(len(anchors)):
        for s in range(mask.shape[1]):
            if mask[b, s]:
                out[b, s] = a_e[i] + w * a_s[i]
                i += 1
    return out.float()


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("seed", range(5))
def test_gigpo_matches_the_step_row_form(mode, seed):
    g = torch.Generator().manual_seed(seed)
    P, G, S = 3, 4, 5
    B = P * G
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    mask = (torch.arange(S)[None, :] < lengths[:, None]).float()  # [B, S]
    rewards = torch.randint(-2, 3, (B, S), generator=g).float() * 0.5  # [B, S]
    invalid = (torch.rand(B, S, generator=g) < 0.2).float()  # [B, S]
    anchors = [[int(x) for x in torch.randint(0, 3, (S,), generator=g)] for _ in range(B)]  # few states: clusters
    groups = torch.arange(B) // G
    expected = _gigpo_step_rows(rewards, mask, anchors, groups, invalid, 0.9, 0.7, mode, 0.1, 1e-6)
    adv, _ = gigpo_advantages(
        rewards, mask, anchors, groups, invalid=invalid, gamma=0.9, step_advantage_w=0.7, mode=mode,
        invalid_penalty=0.1,
    )  # fmt: skip
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_mt_grpo_matches_the_source_form(seed):
    """The source's ``rewards.view(-1, G)`` normalisation and its token split, on random groups of G = 4."""
    g = torch.Generator().manual_seed(seed)
    P, G, S = 3, 4, 3
    ro, rt = torch.randint(0, 3, (P * G,), generator=g).float(), torch.randint(0, 2, (P * G,), generator=g).float()
    first = torch.randint(-1, S, (P * G,), generator=g)
    mask = torch.ones(P * G, S)

    def norm(r):  # grpo_env_trainer._compute_normalized_advantages
        mean = r.view(-1, G).mean(1).repeat_interleave(G)
        std = r.view(-1, G).std(1).repeat_interleave(G)
        return (r - mean) / (std + 1e-4)

    a_o, a_t, a_ot = norm(ro), norm(rt), norm(ro + rt)
    expected = torch.zeros(P * G, S)
    for b in range(P * G):
        for s in range(S):
            if first[b] >= 0:  # a result exists: split at it
                expected[b, s] = a_o[b] + (0.8 * a_t[b] if s < first[b] else 0.0)
            else:
                expected[b, s] = a_ot[b]
    adv, _ = mt_grpo_advantages(ro, rt, first, mask, torch.arange(P * G) // G, turn_advantage_coef=0.8)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-5)
