"""The GRPO variants of docs/variants.md: each checked on a small hand-worked example of its equation."""

import math
from pathlib import Path

import pytest
import torch

from mmgrpo import advantages as adv_lib
from mmgrpo import losses, schedules
from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.rewards import load_reward
from mmgrpo.rewards.variants import tempsamp_shape
from mmgrpo.sampling import VarianceOptions, VarianceSampler, distinct_n

ROOT = Path(__file__).resolve().parents[1]


# --- Reg-GRPO ------------------------------------------------------------------------------------------------


def _reg_loss(log_ratio, adv, mask, G=3, reduction="sum"):
    opts = losses.RegGRPOOptions(reduction=reduction)
    per_unit, metrics = losses.reg_grpo(log_ratio, adv, mask, opts, group_size=G)
    return losses.seq_mean_token_mean(per_unit, mask, max_units=mask.shape[1]), per_unit, metrics


def _reg_grad_by_hand(rho_hat, a, dev, std, s):
    """d/d rho_j of (1/3) sum_i (rho_hat_i - A_i)^2 for G = 3, with d rho_hat_i / d rho_j =
    (delta_ij - 1/3)/s - dev_i * dev_j / ((G-1) * std * s^2), dev = rho - mean, s = std + eps."""
    return [
        sum(
            (2 / 3) * (rho_hat[i] - a[i]) * (((i == j) - 1 / 3) / s - dev[i] * dev[j] / (2 * std * s**2))
            for i in range(3)
        )
        for j in range(3)
    ]


