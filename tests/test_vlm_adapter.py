"""The VLM adapter on the tiny Qwen2.5-VL of the real architecture (no download)."""

import torch

from mmgrpo import losses
from mmgrpo.config import LoraConfig
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask
from tests.numerics import adapter_reductions


def _rows(n=3):
    return ShapesTask(ShapesArgs(train_size=n, eval_size=1)).train_rows()


def test_ratio_is_one_before_update_and_loss_changes_parameters(tiny_vlm_path):
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 6})
    rollout = adapter.rollout(_rows(3), group_size=4)
    B, T = rollout.old_logprobs.shape
    assert B == 12 and T == 6
    assert rollout.prompt_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert rollout.mask.sum() > 0
    idx = torch.arange(B)
    logp = adapter.logprobs(rollout, idx)
    m = rollout.mask.bool()
    adapter_reductions(adapter).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])  # ratio 1

    adv = torch.randn(B, 1).expand(B, T) * rollout.mask
    per_unit, _ = losses.SURROGATES.get("ppo_clip")(
        logp - rollout.old_logprobs,
        adv,
        rollout.mask,
        losses.PPOClipOptions(clip_low=0.2, clip_high=0.2),
    )
    loss = losses.AGGREGATIONS.get("token_mean")(per_unit, rollout.mask, max_units=T)
    assert torch.isfinite(loss)
    params = adapter.trainable_parameters()
    before = [p.detach().clone() for p in params]
    loss.backward()
    torch.optim.SGD(params, lr=1.0).step()
    changed = sum(not torch.equal(b, p) for b, p in zip(before, params))
    assert changed > len(params) // 2, f"only {changed}/{len(params)} parameter tensors changed"


def test_logprobs_match_the_sampling_distribution(tiny_vlm_path):
    """The training forward reproduces generate()'s own per-step scores at temperature 0.7."""
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 5, "temperature": 0.7})
    rows = _rows(2)
    torch.manual_seed(0)
    rollout = adapter.rollout(rows, group_size=2)
    batch = adapter.collate(rollout.state.cache.encodings)
    torch.manual_seed(0)
    model = adapter._unwrapped()
    out = model.generate(
        **batch,
        max_new_tokens=5,
        do_sample=True,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        num_return_sequences=2,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=adapter.pad_id,
        eos_token_id=adapter.eos_ids.tolist(),
        suppress_tokens=adapter.suppress_ids,
    )
    seq = out.sequences[:, batch["input_ids"].shape[1] :]
    scores = torch.stack(out.scores, dim=1).log_softmax(-1)  # [B, T, V] processed = logits / temperature
    gen_logp = scores.gather(-1, seq[..., None]).squeeze(-1)
    m = adapter._completion_mask(seq).bool()
    # Recompute log-probs of exactly these sequences through the training path.
    rollout.state.completion_ids[:, : seq.shape[1]] = seq
    logp = adapter.logprobs(rollout, torch.arange(4))[:, : seq.shape[1]]
    adapter_reductions(adapter).assert_logprobs_close(logp[m].detach(), gen_logp[m])


def test_eos_truncation_and_mask(tiny_vlm_path):
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4, "mask_truncated": True})
    eos = int(adapter.eos_ids[0])
    ids = torch.tensor([[5, eos, 7, 7], [5, 6, 7, 8]])
    assert adapter._completion_mask(ids).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]

    def eos_quarter(module, inputs, logits):  # P(EOS) = 1/4 at every position: some samples finish, some do not
        others = logits.clone()
        others[..., eos] = float("-inf")
        logits = logits.clone()
        logits[..., eos] = others.logsumexp(-1) - torch.log(torch.tensor(3.0))
        return logits

    handle = adapter._unwrapped().lm_head.register_forward_hook(eos_quarter)
    try:
        torch.manual_seed(0)
        rollout = adapter.rollout(_rows(2), group_size=8)
    finally:
        handle.remove()
    finished = (~rollout.truncated).nonzero().flatten().tolist()
    truncated = rollout.truncated.nonzero().flatten().tolist()
    assert finished and truncated, f"both branches must run: finished {finished}, truncated {truncated}"
    ids = rollout.state.completion_ids
    for b in truncated:  # no EOS: fully masked (mask_truncated)
        assert eos not in ids[b].tolist() and rollout.mask[b].sum() == 0
    for b in finished:  # trained up to and including the first EOS, zero after it (pad tokens there)
        end = ids[b].tolist().index(eos)
        assert rollout.mask[b, : end + 1].tolist() == [1.0] * (end + 1)
        assert rollout.mask[b, end + 1 :].sum() == 0
        assert (ids[b, end + 1 :] == adapter.pad_id).all()


