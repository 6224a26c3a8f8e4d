"""Hand-computed checks of mmgrpo.advantages (the arithmetic is written out next to each expected value)."""

import math

import pytest
import torch

from mmgrpo.advantages import (
    DEFAULT_SCALE,
    ESTIMATORS,
    combine_rewards,
    compute_advantages,
    zero_variance_groups,
)

NAN = float("nan")
TOL = dict(atol=1e-6, rtol=1e-6)

# Two groups used throughout: [1, 2, 3, 4] (mean 2.5, deviations ±1.5, ±0.5, Σdev² = 5) and
# [0, 0, 1, 1] (mean 0.5, deviations ±0.5, Σdev² = 1).
R = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]])


def close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), **TOL)


def test_registry_and_default_scales():
    assert ESTIMATORS.names() == ["dr_grpo", "grpo", "rloo"]
    assert DEFAULT_SCALE == {"grpo": "group", "dr_grpo": "none", "rloo": "none"}
    with pytest.raises(KeyError, match="dr_grpo, grpo, rloo"):
        ESTIMATORS.get("ppo")


def test_grpo_group_unbiased():
    # group 1: unbiased std = sqrt(5/3) = 1.2909944; -1.5/1.2909944 = -1.1618950, -0.5/1.2909944 = -0.3872983
    # group 2: unbiased std = sqrt(1/3) = 0.5773503; 0.5/0.5773503 = 0.8660254
    a = ESTIMATORS.get("grpo")(R, scale="group", unbiased=True, eps=0.0)
    close(a, [[-1.1618950, -0.3872983, 0.3872983, 1.1618950], [-0.8660254, -0.8660254, 0.8660254, 0.8660254]])


def test_grpo_group_population_and_eps():
    # group 1: population std = sqrt(5/4) = 1.1180340; -1.5/1.1180340 = -1.3416408, -0.5/1.1180340 = -0.4472136
    # group 2: population std = 0.5; with eps = 0.5: ±0.5 / (0.5 + 0.5) = ±0.5; group 1: ±1.5/1.618034 = ±0.9270510
    a = ESTIMATORS.get("grpo")(R, scale="group", unbiased=False, eps=0.0)
    close(a, [[-1.3416408, -0.4472136, 0.4472136, 1.3416408], [-1.0, -1.0, 1.0, 1.0]])
    a = ESTIMATORS.get("grpo")(R, scale="group", unbiased=False, eps=0.5)
    close(a[1], [-0.5, -0.5, 0.5, 0.5])
    close(a[0, 0], -1.5 / 1.6180340)


def test_grpo_batch_scale():
    # all 8 rewards: mean 12/8 = 1.5; Σ(r - 1.5)² = .25+.25+2.25+6.25+2.25+2.25+.25+.25 = 14; unbiased std = sqrt(14/7)
    # = 1.4142136. Advantages are group-centred / 1.4142136: ±1.5 → ±1.0606602, ±0.5 → ±0.3535534
    a = ESTIMATORS.get("grpo")(R, scale="batch", unbiased=True, eps=0.0)
    close(a, [[-1.0606602, -0.3535534, 0.3535534, 1.0606602], [-0.3535534, -0.3535534, 0.3535534, 0.3535534]])


def test_dr_grpo_no_scale_is_centred_reward():
    a = ESTIMATORS.get("dr_grpo")(R, scale="none", unbiased=True, eps=1e-4)
    close(a, [[-1.5, -0.5, 0.5, 1.5], [-0.5, -0.5, 0.5, 0.5]])


def test_rloo_leave_one_out():
    # group 1 (sum 10): 1 - 9/3 = -2, 2 - 8/3 = -0.6666667, 3 - 7/3 = 0.6666667, 4 - 6/3 = 2
    # group 2 (sum 2):  0 - 2/3 = -0.6666667, 1 - 1/3 = 0.6666667
    a = ESTIMATORS.get("rloo")(R, scale="none", unbiased=True, eps=0.0)
    close(a, [[-2.0, -2 / 3, 2 / 3, 2.0], [-2 / 3, -2 / 3, 2 / 3, 2 / 3]])
    # scale="group", population: group 1 divided by 1.1180340: -2/1.1180340 = -1.7888544,
    # -0.6666667/1.1180340 = -0.5962848
    a = ESTIMATORS.get("rloo")(R, scale="group", unbiased=False, eps=0.0)
    close(a[0], [-1.7888544, -0.5962848, 0.5962848, 1.7888544])