def test_reg_grpo_sum_reading_values_and_gradient_by_hand():
    # eq. 7: rho_i = log pi(y_i|x) - log pi_old(y_i|x), the token SUM. One group of G=3: rows sum to
    # rho = [0.1 + 0.2, -0.1 (one valid unit; 9.0 is masked), 0.05 + 0.05] = [0.3, -0.1, 0.1]; A = [0.5, -1, 0.5].
    # mean 0.1, deviations [0.2, -0.2, 0], unbiased std sqrt(0.08 / 2) = 0.2, s = 0.2 + eps = 0.2001
    lr = torch.tensor([[0.1, 0.2], [-0.1, 9.0], [0.05, 0.05]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    A = torch.tensor([[0.5, 0.5], [-1.0, -1.0], [0.5, 0.5]])
    loss, per_unit, _ = _reg_loss(lr, A, mask)
    s = 0.2 + losses.REG_GRPO_EPS
    rho_hat = [0.2 / s, -0.2 / s, 0.0]  # [0.9995, -0.9995, 0]
    expect = [(rho_hat[0] - 0.5) ** 2, (rho_hat[1] + 1.0) ** 2, 0.25]  # [0.2495, 2.5e-7, 0.25]
    assert per_unit[:, 0].tolist() == pytest.approx(expect, rel=1e-5, abs=1e-9)
    assert per_unit[1, 1] == 0.0  # masked unit
    assert float(loss.detach()) == pytest.approx(sum(expect) / 3, rel=1e-5)
    loss.backward()
    g_rho = _reg_grad_by_hand(rho_hat, [0.5, -1.0, 0.5], [0.2, -0.2, 0.0], 0.2, s)
    assert g_rho == pytest.approx([0.833332, 0.832501, -1.665834], abs=2e-6)  # the numbers, worked out once
    # rho_i is a SUM over the valid units: every valid unit of row i gets the whole d loss / d rho_i
    expect_grad = torch.tensor([[g_rho[0], g_rho[0]], [g_rho[1], 0.0], [g_rho[2], g_rho[2]]])
    torch.testing.assert_close(lr.grad, expect_grad, rtol=1e-4, atol=1e-6)


def test_reg_grpo_mean_reading_divides_by_the_length():
    # the option: rho_i = mean of the valid units: [0.2, 0.4] -> 0.3, [-0.1] -> -0.1, [0.1, 0.1] -> 0.1 (same rho
    # as above), so the same values; each unit's gradient is d loss / d rho_i divided by the row's unit count
    lr = torch.tensor([[0.2, 0.4], [-0.1, 9.0], [0.1, 0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    A = torch.tensor([[0.5, 0.5], [-1.0, -1.0], [0.5, 0.5]])
    loss, per_unit, _ = _reg_loss(lr, A, mask, reduction="mean")
    s = 0.2 + losses.REG_GRPO_EPS
    rho_hat = [0.2 / s, -0.2 / s, 0.0]
    assert per_unit[:, 0].tolist() == pytest.approx(
        [(rho_hat[0] - 0.5) ** 2, (rho_hat[1] + 1.0) ** 2, 0.25], rel=1e-5, abs=1e-9
    )
    loss.backward()
    g = _reg_grad_by_hand(rho_hat, [0.5, -1.0, 0.5], [0.2, -0.2, 0.0], 0.2, s)
    expect_grad = torch.tensor([[g[0] / 2, g[0] / 2], [g[1], 0.0], [g[2] / 2, g[2] / 2]])
    torch.testing.assert_close(lr.grad, expect_grad, rtol=1e-4, atol=1e-6)


def test_reg_grpo_on_policy_gradient_is_the_policy_gradient_direction():
    lr = torch.zeros(4, 3, requires_grad=True)  # on-policy: every rho is 0
    mask = torch.ones(4, 3)
    A = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(4, 3)
    loss, _, _ = _reg_loss(lr, A, mask, G=4)
    loss.backward()
    assert torch.isfinite(lr.grad).all()
    # d loss / d rho_i = -(2/G) (A_i - mean A) / (std + eps), std = sqrt(1e-12) (the clamp); rho is a sum, so
    # every unit of the row gets it whole
    expect = -(2 / 4) * (torch.tensor([1.0, -1.0, 0.5, -0.5]) - 0.0) / (1e-6 + losses.REG_GRPO_EPS)
    torch.testing.assert_close(lr.grad, expect[:, None].expand(4, 3), rtol=1e-4, atol=1e-3)


def test_reg_grpo_refuses_a_minibatch_that_splits_a_group():
    with pytest.raises(ValueError, match="not a multiple of group_size=3"):
        losses.reg_grpo(torch.zeros(4, 2), torch.zeros(4, 2), torch.ones(4, 2), group_size=3)


def test_config_refuses_group_surrogates_with_split_minibatches():
    base = ["algorithm.surrogate=reg_grpo", "algorithm.group_size=8"]
    with pytest.raises(ConfigError, match="minibatch_size to a multiple of group_size=8"):
        load_config(ROOT / "configs/quickstart.yaml", [*base, "algorithm.minibatch_size=12"])
    with pytest.raises(ConfigError, match="prompts_per_step to a multiple of updates_per_epoch"):
        load_config(ROOT / "configs/quickstart.yaml", [*base, "algorithm.updates_per_epoch=3"])


# --- dynamic KL -------------------------------------------------------------------------------------------------


def test_othink_schedule_is_the_papers_equation_by_hand():
    # OThink-MR1 eq. 3 with beta_min 0.04, beta_max 0.1 (visual counting), w = 0.3, S = 11 steps (p = t / 10):
    # beta_mid = 0.07; p <= 0.3: 0.07 - 0.03 * p / 0.3; p > 0.3: 0.04 + 0.06 * (p - 0.3) / 0.7
    oth = {"beta_min": 0.04, "exploration_ratio": 0.3}
    got = [schedules.beta_at("othink", t, 11, 0.1, oth) for t in (0, 1, 3, 5, 10)]
    assert got == pytest.approx([0.07, 0.06, 0.04, 0.04 + 0.06 * 0.2 / 0.7, 0.1], rel=1e-12)
    # the defaults: w = 0.3, beta_min = 0 (geometry's 0.0 / 0.02): 0.01 -> 0 at step 3 -> 0.02 at the end
    assert [schedules.beta_at("othink", t, 11, 0.02) for t in (0, 3, 10)] == pytest.approx([0.01, 0.0, 0.02])
    # beta_max under the paper's name, equal to algorithm.beta; w = 0: no dip, a plain rise from beta_min
    assert schedules.beta_at("othink", 5, 11, 0.1, {"beta_max": 0.1, "exploration_ratio": 0.0}) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="exploration_ratio must be in"):
        schedules.beta_at("othink", 0, 10, 0.1, {"exploration_ratio": 1.0})
    with pytest.raises(ValueError, match=r"beta_min = 0\.2 must be <= beta_max"):
        schedules.beta_at("othink", 0, 10, 0.1, {"beta_min": 0.2})


def test_beta_schedules_by_hand():
    assert [schedules.beta_at("linear", t, 5, 0.1) for t in (0, 2, 4)] == pytest.approx([0.0, 0.05, 0.1])
    assert [schedules.beta_at("cosine", t, 5, 0.1) for t in (0, 1, 2, 4)] == pytest.approx(
        [0.0, 0.1 * 0.5 * (1 - math.cos(math.pi / 4)), 0.05, 0.1]
    )
    assert schedules.beta_at("constant", 3, 10, 0.04) == 0.04


def test_beta_schedule_config_errors_name_the_option():
    q = ROOT / "configs/quickstart.yaml"
    with pytest.raises(ConfigError, match=r"algorithm\.beta_schedule: 'expo' is not allowed"):
        load_config(q, ["algorithm.beta_schedule=expo"])
    with pytest.raises(
        ConfigError,
        match=r"^unknown field 'algorithm\.beta_schedule_args\.warmup_ratio'; allowed: beta_min, beta_max, "
        r"exploration_ratio$",
    ):  # the earlier reading's key
        load_config(q, ["algorithm.beta_schedule=othink", "algorithm.beta_schedule_args={warmup_ratio: 0.5}"])
    with pytest.raises(ConfigError, match=r"^algorithm\.beta_schedule_args \(othink\): beta_max = 1\.0 differs"):
        load_config(
            q, ["algorithm.beta=0.1", "algorithm.beta_schedule=othink", "algorithm.beta_schedule_args={beta_max: 1}"]
        )
    with pytest.raises(ConfigError, match=r"^algorithm\.beta_schedule_args \(othink\): exploration_ratio must be"):
        load_config(q, ["algorithm.beta_schedule=othink", "algorithm.beta_schedule_args={exploration_ratio: 1.5}"])


# --- advantage transforms ----------------------------------------------------------------------------------------


def test_dgrpo_difficulty_weight_by_hand():
    # VITAL's compute_dgrpo_outcome_advantage: d = clip(2 - mean r, 0, 1), A <- A (1 + d) / 2, after normalising.
    # total rewards in [0, 4]: group means 0.5 -> d 1 (weight 1), 1.5 -> d 0.5 (0.75), 3 -> d 0 (0.5)
    r = torch.tensor([[1.0, 0.0], [2.0, 1.0], [4.0, 2.0]])
    a = torch.tensor([[0.7, -0.7], [0.7, -0.7], [0.7, -0.7]])
    out = adv_lib.apply_transforms(["difficulty"], a, r, torch.zeros_like(r), {})
    torch.testing.assert_close(out, a * torch.tensor([[1.0], [0.75], [0.5]]))
    # offset 1 for rewards in [0, 1]: mean 0.25 -> d 0.75 (0.875); a NaN sample leaves the mean of the others
    r1 = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, float("nan"), 1.0]])
    out1 = adv_lib.apply_transforms(
        ["difficulty"], a[:2, :1].expand(2, 4), r1, torch.zeros(2, 4), {"difficulty": {"offset": 1.0}}
    )
    torch.testing.assert_close(out1[:, 0], torch.tensor([0.7 * 0.875, 0.7 * (1 + 1 / 3) / 2]))


def test_lens_all_wrong_group_by_hand():
    # all wrong, G = 3, pi_bar = [0.5, 0.2, 0.2] -> D = 2 max = 1.0; penalty (1/3) pi_bar / (1 - pi_bar)
    # = [1/3, 1/12, 1/12]; r~ = -penalty, mean -1/6; mean-centred only, times alpha 0.25:
    # 0.25 * [-1/6, 1/12, 1/12] = [-0.041667, 0.020833, 0.020833] (the most confident mistake is pushed down)
    r = torch.tensor([[0.0, 0.0, 0.0]])
    lp = torch.log(torch.tensor([[0.5, 0.2, 0.2]]))
    out = adv_lib.apply_transforms(["negative_groups"], torch.zeros(1, 3), r, lp, {})
    torch.testing.assert_close(out, torch.tensor([[-1 / 24, 1 / 48, 1 / 48]]), rtol=1e-6, atol=1e-7)
    out2 = adv_lib.apply_transforms(["negative_groups"], torch.zeros(1, 3), r, lp, {"negative_groups": {"alpha": 1.0}})
    torch.testing.assert_close(out2, torch.tensor([[-1 / 6, 1 / 12, 1 / 12]]), rtol=1e-6, atol=1e-7)


def _grpo(x):
    m = sum(x) / len(x)
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / (len(x) - 1))
    return [(v - m) / (sd + 1e-6) for v in x]


def test_lens_mixed_groups_by_hand():
    lp = torch.log(torch.tensor([[0.5, 0.4, 0.1, 0.25], [0.9, 0.1, 0.05, 0.1]]))
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    out = adv_lib.apply_transforms(["negative_groups"], torch.zeros(2, 4), r, lp, {})
    # group 0: D_imp = [(1/4)(1/0.5 + 1/0.25)]^-1 = 2/3 < 2 max pi_bar = 1 -> D = 1;
    # r~ = [1, -(1/4)(0.4/0.6), -(1/4)(0.1/0.9), 1] = [1, -1/6, -1/36, 1], then GRPO-normalised
    r0 = [1.0, -1 / 6, -1 / 36, 1.0]
    # group 1: D_imp = [(1/4)(1/0.9)]^-1 = 3.6 > 2 max = 1.8 -> D = 3.6;
    # r~ = [1, -(1/4)(0.1/3.5), -(1/4)(0.05/3.55), -(1/4)(0.1/3.5)] = [1, -0.0071429, -0.0035211, -0.0071429]
    r1 = [1.0, -0.1 / 14, -0.05 / 14.2, -0.1 / 14]
    assert r1[1:] == pytest.approx([-0.0071429, -0.0035211, -0.0071429], abs=1e-7)
    torch.testing.assert_close(out, torch.tensor([_grpo(r0), _grpo(r1)]), rtol=1e-5, atol=1e-6)
    # all correct: r~ = r, zero advantage; a NaN sample is left out of G and gets 0
    r2 = torch.tensor([[1.0, 1.0, float("nan")]])
    lp2 = torch.log(torch.tensor([[0.4, 0.4, 0.2]]))
    torch.testing.assert_close(
        adv_lib.apply_transforms(["negative_groups"], torch.ones(1, 3), r2, lp2, {}), torch.zeros(1, 3)
    )
    # a format bonus: wrong_threshold 0.2 counts 0.2 as wrong, the penalty subtracted from the reward as it is
    r3 = torch.tensor([[0.2, 0.2]])
    lp3 = torch.log(torch.tensor([[0.5, 0.25]]))  # D = 1: penalties (1/2)(0.5/0.5), (1/2)(0.25/0.75) = 0.5, 1/6
    out3 = adv_lib.apply_transforms(
        ["negative_groups"], torch.zeros(1, 2), r3, lp3, {"negative_groups": {"wrong_threshold": 0.2}}
    )
    torch.testing.assert_close(out3, 0.25 * torch.tensor([[-1 / 6, 1 / 6]]), rtol=1e-5, atol=1e-7)