def test_rollout_columns_give_box_rewards_their_geometry(tiny_vlm_path):
    """image_grid_thw and the image sizes reach the rewards: iou in Qwen2.5-VL's resized space runs in a rollout."""
    from mmgrpo.rewards import score_rows
    from mmgrpo.rewards.visual import iou

    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4})
    rows = _rows(2)
    for row in rows:
        W, H = row["image"].size
        row["box"] = [0, 0, W / 2, H / 2]  # the top-left quarter, in original pixels
    rollout = adapter.rollout(rows, group_size=2)
    seen = {}

    def record(completions, prompts, columns):  # a stand-in runner: the prompts and columns the rewards get
        seen.update(prompts=prompts, columns=columns)
        return torch.zeros(len(completions), 0), {}

    score_rows(record, rollout.outputs, rows, 2, rollout.extras)
    prompts, columns = seen["prompts"], seen["columns"]
    for b in range(rollout.batch_size):
        _t, gh, gw = columns["image_grid_thw"][b]
        assert columns["resized_image_size"][b] == (gw * 14, gh * 14)
        assert columns["image_size"][b] == rows[b // 2]["image"].size
    kwargs = dict(pred_space="qwen25vl_abs_resized", gt_space="original_pixels", answer_key="box", prompts=prompts)
    scores = iou(rollout.outputs, **kwargs, **columns)  # the sampled text: no box, but no error either
    assert len(scores) == rollout.batch_size
    quarter = [f"<answer>[0, 0, {w / 2}, {h / 2}]</answer>" for w, h in columns["resized_image_size"]]
    assert iou(quarter, **kwargs, **columns) == [1.0] * rollout.batch_size


def test_lora_reference_is_adapter_disabled(tiny_vlm_path):
    adapter = build_vlm_adapter(
        {"name_or_path": tiny_vlm_path, "max_new_tokens": 4}, lora=LoraConfig(enabled=True, r=4, alpha=8)
    )
    names = [n for n, p in adapter._unwrapped().named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    rollout = adapter.rollout(_rows(2), group_size=2)
    idx = torch.arange(4)
    # LoRA B starts at zero: policy == reference before training.
    adapter_reductions(adapter).assert_logprobs_close(
        adapter.ref_logprobs(rollout, idx), adapter.logprobs(rollout, idx)
    )
    with torch.no_grad():
        for n, p in adapter._unwrapped().named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    diff = (adapter.ref_logprobs(rollout, idx) - adapter.logprobs(rollout, idx).detach()).abs().max()
    assert diff > 1e-3


def test_frozen_reference_without_lora(tiny_vlm_path):
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4}, need_reference=True)
    assert adapter.reference is not None
    assert not any(p.requires_grad for p in adapter.reference.parameters())
    rollout = adapter.rollout(_rows(1), group_size=2)
    idx = torch.arange(2)
    adapter_reductions(adapter).assert_logprobs_close(adapter.ref_logprobs(rollout, idx), rollout.old_logprobs)


def test_media_placeholder_tokens_are_never_sampled(tiny_vlm_path):
    """A sampled <|image_pad|> would break the training forward (image tokens != features, TRL #3847)."""
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 8})
    tok = adapter.tokenizer
    assert set(tok.convert_ids_to_tokens(adapter.suppress_ids)) >= {"<|image_pad|>", "<|vision_start|>"}
    with torch.no_grad():  # make the placeholders the most likely tokens by far
        adapter._unwrapped().lm_head.weight[adapter.suppress_ids] *= 50
    rollout = adapter.rollout(_rows(2), group_size=4)
    assert not torch.isin(rollout.state.completion_ids, torch.tensor(adapter.suppress_ids)).any()
    assert torch.isfinite(adapter.logprobs(rollout, torch.arange(8))).all()


def test_text_only_causal_lm(tmp_path):
    """Rows without images go through a text-only AutoModelForCausalLM with its tokenizer."""
    from mmgrpo.modalities.vlm.tiny import build_tiny_causal_lm

    path = build_tiny_causal_lm(tmp_path / "lm")
    adapter = build_vlm_adapter({"name_or_path": str(path), "max_new_tokens": 5})
    assert not adapter.is_multimodal
    rows = [{"prompt": "What colour is the sky?", "answer": "blue"}, {"prompt": "Count to three.", "answer": "3"}]
    rollout = adapter.rollout(rows, group_size=3)
    assert rollout.old_logprobs.shape == (6, 5) and len(rollout.outputs) == 6
    logp = adapter.logprobs(rollout, torch.arange(6))
    m = rollout.mask.bool()
    adapter_reductions(adapter).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])  # ratio 1
    assert len(adapter.evaluate(rows)) == 2
