"""The one reward shape (rewards/_common.py ``per_answer``): signature, ground-truth column, None, extraction."""

import inspect

import pytest

from mmgrpo.config import ConfigError, check_kwargs
from mmgrpo.rewards import REWARDS
from mmgrpo.rewards._common import per_answer


@per_answer("toy_match")
def toy_match(pred, gt, *, which, scale: float = 1.0) -> float:
    """1·scale if the answer equals the ground truth (a hand example of the shape)."""
    return scale * float(pred == gt)


def test_per_answer_owns_lookup_none_and_extraction():
    completions = ["<answer>a</answer><answer>b</answer>", "b", "<answer>c</answer>", "<answer>x</answer>"]
    answers = ["b", "b", None, "x"]
    # which="last" reads b from the first; "b" has no tags, so (tags required) pred is None → 0; None gt → None.
    assert toy_match(completions, answer=answers) == [1.0, 0.0, None, 1.0]
    assert toy_match(completions, answer=answers, which="first", scale=2.0) == [0.0, 0.0, None, 2.0]
    assert toy_match(completions, answer=answers, require_tags=False) == [1.0, 1.0, None, 1.0]  # whole text
    assert toy_match(completions, solution=answers, answer_key="solution") == [1.0, 0.0, None, 1.0]
    with pytest.raises(KeyError, match="reward 'toy_match' needs the column 'answer'"):
        toy_match(completions, prompts=["p"] * 4, solution=answers)


def test_per_answer_exposes_the_public_reward_signature():
    params = inspect.signature(toy_match).parameters
    assert list(params) == ["completions", "prompts", "which", "answer_key", "require_tags", "scale", "columns"]
    assert params["scale"].kind is inspect.Parameter.KEYWORD_ONLY and params["scale"].default == 1.0
    assert params["columns"].kind is inspect.Parameter.VAR_KEYWORD
    assert check_kwargs(toy_match, {"scale": "2", "which": "first"}, "rewards[0].kwargs", skip=1) == {
        "scale": 2.0,  # coerced by the scoring function's annotation
        "which": "first",
    }
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.kwargs\.scale"):
        check_kwargs(toy_match, {"scale": "big"}, "rewards[0].kwargs", skip=1)


@pytest.mark.parametrize(
    "name", ["accuracy", "exact_match", "multiple_choice", "numeric", "last_number", "rouge", "bleu"]
)
def test_builtin_per_answer_rewards_keep_the_public_signature(name):
    params = inspect.signature(REWARDS.get(name)).parameters
    assert list(params)[:5] == ["completions", "prompts", "which", "answer_key", "require_tags"]
    assert list(params)[-1] == "columns"
    # its options, as the registry records them for typo checks of YAML kwargs
    assert REWARDS.get(name).reward_options[:3] == ("which", "answer_key", "require_tags")