def test_rloo_needs_two_samples():
    with pytest.raises(ValueError, match="G >= 2"):
        ESTIMATORS.get("rloo")(torch.ones(3, 1), scale="none", unbiased=True, eps=0.0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_unknown_scale_and_bad_shape(name):
    with pytest.raises(ValueError, match="group, batch, none"):
        ESTIMATORS.get(name)(R, scale="std", unbiased=True, eps=0.0)
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        ESTIMATORS.get(name)(torch.ones(8), scale="none", unbiased=True, eps=0.0)


def test_nan_rewards_excluded_and_zeroed():
    r = torch.tensor([[1.0, NAN, 3.0, 5.0], [NAN, 2.0, NAN, NAN], [NAN, NAN, NAN, NAN]])
    # grpo row 0: valid 1,3,5: mean 3, unbiased var (4+0+4)/2 = 4, std 2 → [-1, 0 (NaN), 0, 1]
    # row 1: one valid sample, std taken as 0, centred 0 → 0 (not NaN); row 2: all NaN → 0
    a = ESTIMATORS.get("grpo")(r, scale="group", unbiased=True, eps=0.0)
    close(a, [[-1.0, 0.0, 0.0, 1.0], [0.0] * 4, [0.0] * 4])
    # rloo row 0: sum of valid = 9, 2 others: 1 - 8/2 = -3, 3 - 6/2 = 0, 5 - 4/2 = 3; row 1: no other sample → 0
    a = ESTIMATORS.get("rloo")(r, scale="none", unbiased=True, eps=0.0)
    close(a, [[-3.0, 0.0, 0.0, 3.0], [0.0] * 4, [0.0] * 4])
    # batch scale: valid rewards 1,3,5,2: mean 2.75, Σdev² = 3.0625+0.0625+5.0625+0.5625 = 8.75, pop std
    # sqrt(8.75/4) = 1.4790199; row 0 → [-2, 0, 0, 2] / 1.4790199 = ±1.3522468
    a = ESTIMATORS.get("grpo")(r, scale="batch", unbiased=False, eps=0.0)
    close(a[0], [-1.3522468, 0.0, 0.0, 1.3522468])
    assert not torch.isnan(a).any()


def test_constant_group_gives_zero_not_nan_even_with_eps_zero():
    r = torch.tensor([[3.0, 3.0, 3.0, 3.0]])
    for name in ["grpo", "dr_grpo", "rloo"]:
        for scale in ["group", "batch", "none"]:
            close(ESTIMATORS.get(name)(r, scale=scale, unbiased=True, eps=0.0), [[0.0] * 4])


def test_combine_rewards_weighted_nansum():
    rewards = torch.tensor([[[0.5, NAN], [NAN, NAN], [1.0, 2.0]]])  # [P=1, G=3, K=2]
    w = torch.tensor([2.0, 3.0])
    # 2·0.5 = 1.0 (NaN skipped); all NaN → NaN; 2·1 + 3·2 = 8
    out = combine_rewards(rewards, w)
    torch.testing.assert_close(out, torch.tensor([[1.0, NAN, 8.0]]), equal_nan=True, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"weights must be \[K\]"):
        combine_rewards(rewards, torch.ones(3))
    with pytest.raises(ValueError, match=r"\[P, G, K\]"):
        combine_rewards(rewards[0], w)


def test_zero_variance_groups():
    r = torch.tensor(
        [
            [1.0, 1.0, 1.0],
            [1.0, 2.0, 1.0],
            [NAN, 4.0, 4.0],  # NaN ignored → constant
            [NAN, NAN, NAN],  # no signal at all
            [1.0, 1.0 + 1e-7, 1.0],  # within tol
            [NAN, 0.0, 1.0],
        ]
    )
    assert zero_variance_groups(r).tolist() == [True, False, True, True, True, False]
    assert zero_variance_groups(torch.tensor([[0.0, 0.5]]), tol=1.0).tolist() == [True]


def test_sum_then_normalize():
    # K=2: r1 = [1,0,1,0], r2 = [0,0,1,1], w = [1, 2] → combined [1, 0, 3, 2]; mean 1.5, deviations
    # [-.5,-1.5,1.5,.5], population std sqrt(5/4) = 1.1180340 → [-0.4472136, -1.3416408, 1.3416408, 0.4472136]
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]]])
    adv, _ = compute_advantages(
        rewards,
        torch.tensor([1.0, 2.0]),
        combine="sum_then_normalize",
        estimator="grpo",
        scale="group",
        unbiased=False,
        eps=0.0,
    )
    close(adv, [[-0.4472136, -1.3416408, 1.3416408, 0.4472136]])


def test_normalize_then_sum_gdpo():
    # r1 = [1,0,0,0]: mean .25, pop std sqrt(.75/4) = 0.4330127 → A1 = [√3, -1/√3, -1/√3, -1/√3]
    # r2 = [0,1,1,0]: mean .5, pop std .5                           → A2 = [-1, 1, 1, -1]
    # A1 + A2 = [√3-1, 1-1/√3, 1-1/√3, -1/√3-1] = [0.7320508, 0.4226497, 0.4226497, -1.5773503], mean 0,
    # Σx² = 8 - 2√3 - 2/√3 = 3.3811979, pop std sqrt(3.3811979/4) = 0.9194017 →
    # [0.7962252, 0.4597008, 0.4597008, -1.7156269]
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0]]])
    w = torch.tensor([1.0, 1.0])
    adv, _ = compute_advantages(
        rewards, w, combine="normalize_then_sum", estimator="grpo", scale="group", unbiased=False, eps=0.0
    )
    close(adv, [[0.7962252, 0.4597008, 0.4597008, -1.7156269]])
    # the point of GDPO: samples 0-2 all have combined reward 1, and sum_then_normalize cannot tell them apart
    grpo, _ = compute_advantages(
        rewards, w, combine="sum_then_normalize", estimator="grpo", scale="group", unbiased=False, eps=0.0
    )
    close(grpo[0, 0], grpo[0, 1])
    assert adv[0, 0] - adv[0, 1] > 0.3


