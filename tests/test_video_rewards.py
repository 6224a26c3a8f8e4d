"""T-GRPO temporal-contrast reward and frame-number temporal IoU (values by hand), plus temporal IoU edge cases
with the columns the video adapter provides."""

import pytest
import torch

from mmgrpo.rewards import RewardRunner, load_reward, multi_span_iou, temporal_iou
from mmgrpo.rewards.video import contrast_bonus, temporal_contrast, temporal_iou_frames


def A(x):
    return f"<answer>{x}</answer>"


def test_contrast_bonus_rule_by_hand():
    # p = 0.5, p̃ = 0.5: 0.5 >= 0.8 * 0.5 -> the two correct samples get alpha
    assert contrast_bonus([1, 1, 0, 0], [1, 0], mu=0.8, alpha=0.3, threshold=0.1) == ([0.3, 0.3, 0.0, 0.0], 0.5, 0.5)
    # p = 0.25 < 0.8 * 1.0 -> nobody
    assert contrast_bonus([1, 0, 0, 0], [1, 1], mu=0.8, alpha=0.3, threshold=0.1)[0] == [0.0] * 4
    # the boundary p == mu * p̃ counts (Video-R1 uses >=)
    assert contrast_bonus([1, 0], [1, 1], mu=0.5, alpha=1.0, threshold=0.1)[0] == [1.0, 0.0]
    # a continuous target: only rewards above the threshold are "correct"
    assert contrast_bonus([0.05, 0.5, 0.1], [0.0], mu=0.8, alpha=0.3, threshold=0.1)[0] == [0.0, 0.3, 0.0]
    # not-applicable samples stay None; no shuffled score -> rule undefined
    assert contrast_bonus([None, 1.0], [0.0], mu=0.8, alpha=0.3, threshold=0.1)[0] == [None, 0.3]
    assert contrast_bonus([1.0, 0.0], [], mu=0.8, alpha=0.3, threshold=0.1)[0] == [None, None]


def test_temporal_contrast_groups_and_metrics():
    completions = [
        A("right"),
        A("right"),
        A("left"),
        A("left"),
        A("up"),
        A("down"),
        A("down"),
        A("down"),
        A("x"),
        A("y"),
    ]
    answers = ["right"] * 4 + ["up"] * 4 + ["left"] * 2
    shuffled = [[A("right"), A("left")]] * 4 + [[A("up"), A("up")]] * 4 + [None] * 2
    logged = {}
    out = temporal_contrast(
        completions,
        prompts=["same question"] * 10,
        answer=answers,
        shuffled_completions=shuffled,
        group_id=[0] * 4 + [1] * 4 + [2] * 2,
        log_metric=logged.__setitem__,
    )
    assert out == [0.3, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None, None]
    assert logged == {
        "p_ordered": pytest.approx((0.5 + 0.25) / 2),
        "p_shuffled": pytest.approx(0.75),
        "bonus_group_fraction": 0.5,
    }


def test_temporal_contrast_options_and_target():
    comps = [A("0.5 to 1.5"), A("0 to 0.5")]
    common = dict(prompts=["q", "q"], answer=[[0.5, 1.5]] * 2, shuffled_completions=[[A("1.5 to 2")]] * 2)
    # target temporal_iou: r = [1, 0]; p̃ = 0 -> bonus to the first; mu/alpha/threshold are options
    assert temporal_contrast(comps, target="temporal_iou", alpha=0.5, **common) == [0.5, 0.0]
    assert temporal_contrast(comps, target="temporal_iou", threshold=1.0, **common) == [0.0, 0.0]
    # groups fall back to equal prompts when there is no group_id column
    out = temporal_contrast(
        [A("a"), A("b"), A("a"), A("a")],
        prompts=["p1", "p1", "p2", "p2"],
        answer=["a", "a", "b", "b"],
        shuffled_completions=[[A("b")]] * 2 + [[A("b")]] * 2,
    )
    assert out == [0.3, 0.0, 0.0, 0.0]  # p2: p = 0 < 0.8 * 1
    with pytest.raises(ValueError, match="must hold a list of completions"):
        temporal_contrast([A("a")], prompts=["p"], answer=["a"], shuffled_completions=["oops"])


