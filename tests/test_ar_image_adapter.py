"""Autoregressive image adapter on a tiny random Janus built from config (no download)."""

import pytest
import torch

from mmgrpo import losses
from mmgrpo.config import ConfigError, LoraConfig
from mmgrpo.modalities.ar_image.adapter import ARImageState, PromptCache, build_ar_image_adapter, guided_logits
from tests.numerics import adapter_reductions

PROMPTS = [{"prompt": "a red circle top left"}, {"prompt": "a blue square on the right"}]  # two prompt lengths
G, T = 3, 16
GUIDANCE = 3.0  # make()'s guidance scale s: ℓ_u + s·(ℓ_c − ℓ_u) scales both branches' rounding by s
LORA = LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def make(lora=True, **over):
    args = {"name_or_path": "tiny-janus", "guidance_scale": 3.0, "temperature": 1.0, **over}
    return build_ar_image_adapter(args, seed=0, lora=LORA if lora else None)


def _perturb(ad, scale=0.2, seed=1):
    """Move every trainable parameter (LoRA B included) so that the policy differs from the reference."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ad.trainable_parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


@pytest.fixture(scope="module")
def adapter(mmgrpo_cache):
    ad = make()
    _perturb(ad)
    return ad


def _sampled_state(ad, seed=0):
    torch.manual_seed(seed)
    ids = [ad._encode(r) for r in PROMPTS]
    tokens, sampler_logprobs = ad._sample(ids, G, greedy=False)
    state = ARImageState(tokens, torch.arange(len(PROMPTS)).repeat_interleave(G), PromptCache(ids))
    return state, sampler_logprobs


@pytest.mark.parametrize("prefix_sharing", [True, False])
def test_sampler_logprobs_equal_training_forward(adapter, prefix_sharing):
    """The KV-cached sampling loop and the training forward give the same guided log-probs (ratio == 1)."""
    state, sampler = _sampled_state(adapter)
    adapter.args.prefix_sharing = prefix_sharing
    try:
        lp = adapter._token_logprobs(adapter.model, state, torch.arange(len(PROMPTS) * G)).detach()
    finally:
        adapter.args.prefix_sharing = True
    adapter_reductions(adapter).assert_logprobs_close(lp, sampler, factor=GUIDANCE)
    assert sampler.min() < -0.1  # a real distribution, not one-hot


def test_rollout_contract_and_ratio_one(adapter):
    ro = adapter.rollout(PROMPTS, G)
    B = len(PROMPTS) * G
    assert len(ro.outputs) == B and ro.outputs[0].size == (16, 16) and ro.outputs[0].mode == "RGB"
    assert ro.old_logprobs.shape == ro.mask.shape == (B, T) and ro.mask.all()
    assert ro.prompt_index.tolist() == [0, 0, 0, 1, 1, 1] and not ro.truncated.any()
    idx = torch.tensor([4, 0, 2])  # any minibatch, any order
    lp = adapter.logprobs(ro, idx).detach()
    adapter_reductions(adapter).assert_logprobs_close(lp, ro.old_logprobs[idx], factor=GUIDANCE)  # ratio 1


def test_reference_equals_policy_at_lora_init(mmgrpo_cache):
    ad = make()
    ro = ad.rollout(PROMPTS, 2)
    idx = torch.arange(ro.batch_size)
    adapter_reductions(ad).assert_logprobs_close(ad.ref_logprobs(ro, idx), ro.old_logprobs, factor=GUIDANCE)  # B = 0
    _perturb(ad)
    assert (ad.ref_logprobs(ro, idx) - ad.logprobs(ro, idx).detach()).abs().max() > 1e-3


def test_prefix_sharing_equals_naive_with_gradients(adapter):
    state, _ = _sampled_state(adapter, seed=1)
    idx = torch.tensor([5, 1, 3, 0])
    params = adapter.trainable_parameters()
    out = {}
    for shared in (True, False):
        adapter.args.prefix_sharing = shared
        lp = adapter._token_logprobs(adapter.model, state, idx)
        weights = torch.linspace(-1, 1, lp.numel()).view_as(lp)
        out[shared] = (lp.detach(), torch.autograd.grad((lp * weights).sum(), params))
    adapter.args.prefix_sharing = True
    budget = adapter_reductions(adapter)
    budget.assert_logprobs_close(out[True][0], out[False][0], factor=GUIDANCE)
    for a, b in zip(out[True][1], out[False][1]):
        budget.backward().assert_close(a, b, factor=GUIDANCE)


def _separate_branch_logits(ad, state, idx, uncond: bool):
    """Image-head logits of one CFG branch from its own full forward (no cache, no batching with the other)."""
    fam, base = ad.family, ad._base(ad.model)
    rows = []
    for b in idx.tolist():
        ids = torch.tensor([state.cache.ids[int(state.prompt_of[b])]])  # [1, L]
        if uncond:
            ids = fam.uncond_ids(ids)
        tokens = state.image_tokens[b : b + 1]  # [1, T]
        embeds = torch.cat([fam.embed_text(base, ids), fam.embed_image(base, tokens[:, :-1])], 1)
        hidden = fam.backbone(base)(inputs_embeds=embeds, use_cache=False).last_hidden_state
        rows.append(fam.image_logits(base, hidden[:, ids.shape[1] - 1 :]).float())
    return torch.cat(rows)  # [n, T, V]


def test_cfg_batched_forward_equals_two_separate_forwards(adapter):
    """ℓ_u + s(ℓ_c − ℓ_u) from the one batched [2n] forward equals two unbatched forwards, gradients included."""
    state, _ = _sampled_state(adapter, seed=2)
    idx = torch.tensor([0, 4])
    params = adapter.trainable_parameters()
    lp = adapter._token_logprobs(adapter.model, state, idx)  # [n, T]
    cond = _separate_branch_logits(adapter, state, idx, uncond=False)
    uncond = _separate_branch_logits(adapter, state, idx, uncond=True)
    ref = torch.log_softmax(uncond + 3.0 * (cond - uncond), -1).gather(-1, state.image_tokens[idx][..., None])[..., 0]
    budget = adapter_reductions(adapter)
    budget.assert_logprobs_close(lp.detach(), ref.detach(), factor=GUIDANCE)
    g_batched = torch.autograd.grad(lp.sum(), params)
    g_separate = torch.autograd.grad(ref.sum(), params, retain_graph=True)
    for a, b in zip(g_batched, g_separate):
        budget.backward().assert_close(a, b, factor=GUIDANCE)
    # the unconditional branch carries gradient: the cond-only log-prob has a different gradient
    ref_cond = torch.log_softmax(cond, -1).gather(-1, state.image_tokens[idx][..., None])[..., 0]
    g_cond = torch.autograd.grad(ref_cond.sum(), params)
    assert any(
        (a - b).abs().max() > 100 * budget.backward().tol(float(b.abs().max())) for a, b in zip(g_batched, g_cond)
    )


def test_cfg_logprob_modes_and_their_identities(adapter):
    """cond ≠ guided when s ≠ 1; at s = 1 guided is the conditional distribution (ℓ_u cancels); at s = 0 it is
    the unconditional one; the cond log-probs do not depend on s; scaled = log softmax(guided / s)."""
    state, _ = _sampled_state(adapter, seed=3)
    idx = torch.arange(4)
    tok = state.image_tokens[idx][..., None]

    def lp(**over):
        saved = dict(vars(adapter.args))
        vars(adapter.args).update(over)
        try:
            return adapter._token_logprobs(adapter.model, state, idx).detach()
        finally:
            vars(adapter.args).update(saved)

    guided, cond = lp(cfg_logprob="guided"), lp(cfg_logprob="cond")
    assert (guided - cond).abs().max() > 1e-2  # s = 3: the shortcut is not the sampler's distribution
    close = adapter_reductions(adapter).assert_logprobs_close
    close(lp(cfg_logprob="guided", guidance_scale=1.0), cond)
    torch.testing.assert_close(lp(cfg_logprob="cond", guidance_scale=7.0), cond, atol=0, rtol=0)  # s is not read
    with torch.no_grad():
        c, u = adapter._unit_logits(adapter.model, state, idx)
    s0 = torch.log_softmax(u, -1).gather(-1, tok)[..., 0]
    close(lp(cfg_logprob="guided", guidance_scale=0.0), s0)
    scaled = torch.log_softmax(guided_logits(c, u, 3.0) / 3.0, -1).gather(-1, tok)[..., 0]
    close(lp(cfg_logprob="scaled"), scaled, factor=GUIDANCE)
    # temperature divides the guided logits
    hot = torch.log_softmax(guided_logits(c, u, 3.0) / 2.0, -1).gather(-1, tok)[..., 0]
    close(lp(temperature=2.0), hot, factor=GUIDANCE)


@pytest.mark.parametrize("ratio_level", ["token", "chunk", "sequence"])
def test_one_grpo_step_changes_parameters(ratio_level, mmgrpo_cache):
    ad = make()
    ro = ad.rollout(PROMPTS, G)
    red = torch.tensor(
        [float(torch.tensor(list(im.getchannel(0).get_flattened_data())).float().mean()) for im in ro.outputs]
    )
    r = red.view(len(PROMPTS), G)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()  # [B]
    unit_adv = adv[:, None].expand(-1, T)  # [B, T]
    before = [p.detach().clone() for p in ad.trainable_parameters()]
    opt = torch.optim.AdamW(ad.trainable_parameters(), lr=1e-2)
    idx = torch.arange(ro.batch_size)
    logp = ad.logprobs(ro, idx)
    chunks = [4, 4, 4, 4] if ratio_level == "chunk" else None  # rows of the 4×4 token grid
    log_ratio = losses.RATIO_LEVELS.get(ratio_level)(logp - ro.old_logprobs, ro.mask, chunk_sizes=chunks)
    per_unit, _ = losses.SURROGATES.get("ppo_clip")(
        log_ratio, unit_adv, ro.mask, losses.PPOClipOptions(clip_low=0.2, clip_high=0.2)
    )
    loss = losses.AGGREGATIONS.get("token_mean")(per_unit, ro.mask, max_units=T)
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    assert sum(not torch.equal(b, p.detach()) for b, p in zip(before, ad.trainable_parameters())) > 0
    assert (ad.logprobs(ro, idx).detach() - ro.old_logprobs).abs().max() > 1e-4  # the policy moved


def test_evaluate_is_deterministic_and_seeded(adapter):
    rows = [{"prompt": "a red circle top left", "seed": 1}, {"prompt": "a red circle top left", "seed": 2}]
    a, b = adapter.evaluate(rows), adapter.evaluate(rows)
    assert [list(x.get_flattened_data()) for x in a] == [list(x.get_flattened_data()) for x in b]
    assert list(a[0].get_flattened_data()) != list(a[1].get_flattened_data())


def test_save_pretrained_lora_roundtrip(adapter, tmp_path):
    from peft import PeftModel
    from transformers import JanusForConditionalGeneration

    from mmgrpo.modalities.ar_image.tiny import resolve_model_path

    adapter.save_pretrained(str(tmp_path))
    base = JanusForConditionalGeneration.from_pretrained(resolve_model_path("tiny-janus"))
    loaded = PeftModel.from_pretrained(base, str(tmp_path))
    ad2 = make(lora=False)
    ad2.model = loaded
    state, _ = _sampled_state(adapter, seed=4)
    idx = torch.arange(3)
    with torch.no_grad():
        adapter_reductions(adapter).assert_logprobs_close(
            ad2._token_logprobs(ad2.model, state, idx), adapter._token_logprobs(adapter.model, state, idx)
        )


def test_no_guidance_runs_one_branch(mmgrpo_cache):
    ad = make(guidance_scale=1.0)
    ro = ad.rollout(PROMPTS[:1], 2)
    adapter_reductions(ad).assert_logprobs_close(ad.logprobs(ro, torch.arange(2)).detach(), ro.old_logprobs)


@pytest.mark.parametrize(
    "over, match",
    [
        ({"cfg_logprob": "uncond"}, "cfg_logprob"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_config_errors_name_the_field(over, match, mmgrpo_cache):
    with pytest.raises(ConfigError, match=match):
        make(**over)
