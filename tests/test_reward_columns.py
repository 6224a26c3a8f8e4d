"""reward_columns: the columns the rewards receive, for datasets whose rows differ (mixed, routed tasks)."""

import torch

from mmgrpo.rewards import RewardRunner
from mmgrpo.trainer import reward_columns


def test_union_of_keys_over_all_rows_missing_as_none():
    rows = [
        {"prompt": "count", "answer": "3", "reward_type": "count"},
        {"prompt": "where", "solution": "<answer>[1, 2, 3, 4]</answer>", "image_size": (64, 32), "reward_type": "box"},
    ]
    prompts, columns = reward_columns(rows, group_size=2, extras={"completion_ids": [[1], [2], [3], [4]]})
    assert prompts == ["count", "count", "where", "where"]
    assert list(columns) == ["answer", "reward_type", "solution", "image_size", "completion_ids"]
    assert columns["answer"] == ["3", "3", None, None]
    assert columns["solution"] == [None, None] + ["<answer>[1, 2, 3, 4]</answer>"] * 2
    assert columns["image_size"] == [None, None, (64, 32), (64, 32)]


def test_routed_rewards_see_the_columns_of_later_rows():
    rows = [
        {"prompt": "p0", "answer": "3", "reward_type": "text"},
        {"prompt": "p1", "solution": "<answer> 7 </answer>", "reward_type": "tagged"},
    ]
    prompts, columns = reward_columns(rows, group_size=2, extras={})
    runner = RewardRunner(
        [("accuracy", 1.0, {}), ("accuracy", 1.0, {"answer_key": "solution"})],
        reward_types=[["text"], ["tagged"]],
    )
    completions = ["<answer>3</answer>", "<answer>4</answer>", "<answer>7</answer>", "<answer>3</answer>"]
    rewards, _ = runner(completions, prompts, columns)
    assert torch.equal(torch.isnan(rewards), torch.tensor([[False, True]] * 2 + [[True, False]] * 2))
    assert rewards[:2, 0].tolist() == [1.0, 0.0] and rewards[2:, 1].tolist() == [1.0, 0.0]
