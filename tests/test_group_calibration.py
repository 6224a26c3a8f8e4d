"""Issue 51 items 3, 4 and 6: NGRPO's virtual maximum-reward sample, SEED-GRPO's semantic-entropy scale and the
unlikeliness reward (advantage transforms, mmgrpo/advantages.py), the answer clusters SEED-GRPO reads
(mmgrpo/advantage_steps.py), their load-time refusals, and held-out pass@k (mmgrpo/pass_at_k.py). Every expected
number below is worked by hand in the comments next to it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mmgrpo import advantage_steps, advantages
from mmgrpo.config import ConfigError
from mmgrpo.groups import Groups
from mmgrpo.loader import load_config
from mmgrpo.pass_at_k import pass_at_k

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


# ------------------------------------------------------------------------------------------------------ NGRPO


def test_ngrpo_reproduces_the_papers_worked_case():
    """G = 8, one correct answer. GRPO: mean 1/8, unbiased std √(1/8) = 0.35355 → A = 0.875/0.35355 = 2.4749 and
    −0.125/0.35355 = −0.35355 (the paper's 2.47 / −0.35). NGRPO adds r_max = 1: 9 rewards, two of them 1, mean 2/9,
    var = (2·(7/9)² + 7·(2/9)²)/8 = (98/81 + 28/81)/8 = 126/648 = 0.19444, std 0.44096 → (7/9)/0.44096 = 1.7638 and
    −(2/9)/0.44096 = −0.50395 (the paper's 1.76 / −0.50)."""
    r = torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0]])
    grpo = advantages.grpo(r, scale="group", unbiased=True, eps=1e-6)
    assert grpo[0, 0].item() == pytest.approx(2.474874, abs=1e-5)
    assert grpo[0, 1].item() == pytest.approx(-0.353553, abs=1e-5)
    out = advantages.ngrpo_calibration(grpo, r, torch.zeros_like(r), max_reward=1.0)
    assert out[0, 0].item() == pytest.approx(1.763834, abs=1e-5)
    assert out[0, 1:].tolist() == pytest.approx([-0.503953] * 7, abs=1e-5)


def test_ngrpo_trains_all_wrong_groups_and_leaves_all_correct_ones():
    """All wrong, G = 4: {0, 0, 0, 0, 1}: mean 0.2, var = (4·0.04 + 0.64)/4 = 0.2, std 0.44721 → −0.2/0.44721 =
    −0.44721 each. All correct (r = r_max = 1.2): mean 1.2, std 0 → 0. Two virtual samples of 1 with {0, 1}: mean
    3/4, var = (0.5625 + 3·0.0625)/3 = 0.25, std 0.5 → −1.5 and 0.5. A NaN reward gets 0 and is left out."""
    r = torch.tensor([[0.0, 0, 0, 0], [1.2, 1.2, 1.2, 1.2], [0.0, 1.0, NAN, NAN]])
    out = advantages.ngrpo_calibration(torch.zeros_like(r), r, torch.zeros_like(r), max_reward=1.0)
    assert out[0].tolist() == pytest.approx([-0.447213] * 4, abs=1e-5)
    out = advantages.ngrpo_calibration(torch.zeros_like(r), r, torch.zeros_like(r), max_reward=1.2)
    assert out[1].tolist() == pytest.approx([0.0] * 4, abs=1e-6)
    two = advantages.ngrpo_calibration(r[2:], r[2:], r[2:], max_reward=1.0, virtual_samples=2)
    assert two[0].tolist() == pytest.approx([-1.5, 0.5, 0.0, 0.0], abs=1e-5)


# --------------------------------------------------------------------------------------------- unlikeliness


def test_unlikeliness_reward_by_hand():
    """r = [1, 1, 0, 1], mean token log-probs [−0.1, −2.0, −0.5, −1.0]: ranks from the least likely 0..3 are
    [3, 0, 2, 1]; β = 0.25, n = 4: r̃ = [1·(1 − 0.25·3/4), 1, 0, 1·(1 − 0.25·1/4)] = [0.8125, 1, 0, 0.9375];
    mean 0.6875, deviations [0.125, 0.3125, −0.6875, 0.25], Σ² = 0.6484375, unbiased std √(0.6484375/3) = 0.464915
    → A = [0.26887, 0.67217, −1.47877, 0.53773]: the improbable correct answer gets the largest advantage."""
    r = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    lp = torch.tensor([[-0.1, -2.0, -0.5, -1.0]])
    out = advantages.unlikeliness_reward(torch.zeros_like(r), r, lp, beta=0.25)
    assert out[0].tolist() == pytest.approx([0.268866, 0.672166, -1.478766, 0.537733], abs=1e-5)