def test_advantage_transform_config_errors():
    q = ROOT / "configs/quickstart.yaml"
    with pytest.raises(ConfigError, match=r"algorithm\.advantage_transform: 'nope' is not allowed"):
        load_config(q, ["algorithm.advantage_transform=[nope]"])
    with pytest.raises(
        ConfigError,
        match=r"^unknown field 'algorithm\.advantage_transform_args\.difficulty\.strength'; allowed: offset$",
    ):  # the earlier reading's key
        load_config(
            q,
            [
                "algorithm.advantage_transform=[difficulty]",
                "algorithm.advantage_transform_args={difficulty: {strength: 2}}",
            ],
        )
    with pytest.raises(ConfigError, match=r"^algorithm\.advantage_transform: negative_groups \(LENS\) replaces"):
        load_config(q, ["algorithm.advantage_transform=[difficulty, negative_groups]"])
    with pytest.raises(ConfigError, match=r"^algorithm\.surrogate_args\.reduction: 'token' is not allowed; choose one"):
        load_config(q, ["algorithm.surrogate=reg_grpo", "algorithm.surrogate_args={reduction: token}"])
    with pytest.raises(ConfigError, match=r"negative_groups\.strength'; allowed: alpha, wrong_threshold, eps$"):
        load_config(
            q,
            [
                "algorithm.advantage_transform=[negative_groups]",
                "algorithm.advantage_transform_args={negative_groups: {strength: 2}}",
            ],
        )


# --- rewards -------------------------------------------------------------------------------------------------


def test_self_consistency_frequency_majority_and_entropy_term():
    comps = ["<answer>red</answer>", "<answer>Red</answer>", "<answer>blue</answer>", "no tags", "<answer>x</answer>"]
    cols = {"group_index": [0, 0, 0, 0, 1]}
    freq = load_reward("self_consistency")(comps, prompts=["p"] * 5, **cols)
    assert freq == pytest.approx([0.5, 0.5, 0.25, 0.0, 1.0])  # p(a) over the N=4 completions of group 0
    maj = load_reward("self_consistency", vote="majority", entropy_weight=0.1)(comps, prompts=["p"] * 5, **cols)
    assert maj == pytest.approx([1 + 0.1 * math.log(0.5), 1 + 0.1 * math.log(0.5), 0.1 * math.log(0.25), 0.0, 1.0])


STEP_OK = (
    "### Image Description: a red bar.\n### Rationales: count it.\n### Step 1: the bar is red and wide.\n"
    "### Step 2: compare with Blue.\n### The final answer is: 42"
)


def test_step_rar_and_step_rvr_by_hand():
    rar = load_reward("step_rar")
    cols = {"answer": ["42", "41", "42"], "key_steps": [[["red", "crimson"], ["blue"], ["green"]], [["red"]], None]}
    # 1 + 0.1 * 2/3 ; 0 + 0.1 * 1/1 ; answer only
    assert rar([STEP_OK, STEP_OK, STEP_OK], prompts=["p"] * 3, **cols) == pytest.approx([1 + 0.2 / 3, 0.1, 1.0])
    rvr = load_reward("step_rvr")
    skipped = STEP_OK.replace("### Step 2:", "### Step 3:")
    late = STEP_OK.replace("### The final answer is: 42", "") + "\n### The final answer is: 42\n### Step 3: x"
    missing = STEP_OK.replace("### Rationales: count it.\n", "")
    assert rvr([STEP_OK, skipped, late, missing], prompts=["p"] * 4) == [1.0, 0.0, 0.0, 0.0]


def test_tempsamp_shape_by_hand():
    e = math.e
    assert tempsamp_shape(1.0) == pytest.approx(0.8 + 0.01 * math.log(1.2))  # 0.8018
    assert tempsamp_shape(0.8) == pytest.approx(0.8)
    assert tempsamp_shape(0.5) == pytest.approx(0.8 - (math.exp(0.3) - 1) / (e - 1))  # 0.5964
    assert tempsamp_shape(0.0) == pytest.approx(0.8 - (math.exp(0.8) - 1) / (e - 1))  # 0.0868
    soft = load_reward("tempsamp_soft")(
        ["<answer>0.5 to 1.5</answer>", "<answer>0.5 to 1.0</answer>"], prompts=["p"] * 2, answer=[[0.5, 1.5], None]
    )
    assert soft[1] is None  # no ground truth: not applicable
    assert soft[0] == pytest.approx(0.8 + 0.01 * math.log(1.2))  # IoU 1


# --- variance-aware sampling ---------------------------------------------------------------------------------


def test_variance_sampler_is_world_size_invariant_and_follows_the_scores():
    one = VarianceSampler(20, 4, 1, 0, seed=3, options=VarianceOptions(mixture_ratio=1.0))
    two = [VarianceSampler(20, 2, 2, r, seed=3, options=VarianceOptions(mixture_ratio=1.0)) for r in range(2)]
    assert one.indices(0) == two[0].indices(0) + two[1].indices(0)
    assert one.positions(1) == two[0].positions(1) + two[1].positions(1)
    rows = torch.arange(20)
    rewards = torch.zeros(20, 4)
    rewards[:4] = torch.tensor([1.0, 0.0, 1.0, 0.0])  # rows 0-3: variance p(1-p) = 0.25; the others 0
    for s in [one, *two]:
        s.observe(rows, rewards, distinct_n(["a b c"] * 80, 4))
    torch.testing.assert_close(one.variance[:5], torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0]))
    assert one.diversity[0] == 0.25  # one distinct 3-gram among the group's four
    # min-max normalised weights: 1 for rows 0-3, 0 for the others -> with mixture 1 only rows 0-3 are drawn
    torch.testing.assert_close(one.weights()[:5], torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0]), atol=1e-6, rtol=0)
    assert all(set(one.indices(step)) == {0, 1, 2, 3} for step in range(1, 20))
    assert one.indices(1) == two[0].indices(1) + two[1].indices(1)
    filt = VarianceSampler(20, 4, 1, 0, seed=3, options=VarianceOptions(mode="filter"))
    filt.observe(rows, rewards, torch.ones(20))
    assert all(set(filt.indices(s)) <= {0, 1, 2, 3} for s in range(5))


