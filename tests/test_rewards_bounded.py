"""Every built-in reward is bounded (issue 21.3), reads whole expressions (``numeric``) and case-insensitive tags.

Hand-worked values: sqrt(5)/2 = 1.118034, sqrt(3)/2 = 0.866025, sqrt(8) = 2 sqrt(2) = 2.828427.
"""

from __future__ import annotations

import math
import time

import pytest

from mmgrpo.rewards import RewardError, RewardRunner, accuracy, format_reward, math_accuracy, numeric, regression
from mmgrpo.rewards import text as text_rewards
from mmgrpo.rewards.parsing import is_think_answer_format, parse_json, parse_points, parse_time_spans
from mmgrpo.rewards.text import math_value

TOWER = r"The answer is \boxed{9^{9^{9}}}"  # 9^387420489: sympy computes it exactly for minutes when comparing


def test_math_accuracy_on_a_power_tower_returns_within_timeout_under_default_settings():
    """Through the RewardRunner as the trainer builds it (default isolation, on_error), timeout_s=3."""
    runner = RewardRunner([("math_accuracy", 1.0, {})], timeout_s=3)
    assert runner.isolated == [True]  # registered unbounded=True: a worker process that timeout_s can kill
    t0 = time.monotonic()
    rewards, _ = runner([TOWER, r"\boxed{4}"], ["p", "p"], {"answer": ["5", "4"]})
    assert time.monotonic() - t0 < 3 + 2
    assert rewards[:, 0].tolist() == [0.0, 1.0]  # the tower is not a number it compares: a wrong answer


def test_math_accuracy_is_killed_at_timeout_even_without_its_own_bound(monkeypatch):
    """The size bound off (as for an input it does not foresee): the worker process is killed at timeout_s."""
    monkeypatch.setattr(text_rewards, "_too_large", lambda parsed: False)
    runner = RewardRunner([("math_accuracy", 1.0, {})], timeout_s=3)
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"timed out after 3s .*worker process was killed"):
        runner([TOWER], ["p"], {"answer": ["5"]})
    assert time.monotonic() - t0 < 3 + 2


def test_power_tower_scores_zero_quickly_when_called_directly():
    t0 = time.monotonic()
    assert math_accuracy([TOWER, r"\boxed{2^{10}}"], answer=["5", "1024"]) == [0.0, 1.0]
    assert numeric([f"<answer>{TOWER}</answer>"], answer=["5"]) == [0.0]
    assert time.monotonic() - t0 < 10  # minutes before; imports of sympy included


@pytest.mark.parametrize(
    "parse, text",
    [
        (parse_time_spans, "1" * 20_000),  # 71 s before: the span regex backtracked inside the digit run
        (is_think_answer_format, "<think>a</think><answer>" * 2_000),
        (parse_points, "(1,2)," * 8_000),
        (parse_json, "{" * 40_000),
    ],
)
def test_parsers_are_linear_on_adversarial_text(parse, text):
    t0 = time.monotonic()
    parse(text)
    assert time.monotonic() - t0 < 1.0


# --------------------------------------------------------------------------------------------- numeric


def test_numeric_compares_the_whole_expression():
    def ans(x):
        return f"<answer>{x}</answer>"

    # sqrt(5)/2 = 1.118 vs sqrt(3)/2 = 0.866: wrong (it was 1.0: both end in the number 2)
    assert numeric([ans(r"\dfrac{\sqrt5}{2}"), ans(r"\frac{\sqrt{3}}{2}")], answer=[r"\frac{\sqrt3}{2}"] * 2) == [
        0.0,
        1.0,
    ]
    # regression: 1 - |1.118034 - 0.866025| / 0.866025 = 1 - 0.290994 = 0.709006
    r = regression([ans(r"\dfrac{\sqrt5}{2}")], answer=[r"\frac{\sqrt3}{2}"])[0]
    assert r == pytest.approx(1 - (math.sqrt(5) - math.sqrt(3)) / math.sqrt(3), abs=1e-9)
    assert r == pytest.approx(0.709006, abs=1e-6)
    # a ground truth of \sqrt8 (it raised): 2\sqrt{2} and 2.828427 are right, 2.8 is not (rel_tol 1e-6)
    preds = [ans(r"2\sqrt{2}"), ans("2.8284271247"), ans("2.8"), ans(r"\sqrt{8}")]
    assert numeric(preds, answer=[r"\sqrt8"] * 4) == [1.0, 1.0, 0.0, 1.0]
    # plain numbers and prose as before
    assert numeric([ans("1,234.5"), ans("3/4"), ans("about 42 apples")], answer=["1234.5", "0.75", 42]) == [1.0] * 3
    assert math_value(r"x = \frac12") == 0.5 and math_value(r"\frac{1}{0}") is None and math_value("-2e3") == -2000.0
    with pytest.raises(ValueError, match=r"cannot read a number from the ground truth 'banana'"):
        numeric([ans("1")], answer=["banana"])


def test_answer_tags_are_case_insensitive_in_every_reward():
    for upper in ("<ANSWER>4</ANSWER>", "<Answer>4</answer>"):
        assert accuracy([upper], answer=["4"]) == [1.0]
        assert numeric([upper], answer=["4"]) == [1.0]
        assert math_accuracy([upper], answer=["4"]) == [1.0]
        assert format_reward([upper], think=False) == [1.0]
    assert format_reward(["<THINK>x</THINK> <ANSWER>4</ANSWER>"]) == [1.0]
    assert format_reward(["<answer>4</answer><ANSWER>5</ANSWER>"], think=False) == [0.0]  # two blocks: as before
    assert accuracy(["<ANSWER>5</ANSWER>"], answer=["4"]) == [0.0]