def test_normalize_then_sum_weights_the_per_reward_advantages():
    # same rewards, w = [1, 2]: A1 + 2·A2 = [√3-2, 2-1/√3, 2-1/√3, -1/√3-2] = [-0.2679492, 1.4226497, 1.4226497,
    # -2.5773503], mean 0, Σx² = (7-4√3) + 2·(13/3-4/√3) + (13/3+4/√3) = 0.0717968 + 4.0478645 + 6.6427344
    # = 10.7623957, pop std sqrt(10.7623957/4) = 1.6403045 → [-0.1633533, 0.8673083, 0.8673083, -1.5712633]
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0]]])
    adv, _ = compute_advantages(
        rewards,
        torch.tensor([1.0, 2.0]),
        combine="normalize_then_sum",
        estimator="grpo",
        scale="group",
        unbiased=False,
        eps=0.0,
    )
    close(adv, [[-0.1633533, 0.8673083, 0.8673083, -1.5712633]])


def test_normalize_then_sum_with_nan_rewards():
    # G=4, K=2; sample 3 has no reward at all. r1 = [1, 0, 1, -], r2 = [-, 1, 0, -]
    # A1 over [1,0,1]: mean 2/3, pop std √2/3 = 0.4714045 → [0.7071068, -1.4142136, 0.7071068]
    # A2 over samples 1,2 = [1, 0]: mean .5, std .5 → [0 (NaN), 1, -1]
    # sum = [0.7071068, -0.4142136, -0.2928932], mean 0, Σx² = .5+.1715729+.0857864 = 0.7573593,
    # pop std sqrt(0.7573593/3) = 0.5024471 → [1.4073258, -0.8243924, -0.5829334]; sample 3 → 0
    rewards = torch.tensor([[[1.0, NAN], [0.0, 1.0], [1.0, 0.0], [NAN, NAN]]])
    adv, m = compute_advantages(
        rewards,
        torch.tensor([1.0, 1.0]),
        combine="normalize_then_sum",
        estimator="grpo",
        scale="group",
        unbiased=False,
        eps=0.0,
    )
    close(adv, [[1.4073258, -0.8243924, -0.5829334, 0.0]])
    close(m["reward/nan_fraction"], 3 / 8)


def test_metrics():
    # P=2, K=1: [[1,2,3,4], [2,2,2,2]], grpo, group, population, eps 0
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]]).unsqueeze(-1)
    adv, m = compute_advantages(
        rewards,
        torch.tensor([1.0]),
        combine="sum_then_normalize",
        estimator="grpo",
        scale="group",
        unbiased=False,
        eps=0.0,
    )
    close(adv, [[-1.3416408, -0.4472136, 0.4472136, 1.3416408], [0.0] * 4])
    close(m["reward/mean"], 2.25)  # 18 / 8
    close(m["reward/std"], 0.8291562)  # Σ(r-2.25)² = 1.5625+.0625+.5625+3.0625+4·.0625 = 5.5; sqrt(5.5/8)
    close(m["reward/std_within_group"], 0.5590170)  # (1.1180340 + 0) / 2
    close(m["reward/nan_fraction"], 0.0)
    close(m["advantage/mean"], 0.0)
    close(m["advantage/abs_mean"], 0.4472136)  # (2·1.3416408 + 2·0.4472136) / 8
    close(m["advantage/zero_std_fraction"], 0.5)  # group 2 is constant
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def test_compute_advantages_errors():
    rewards = torch.ones(2, 4, 1)
    kw = dict(estimator="grpo", scale="group", unbiased=True, eps=1e-4)
    with pytest.raises(ValueError, match="sum_then_normalize, normalize_then_sum"):
        compute_advantages(rewards, torch.ones(1), combine="mean", **kw)
    with pytest.raises(KeyError, match="valid: dr_grpo, grpo, rloo"):
        compute_advantages(rewards, torch.ones(1), combine="sum_then_normalize", **{**kw, "estimator": "gae"})
    with pytest.raises(ValueError, match="group, batch, none"):
        compute_advantages(rewards, torch.ones(1), combine="normalize_then_sum", **{**kw, "scale": "auto"})
    with pytest.raises(ValueError, match=r"weights must be \[K\]"):
        compute_advantages(rewards, torch.ones(2), combine="sum_then_normalize", **kw)


def test_half_precision_input_is_computed_in_fp32():
    a = ESTIMATORS.get("grpo")(R.to(torch.bfloat16), scale="group", unbiased=True, eps=0.0)
    assert a.dtype == torch.float32
    close(a[0, 0], -1.5 / math.sqrt(5 / 3))