def test_variance_sampler_mixture_momentum_and_distinct_3():
    # MMR1 MixedCurriculumSampler: half of each step by weight (rows 0-3 only), half uniformly over the other rows,
    # interleaved weighted / uniform
    mix = VarianceSampler(20, 4, 1, 0, seed=5, options=VarianceOptions(mixture_ratio=0.5))
    rewards = torch.zeros(20, 4)
    rewards[:4] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mix.observe(torch.arange(20), rewards, torch.zeros(20))
    odd = []
    for step in range(50):
        rows = mix.indices(step)
        assert len(set(rows)) == 4 and rows[0] < 4 and rows[2] < 4  # weighted draws at even slots
        odd += rows[1::2]  # uniform over the 18 rows the weighted draw left: rows >= 4 with probability 16/18
    assert 0.75 < sum(r >= 4 for r in odd) / len(odd) < 0.98  # 100 draws: about 3 standard deviations
    # momentum m: new = m * old + (1 - m) * observed, for rows seen before
    mom = VarianceSampler(4, 1, 1, 0, seed=0, options=VarianceOptions(momentum=0.75))
    mom.observe(torch.tensor([0]), torch.tensor([[1.0, 0.0]]), torch.tensor([1.0]))  # first sight: 0.25, 1
    mom.observe(torch.tensor([0]), torch.tensor([[1.0, 1.0]]), torch.tensor([0.0]))  # variance 0, TDS 0
    assert float(mom.variance[0]) == pytest.approx(0.75 * 0.25)
    assert float(mom.diversity[0]) == pytest.approx(0.75)
    # distinct-3: group 1 "a b c d" + "a b c x" -> 3-grams abc, bcd, abc, bcx: 3 distinct of 4; group 2 no 3-gram
    torch.testing.assert_close(distinct_n(["a b c d", "a b c x", "a b", "c"], 2), torch.tensor([0.75, 0.0]))


def test_variance_sampler_state_round_trip_draws_the_same_rows():
    import json

    a = VarianceSampler(30, 3, 1, 0, seed=1, options=VarianceOptions(beta=0.5))
    gen = torch.Generator().manual_seed(0)
    for step in range(4):
        rows = torch.tensor(a.indices(step))
        a.observe(rows, torch.randint(0, 2, (3, 4), generator=gen).float(), torch.rand(3, generator=gen))
    b = VarianceSampler(30, 3, 1, 0, seed=1, options=VarianceOptions(beta=0.5))
    assert [b.indices(s) for s in range(4, 9)] != [a.indices(s) for s in range(4, 9)]  # fresh statistics differ
    b.load_state_dict(json.loads(json.dumps(a.state_dict(), allow_nan=False)))  # strict JSON: unseen rows -> null
    assert [b.indices(s) for s in range(4, 9)] == [a.indices(s) for s in range(4, 9)]
    with pytest.raises(ValueError, match="has 30 rows, the training data has 29"):
        VarianceSampler(29, 3, 1, 0, seed=1).load_state_dict(a.state_dict())


# --- configs: one short run each ------------------------------------------------------------------------------

SMALL = [
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=4",
    "model.args.max_new_tokens=5",
    "task.args.train_size=16",
    "task.args.eval_size=4",
    "warmup.steps=0",
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "steps=2",
    "logging.trackers=[]",
    "logging.progress=false",
    "logging.plot=false",
    "checkpoint.save_final=false",
]


def _records(run) -> list[dict]:
    import json

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss/policy" in r]


def _last_record(run) -> dict:
    return _records(run)[-1]


SAMPLING = "variant_variance_sampling.yaml"  # trained (and resumed) by the test below
OWN_RUNS = {SAMPLING, "variant_dgpo.yaml"}  # configs with a test of their own (the flow one: other overrides)


def length_reward(completions: list, **columns) -> list[float]:
    """1 when the completion's length is a multiple of 4: zero-variance groups often, but not always."""
    return [float(len(str(c)) % 4 == 0) for c in completions]


# an untrained model scores 0 everywhere on the built-in rewards: give the refill groups to find
VARIANT_OVERRIDES = {
    "variant_dynamic_sampling.yaml": [
        "rewards=[{name: 'tests.test_variants:length_reward'}]",
        "steps=3",
        "algorithm.dynamic_sampling.max_num_gen_batches=2",
    ],
    "variant_tree_grpo.yaml": ["rollout.tree.nodes=1", "checkpoint.after_warmup=false"],  # 2 × (1 + 1) = G = 4
    "variant_arpo.yaml": ["rollout.tree.trees=2", "checkpoint.after_warmup=false"],  # 2 chains, 2 slots for forks
}


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (ROOT / "configs").glob("variant_*.yaml") if p.name not in OWN_RUNS)
)
def test_variant_config_trains(name, tmp_path, mmgrpo_cache):
    from mmgrpo.trainer import train

    gt_span = name in ("variant_tempsamp.yaml", "variant_gcpo.yaml")
    extra = ["model.args.max_new_tokens=12"] if gt_span else []  # room for the GT span
    extra += VARIANT_OVERRIDES.get(name, [])
    cfg = load_config(ROOT / "configs" / name, [*SMALL, *extra, f"output_dir={tmp_path / 'run'}"])
    train(cfg)
    last = _last_record(tmp_path / "run")
    assert math.isfinite(last["loss/policy"]) and "kl/beta" in last
    if cfg.algorithm.dynamic_sampling.enabled:  # the kept groups have signal; only the fill-ins have none
        P, limit = cfg.algorithm.prompts_per_step, cfg.algorithm.dynamic_sampling.max_num_gen_batches
        for r in _records(tmp_path / "run"):
            assert 1 <= r["data/dynamic_gen_batches"] <= limit
            assert r["advantage/zero_std_fraction"] == pytest.approx(r["data/dynamic_short_groups"] / P)
        refilled = [r for r in _records(tmp_path / "run") if r["data/dynamic_gen_batches"] > 1]
        assert any(r["data/dynamic_short_groups"] < P for r in refilled)  # a refill found a group with signal
    if cfg.algorithm.token_weighting == "tw_grpo":  # weights in [1, alpha], the group's max position at alpha
        assert 1.0 < last["advantage/token_weight_mean"] < cfg.algorithm.token_weighting_args["alpha"]
    if cfg.algorithm.difficulty_augmentation.enabled:  # step 0 has no reference window; step 1 measures against it
        first, second = _records(tmp_path / "run")
        assert first["augment/window_mean"] == 0.0 and first["augment/delta_mean"] == 0.0
        assert second["augment/window_mean"] == pytest.approx(first["reward/mean"], abs=1e-6)
        assert 0.0 <= second["augment/hinted_fraction"] + second["augment/noised_fraction"] <= 1.0
    if cfg.algorithm.gt_injection.enabled:  # one ground-truth sample in each group of G = 4
        assert last["gt/injected_fraction"] == pytest.approx(0.25)
    if "llds" in cfg.algorithm.loss_terms:  # the per-step likelihood displacement is logged (mmgrpo/llds.py)
        assert math.isfinite(last["llds/displacement"]) and last["loss/llds"] >= 0.0
    if "entropy_bonus" in cfg.algorithm.loss_terms:  # the entropy is logged every step (mmgrpo/entropy_control.py)
        assert all(r["entropy/mean"] > 0.0 for r in _records(tmp_path / "run"))
    if "aepo" in cfg.algorithm.rollout_steps:  # T is one of AEPO's two temperatures
        assert last["aepo/temperature"] in (0.8, 1.2)
    if cfg.algorithm.credit == "igpo":  # the probe ran before turn 0: a probability of the ground truth
        assert 0.0 < last["credit/gt_prob_first"] < 1.0
    if "gcpo" in cfg.algorithm.rollout_steps:  # gold only where every sample failed: never more groups than failed
        records = _records(tmp_path / "run")
        assert all(0.0 <= r["gcpo/injected_groups"] <= r["gcpo/failed_groups"] <= 1.0 for r in records)
        assert records[0]["gcpo/injected_groups"] == 1.0  # the untrained policy fails every group: all get the gold


