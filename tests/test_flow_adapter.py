"""Flow/diffusion adapter on tiny SD3, FLUX and DDIM-UNet pipelines built from config (no download)."""

import pytest
import torch

from mmgrpo import losses, shaping
from mmgrpo.config import ConfigError, LoraConfig
from mmgrpo.modalities.flow import kernels as K
from mmgrpo.modalities.flow.adapter import FLOW_LORA_TARGETS, build_flow_adapter
from mmgrpo.rewards import weighted_scorer
from tests.numerics import adapter_reductions

UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
PROMPTS = [{"prompt": "a red circle top left"}, {"prompt": "a blue square bottom right"}]
G, T = 3, 4
KINDS = {
    "sd3": {"name_or_path": "tiny-sd3", "kernel": "flow_sde", "noise_level": 0.7},
    "flux": {"name_or_path": "tiny-flux", "kernel": "flow_sde", "noise_level": 0.9, "cfg": "none"},
    "unet": {"name_or_path": "tiny-unet", "kernel": "ddim", "noise_level": 1.0},
}


def make(kind, lora=True, need_reference=False, **over):
    args = {
        **KINDS[kind],
        "num_steps": T,
        "eval_num_steps": 3,
        "resolution": 32,
        "guidance_scale": 2.0,
        "device": "cpu",
        **over,
    }
    targets = UNET_TARGETS if kind == "unet" else FLOW_LORA_TARGETS
    cfg = LoraConfig(enabled=lora, r=4, alpha=8, target_modules=targets)
    return build_flow_adapter(args, seed=0, lora=cfg, need_reference=need_reference, reward_scorer=weighted_scorer)


@pytest.fixture(scope="module", params=list(KINDS))
def adapter(request, mmgrpo_cache):
    return request.param, make(request.param)


def _perturb(ad, scale=0.05, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ad.trainable_parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def test_rollout_contract(adapter):
    _kind, ad = adapter
    ro = ad.rollout(PROMPTS, G)
    B = len(PROMPTS) * G
    assert len(ro.outputs) == B and ro.outputs[0].size == (32, 32)
    assert ro.old_logprobs.shape == ro.mask.shape == ro.unit_sigmas.shape == (B, T)
    assert ro.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    # fraction 0.99 of 4 steps: the first 3 trained, the last not
    assert ro.mask[:, :3].all() and not ro.mask[:, 3].any()
    assert (ro.old_logprobs[ro.mask == 0] == 0).all() and torch.isfinite(ro.old_logprobs).all()
    assert (ro.unit_sigmas[:, 1:] < ro.unit_sigmas[:, :-1]).all() and ro.unit_sigmas.max() <= 1
    assert ro.state.latents.shape[:2] == (B, T + 1)


def test_ratio_is_one_before_the_first_update(adapter):
    _kind, ad = adapter
    ro = ad.rollout(PROMPTS, G)
    idx = torch.tensor([4, 0, 2])  # any minibatch, any order
    lp = ad.logprobs(ro, idx)
    budget = adapter_reductions(ad)
    budget.assert_logprobs_close(lp.detach(), ro.old_logprobs[idx])
    budget.assert_logprobs_close(ad.ref_logprobs(ro, idx), ro.old_logprobs[idx])  # LoRA B = 0
    assert ad.exact_kl(ro, idx).abs().max() < 1e-8


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_grpo_step_changes_parameters(kind, mmgrpo_cache):
    ad = make(kind)
    ro = ad.rollout(PROMPTS, G)
    brightness = torch.tensor([float(torch.tensor(list(im.get_flattened_data())).float().mean()) for im in ro.outputs])
    r = brightness.view(len(PROMPTS), G)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)  # [P, G]
    unit_adv = shaping.shape_advantages("none", adv, shaping.ShapingInputs(ro.mask, r), {})
    before = [p.detach().clone() for p in ad.trainable_parameters()]
    opt = torch.optim.AdamW(ad.trainable_parameters(), lr=1e-2)
    idx = torch.arange(ro.batch_size)
    logp = ad.logprobs(ro, idx)
    log_ratio = losses.RATIO_LEVELS.get("token")(logp - ro.old_logprobs, ro.mask, chunk_sizes=None)
    per_unit, _ = losses.SURROGATES.get("ppo_clip")(
        log_ratio, unit_adv, ro.mask, losses.PPOClipOptions(clip_low=1e-4, clip_high=1e-4)
    )
    loss = losses.AGGREGATIONS.get("token_mean")(per_unit, ro.mask, max_units=T)
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    changed = sum(not torch.equal(b, p.detach()) for b, p in zip(before, ad.trainable_parameters()))
    assert changed > 0
    after = ad.logprobs(ro, idx).detach()
    assert (after - ro.old_logprobs).abs().max() > 1e-6  # the policy moved
    assert ad.exact_kl(ro, idx).max() > 0


