"""The ``arithmetic`` task (mmgrpo/tasks/arithmetic.py): problems worked by hand, disjoint splits, the metric."""

import random

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_builtins
from mmgrpo.plugins import TASKS
from mmgrpo.tasks.arithmetic import ArithmeticArgs, make_problem


def _task(**args):
    load_builtins()
    return TASKS.get("arithmetic")(args, seed=0)


def test_answers_are_the_arithmetic_of_the_numbers_in_the_question():
    task = _task(ops=["+", "-", "*"], train_size=300, eval_size=60)
    for row in task.train_rows() + task.eval_rows():
        a, b = (int(w) for w in row["prompt"].replace(".", " ").split() if w.isdigit())
        want = {"+": a + b, "-": a - b, "*": a * b}[row["question_type"]]
        assert row["answer"] == want and row["answer"] > 0, row
        if row["question_type"] == "*":
            assert 2 <= a <= 9 and 2 <= b <= 9
        else:
            assert min(a, b) >= 2 and max(a, b) <= 21  # a tie a == b becomes a + 1 - b for "-"
    assert {r["question_type"] for r in task.eval_rows()} == {"+", "-", "*"}


def test_a_problem_worked_by_hand():
    class Fixed(random.Random):  # randint returns its queued values, choice the first option
        def __init__(self, values):
            super().__init__(0)
            self.values = list(values)

        def randint(self, a, b):
            return self.values.pop(0)

        def choice(self, seq):
            return seq[0]

    args = ArithmeticArgs(instruction="Answer with a number.")
    assert make_problem(Fixed([8, 5]), "+", args) == (
        "Tom has 8 apples. Tom gets 5 more apples. How many apples does Tom have now? Answer with a number.",
        13,
    )
    assert make_problem(Fixed([5, 8]), "-", args)[1] == 3  # the larger number comes first
    assert make_problem(Fixed([7, 7]), "-", args)[0].startswith("Tom has 8 apples. Tom gives away 7 apples.")
    assert make_problem(Fixed([3, 4]), "*", ArithmeticArgs()) == (
        "Tom has 3 bags with 4 apples in each bag. How many apples does Tom have?",
        12,
    )


def test_the_splits_are_disjoint_seeded_and_independent_of_the_run_seed():
    load_builtins()
    spec = TASKS.get("arithmetic")
    a, b = spec({"train_size": 2000, "eval_size": 100}, seed=0), spec({"train_size": 2000, "eval_size": 100}, seed=7)
    assert a.eval_rows() == b.eval_rows() and a.train_rows() == b.train_rows()  # task.args.seed decides the data
    assert not {r["prompt"] for r in a.train_rows()} & {r["prompt"] for r in a.eval_rows()}
    other = spec({"train_size": 10, "eval_size": 100, "seed": 99}, seed=0)
    assert other.eval_rows() != a.eval_rows()


def test_score_is_the_last_number_accuracy_of_the_replies():
    task = _task(train_size=4, eval_size=4)
    rows = [{"prompt": "p", "answer": 13}, {"prompt": "p", "answer": 3}, {"prompt": "p", "answer": 7}]
    replies = ["Tom has 8 + 5 = 13 apples.", "Sam has 8 - 5 =", "I cannot tell."]
    assert task.score(replies, rows) == {"accuracy": pytest.approx(1 / 3), "answered": pytest.approx(2 / 3)}


def test_bad_ranges_fail_in_one_line():
    with pytest.raises(ConfigError, match=r"task.args.min_value \(9\) must be <= max_value \(3\)"):
        _task(min_value=9, max_value=3)
    with pytest.raises(ConfigError, match="too few distinct problems"):
        _task(ops=["*"], max_factor=2, train_size=1, eval_size=3000)  # 160 problems, all held out