def test_variance_sampling_config_trains_and_resumes_its_statistics(tmp_path, mmgrpo_cache):
    from mmgrpo.trainer import Trainer

    over = [*SMALL, f"output_dir={tmp_path / 'run'}", "checkpoint.every=1"]
    first = Trainer(load_config(ROOT / "configs" / SAMPLING, over))
    first.run()
    last = _last_record(tmp_path / "run")
    assert math.isfinite(last["loss/policy"]) and "kl/beta" in last
    seen = ~torch.isnan(first.sampler.variance)
    assert int(seen.sum()) >= 2  # the two steps' prompts were observed
    resumed = Trainer(load_config(ROOT / "configs" / SAMPLING, [*over, "resume=latest", "steps=4"]))
    assert torch.isnan(resumed.sampler.variance).all()  # before the checkpoint is loaded: nothing seen
    resumed._maybe_resume()
    torch.testing.assert_close(resumed.sampler.variance, first.sampler.variance, equal_nan=True)
    assert [resumed.sampler.indices(s) for s in (2, 3)] == [first.sampler.indices(s) for s in (2, 3)]


def test_thought_dropout_empties_think_blocks_at_the_rate():
    from mmgrpo.thoughts import EMPTY_THOUGHT, drop_thoughts

    rows = [{"target": f"<think>step {i}</think><answer>{i}</answer>"} for i in range(1000)] + [{"target": "<answer>x"}]
    out = drop_thoughts(rows, 0.3, seed=1)
    dropped = [r["target"] == f"{EMPTY_THOUGHT}<answer>{i}</answer>" for i, r in enumerate(out[:1000])]
    kept = [r["target"] == rows[i]["target"] for i, r in enumerate(out[:1000])]
    assert all(d or k for d, k in zip(dropped, kept))
    assert 0.25 < sum(dropped) / 1000 < 0.35  # binomial(1000, 0.3): 5 standard deviations
    assert out[-1] == rows[-1] and drop_thoughts(rows, 0.3, seed=1) == out
    assert drop_thoughts(rows, 1.0, seed=0)[0]["target"] == f"{EMPTY_THOUGHT}<answer>0</answer>"
    with pytest.raises(ConfigError, match=r"warmup\.thought_dropout"):
        load_config(ROOT / "configs/quickstart.yaml", ["warmup.thought_dropout=1.5"])


# --- TempSamp-R1 ground-truth injection ---------------------------------------------------------------------------


def test_gt_injection_teacher_forces_one_slot_per_group(tiny_vlm_path):
    from mmgrpo.injection import inject_ground_truth
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    torch.manual_seed(0)
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 8})
    rows = list(ShapesTask(ShapesArgs(train_size=3, eval_size=1)).train_rows())
    rows[1] = {k: v for k, v in rows[1].items() if k != "answer"}  # no ground truth: the group stays on-policy
    rollout = adapter.rollout(rows, group_size=3)
    before_old, before_out = rollout.old_logprobs.clone(), list(rollout.outputs)
    injected = inject_ground_truth(adapter, rollout, rows, column="answer", template="<answer>{answer}</answer>")
    assert injected.tolist() == [False, False, True, False, False, False, False, False, True]  # slot -1
    for b in (2, 8):
        text = f"<answer>{rows[b // 3]['answer']}</answer>"
        ids = adapter.tokenizer.encode(text, add_special_tokens=False) + [int(adapter.eos_ids[0])]
        comp = rollout.state.completion_ids[b]
        assert comp[: len(ids)].tolist() == ids and (comp[len(ids) :] == adapter.pad_id).all()
        assert rollout.outputs[b] == text and not rollout.truncated[b]
        assert rollout.mask[b].tolist() == [1.0] * len(ids) + [0.0] * (8 - len(ids))  # up to and including EOS
    keep = ~injected
    assert torch.equal(rollout.old_logprobs[keep], before_old[keep])
    assert [o for o, k in zip(rollout.outputs, keep) if k] == [o for o, k in zip(before_out, keep) if k]
    gt = torch.tensor([2, 8])
    logp = adapter.logprobs(rollout, gt)  # [2, T] the training forward, with grad
    m = rollout.mask[gt].bool()
    assert (rollout.old_logprobs[gt][m] < 0).all()  # real teacher-forced log-probs, not zeros
    # the re-implementation's treatment: old log-probs recomputed by the policy -> ratio exactly 1, no IS weight
    torch.testing.assert_close(logp.detach()[m], rollout.old_logprobs[gt][m], atol=1e-5, rtol=0)
    # the gradient flows through the GT tokens: a positive advantage raises their log-probability
    params = adapter.trainable_parameters()
    opt = torch.optim.SGD(params, lr=0.05)
    per_unit, _ = losses.ppo_clip(logp - rollout.old_logprobs[gt], torch.ones_like(logp), rollout.mask[gt])
    losses.token_mean(per_unit, rollout.mask[gt], max_units=8).backward()
    opt.step()
    with torch.no_grad():
        after = adapter.logprobs(rollout, gt)
    assert float((after - logp.detach())[m].sum()) > 0
    snapshot = (list(rollout.outputs), rollout.old_logprobs.clone())
    none = inject_ground_truth(adapter, rollout, rows, column="missing", template="<answer>{answer}</answer>")
    assert not none.any() and (list(rollout.outputs), rollout.old_logprobs.tolist()) == (
        snapshot[0],
        snapshot[1].tolist(),
    )  # no ground truth anywhere: nothing changes
    with pytest.raises(ValueError, match=r"more than model\.args\.max_new_tokens=8"):
        inject_ground_truth(adapter, rollout, rows[:1] * 3, column="answer", template="<answer>{answer} " * 4)
    with pytest.raises(ValueError, match=r"gt_injection\.template .* cannot format row 0"):
        inject_ground_truth(adapter, rollout, rows, column="answer", template="{answer[5]}")


# --- TW-GRPO token weights ---------------------------------------------------------------------------------------


def _k3(lbar: list[float], lp: list[float]) -> float:
    return sum(math.exp(a - b) - (a - b) - 1 for a, b in zip(lbar, lp))


