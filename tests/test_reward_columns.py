"""score_rows: the columns the rewards receive, for datasets whose rows differ (mixed, routed tasks)."""

import torch

from mmgrpo.rewards import RewardRunner, score_rows


class _Recorder:
    """A stand-in runner that records what ``score_rows`` passes it."""

    def __call__(self, completions, prompts, columns, **kwargs):
        self.completions, self.prompts, self.columns, self.kwargs = completions, prompts, columns, kwargs
        return torch.zeros(len(completions), 1), {}


def test_union_of_keys_over_all_rows_missing_as_none():
    rows = [
        {"prompt": "count", "answer": "3", "reward_type": "count"},
        {"prompt": "where", "solution": "<answer>[1, 2, 3, 4]</answer>", "image_size": (64, 32), "reward_type": "box"},
    ]
    run = _Recorder()
    score_rows(run, list("abcd"), rows, group_size=2, extras={"completion_ids": [[1], [2], [3], [4]]})
    assert run.prompts == ["count", "count", "where", "where"]
    assert run.completions == list("abcd") and run.kwargs == {}
    assert list(run.columns) == ["answer", "reward_type", "solution", "image_size", "completion_ids"]
    assert run.columns == {
        "answer": ["3", "3", None, None],
        "reward_type": ["count", "count", "box", "box"],
        "solution": [None, None, "<answer>[1, 2, 3, 4]</answer>", "<answer>[1, 2, 3, 4]</answer>"],
        "image_size": [None, None, (64, 32), (64, 32)],
        "completion_ids": [[1], [2], [3], [4]],
    }


def test_rows_repeat_group_major_with_group_index_and_call_kwargs():
    rows = [{"prompt": "p0", "answer": "a"}, {"prompt": "p1", "answer": "b", "hint": "h"}]
    run = _Recorder()
    score_rows(run, list("abcdef"), rows, 3, {"extra": [1, 2, 3, 4, 5, 6]}, group_index=True, trainer_state="S")
    assert run.prompts == ["p0", "p0", "p0", "p1", "p1", "p1"]
    assert run.columns == {
        "answer": ["a", "a", "a", "b", "b", "b"],
        "hint": [None, None, None, "h", "h", "h"],
        "extra": [1, 2, 3, 4, 5, 6],
        "group_index": [0, 0, 0, 1, 1, 1],
    }
    assert run.kwargs == {"trainer_state": "S"}
    score_rows(run, list("ab"), rows)  # G = 1, no group_index unless asked
    assert run.prompts == ["p0", "p1"] and run.columns == {"answer": ["a", "b"], "hint": [None, "h"]}
    score_rows(run, list("ab"), rows, extras={"group_index": [7, 7]}, group_index=True)  # given ones are kept
    assert run.columns["group_index"] == [7, 7]


def test_routed_rewards_see_the_columns_of_later_rows():
    rows = [
        {"prompt": "p0", "answer": "3", "reward_type": "text"},
        {"prompt": "p1", "solution": "<answer> 7 </answer>", "reward_type": "tagged"},
    ]
    runner = RewardRunner(
        [("accuracy", 1.0, {}), ("accuracy", 1.0, {"answer_key": "solution"})],
        reward_types=[["text"], ["tagged"]],
    )
    completions = ["<answer>3</answer>", "<answer>4</answer>", "<answer>7</answer>", "<answer>3</answer>"]
    rewards, _ = score_rows(runner, completions, rows, group_size=2)
    assert torch.equal(torch.isnan(rewards), torch.tensor([[False, True]] * 2 + [[True, False]] * 2))
    assert rewards[:2, 0].tolist() == [1.0, 0.0] and rewards[2:, 1].tolist() == [1.0, 0.0]