def test_unlikeliness_leaves_wrong_answers_with_a_format_bonus_unranked():
    """r = [1.2, 0.2, 0.2, 1.2] (accuracy + 0.2 format), log-probs [−0.1, −0.2, −0.3, −0.4]: ranks [3, 2, 1, 0];
    with wrong_threshold 0.2 only the correct ones are scaled: r̃ = [1.2·(1 − 0.25·3/4), 0.2, 0.2, 1.2] =
    [0.975, 0.2, 0.2, 1.2], mean 0.64375, deviations [0.33125, −0.44375, −0.44375, 0.55625], Σ² = 0.8129688,
    std √(0.8129688/3) = 0.520567 → A = [0.636325, −0.852436, −0.852436, 1.068546]. An all-wrong group [0.2] × 4
    keeps 0 (the code's form, threshold below 0.2, would rank it: r̃ = 0.2·[1, 0.9375, 0.875, 0.8125])."""
    r = torch.tensor([[1.2, 0.2, 0.2, 1.2], [0.2, 0.2, 0.2, 0.2]])
    lp = torch.tensor([[-0.1, -0.2, -0.3, -0.4], [-0.4, -0.3, -0.2, -0.1]])
    out = advantages.unlikeliness_reward(torch.zeros_like(r), r, lp, beta=0.25, wrong_threshold=0.2)
    assert out[0].tolist() == pytest.approx([0.636325, -0.852436, -0.852436, 1.068546], abs=1e-5)
    assert out[1].tolist() == pytest.approx([0.0] * 4)
    ranked = advantages.unlikeliness_reward(torch.zeros_like(r), r, lp, beta=0.25, wrong_threshold=-1.0)
    assert ranked[1, 0] > ranked[1, 3]  # every wrong answer ranked: the least likely one gets the largest advantage


def test_unlikeliness_with_beta_zero_is_grpo_and_ranks_ties_by_index():
    """β = 0 gives GRPO's unbiased advantages; with equal log-probs the first sample ranks lowest: r = [1, 1]
    → ranks [0, 1] → r̃ = [1, 1 − 0.5·1/2] = [1, 0.75], mean 0.875, std √(2·0.015625/1) = 0.176777 → ±0.707107."""
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, NAN, NAN]])
    lp = torch.tensor([[-0.3, -0.2, -0.1, -0.4], [-1.0, -1.0, 0.0, 0.0]])
    out = advantages.unlikeliness_reward(torch.zeros_like(r), r, lp, beta=0.0)
    assert out[0].tolist() == pytest.approx(advantages.grpo(r[:1], scale="group", unbiased=True, eps=1e-6)[0].tolist())
    out = advantages.unlikeliness_reward(torch.zeros_like(r), r, lp, beta=0.5)
    assert out[1].tolist() == pytest.approx([0.707107, -0.707107, 0.0, 0.0], abs=1e-5)


# ------------------------------------------------------------------------------------------------- SEED-GRPO


def test_semantic_entropy_scale_by_hand():
    """Answers [a, a, b, c]: p = [1/2, 1/4, 1/4], K = 3, SE = (ln 2 + ln 4 + ln 4)/3 = 1.155245, SE_max = ln 4 =
    1.386294, SE/SE_max = 5/6; α = 0.5 → factor 1 − 5/12 = 0.583333. One answer: SE = 0 → 1. All different:
    SE = ln 4 = SE_max → 1 − 0.5 = 0.5. Ragged [a, b, pad, pad]: n = 2, SE = ln 2 = SE_max → 0.5 (padding ignored)."""
    ids = torch.tensor([[0.0, 0, 1, 2], [0, 0, 0, 0], [0, 1, 2, 3], [0, 1, NAN, NAN]])
    adv = torch.tensor([[1.0, -1.0, 2.0, -2.0]]).repeat(4, 1)
    out = advantages.semantic_entropy_scale(adv, torch.zeros(4, 4), ids, alpha=0.5)
    factor = out / adv
    assert factor[0].tolist() == pytest.approx([0.583333] * 4, abs=1e-5)
    assert factor[1].tolist() == pytest.approx([1.0] * 4)
    assert factor[2].tolist() == pytest.approx([0.5] * 4, abs=1e-6)
    assert factor[3].tolist() == pytest.approx([0.5] * 4, abs=1e-6)


def test_answer_clusters_read_the_last_answer_of_each_completion():
    """Group 1: 'Red' and 'red ' are one answer, 'blue' another, a completion without a tag its own; group 2 (of
    size 2, ragged) starts its ids anew."""
    outputs = ["<answer>x</answer><answer>Red</answer>", "<answer>red </answer>", "<answer>blue</answer>", "red", "a"]
    outputs += ["<answer>a</answer>"]
    ids = advantage_steps.answer_clusters(outputs, (4, 2), r"<answer>(.*?)</answer>")
    g1, g2 = ids[:4].tolist(), ids[4:].tolist()
    assert g1[0] == g1[1] and len({g1[0], g1[2], g1[3]}) == 3
    assert g2[0] != g2[1]
    grid = Groups((4, 2), 4).grid(ids)  # [2, 4], NaN padding
    assert math.isnan(grid[1, 2].item()) and grid[0].tolist() == g1