def test_tw_grpo_divergence_and_weights_by_hand():
    from mmgrpo.shaping import intragroup_divergence, tw_grpo_weights

    L = math.log
    # G = 2 samples, T = 3 positions, V = 2; logits = log-probabilities. t0: both (0.5, 0.5); t1: (0.8, 0.2) vs
    # (0.2, 0.8); t2: (0.8, 0.2) vs sample 2 ended (uniform log 1/2 replaces its row)
    logits = torch.tensor(
        [[[L(0.5), L(0.5)], [L(0.8), L(0.2)], [L(0.8), L(0.2)]], [[L(0.5), L(0.5)], [L(0.2), L(0.8)], [5.0, -3.0]]]
    )
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    lbar1 = [L(0.4), L(0.4)]  # mean of log 0.8 and log 0.2 = log 0.4
    lbar2 = [(L(0.8) + L(0.5)) / 2, (L(0.2) + L(0.5)) / 2]
    d1 = (_k3(lbar1, [L(0.8), L(0.2)]) + _k3(lbar1, [L(0.2), L(0.8)])) / 2  # = 0.5
    d2 = (_k3(lbar2, [L(0.8), L(0.2)]) + _k3(lbar2, [L(0.5), L(0.5)])) / 2
    expect = torch.tensor([0.0, d1, d2])
    assert d1 == pytest.approx(0.5)
    for chunk in (1, 2, 64):  # chunking over positions does not change the result
        torch.testing.assert_close(intragroup_divergence(logits, mask, chunk=chunk), expect, atol=1e-6, rtol=1e-6)
    w = tw_grpo_weights(expect[None], mask, alpha=1.4)  # [2, 3]: min-max over T, shared by the group, masked
    row = [1.0, 1.4, 1.0 + 0.4 * d2 / d1]
    torch.testing.assert_close(w, torch.tensor([row, row[:2] + [0.0]]), atol=1e-6, rtol=1e-6)
    # a large gap is clamped at 11 before the exp (the code's clamp): finite
    far = torch.tensor([[[0.0, 0.0]], [[-200.0, 200.0]]])
    assert torch.isfinite(intragroup_divergence(far, torch.ones(2, 1)))
    with pytest.raises(ValueError, match="alpha: must be >= 1"):
        tw_grpo_weights(expect[None], mask, alpha=0.5)


def test_tw_grpo_config_errors():
    q = ROOT / "configs/quickstart.yaml"
    with pytest.raises(ConfigError, match=r"algorithm\.token_weighting: 'tw' is not allowed"):
        load_config(q, ["algorithm.token_weighting=tw"])
    with pytest.raises(ConfigError, match=r"token_weighting_args: \['max_weight'\] not allowed"):
        load_config(q, ["algorithm.token_weighting=tw_grpo", "algorithm.token_weighting_args={max_weight: 2}"])


# --- DAPO dynamic sampling -----------------------------------------------------------------------------------


def test_dynamic_sampling_selects_the_first_groups_with_signal():
    from mmgrpo.dynamic_sampling import refill_indices, select_groups

    # batch 0 keeps groups 1, 3; batch 1 keeps 0, 2, 3: the first P = 4 in generation order
    assert select_groups([[1, 3], [0, 2, 3]], 4) == ([(0, 1), (0, 3), (1, 0), (1, 2)], 0)
    # too few after all batches: the earliest zero-variance groups fill the rest
    assert select_groups([[2], [1]], 4) == ([(0, 0), (0, 1), (0, 2), (1, 1)], 2)
    a = refill_indices(100, 5, seed=1, step=3, batch=1, rank=0)
    assert a == refill_indices(100, 5, seed=1, step=3, batch=1, rank=0)  # keyed: a resumed step redraws them
    assert a != refill_indices(100, 5, seed=1, step=3, batch=2, rank=0) and all(0 <= i < 100 for i in a)


def test_merge_groups_keeps_each_sample_with_its_prompt(tiny_vlm_path):
    from mmgrpo.dynamic_sampling import merge_groups
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    torch.manual_seed(1)
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4})
    rows = ShapesTask(ShapesArgs(train_size=4, eval_size=1)).train_rows()
    first, second = adapter.rollout([rows[0], rows[1]], 2), adapter.rollout([rows[2], rows[3]], 2)
    merged = merge_groups(adapter, [(first, [1]), (second, [0, 1])])  # groups: rows 1, 2, 3
    assert merged.batch_size == 6 and merged.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert merged.outputs == first.outputs[2:4] + second.outputs
    torch.testing.assert_close(merged.old_logprobs, torch.cat([first.old_logprobs[2:4], second.old_logprobs]))
    # the merged state recomputes the same log-probs: each completion still follows its own prompt (and image)
    with torch.no_grad():
        logp = adapter.logprobs(merged, torch.arange(6))
    m = merged.mask.bool()
    torch.testing.assert_close(logp[m], merged.old_logprobs[m], atol=1e-5, rtol=0)


# --- DGPO (flow) ------------------------------------------------------------------------------------------------


def test_dgpo_surrogate_values_and_gradient_by_hand():
    # one group of G = 2, M = 1 level: A = [1, -1], l - l_ref = [0.1, 0.3] -> log_ratio = [-0.1, -0.3]
    lr = torch.tensor([[-0.1], [-0.3]], requires_grad=True)
    A = torch.tensor([[1.0], [-1.0]])
    loss, mets = losses.dgpo(lr, A, torch.ones(2, 1), losses.DGPOOptions(beta_dpo=10.0), group_size=2)
    w = 1 / (1 + math.exp(1.0))  # S = (10 / 2) * (1 * 0.1 - 1 * 0.3) = -1
    assert loss[:, 0].tolist() == pytest.approx([w * 0.1, -w * 0.3], rel=1e-6)
    assert float(mets["loss/dgpo_weight_mean"]) == pytest.approx(w)
    loss.sum().backward()
    # d/d log_ratio = -sg(w) * A, i.e. d/d l = +w * A: the code's gradient of mean(sg(sigmoid(S)) * A * l)
    torch.testing.assert_close(lr.grad, torch.tensor([[-w], [w]]))
    with pytest.raises(ValueError, match="not a multiple of group_size=2"):
        losses.dgpo(torch.zeros(3, 1), torch.zeros(3, 1), torch.ones(3, 1), group_size=2)