def test_guided_cfg_logprob_matches_naive_two_pass(mmgrpo_cache):
    """Batched CFG (one doubled forward) equals two separate forwards combined v_u + w(v_c − v_u); both get grad."""
    ad = make("sd3")
    _perturb(ad)
    ro = ad.rollout(PROMPTS[:1], 2)
    idx = torch.tensor([1])
    lp = ad.logprobs(ro, idx)
    st, t = ro.state, 1
    x, nxt = st.latents[1:2, t], st.latents[1:2, t + 1]
    be = ad.backend
    cond = {k: v[:1] for k, v in st.cond.tensors.items()}
    v_c = be.forward(ad.model, x, st.t_model[1:2, t], cond)
    v_u = be.forward(ad.model, x, st.t_model[1:2, t], st.cond.uncond)
    v = v_u + 2.0 * (v_c - v_u)
    naive = K.flow_sde(
        v,
        x,
        st.coef[1:2, t],
        st.coef_next[1:2, t],
        noise_level=0.7,
        sigma_max=float(st.coef[0, 1]),
        draw=K.Draw(prev_sample=nxt),
    )
    budget = adapter_reductions(ad)  # w = 2 scales both branches' rounding
    budget.assert_logprobs_close(lp[0, t], naive.logprob[0], factor=2.0)
    g_batched = torch.autograd.grad(lp[0, t], ad.trainable_parameters(), retain_graph=True)
    g_naive = torch.autograd.grad(naive.logprob[0], ad.trainable_parameters(), retain_graph=True)
    for a, b in zip(g_batched, g_naive):
        budget.backward().assert_close(a, b, factor=2.0)
    # the unconditional branch matters: dropping it changes the gradient
    cond_only = K.flow_sde(
        v_c,
        x,
        st.coef[1:2, t],
        st.coef_next[1:2, t],
        noise_level=0.7,
        sigma_max=float(st.coef[0, 1]),
        draw=K.Draw(prev_sample=nxt),
    )
    g_cond = torch.autograd.grad(cond_only.logprob[0], ad.trainable_parameters())
    assert any(not torch.allclose(a, b) for a, b in zip(g_batched, g_cond))


def test_chunk_ratio_is_geometric_mean_of_step_ratios(mmgrpo_cache):
    ad = make("sd3", num_steps=6, steps="fraction", step_args={"fraction": 1.0})
    ro = ad.rollout(PROMPTS, 2)
    _perturb(ad)
    idx = torch.arange(ro.batch_size)
    step_log_ratio = ad.logprobs(ro, idx).detach() - ro.old_logprobs  # [n, 6]
    chunk = losses.RATIO_LEVELS.get("chunk")(step_log_ratio, ro.mask, chunk_sizes=[2, 4])
    r = step_log_ratio.exp()
    geo0 = (r[:, 0] * r[:, 1]) ** 0.5
    geo1 = r[:, 2:].prod(1) ** 0.25
    torch.testing.assert_close(chunk.exp()[:, 0], geo0, rtol=1e-6, atol=0)
    torch.testing.assert_close(chunk.exp()[:, 3], geo1, rtol=1e-6, atol=0)
    assert (r[:, 0] - r[:, 1]).abs().max() > 1e-6  # not trivially equal ratios


def test_ratio_norm_inputs_match_definition(mmgrpo_cache):
    ad = make("sd3")
    ro = ad.rollout(PROMPTS, 2)
    _perturb(ad)
    idx = torch.tensor([0, 3])
    logp, fwd = ad.logprobs_with_forward(ro, idx)
    inp = ad.ratio_norm_inputs(ro, idx, fwd)
    torch.testing.assert_close(inp["std"], ro.state.std[idx] * ro.mask[idx])
    normed = shaping.ratio_norm(logp - ro.old_logprobs[idx], ro.mask[idx], **inp)
    st = ro.state
    for j, b in enumerate(idx.tolist()):
        for t in range(3):
            z = (st.latents[b, t + 1] - st.old_means[b, t]) / st.std[b, t]
            mu = fwd.mean[(fwd.rows == j) & (fwd.steps == t)][0]
            expected = (z * (mu - st.old_means[b, t])).mean()
            torch.testing.assert_close(normed[j, t], expected, atol=1e-5, rtol=1e-4)
    normed.sum().backward()  # differentiable through μ_θ
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in ad.trainable_parameters())


