"""Hand-computed checks of mmgrpo.losses: values, gradients and errors (arithmetic next to each expected value)."""

import dataclasses
import math

import pytest
import torch

from mmgrpo.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    RATIO_LEVELS,
    SURROGATES,
    GMPOOptions,
    PPOClipOptions,
    SAPOOptions,
    options_class,
    segment_mean,
)

NAN, INF = float("nan"), float("inf")
TOL = dict(atol=1e-6, rtol=1e-6)
LN2 = math.log(2.0)  # 0.6931472


def close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), **TOL)


def leaf(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def test_registry_names():
    assert RATIO_LEVELS.names() == ["chunk", "sequence", "sequence_token", "token"]
    assert SURROGATES.names() == ["cispo", "dgpo", "gmpo", "ppo_clip", "reg_grpo", "reinforce", "sapo"]
    assert AGGREGATIONS.names() == ["seq_mean_token_mean", "seq_sum_const_norm", "token_mean"]
    assert KL_ESTIMATORS.names() == ["gaussian_exact", "k1", "k2", "k3"]


# ---------------------------------------------------------------------------------------------------- ratio levels


def test_segment_mean_values_and_gradient():
    x = leaf([[1.0, 2.0, NAN, 4.0, 5.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0, 0.0]])
    ids = torch.tensor([0, 0, 0, 1, 1, 2])
    out = segment_mean(x, mask, ids)
    # seg 0: valid units 0,1 → (1+2)/2 = 1.5 (the NaN at the masked unit is ignored); seg 1: (4+5)/2 = 4.5;
    # seg 2 fully masked → 0; masked units → 0
    close(out, [[1.5, 1.5, 0.0, 4.5, 4.5, 0.0]])
    # d Σ w·out / dx_t = (Σ of w over the segment's valid units) / count: seg 0 (1+2)/2 = 1.5, seg 1 (4+5)/2 = 4.5
    (out * torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])).sum().backward()
    close(x.grad, [[1.5, 1.5, 0.0, 4.5, 4.5, 0.0]])


def test_segment_mean_non_contiguous_and_shape_error():
    x = torch.tensor([[1.0, 10.0, 3.0, 20.0]])
    # segments {0, 2} and {1, 3}: (1+3)/2 = 2, (10+20)/2 = 15
    close(segment_mean(x, torch.ones(1, 4), torch.tensor([0, 1, 0, 1])), [[2.0, 15.0, 2.0, 15.0]])
    with pytest.raises(ValueError, match=r"segment_ids must be \[T\]"):
        segment_mean(x, torch.ones(1, 4), torch.tensor([0, 1]))