def test_dgpo_flow_units_are_dsm_losses_against_the_reference(mmgrpo_cache):
    from mmgrpo import noise
    from mmgrpo.config import LoraConfig
    from mmgrpo.modalities.flow.adapter import FLOW_LORA_TARGETS, build_flow_adapter

    args = {"name_or_path": "tiny-sd3", "objective": "dgpo", "dgpo_times": 2, "dgpo_trunc_steps": 2, "num_steps": 4}
    args |= {"eval_num_steps": 2, "resolution": 32, "cfg": "none", "device": "cpu"}
    ad = build_flow_adapter(args, lora=LoraConfig(enabled=True, r=4, alpha=8, target_modules=FLOW_LORA_TARGETS))
    prompts = [{"prompt": "a red circle top left"}, {"prompt": "a blue square bottom right"}]
    keys = noise.NoiseKeys(3, 0, (0, 1), 2)
    ro = ad.rollout(prompts, 2, keys)
    st = ro.state
    assert ro.mask.tolist() == [[1.0, 1.0]] * 4 and st.eps.shape[:2] == (4, 2)
    assert torch.equal(st.eps[0], st.eps[1]) and not torch.equal(st.eps[1], st.eps[2])  # shared within a group
    assert not torch.equal(st.x0[0], st.x0[1])  # different samples of one group
    # u = -mean_D |v(x_t) - (eps - x0)|^2 by hand for sample 3 at level 1
    b, j = 3, 1
    sig = float(st.sigma[b, j])
    xt = (1 - sig) * st.x0[b] + sig * st.eps[b, j]
    rows = {k: v[st.prompt_of[b : b + 1]] for k, v in st.cond.tensors.items()}
    with torch.no_grad():
        v = ad.backend.forward(ad.model, xt[None], st.t_model[b, j : j + 1], rows)
        u = ad.logprobs(ro, torch.arange(4))
    assert float(u[b, j]) == pytest.approx(-float((v[0] - (st.eps[b, j] - st.x0[b])).square().mean()), rel=1e-4)
    # LoRA starts at zero: policy = reference, so every log-ratio and the velocity KL are 0
    torch.testing.assert_close(u, ro.old_logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(ad.exact_kl(ro, torch.arange(4)), torch.zeros(4, 2), atol=1e-10, rtol=0)
    again = ad.rollout(prompts, 2, keys)  # keyed: the same rollout again (deterministic ODE samples, times, noise)
    assert torch.equal(again.state.x0, st.x0) and torch.equal(again.state.sigma, st.sigma)


def test_dgpo_config_pairs_surrogate_and_objective():
    with pytest.raises(ConfigError, match=r"surrogate: dgpo and model\.args\.objective: dgpo go together"):
        load_config(ROOT / "configs/variant_dgpo.yaml", ["algorithm.surrogate=ppo_clip", "algorithm.surrogate_args={}"])
    with pytest.raises(ConfigError, match=r"use ratio_level: token and ratio_norm: false \(got 'sequence'"):
        load_config(ROOT / "configs/variant_dgpo.yaml", ["algorithm.ratio_level=sequence"])
    with pytest.raises(ConfigError, match=r"algorithm\.kl: with model\.args\.objective: dgpo"):
        load_config(ROOT / "configs/variant_dgpo.yaml", ["algorithm.kl=k3"])
    with pytest.raises(
        ConfigError, match=r"surrogate_args\.beta: not an option of surrogate 'dgpo'; allowed: beta_dpo$"
    ):
        load_config(ROOT / "configs/variant_dgpo.yaml", ["algorithm.surrogate_args={beta: 1}"])
    with pytest.raises(ConfigError, match=r"surrogate_args\.clip_low: not an option of surrogate 'dgpo'"):
        load_config(ROOT / "configs/variant_dgpo.yaml", ["algorithm.surrogate_args={clip_low: 1}"])


@pytest.mark.slow  # ~10 s: the loss and the adapter's units are covered by the fast tests above
def test_dgpo_config_trains(tmp_path, mmgrpo_cache):
    from mmgrpo.trainer import train

    small = ["steps=2", "algorithm.group_size=2", "algorithm.prompts_per_step=2", "algorithm.minibatch_size=2"]
    small += ["model.args.num_steps=4", "model.args.dgpo_trunc_steps=2", "model.args.dgpo_times=2"]
    small += ["model.args.eval_num_steps=2", "eval.before=false", "eval.max_rows=2", "task.args.eval_seeds=1"]
    cfg = load_config(ROOT / "configs/variant_dgpo.yaml", [*small, f"output_dir={tmp_path / 'run'}"])
    summary = train(cfg)
    assert 0 <= summary["eval/after/reward"] <= 1
    records = _records(tmp_path / "run")
    assert len(records) == 2 and all(math.isfinite(r["loss/policy"]) for r in records)
    assert all(0 < r["loss/dgpo_weight_mean"] < 1 for r in records)
    assert records[0]["kl/mean"] == pytest.approx(0.0, abs=1e-9)  # LoRA at zero: the policy is the reference
    assert records[1]["kl/mean"] > 0  # after the first update it moved away


def test_variant_hooks_are_checked_at_load():
    flow = ROOT / "configs/flow_grpo.yaml"  # the flow adapter has none of the token adapters' variant hooks
    for over, method in [
        ("algorithm.gt_injection.enabled=true", "inject"),
        ("algorithm.token_weighting=tw_grpo", "vocab_logits"),
        ("algorithm.dynamic_sampling.enabled=true", "merge_states"),
    ]:
        with pytest.raises(ConfigError, match=rf"needs an adapter with {method}\(\); model\.adapter 'flow' has none"):
            load_config(flow, [over])
    load_config(ROOT / "configs/quickstart.yaml", ["algorithm.gt_injection.enabled=true"])  # vlm has them all


# --- DeepVideo-R1 difficulty-aware augmentation ------------------------------------------------------------------


class _FakeVideoAdapter:
    """The two calls the augmentation makes: ``augment_video`` (as the video adapter's) and ``rollout``."""

    def __init__(self):
        self.rolled = []

    def augment_video(self, row, std, seed):
        return row if row.get("video") is None else {**row, "video_noise_std": std, "video_noise_seed": seed}

    def rollout(self, rows, group_size, keys=None):
        from types import SimpleNamespace

        self.rolled.append((rows, keys))
        outputs = ["abcd" if "Hint" in row["prompt"] else "abc" for row in rows for _ in range(group_size)]
        return SimpleNamespace(outputs=outputs, extras={}, batch_size=len(outputs))


def _augmentation_context(adapter, runner, step, keys, positions):
    """The run as the augmentation step sees it: the fake adapter's rollouts, scored by ``runner``."""
    from mmgrpo import rollout_steps
    from mmgrpo.groups import Groups
    from mmgrpo.rewards import score_rows

    def rollout(rows, indices, keys):
        r = adapter.rollout(rows, 2, keys)
        scores, metrics = score_rows(runner, r.outputs, rows, 2, r.extras, group_index=True)
        return rollout_steps.RolloutBatch(rows, r, scores, indices, metrics, Groups.uniform(len(rows), 2))

    return rollout_steps.RolloutContext(
        step=step,
        group_size=2,
        weights=runner.weights,
        reward_names=runner.names,
        adapter=adapter,
        positions=positions,
        seed=7,
        keys=lambda seed, at=None: None if keys is None else noise_keys(seed, keys),
        rollout=rollout,
        read_rows=lambda indices: [],
        n_rows=3,
        acc=None,
        sampler=None,
    )


def noise_keys(seed, keys):
    from mmgrpo import noise

    return noise.NoiseKeys(seed, keys.step, keys.positions, keys.group_size)


def test_difficulty_augmentation_by_hand():
    from mmgrpo import augmentation, noise, rollout_steps
    from mmgrpo.config import AlgorithmConfig, DifficultyAugmentationConfig
    from mmgrpo.groups import Groups
    from mmgrpo.rewards import RewardRunner

    opts = DifficultyAugmentationConfig(enabled=True, window=2, hint_template=" Hint: {hint}", noise_std=10.0)
    runner = RewardRunner([("tests.test_variants:length_reward", 1.0, {})], isolation="thread")
    (aug,) = rollout_steps.build(AlgorithmConfig(difficulty_augmentation=opts))
    ad = _FakeVideoAdapter()
    rows = [
        {"prompt": "Q0", "video": "a.mp4", "reasoning": "the bar moves from left to right"},
        {"prompt": "Q1", "video": "b.mp4", "reasoning": "x y"},
        {"prompt": "Q2", "video": "c.mp4"},
    ]

    def step(scores, keys, positions, n):
        # "first" stands for the step's first rollout (never read): its groups, G = 2 each, given explicitly
        batch = rollout_steps.RolloutBatch(rows, "first", scores, [0, 1, 2], {}, Groups.uniform(3, 2))
        out = rollout_steps.run([aug], _augmentation_context(ad, runner, n, keys, positions), batch)
        return out.rows, out.rollout, out.scores, out.metrics

    # step 0: group means [0.5, 1.0, 0.75] -> batch mean 0.75; empty window: nothing is augmented or resampled
    s0 = torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.5], [1.0]])  # [B, K], B = 3 prompts x G = 2
    out_rows, _, out_scores, m = step(s0, None, [0, 1, 2], 0)
    assert out_rows is rows and out_scores is s0 and ad.rolled == [] and m["augment/hinted_fraction"] == 0.0
    # step 1: group means [0.0, 2.5, 0.75], window mean 0.75 -> dR = [0.75, -1.75, 0.0]
    s1 = torch.tensor([[0.0], [0.0], [2.0], [3.0], [0.5], [1.0]])
    keys = noise.NoiseKeys(3, 1, (10, 11, 12), 2)
    out_rows, again, out_scores, m = step(s1, keys, [10, 11, 12], 1)
    assert again.outputs == ["abcd", "abcd", "abc", "abc", "abc", "abc"]  # the step trains on the second rollout
    # hard: round(0.75) + 1 = 2 words of the reasoning
    assert out_rows[0]["prompt"] == "Q0 Hint: the bar" and "video_noise_std" not in out_rows[0]
    # easy: sigma = 10 * (1.75 + 1) = 27.5, keyed by (seed, tag, step, position)
    assert out_rows[1]["prompt"] == "Q1" and out_rows[1]["video_noise_std"] == pytest.approx(27.5)
    assert out_rows[1]["video_noise_seed"] == noise.mix(7, augmentation.FRAME_NOISE, 1, 11)
    assert out_rows[2] == rows[2]  # dR = 0: unchanged
    assert rows[0]["prompt"] == "Q0" and "video_noise_std" not in rows[1]  # the step's own rows are not mutated
    # the second rollout: the augmented rows, its own keys; scored again (length_reward: "abcd" -> 1, "abc" -> 0)
    ((rolled_rows, rolled_keys),) = ad.rolled
    assert rolled_rows == out_rows and rolled_keys.positions == (10, 11, 12) and rolled_keys.seed != 3
    assert out_scores[:, 0].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert m["augment/window_mean"] == 0.75 and m["augment/delta_mean"] == pytest.approx((0.75 - 1.75) / 3)
    assert m["augment/hinted_fraction"] == pytest.approx(1 / 3) and m["augment/noised_fraction"] == pytest.approx(1 / 3)
    # the window keeps W = 2 batch means: [0.75, 3.25 / 3]; step 2 measures against their mean
    assert list(aug.memory["window"]) == pytest.approx([0.75, 3.25 / 3])
    step(s0, None, [0, 1, 2], 2)
    assert list(aug.memory["window"]) == pytest.approx([3.25 / 3, 0.75])  # the oldest left the window
    # hint units: round half to even, + 1; word or separator units
    assert [augmentation.hint_units(d) for d in (0.2, 0.5, 1.5, 2.4, -3.0)] == [1, 1, 3, 3, 4]
    assert augmentation.hint_prefix("a. b. c", 2, ". ") == "a. b"
    assert augmentation.noise_scale(-0.5) == 1.5


