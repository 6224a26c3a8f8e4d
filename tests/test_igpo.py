"""IGPO (arXiv 2510.14967, mmgrpo/igpo.py): information gains and turn advantages on a hand-worked group; the
ground-truth probe of the multi-turn driver on the tiny Qwen2.5-VL against a direct forward of the conversation;
the combinations refused at load, one line each."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmgrpo import credit, igpo, multiturn
from mmgrpo.cli import main
from mmgrpo.config import ConfigError, RolloutConfig
from mmgrpo.loader import load_config
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.types import DataError
from tests.test_turns import CROP, _rows, _teacher_forced, script

ROOT = Path(__file__).resolve().parents[1]
IGPO = ROOT / "configs" / "variant_igpo.yaml"


def _group():
    """One prompt, G = 3. Trajectory 0 crops (π̄ of the answer 0.2 → 0.6), then answers right (outcome 1);
    trajectory 1 crops a wrong box (0.2 → 0.1), answers wrong (0); trajectory 2 answers at once (0.5)."""
    ell = torch.log(torch.tensor([[0.2, 0.6], [0.2, 0.1], [0.2, 1.0]]))  # [B, S] (the padding's value is unused)
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])  # [B, S]
    outcome = torch.tensor([1.0, 0.0, 0.5])  # [B]
    return ell, outcome, mask, torch.zeros(3, dtype=torch.long)


def test_information_gains_by_hand():
    ell, _, mask, _ = _group()
    gains = igpo.information_gains(ell, mask)
    # prob_diff: 0.6 − 0.2 = 0.4 and 0.1 − 0.2 = −0.1 on the crop turns; none on a last turn or the padding
    torch.testing.assert_close(gains, torch.tensor([[0.4, 0.0], [-0.1, 0.0], [0.0, 0.0]]), rtol=0, atol=1e-6)
    logs = igpo.information_gains(ell, mask, "log_prob_diff")  # ln 0.6 − ln 0.2 = ln 3, ln 0.1 − ln 0.2 = −ln 2
    torch.testing.assert_close(logs, torch.tensor([[1.098612, 0.0], [-0.693147, 0.0], [0.0, 0.0]]), atol=1e-6, rtol=0)
    assert igpo.last_turns(mask).tolist() == [[False, True], [False, True], [True, False]]


def test_joint_normalisation_and_discount_by_hand():
    ell, outcome, mask, group = _group()
    adv, metrics = igpo.igpo_advantages(ell, outcome, mask, group)
    # rewards r = [0.4, 1.0 | −0.1, 0.0 | 0.5]: mean 1.8 / 5 = 0.36; deviations 0.04, 0.64, −0.46, −0.36, 0.14;
    # population variance (0.0016 + 0.4096 + 0.2116 + 0.1296 + 0.0196) / 5 = 0.1544, std 0.392938;
    # Â = deviation / (std + 1e-6) = 0.101797, 1.628751 | −1.170660, −0.916168 | 0.356285; γ = 1: Ã_0 = Â_0 + Â_1
    s = 0.392938 + 1e-6
    a = [0.04 / s, 0.64 / s, -0.46 / s, -0.36 / s, 0.14 / s]
    want = torch.tensor([[a[0] + a[1], a[1]], [a[2] + a[3], a[3]], [a[4], 0.0]])
    torch.testing.assert_close(adv, want, rtol=0, atol=2e-5)
    assert adv[0].tolist() == pytest.approx([1.730548, 1.628751], abs=2e-5)
    assert metrics["credit/info_gain_mean"] == pytest.approx(0.15, abs=1e-6)  # (0.4 − 0.1) / 2 crop turns
    assert metrics["credit/info_gain_positive_fraction"] == pytest.approx(0.5)
    assert metrics["credit/gt_prob_first"] == pytest.approx(0.2, abs=1e-6)
    assert metrics["credit/gt_prob_last"] == pytest.approx((0.6 + 0.1 + 0.2) / 3, abs=1e-6)  # before each last turn
    half, _ = igpo.igpo_advantages(ell, outcome, mask, group, gamma=0.5)  # Ã_0 = Â_0 + 0.5·Â_1
    assert half[0, 0] == pytest.approx(a[0] + 0.5 * a[1], abs=2e-5) and half[0, 1] == pytest.approx(a[1], abs=2e-5)


def test_separate_normalisation_weight_and_mean_only_by_hand():
    ell, outcome, mask, group = _group()
    adv, _ = igpo.igpo_advantages(ell, outcome, mask, group, normalization="separate", gamma=0.0)
    # gains {0.4, −0.1}: mean 0.15, population std 0.25 → ±1 (÷ 0.250001); outcomes {1, 0, 0.5}: mean 0.5,
    # std sqrt(1/6) = 0.408248 → ±1.224742, 0
    g, o = 0.25 / 0.250001, 0.5 / (0.408248 + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([[g, o], [-g, -o], [0.0, 0.0]]), rtol=0, atol=2e-5)
    centred, _ = igpo.igpo_advantages(ell, outcome, mask, group, scale=False, info_gain_weight=0.5, gamma=0.0)
    # w = 0.5: r = [0.2, 1 | −0.05, 0 | 0.5], mean 1.65 / 5 = 0.33, no division
    want = torch.tensor([[-0.13, 0.67], [-0.38, -0.33], [0.17, 0.0]])
    torch.testing.assert_close(centred, want, rtol=0, atol=1e-6)


def test_groups_are_normalised_apart_and_a_lone_item_gets_zero():
    ell = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    adv, _ = igpo.igpo_advantages(ell, torch.tensor([1.0, 0.0]), mask, torch.tensor([0, 1]))
    assert adv.tolist() == [[0.0, 0.0], [0.0, 0.0]]  # each group holds one outcome: std 1, minus its own mean


def test_the_credit_is_registered_and_reads_the_turn_inputs():
    ell, outcome, mask, group = _group()
    assert credit.CREDITS.options_class("igpo") is igpo.IGPOOptions
    turns = credit.TurnInputs(mask, torch.zeros(3, 2), torch.zeros(3, 2), [[0, 1]] * 3, torch.zeros(3), group)
    with pytest.raises(ValueError, match="igpo needs the ground-truth log-probs of each turn"):
        igpo.igpo_credit(torch.zeros(1, 3), outcome, turns, igpo.IGPOOptions())
    turns = credit.TurnInputs(
        mask, torch.zeros(3, 2), torch.zeros(3, 2), [[0, 1]] * 3, torch.zeros(3), group, None, ell
    )
    got, _ = igpo.igpo_credit(torch.zeros(1, 3), outcome, turns, igpo.IGPOOptions())
    torch.testing.assert_close(got, igpo.igpo_advantages(ell, outcome, mask, group)[0])


def test_the_probes_pseudo_response_scores_the_answer_span(tiny_vlm_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_vlm_path)
    assert igpo.render_answer("<answer>{answer}</answer>", "red") == ("<answer>red</answer>", 8, 11)
    assert igpo.render_answer("{answer[0]:g}s to {answer[1]:g}s", [1.5, 2]) == ("1.5s to 2s", 0, 9)
    ids, scored = igpo.probe_target(tok, "<answer>{answer}</answer>", "red", "answer")
    assert ids == tok.encode("<answer>red</answer>", add_special_tokens=False)
    assert [i for i, s in zip(ids, scored) if s] == tok.encode("red", add_special_tokens=False)
    assert igpo.probe_target(tok, "<answer>{answer}</answer>", "red", "text")[1] == [1] * len(ids)


def test_the_probe_equals_the_conversation_answered_with_the_ground_truth(tiny_vlm_path):
    """Trajectory 0 crops, then answers; trajectory 1 answers at once. ℓ before each turn = the mean log-prob of
    ``<answer>{gt}</answer>`` as the assistant's reply after the context so far (the crop image included), from a
    forward over the conversation rendered in one go by the chat template (tests/test_turns.py)."""
    probe = {"column": "answer", "template": "<answer>{answer}</answer>", "score": "text", "batch_size": 1}
    settings = RolloutConfig(tools=["crop"], max_total_tokens=400, ground_truth_probe=probe)
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 24}, rollout=settings)
    row = _rows(1)[0]
    gt = f"<answer>{row['answer']}</answer>"
    script(adapter, {0: [CROP, "<answer>red</answer>"], 1: ["<answer>blue</answer>"]})
    rollout = adapter.rollout([row], group_size=2)
    ex = rollout.extras
    assert ex["num_turns"] == [2, 1] and [len(v) for v in ex["gt_logprobs"]] == [2, 1]
    target = adapter.tokenizer.encode(gt, add_special_tokens=False)

    def direct(messages):  # mean log-prob of the target tokens as the last assistant reply of the conversation
        ids, _, logp = _teacher_forced(adapter, row, [*messages, {"role": "assistant", "content": gt}])
        ids = ids.tolist()
        at = max(i for i in range(len(ids) - len(target) + 1) if ids[i : i + len(target)] == target)
        return float(logp[at : at + len(target)].mean())

    before_turn_1 = ex["messages"][0][:2]  # the crop call and its tool reply (the crop image)
    assert [m["role"] for m in before_turn_1] == ["assistant", "tool"]
    assert ex["gt_logprobs"][0][0] == pytest.approx(direct([]), abs=1e-5)
    assert ex["gt_logprobs"][1][0] == pytest.approx(direct([]), abs=1e-5)  # the prompt alone, probed once
    assert ex["gt_logprobs"][0][1] == pytest.approx(direct(before_turn_1), abs=1e-5)
    assert ex["gt_logprobs"][0][1] != pytest.approx(ex["gt_logprobs"][0][0], abs=1e-3)  # the crop moved it
    inputs = multiturn.turn_inputs(rollout)
    torch.testing.assert_close(inputs.gt_logprobs, torch.tensor([ex["gt_logprobs"][0], [ex["gt_logprobs"][1][0], 0]]))


def test_refused_combinations_name_the_fix():
    with pytest.raises(ConfigError, match=r"igpo .* rollout\.ground_truth_probe is not set; set rollout\.ground"):
        load_config(IGPO, ["rollout.ground_truth_probe=null"])
    single = ROOT / "configs" / "quickstart.yaml"
    with pytest.raises(ConfigError, match=r"ground_truth_probe .* rollouts are single-turn; set rollout\.tools"):
        load_config(single, ["rollout.ground_truth_probe={column: answer}"])
    with pytest.raises(ConfigError, match=r"ground_truth_probe .* rollouts are single-turn"):
        load_config(single, ["algorithm.credit=igpo", "rollout.ground_truth_probe={column: answer}"])
    with pytest.raises(ConfigError, match=r"rollout\.ground_truth_probe\.colum"):
        load_config(IGPO, ["rollout.ground_truth_probe={colum: answer}"])
    with pytest.raises(ConfigError, match=r"algorithm\.credit_args\.gama"):
        load_config(IGPO, ["algorithm.credit_args={gama: 0.9}"])
    with pytest.raises(ConfigError, match=r"algorithm\.shaping: temporal with algorithm\.credit: igpo"):
        load_config(IGPO, ["algorithm.shaping=temporal"])


def test_rows_without_the_ground_truth_column_are_refused_at_dry_run(capsys):
    small = ["task.args.train_size=4", "task.args.eval_size=4"]
    assert main(["train", str(IGPO), "--dry-run", *small]) == 0
    code = main(["train", str(IGPO), "--dry-run", *small, "rollout.ground_truth_probe={column: truth}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1
    assert "reads the ground truth from column 'truth', which the row does not have" in err[0]
    assert "set rollout.ground_truth_probe.column" in err[0]
    row = {"prompt": "p", "answer": [1]}
    with pytest.raises(DataError, match=r"cannot format the row's 'answer' = \[1\]"):
        igpo.check_row(igpo.ProbeOptions(template="{answer[3]}"), row, "row 0")