def test_exact_kl_matches_reference_means(mmgrpo_cache):
    ad = make("flux")
    ro = ad.rollout(PROMPTS, 2)
    _perturb(ad)
    idx = torch.tensor([1, 2])
    _, fwd = ad.logprobs_with_forward(ro, idx)
    kl = ad.exact_kl(ro, idx, fwd)
    with ad.reference_policy() as ref, torch.no_grad():
        _, k_ref, rows, steps = ad._forward_units(ref, ro, idx)
    st = ro.state
    b = idx[rows]
    expected = ((fwd.mean - k_ref.mean) ** 2).flatten(1).mean(1) / (2 * st.std[b, steps] ** 2)
    torch.testing.assert_close(kl[rows, steps], expected, rtol=1e-5, atol=1e-8)
    assert kl.requires_grad
    # No hidden cache: without a record the adapter runs the forward of exactly these rows, whatever ran before
    ad.logprobs(ro, torch.tensor([0, 3]))
    torch.testing.assert_close(ad.exact_kl(ro, idx), kl.detach(), rtol=1e-5, atol=1e-8)
    other = torch.tensor([0, 3])
    torch.testing.assert_close(ad.exact_kl(ro, other), ad.exact_kl(ro, other, ad.logprobs_with_forward(ro, other)[1]))


def test_cps_last_step_masked_and_full_finetune_reference(mmgrpo_cache):
    ad = make(
        "sd3",
        lora=False,
        need_reference=True,
        kernel="cps",
        noise_level=0.8,
        steps="fraction",
        step_args={"fraction": 1.0},
    )
    ro = ad.rollout(PROMPTS, 2)
    assert ro.mask[:, :3].all() and not ro.mask[:, 3].any()  # σ_T = 0: deterministic, never trained
    assert (ro.state.std[:, 3] == 0).all()
    _perturb(ad)
    idx = torch.arange(4)
    adapter_reductions(ad).assert_logprobs_close(ad.ref_logprobs(ro, idx), ro.old_logprobs)  # frozen copy
    assert (ad.logprobs(ro, idx).detach() - ro.old_logprobs).abs().max() > 1e-6


def test_sde_window_and_branching_rollouts(mmgrpo_cache):
    ad = make("sd3", num_steps=6, steps="sde_window", step_args={"window": 2, "low": 0, "high": 4})
    ro = ad.rollout(PROMPTS, 2)
    on = ro.mask[0].nonzero().flatten().tolist()
    assert len(on) == 2 and on[1] == on[0] + 1 and on[1] < 4 and (ro.mask == ro.mask[0]).all()
    # outside the window the transition is the deterministic Euler step
    st = ro.state
    t = 5
    v = ad.velocity(ad.model, st.latents[:, t], st.t_model[:, t], st.cond, st.prompt_of, 2.0).detach()
    ode = K.ode(v, st.latents[:, t], st.coef[:, t], st.coef_next[:, t])
    adapter_reductions(ad).assert_close(ode.prev_sample, st.latents[:, t + 1])

    br = make("sd3", num_steps=6, steps="branching")
    ro = br.rollout(PROMPTS, 3)
    lat = ro.state.latents  # [6, 7, ...]
    for p in range(2):
        g = slice(3 * p, 3 * p + 3)
        k = int(ro.mask[3 * p].argmax())
        assert (ro.mask[g].sum(1) == 1).all() and (ro.mask[g, k] == 1).all()
        assert torch.equal(lat[g, : k + 1], lat[3 * p : 3 * p + 1, : k + 1].expand_as(lat[g, : k + 1]))  # shared prefix
        assert not torch.allclose(lat[3 * p, k + 1], lat[3 * p + 1, k + 1])  # children differ after the branch


def test_value_rewards_fill_unit_values(mmgrpo_cache):
    import mmgrpo.tasks.flow_shapes  # noqa: F401 - registers flow_shape_match

    ad = make("sd3", value_rewards=[{"name": "flow_shape_match", "weight": 2.0}])
    ro = ad.rollout(PROMPTS, 2)
    assert ro.unit_values.shape == (4, T) and torch.isfinite(ro.unit_values).all()
    assert (ro.unit_values >= 0).all() and (ro.unit_values <= 2).all()