def test_frame_noise_by_hand():
    from mmgrpo.modalities.tokens.video import add_frame_noise

    frames = torch.tensor([10, 250, 0, 128], dtype=torch.uint8).view(2, 1, 1, 2)  # [F, C, H, W]
    eps = torch.randn(frames.shape, generator=torch.Generator().manual_seed(5))
    out = add_frame_noise(frames, 4.0, torch.Generator().manual_seed(5))
    expect = (torch.tensor([10.0, 250.0, 0.0, 128.0]).view(2, 1, 1, 2) + 4.0 * eps).clamp(0, 255).round()
    assert out.dtype == torch.uint8 and torch.equal(out, expect.to(torch.uint8))
    # a huge sigma saturates: each value goes to 0 or 255 by the sign of its draw
    big = add_frame_noise(frames, 1e6, torch.Generator().manual_seed(5))
    assert torch.equal(big, torch.where(eps > 0, 255, 0).to(torch.uint8))


def test_video_adapter_noises_the_frames_it_encodes(tiny_vlm_path, mmgrpo_cache):
    from mmgrpo.modalities.tokens.video import add_frame_noise
    from mmgrpo.modalities.video.adapter import build_video_adapter
    from mmgrpo.tasks.video_motion import VideoMotionArgs, VideoMotionTask

    sampling = {"nframes": 4, "min_pixels": 3136, "max_pixels": 3136}
    ad = build_video_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 2, "video": sampling})
    row = VideoMotionTask(VideoMotionArgs(train_size=1, eval_size=1)).train_rows()[0]
    noisy = ad.augment_video(row, 27.5, 123)
    assert noisy is not row and "video_noise_std" not in row
    assert ad.augment_video({"prompt": "no video"}, 27.5, 1) == {"prompt": "no video"}
    clean = ad.video.clip(row).frames
    got = ad.video.clip(noisy).frames
    assert torch.equal(got, add_frame_noise(clean, 27.5, torch.Generator().manual_seed(123)))
    assert torch.equal(ad.video.clip(row).frames, clean)  # the clean clip is not changed by the noisy one
    assert float((got.float() - clean.float()).std()) == pytest.approx(27.5, rel=0.2)  # clamping shrinks it a little
    pixels = [ad.rollout([r], 2).state.cache.encodings[0]["pixel_values_videos"] for r in (row, noisy, row)]
    assert torch.equal(pixels[0], pixels[2]) and not torch.equal(pixels[0], pixels[1])  # the policy sees the noise


def test_difficulty_augmentation_config_errors():
    q = ROOT / "configs/variant_deepvideo_r1.yaml"
    load_config(q)
    with pytest.raises(
        ConfigError,
        match=r"^algorithm\.difficulty_augmentation\.enabled needs an adapter with augment_video\(\); model\.adapter "
        r"'vlm' has none \(video adapters such as video have it\)",
    ):
        load_config(ROOT / "configs/quickstart.yaml", ["algorithm.difficulty_augmentation.enabled=true"])
    with pytest.raises(ConfigError, match=r"^algorithm\.difficulty_augmentation: not combined with dynamic_sampling"):
        load_config(q, ["algorithm.dynamic_sampling.enabled=true"])
    with pytest.raises(ConfigError, match=r"^algorithm\.difficulty_augmentation\.window: must be >= 1, got 0$"):
        load_config(q, ["algorithm.difficulty_augmentation.window=0"])
    with pytest.raises(ConfigError, match=r"^unknown field 'algorithm\.difficulty_augmentation\.noise'; allowed: "):
        load_config(q, ["algorithm.difficulty_augmentation.noise=1"])