def test_token_level_is_identity_on_valid_units():
    lr = leaf([[0.1, -0.2, INF], [0.3, 0.4, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    out = RATIO_LEVELS.get("token")(lr, mask, chunk_sizes=None)
    close(out, [[0.1, -0.2, 0.0], [0.3, 0.4, 0.5]])
    out.sum().backward()
    close(lr.grad, [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_sequence_level_gspo():
    lr = leaf([[0.1, 0.3, -0.2, 9.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    out = RATIO_LEVELS.get("sequence")(lr, mask, chunk_sizes=None)
    # (0.1 + 0.3 - 0.2) / 3 = 0.0666667 on the 3 valid units; fully masked row → 0
    close(out, [[0.2 / 3, 0.2 / 3, 0.2 / 3, 0.0], [0.0] * 4])
    # GSPO: exp(level) is the geometric mean of the token ratios (e^.1·e^.3·e^-.2)^(1/3) = e^(0.2/3) = 1.0689391
    close(out[0, 0].exp(), 1.0689391)
    # d Σ w·out / d lr_t = (w0+w1+w2)/3 = (1+2+3)/3 = 2 for each valid unit
    (out * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    close(lr.grad, [[2.0, 2.0, 2.0, 0.0], [0.0] * 4])


def test_sequence_token_level_value_and_straight_through_gradient():
    lr = leaf([[0.1, 0.3, -0.2, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = RATIO_LEVELS.get("sequence_token")(lr, mask, chunk_sizes=None)
    close(out, [[0.2 / 3, 0.2 / 3, 0.2 / 3, 0.0]])  # value of the sequence level
    # gradient is per unit: d Σ w·out / d lr_t = w_t (not the sequence mean 2 of the test above)
    (out * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    close(lr.grad, [[1.0, 2.0, 3.0, 0.0]])


def test_sequence_token_with_reinforce_like_surrogate_gives_per_token_advantages():
    # GSPO-token: ∇ of -A_t·s_{i,t} is -A_t·s_i·∇log π_t; s_i = e^(0.2/3) = 1.0689391
    logp = leaf([[0.1, 0.3, -0.2]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -2.0, 0.5]])
    out = RATIO_LEVELS.get("sequence_token")(logp - old, torch.ones(1, 3), chunk_sizes=None)
    (-adv * out.exp()).sum().backward()
    close(logp.grad, [[-1.0689391, 2.1378782, -0.5344696]])


def test_chunk_level_geometric_mean_per_chunk():
    lr = leaf([[0.2, 0.4, 0.6, 1.0, NAN, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])
    out = RATIO_LEVELS.get("chunk")(lr, mask, chunk_sizes=[2, 3, 1])
    # chunk 0 = units 0,1: (0.2+0.4)/2 = 0.3; chunk 1 = units 2,3,4 (4 masked): (0.6+1.0)/2 = 0.8;
    # chunk 2 = unit 5, fully masked → 0
    close(out, [[0.3, 0.3, 0.8, 0.8, 0.0, 0.0]])
    close(out[0, 0].exp(), math.sqrt(math.exp(0.2) * math.exp(0.4)))  # geometric mean of the step ratios
    (out * torch.tensor([1.0, 3.0, 1.0, 2.0, 5.0, 7.0])).sum().backward()
    # chunk 0: (1+3)/2 = 2 per unit; chunk 1: (1+2)/2 = 1.5 per valid unit
    close(lr.grad, [[2.0, 2.0, 1.5, 1.5, 0.0, 0.0]])


def test_chunk_level_errors():
    fn = RATIO_LEVELS.get("chunk")
    lr, mask = torch.zeros(2, 5), torch.ones(2, 5)
    with pytest.raises(ValueError, match="needs chunk_sizes"):
        fn(lr, mask, chunk_sizes=None)
    with pytest.raises(ValueError, match="sum to the number of action units T=5; they sum to 4"):
        fn(lr, mask, chunk_sizes=[2, 2])
    with pytest.raises(ValueError, match="positive"):
        fn(lr, mask, chunk_sizes=[0, 5])


# ------------------------------------------------------------------------------------------------------ surrogates


def test_ppo_clip_values_gradients_metrics():
    # units: (r, A) = (1.5, +1), (0.5, +1), (0.5, -2), (1.5, -2), (1.0, 0.5), masked (inf, NaN)
    lr = leaf([[math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.5), 0.0, INF]])
    adv = torch.tensor([[1.0, 1.0, -2.0, -2.0, 0.5, NAN]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, m = SURROGATES.get("ppo_clip")(lr, adv, mask)
    # max(-A·r, -A·clip(r, 0.8, 1.28)):
    # (1.5,+1): max(-1.5, -1.28) = -1.28 clipped | (0.5,+1): max(-0.5, -0.8) = -0.5
    # (0.5,-2): max(1.0, 1.6) = 1.6 clipped      | (1.5,-2): max(3.0, 2.56) = 3.0 | (1,.5): -0.5 | masked 0
    close(loss, [[-1.28, -0.5, 1.6, 3.0, -0.5, 0.0]])
    loss.sum().backward()
    # d(-A·r)/d lr = -A·r where unclipped, 0 where clipped: [0, -0.5, 0, 3.0, -0.5, 0]
    close(lr.grad, [[0.0, -0.5, 0.0, 3.0, -0.5, 0.0]])
    close(m["loss/clip_fraction"], 2 / 5)
    close(m["loss/ratio_mean"], 1.0)  # (1.5 + 0.5 + 0.5 + 1.5 + 1) / 5
    close(m["loss/ratio_max"], 1.5)
    assert "loss/dual_clip_fraction" not in m


def test_ppo_dual_clip():
    # (r, A) = (4, -1): max(4, 1.28) = 4 > c·|A| = 3 → 3 (gradient 0); (1.5, -2): 3.0 < 6 → 3.0 unchanged;
    # (4, +1): dual clip only acts for A < 0 → max(-4, -1.28) = -1.28
    lr = leaf([[math.log(4.0), math.log(1.5), math.log(4.0)]])
    adv = torch.tensor([[-1.0, -2.0, 1.0]])
    loss, m = SURROGATES.get("ppo_clip")(lr, adv, torch.ones(1, 3), PPOClipOptions(dual_clip=3.0))
    close(loss, [[3.0, 3.0, -1.28]])
    loss.sum().backward()
    close(lr.grad, [[0.0, 3.0, 0.0]])  # only (1.5, -2) is on the unclipped branch: -A·r = 3
    close(m["loss/dual_clip_fraction"], 1 / 3)
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError, match="dual_clip must be > 1"):
            SURROGATES.get("ppo_clip")(lr, adv, torch.ones(1, 3), PPOClipOptions(dual_clip=bad))


def test_sapo_soft_gate():
    # (r, A) = (1, +1): -(4/1)·σ(0)·1 = -2; gradient -4σ(1-σ)·A·r = -4·.25 = -1 (the plain policy gradient)
    # (1.5, -2), τ_neg = 1.05: σ(1.05·0.5) = σ(0.525) = 1/(1+e^-0.525) = 0.6283162;
    #   loss = -(4/1.05)·0.6283162·(-2) = 4.7871710; grad = -4·0.6283162·0.3716838·1.5·(-2) = 2.8024195
    # (2, 0): A = 0 → loss 0, gradient 0
    lr = leaf([[0.0, math.log(1.5), math.log(2.0)]])
    adv = torch.tensor([[1.0, -2.0, 0.0]])
    loss, m = SURROGATES.get("sapo")(lr, adv, torch.ones(1, 3))
    close(loss, [[-2.0, 4.7871710, 0.0]])
    loss.sum().backward()
    close(lr.grad, [[-1.0, 2.8024195, 0.0]])
    close(m["loss/ratio_mean"], 1.5)  # (1 + 1.5 + 2) / 3
    # τ_pos is used for A > 0: with τ_pos = 2, (1, +1) → -(4/2)·σ(0) = -1
    loss2, _ = SURROGATES.get("sapo")(lr.detach(), adv, torch.ones(1, 3), SAPOOptions(tau_pos=2.0))
    close(loss2[0, 0], -1.0)
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        SURROGATES.get("sapo")(lr, adv, torch.ones(1, 3), SAPOOptions(tau_neg=0.0))


def test_gmpo_sign_aware_log_clip_and_geometric_mean():
    lr = leaf([[LN2, 0.0, -0.1, 5.0], [LN2, -0.5, 0.0, NAN]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    loss, m = SURROGATES.get("gmpo")(lr, adv, mask, GMPOOptions(log_clip_low=0.4, log_clip_high=0.4))
    # row 0, A>0: min(lr, clip(lr, -.4, .4)) = [0.4, 0, -0.1] → mean 0.1 → loss -1·e^0.1 = -1.1051709
    # row 1, A<0: max(lr, clip(lr))          = [ln2, -0.4, 0] → mean (0.6931472-0.4)/3 = 0.0977157
    #             → loss +1·e^0.0977157 = 1.1026493
    close(loss, [[-1.1051709] * 3 + [0.0], [1.1026493] * 3 + [0.0]])
    AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, max_units=4).backward()
    # seq_mean_token_mean gives each row weight 1/2 and the row's loss is constant, so ∂/∂lr_t = ½·(-A·e^m/3)
    # on unclipped tokens: row 0 ½·(-1.1051709/3) = -0.1841952 (token 0 clipped → 0);
    # row 1 ½·(1.1026493/3) = 0.1837749 (token 1 clipped → 0)
    close(lr.grad, [[0.0, -0.1841952, -0.1841952, 0.0], [0.1837749, 0.0, 0.1837749, 0.0]])
    close(m["loss/clip_fraction"], 2 / 6)
    close(m["loss/seq_ratio_mean"], (1.1051709 + 1.1026493) / 2)


def test_gmpo_uses_masked_mean_advantage_per_sequence():
    # per-unit advantages [3, 0, 0, (9 masked)] → sequence advantage 1; ratio 1 → loss -1 on valid units
    loss, _ = SURROGATES.get("gmpo")(
        torch.zeros(1, 4), torch.tensor([[3.0, 0.0, 0.0, 9.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    )
    close(loss, [[-1.0, -1.0, -1.0, 0.0]])


def test_cispo_detached_clipped_weight():
    # (r, A) = (2, +1), (0.5, -1), (1, 2); clip_high 0.28 → weight sg(min(r, 1.28)) = [1.28, 0.5, 1]
    # loss = -w·A·log r = [-1.28·0.6931472, -0.5·(-1)·(-0.6931472), 0] = [-0.8872284, -0.3465736, 0]
    lr = leaf([[LN2, -LN2, 0.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, m = SURROGATES.get("cispo")(lr, adv, torch.ones(1, 3))
    close(loss, [[-0.8872284, -0.3465736, 0.0]])
    loss.sum().backward()
    # the weight is a constant: ∇ = -clamp(r)·A·∇log π = [-1.28, 0.5, -2] (a non-detached weight would add
    # -A·r·log r terms, e.g. -0.5·(-1)·(-0.6931472) = -0.3465736 at unit 1)
    close(lr.grad, [[-1.28, 0.5, -2.0]])
    close(m["loss/clip_fraction"], 1 / 3)
    close(m["loss/ratio_mean"], 3.5 / 3)  # (2 + 0.5 + 1) / 3
    close(m["loss/ratio_max"], 2.0)


def test_reinforce_gradient_through_logprobs():
    # μ = 1: logprobs == old_logprobs, so log r = 0 and the loss value is 0, but ∇_logp = -A
    logp = leaf([[-1.2, -0.3, -2.0]])
    adv = torch.tensor([[1.0, -2.0, 0.5]])
    loss, m = SURROGATES.get("reinforce")(logp - logp.detach(), adv, torch.tensor([[1.0, 1.0, 0.0]]))
    close(loss, [[0.0, 0.0, 0.0]])
    loss.sum().backward()
    close(logp.grad, [[-1.0, 2.0, 0.0]])
    close(m["loss/ratio_mean"], 1.0)


@pytest.mark.parametrize("name", ["ppo_clip", "sapo", "gmpo", "cispo", "reinforce"])
def test_surrogates_ignore_garbage_at_masked_units(name):
    lr = leaf([[0.1, INF, NAN], [-0.2, 0.0, -INF]])
    adv = torch.tensor([[1.0, NAN, 5.0], [-1.0, 2.0, INF]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    options = PPOClipOptions(dual_clip=3.0) if name == "ppo_clip" else options_class(SURROGATES.get(name))()
    loss, metrics = SURROGATES.get(name)(lr, adv, mask, options)
    assert loss.shape == (2, 3) and loss.dtype == torch.float32
    assert loss[0, 1] == 0 and loss[0, 2] == 0 and loss[1, 2] == 0
    assert torch.isfinite(loss).all()
    loss.sum().backward()
    assert torch.isfinite(lr.grad).all() and (lr.grad[mask == 0] == 0).all()
    assert lr.grad[0, 0] != 0  # the valid unit with A = 1 does get a gradient
    assert all(torch.isfinite(v) and not v.requires_grad for v in metrics.values())


def test_surrogate_shape_mismatch():
    with pytest.raises(ValueError, match="one shape"):
        SURROGATES.get("ppo_clip")(torch.zeros(2, 3), torch.zeros(2, 1), torch.ones(2, 3))


# ---------------------------------------------------------------------------------------------------- aggregations

LOSS = [[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_token_mean():
    loss = leaf(LOSS)
    out = AGGREGATIONS.get("token_mean")(loss, MASK, max_units=8)
    close(out, 2.5)  # (1+2+3+4) / 4 valid units
    out.backward()
    close(loss.grad, MASK / 4)


def test_seq_mean_token_mean():
    loss = leaf(LOSS)
    out = AGGREGATIONS.get("seq_mean_token_mean")(loss, MASK, max_units=8)
    close(out, 3.0)  # row 0: 6/3 = 2, row 1: 4/1 = 4, row 2 has no units and is skipped → (2+4)/2
    out.backward()
    # row 0: 1/3 · 1/2 = 1/6 per valid unit, row 1: 1 · 1/2, row 2: 0
    close(loss.grad, [[1 / 6, 1 / 6, 1 / 6, 0.0], [0.5, 0.0, 0.0, 0.0], [0.0] * 4])


def test_seq_sum_const_norm():
    loss = leaf(LOSS)
    out = AGGREGATIONS.get("seq_sum_const_norm")(loss, MASK, max_units=5)
    close(out, 10 / 15)  # (6 + 4) / (n=3 · max_units=5)
    out.backward()
    close(loss.grad, MASK / 15)
    with pytest.raises(ValueError, match="max_units > 0"):
        AGGREGATIONS.get("seq_sum_const_norm")(loss, MASK, max_units=0)


@pytest.mark.parametrize("name", ["token_mean", "seq_mean_token_mean", "seq_sum_const_norm"])
def test_all_masked_minibatch_is_zero_with_gradient(name):
    loss = leaf([[1.0, 2.0], [3.0, 4.0]])
    out = AGGREGATIONS.get(name)(loss, torch.zeros(2, 2), max_units=2)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    close(loss.grad, [[0.0, 0.0], [0.0, 0.0]])


# ------------------------------------------------------------------------------------------------------------- KL


def test_kl_estimators_values_and_gradients():
    # π = [0.5, 0.25], π_ref = [0.25, 0.5] → x = ref - logp = [-ln2, ln2]
    logp = leaf([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    close(KL_ESTIMATORS.get("k1")(logp, ref), [[LN2, -LN2]])  # -x = [0.6931472, -0.6931472]
    close(KL_ESTIMATORS.get("k2")(logp, ref), [[0.2402265, 0.2402265]])  # ½·ln2² = 0.2402265
    k3 = KL_ESTIMATORS.get("k3")(logp, ref)
    close(k3, [[0.1931472, 0.3068528]])  # e^-ln2 + ln2 - 1 = 0.5 + 0.6931472 - 1; 2 - 0.6931472 - 1
    k3.sum().backward()
    close(logp.grad, [[0.5, -1.0]])  # d/dlogp (e^x - x - 1) = 1 - e^x = 1 - 0.5, 1 - 2


def test_kl_fp32_and_k3_clamp():
    logp = torch.tensor([[-100.0, 0.0]], dtype=torch.bfloat16, requires_grad=True)
    ref = torch.tensor([[0.0, -100.0]], dtype=torch.bfloat16)
    k3 = KL_ESTIMATORS.get("k3")(logp, ref)
    assert k3.dtype == torch.float32
    # x = 100 clamped to 20: e^20 - 20 - 1 = 485165174.41; x = -100 clamped to -20: e^-20 + 20 - 1 = 19.000000002
    torch.testing.assert_close(k3, torch.tensor([[485165174.41, 19.0]]), rtol=1e-6, atol=1e-6)
    k3.sum().backward()
    assert (logp.grad == 0).all()  # outside the clamp the value saturates
    assert KL_ESTIMATORS.get("k1")(logp, ref).dtype == torch.float32
    with pytest.raises(ValueError, match="one shape"):
        KL_ESTIMATORS.get("k2")(torch.zeros(2, 3), torch.zeros(2, 4))


# --------------------------------------------------------------------------------------------------------- options


def _algorithm(**fields):
    from mmgrpo.config import AlgorithmConfig

    return AlgorithmConfig(**fields)


def test_each_component_declares_its_own_options_with_the_old_defaults():
    from mmgrpo import losses

    opts = losses.resolve_options(_algorithm())
    assert opts.surrogate == PPOClipOptions(clip_low=0.2, clip_high=0.28, dual_clip=None)
    assert opts.aggregation == losses.TokenMeanOptions() and opts.kl == losses.SampleKLOptions()
    assert losses.resolve_options(_algorithm(surrogate="sapo")).surrogate == SAPOOptions(tau_pos=1.0, tau_neg=1.05)
    assert losses.resolve_options(_algorithm(surrogate="cispo")).surrogate == losses.CISPOOptions(clip_high=0.28)
    assert losses.resolve_options(_algorithm(surrogate="dgpo")).surrogate == losses.DGPOOptions(beta_dpo=100.0)
    assert losses.resolve_options(_algorithm(surrogate="reg_grpo")).surrogate == losses.RegGRPOOptions(
        eps=1e-4, reduction="sum"
    )  # eq. 7's whole-sequence log-ratio
    # GMPO's bounds are on log r, with their own names and the paper's 0.4 (arXiv 2507.20673)
    assert losses.resolve_options(_algorithm(surrogate="gmpo")).surrogate == GMPOOptions(0.4, 0.4)
    for registry in (SURROGATES, AGGREGATIONS, KL_ESTIMATORS):
        for name in registry.names():
            assert dataclasses.is_dataclass(options_class(registry.get(name))), (registry.kind, name)


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(surrogate="sapo", surrogate_args={"clip_high": 0.3}),
            r"^algorithm\.surrogate_args\.clip_high: not an option of surrogate 'sapo'; allowed: tau_pos, tau_neg$",
        ),
        (
            dict(surrogate="gmpo", surrogate_args={"clip_low": 0.2}),
            r"surrogate_args\.clip_low: not an option of surrogate 'gmpo'; allowed: log_clip_low, log_clip_high$",
        ),
        (
            dict(surrogate="reinforce", surrogate_args={"dual_clip": 3}),
            r"surrogate_args\.dual_clip: not an option of surrogate 'reinforce'; allowed: \(none\)$",
        ),
        (
            dict(surrogate="gmpo", surrogate_args={"log_clip_high": 11}),
            r"^algorithm\.surrogate_args\.log_clip_high: must be >= 0 and <= 10, got 11",
        ),
        (dict(surrogate_args={"clip_low": 1.0}), r"surrogate_args\.clip_low: must be >= 0 and < 1, got 1\.0$"),
        (dict(surrogate_args={"dual_clip": 0.5}), r"surrogate_args\.dual_clip: must be > 1, got 0\.5$"),
        (dict(surrogate="sapo", surrogate_args={"tau_neg": 0}), r"surrogate_args\.tau_neg: must be > 0, got 0"),
        (dict(surrogate="dgpo", surrogate_args={"beta_dpo": "x"}), r"surrogate_args\.beta_dpo: expected a number"),
        (
            dict(aggregation_args={"max_units": 4}),
            r"^algorithm\.aggregation_args\.max_units: not an option of loss aggregation 'token_mean'",
        ),
        (dict(kl="k1", kl_args={"clamp": 20}), r"^algorithm\.kl_args\.clamp: not an option of KL estimator 'k1'"),
    ],
)
def test_options_are_checked_against_the_components_dataclass(fields, message):
    from mmgrpo import losses
    from mmgrpo.config import ConfigError

    with pytest.raises(ConfigError, match=message) as err:
        losses.resolve_options(_algorithm(**fields))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("key, value", [("clip_high", 0.28), ("clip_low", 0.2), ("dual_clip", 3), ("tau_pos", 2)])
def test_an_old_flat_key_names_its_new_place(key, value):
    from mmgrpo.config import ConfigError
    from mmgrpo.loader import load_config

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    with pytest.raises(ConfigError) as err:
        load_config(root / "configs/quickstart.yaml", [f"algorithm.{key}={value}"])
    assert str(err.value) == f"algorithm.{key} moved: write algorithm.surrogate_args: {{{key}: {value}}}"


def test_gaussian_exact_is_a_kl_estimator_reading_the_adapters_closed_form():
    from mmgrpo import losses

    fn = KL_ESTIMATORS.get("gaussian_exact")
    assert options_class(fn).reads == "exact_kl" and options_class(KL_ESTIMATORS.get("k3")).reads == "ref_logprobs"
    exact = torch.tensor([[0.5, 0.0], [1.5, 2.0]], dtype=torch.float64)
    out = fn(torch.zeros(2, 2), exact, losses.GaussianExactOptions())
    assert out.dtype == torch.float32
    close(out, [[0.5, 0.0], [1.5, 2.0]])
    with pytest.raises(ValueError, match="one shape"):
        fn(torch.zeros(2, 3), exact)