def test_dense_value_is_the_weighted_sum_of_the_value_rewards_none_is_nan(mmgrpo_cache):
    """V = Σ_k w_k·reward_k(decode(x̂₀)) over the prompts repeated G times; a reward's None makes the value NaN."""
    from mmgrpo.rewards import RewardRunner, WeightedScore
    from mmgrpo.tasks.flow_shapes import flow_shape_match  # registers it

    ad = make("sd3", value_rewards=[{"name": "flow_shape_match", "weight": 2.0}])
    rows = [{"prompt": "a red circle top left", "tag": "x"}, {"prompt": "a blue square bottom right"}]
    seen = {}

    def second(completions, prompts, tag):  # None on the first prompt's samples
        seen.update(prompts=prompts, tag=tag)
        return [None if t == "x" else 0.25 for t in tag]

    ad.value_score = WeightedScore(RewardRunner([("flow_shape_match", 2.0), (second, 0.5)]), [2.0, 0.5])
    x0 = torch.randn(4, *ad.backend.latent_shape(), generator=torch.Generator().manual_seed(0))  # [B, C, H, W]
    value = ad._value(x0, rows, 2)  # [B]
    prompts = [r["prompt"] for r in rows for _ in range(2)]
    match = flow_shape_match(ad.backend.decode(x0), prompts=prompts)
    assert seen == {"prompts": prompts, "tag": ["x", "x", None, None]}
    assert value[:2].isnan().all()
    expected = torch.zeros(2) + 2.0 * torch.tensor(match[2:], dtype=torch.float32) + 0.5 * torch.tensor([0.25, 0.25])
    assert torch.equal(value[2:], expected)


def test_value_rewards_are_scored_by_the_builders_callable(mmgrpo_cache):
    """The adapter runs no reward machinery of its own (issue 49): built without ``reward_scorer`` its rollout names
    the fix in one line; the scorer's load error names the entry (``model.args.value_rewards[i]``)."""
    import mmgrpo.tasks.flow_shapes  # noqa: F401 - registers flow_shape_match

    args = {**KINDS["sd3"], "num_steps": T, "resolution": 32, "device": "cpu"}
    bare = build_flow_adapter({**args, "value_rewards": [{"name": "flow_shape_match"}]})
    assert bare.value_score is None
    with pytest.raises(ConfigError, match=r"^model.args.value_rewards: .*without a reward scorer") as e:
        bare.rollout(PROMPTS, 2)
    assert "\n" not in str(e.value)
    assert make("sd3", value_rewards=[{"name": "flow_shape_match", "weight": 2.0}]).value_score.weights == [2.0]
    with pytest.raises(ConfigError, match=r"model.args.value_rewards\[1\]: .*no_such_reward"):
        make("sd3", value_rewards=[{"name": "flow_shape_match"}, {"name": "no_such_reward"}])


def test_evaluate_is_deterministic_and_seeded(adapter):
    _kind, ad = adapter
    rows = [{"prompt": "a red circle top left", "seed": 1}, {"prompt": "a red circle top left", "seed": 2}]
    a, b = ad.evaluate(rows), ad.evaluate(rows)
    assert [list(x.get_flattened_data()) for x in a] == [list(x.get_flattened_data()) for x in b]
    assert list(a[0].get_flattened_data()) != list(a[1].get_flattened_data())


def test_save_pretrained_lora_roundtrip(mmgrpo_cache, tmp_path):
    from mmgrpo.modalities.flow.tiny import resolve_pipeline

    ad = make("sd3")
    _perturb(ad)
    ad.save_pretrained(str(tmp_path))
    pipe = resolve_pipeline("tiny-sd3")
    pipe.load_lora_weights(str(tmp_path))
    x = torch.randn(2, 4, 8, 8)
    cond = ad.backend.encode(["a red circle top left"] * 2)
    t = torch.full((2,), 500.0)
    with torch.no_grad():
        ours = ad.backend.forward(ad.model, x, t, cond)
        loaded = ad.backend.forward(pipe.transformer, x, t, cond)
    adapter_reductions(ad).assert_close(ours, loaded)  # LoRA merged into the layers by diffusers: another order


@pytest.mark.parametrize(
    "over,match",
    [
        ({"kernel": "ddim"}, "UNet"),
        ({"kernel": "euler"}, "kernel"),
        ({"cfg": "both"}, "cfg"),
        ({"steps": "every"}, "steps"),
        ({"step_args": {"windw": 3}, "steps": "sde_window"}, "step_args"),
        ({"value_rewards": [{"nam": "x"}]}, "value_rewards"),
        ({"num_step": 3}, "num_step"),
    ],
)
def test_config_errors_name_the_field(over, match, mmgrpo_cache):
    with pytest.raises(ConfigError, match=match):
        make("sd3", **over)


def test_lora_targets_error_suggests_flow_targets(mmgrpo_cache):
    with pytest.raises(ConfigError, match="to_add_out"):
        build_flow_adapter(
            {"name_or_path": "tiny-sd3", "resolution": 32, "device": "cpu"},
            lora=LoraConfig(enabled=True, target_modules=["q_proj", "v_proj"]),
        )