def test_temporal_contrast_through_the_runner():
    runner = RewardRunner([("accuracy", 1.0, {}), ("temporal_contrast", 1.0, {"mu": 0.8, "alpha": 0.3})])
    completions = [A("left"), A("right"), A("left"), A("left")]
    columns = {
        "answer": ["left"] * 4,
        "group_id": [0, 0, 1, 1],
        "shuffled_completions": [[A("right")]] * 2 + [[A("left")]] * 2,
    }
    rewards, metrics = runner(completions, ["q"] * 4, columns)
    expected = torch.tensor([[1.0, 0.3], [0.0, 0.0], [1.0, 0.3], [1.0, 0.3]])  # group 1: p = p̃ = 1 >= 0.8
    torch.testing.assert_close(rewards, expected, atol=0, rtol=0)
    assert metrics["reward/temporal_contrast/bonus_group_fraction"] == 1.0
    assert metrics["reward/temporal_contrast/p_shuffled"] == 0.5
    runner.close()


TS = [0.0, 0.375, 0.75, 1.125, 1.5, 1.875]  # 6 frames sampled from 16 at 8 fps (linspace), 2 s of video


def test_temporal_iou_frames_uses_the_real_timestamps():
    comps = [A("1 to 2"), A("5 to 5"), A("0 to 6"), A("3 to 1"), A("1.5 to 2"), A("no span"), A("1 to 1")]
    n = len(comps)
    out = temporal_iou_frames(
        comps, answer=[[0.375, 1.125]] + [[1.5, 2.0]] * 6, frame_timestamps=[TS] * n, duration=[2.0] * n
    )
    # frames 1..2 cover [0.375, 1.125): exact; frame 5 covers [1.875, 2.0) of [1.5, 2.0]: 0.125 / 0.5
    # frame 6 does not exist; 3 > 1; 1.5 is not a frame; no span; frame 1 [0.375, 0.75) vs [1.5, 2]: disjoint
    assert out == [pytest.approx(1.0), pytest.approx(0.25), 0.0, 0.0, 0.0, 0.0, 0.0]
    one = temporal_iou_frames(
        [A("1 to 1")], answer=[[0.0, 0.375]], frame_timestamps=[TS], duration=[2.0], one_based=True
    )
    assert one == [pytest.approx(1.0)]
    assert temporal_iou_frames([A("0 to 1")], answer=[None], frame_timestamps=[TS], duration=[2.0]) == [None]
    assert temporal_iou_frames([A("0 to 1")], answer=[[0, 1]], frame_timestamps=[None], duration=[None]) == [None]
    assert "temporal_iou_frames" in dict(__import__("mmgrpo.rewards", fromlist=["list_rewards"]).list_rewards())


def test_temporal_iou_edge_cases_with_the_adapter_columns():
    # touching spans do not overlap; a prediction containing the truth scores |gt| / |pred|
    assert temporal_iou([A("0 to 0.5")], answer=[[0.5, 1.0]]) == [0.0]
    assert temporal_iou([A("0 to 2")], answer=[[0.5, 1.0]]) == [pytest.approx(0.25)]
    # a zero-length prediction inside a real span has no area: 0; equal instants: 1 (zero union guard)
    assert temporal_iou([A("0.5 to 0.5")], answer=[[0.0, 1.0]]) == [0.0]
    assert temporal_iou([A("1 to 1")], answer=[[1.0, 1.0]]) == [1.0]
    # normalised predictions use the decoded duration column the video adapter adds (2 s here)
    assert temporal_iou([A("0.25 to 0.5")], answer=[[0.5, 1.0]], pred_units="normalized", duration=[2.0]) == [1.0]
    # a prediction past the end of the clip is still scored against the truth (no clipping)
    assert temporal_iou([A("1.5 to 3")], answer=[[1.5, 2.0]]) == [pytest.approx(1 / 3)]
    # unparsable, missing tags, start > end
    assert temporal_iou([A("soon"), "1 to 2", A("2 to 1")], answer=[[1, 2]] * 3) == [0.0, 0.0, 0.0]
    # multi-span: overlapping predictions merge before the IoU
    assert multi_span_iou([A("0 to 1, 0.5 to 1.5")], answer=[[(0, 1.5)]]) == [pytest.approx(1.0)]
    assert multi_span_iou([A("0 to 0.5, 1 to 1.5")], answer=[[(0, 1.5)]]) == [pytest.approx(2 / 3)]


def test_load_by_name_with_options():
    fn = load_reward("temporal_contrast", mu=1.0, alpha=0.1)
    out = fn([A("a"), A("b")], prompts=["p", "p"], answer=["a", "a"], shuffled_completions=[[A("a")]] * 2)
    assert out == [0.0, 0.0]  # p = 0.5 < 1.0 * 1.0