def test_seed_grpo_step_scales_the_advantages_from_the_rollouts_outputs():
    """The pipeline step reads the rollout's outputs: group 1 answers [a, a, a, a] (factor 1), group 2 [a, a, b, c]
    (factor 0.583333 with α = 0.5)."""

    class _Rollout:
        outputs = ["<answer>a</answer>"] * 4 + ["<answer>a</answer>", "<answer>a</answer>", "<answer>b</answer>", "c"]
        mask = torch.ones(8, 3)
        old_logprobs = torch.zeros(8, 3)

    cfg = load_config(ROOT / "configs/variant_seed_grpo.yaml", [])
    steps = [s for s in advantage_steps.build(cfg.algorithm) if s.kind == "advantage_transform"]
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0]])
    state = advantage_steps.AdvantageState(adv, torch.zeros(2, 4), torch.ones(8, 3), _Rollout(), None)
    advantage_steps.run(steps, state)
    assert (state.advantages / adv)[0].tolist() == pytest.approx([1.0] * 4)
    assert (state.advantages / adv)[1].tolist() == pytest.approx([0.583333] * 4, abs=1e-5)


# ------------------------------------------------------------------------------------------- load-time refusals


@pytest.mark.parametrize(
    "config, overrides, message",
    [
        (
            "ngrpo",
            ["algorithm.advantage_transform=[difficulty, ngrpo]"],
            r"^algorithm\.advantage_transform: ngrpo \(NGRPO\) replaces the advantages",
        ),
        ("ngrpo", ["algorithm.advantage_transform=[ngrpo, unlikeliness]"], r"and only one of"),
        ("ngrpo", ["algorithm.filter_zero_variance=true"], r"drops the all-wrong groups"),
        ("ngrpo", ["algorithm.estimator=rloo"], r"ngrpo computes GRPO's group mean and std itself"),
        ("unlikeliness", ["algorithm.scale=batch"], r"unlikeliness computes GRPO's group mean"),
        ("unlikeliness", ["algorithm.combine=normalize_then_sum"], r"combine: sum_then_normalize"),
        ("seed_grpo", ["algorithm.advantage_transform_args.seed_grpo.answer_pattern=(oops"], r"not a regular"),
        ("seed_grpo", ["algorithm.advantage_transform_args.seed_grpo.beta=1"], r"unknown field"),
        ("unlikeliness", ["eval.pass_k=[1, 32]"], r"eval\.pass_k: \[32\] not in \[1, eval\.pass_samples=16\]"),
    ],
)
def test_unsupported_combinations_are_refused_at_load_in_one_line(config, overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config(ROOT / f"configs/variant_{config}.yaml", overrides)
    assert "\n" not in str(e.value)


def test_the_shipped_configs_load_with_their_options():
    a = load_config(ROOT / "configs/variant_ngrpo.yaml", []).algorithm
    assert a.advantage_transform == ["ngrpo"] and a.surrogate_args == {"clip_low": 0.16, "clip_high": 0.24}
    b = load_config(ROOT / "configs/variant_unlikeliness.yaml", [])
    assert b.algorithm.advantage_transform_args == {
        "unlikeliness": {"beta": 0.25, "wrong_threshold": 0.2}
    } and b.eval.pass_k == [1, 4, 16]


# --------------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_by_hand():
    """n = 4, c = 1: pass@1 = 1/4, pass@2 = 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5, pass@4 = 1. c = 0 → 0; c = 4 → 1;
    n = 5, c = 2, k = 3: 1 − C(3,3)/C(5,3) = 1 − 1/10 = 0.9."""
    n, c = torch.tensor([4, 4, 4]), torch.tensor([1, 0, 4])
    assert pass_at_k(n, c, 1).tolist() == pytest.approx([0.25, 0.0, 1.0])
    assert pass_at_k(n, c, 2).tolist() == pytest.approx([0.5, 0.0, 1.0])
    assert pass_at_k(n, c, 4).tolist() == pytest.approx([1.0, 0.0, 1.0])
    assert pass_at_k(torch.tensor([5]), torch.tensor([2]), 3).tolist() == pytest.approx([0.9])


def test_a_run_reports_held_out_pass_at_k(tmp_path, mmgrpo_cache):
    """One step of the unlikeliness config with the after-training evaluation: pass@k is a probability that does not
    fall with k, and pass@1 of 4 samples is a multiple of 1/(4·rows)."""
    from mmgrpo.trainer import train

    small = [
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=4",
        "algorithm.minibatch_size=8",
        "model.args.max_new_tokens=5",
        "task.args.train_size=8",
        "task.args.eval_size=3",
        "warmup.steps=0",
        "eval.before=false",
        "eval.every=0",
        "eval.pass_k=[1, 2, 4]",
        "eval.pass_samples=4",
        "steps=1",
        "logging.trackers=[]",
        "logging.progress=false",
        "logging.plot=false",
        "checkpoint.save_final=false",
        f"output_dir={tmp_path / 'run'}",
    ]
    train(load_config(ROOT / "configs/variant_unlikeliness.yaml", small))
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    after = next(r for r in records if "eval/after/pass@1" in r)
    p1, p2, p4 = after["eval/after/pass@1"], after["eval/after/pass@2"], after["eval/after/pass@4"]
    assert 0.0 <= p1 <= p2 <= p4 <= 1.0
    assert round(p1 * 12) == pytest.approx(p1 * 12, abs=1e-9)
