"""The ``arithmetic`` task (mmgrpo/tasks/arithmetic.py): problems worked by hand, disjoint splits, the metric."""

import random

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_builtins
from mmgrpo.plugins import TASKS
from mmgrpo.tasks.arithmetic import ArithmeticArgs, make_problem, make_worked_problem, worked_solution


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


class _Queued(random.Random):
    """randint returns its queued values, choice the first option."""

    def __init__(self, values):
        super().__init__(0)
        self.values = list(values)

    def randint(self, a, b):
        return self.values.pop(0)

    def choice(self, seq):
        return seq[0]


def test_a_problem_worked_by_hand():
    args = ArithmeticArgs(instruction="Answer with a number.")
    assert make_problem(_Queued([8, 5]), "+", args) == (
        "Tom has 8 apples. Tom gets 5 more apples. How many apples does Tom have now? Answer with a number.",
        13,
    )
    assert make_problem(_Queued([5, 8]), "-", args)[1] == 3  # the larger number comes first
    assert make_problem(_Queued([7, 7]), "-", args)[0].startswith("Tom has 8 apples. Tom gives away 7 apples.")
    assert make_problem(_Queued([3, 4]), "*", ArithmeticArgs()) == (
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


# --- worked solutions: chains, key steps, warm-up targets (StepGRPO, TON; docs/variants.md) -----------------------


def test_a_chain_worked_by_hand():
    args = ArithmeticArgs(ops=["-"], terms=3, min_value=1, max_value=5)
    # 3, then "- 4" would leave -1 (< 1): it becomes "+ 4"; then "- 2"
    assert make_worked_problem(_Queued([3, 4, 2]), "-", args) == (
        "Tom has 3 apples. Tom gets 4 more apples. Tom gives away 2 apples. How many apples does Tom have now?",
        5,
        ["3 + 4 = 7", "7 - 2 = 5"],
    )
    symbols = ArithmeticArgs(ops=["-"], terms=4, min_value=1, max_value=9, phrasing="symbols")
    assert make_worked_problem(_Queued([9, 4, 2, 1]), "-", symbols) == (
        "What is 9 - 4 - 2 - 1?",
        2,
        ["9 - 4 = 5", "5 - 2 = 3", "3 - 1 = 2"],
    )
    assert make_worked_problem(_Queued([8, 5]), "+", ArithmeticArgs())[2] == ["8 + 5 = 13"]  # one step


def test_worked_solutions_are_what_the_step_rewards_and_thought_dropout_read():
    from mmgrpo.rewards.text import accuracy, format_reward
    from mmgrpo.rewards.variants import step_rar, step_rvr
    from mmgrpo.thoughts import drop_thoughts

    steps = worked_solution(["3 + 4 = 7", "7 - 2 = 5"], 5, "steps")
    assert steps == (
        "### Image Description: none\n### Rationales: in order\n"
        "### Step 1: 3 + 4 = 7\n### Step 2: 7 - 2 = 5\n### The final answer is: 5"
    )
    key = [["3 + 4 = 7", "7 - 2 = 5"]]
    assert step_rvr([steps]) == [1.0]
    assert step_rar([steps, steps.replace("7 - 2", "7 - 3")], answer=[5, 5], key_steps=key * 2) == [
        pytest.approx(1.1),
        pytest.approx(1.05),  # right answer, one of the two key steps
    ]
    think = worked_solution(["3 + 4 = 7", "7 - 2 = 5"], 5, "think")
    assert think == "<think>3 + 4 = 7. 7 - 2 = 5.</think><answer>5</answer>"
    dropped = drop_thoughts([{"target": think}], 1.0, seed=0)[0]["target"]
    assert dropped == "<think>\n\n</think><answer>5</answer>"
    assert accuracy([think, dropped], answer=[5, 5]) == [1.0, 1.0]
    assert format_reward([think, dropped], think=True) == [1.0, 1.0]
    with pytest.raises(ValueError, match="reasoning must be 'steps' or 'think'"):
        worked_solution(["1 + 1 = 2"], 2, "none")


def test_chain_rows_carry_their_key_steps_and_warmup_targets():
    task = _task(ops=["+", "-"], terms=3, min_value=1, max_value=5, reasoning="think", phrasing="symbols",
                 train_size=300, eval_size=40, warmup_size=7)  # fmt: skip
    for row in task.train_rows() + task.eval_rows():
        words = row["prompt"].rstrip("?").split()  # What is a op b op c
        total = int(words[2])
        for step, op, b in zip(row["key_steps"], words[3::2], words[4::2], strict=True):
            new = total + int(b) if op == "+" else total - int(b)
            assert step == f"{total} {op} {b} = {new}" and new >= 1, row
            total = new
        assert row["answer"] == total and row["question_type"] == "chain"
    warm = task.warmup_rows(seed=0)
    assert [{k: v for k, v in r.items() if k != "target"} for r in warm] == task.train_rows()[:7]
    assert all(r["target"] == worked_solution(r["key_steps"], r["answer"], "think") for r in warm)
    assert "key_steps" not in _task(train_size=4, eval_size=4).train_rows()[0]  # reasoning: none, as before


def test_score_with_reasoning_adds_reply_length_and_thought_share():
    task = _task(terms=3, reasoning="think", train_size=4, eval_size=4)
    replies = ["<think>1 + 4 = 5.</think><answer>5</answer>", "<think>\n\n</think><answer>4</answer>"]
    assert task.score(replies, [{"prompt": "p", "answer": 5}] * 2) == {
        "accuracy": pytest.approx(0.5),
        "answered": pytest.approx(1.0),
        "reply_chars": pytest.approx((43 + 35) / 2),
        "thought_share": pytest.approx(0.5),
    }


def test_chain_options_fail_in_one_line():
    with pytest.raises(ConfigError, match=r"task.args.ops: '\*' makes one-step problems only; drop it or set terms: 2"):
        _task(ops=["+", "*"], terms=3)
    with pytest.raises(ConfigError, match=r"task.args.reasoning: none has no warm-up targets"):
        _task(train_size=4, eval_size=4).warmup_rows(seed=0)


@pytest.mark.slow
def test_thought_dropout_decides_whether_the_warmed_up_policy_thinks(tmp_path, mmgrpo_cache):
    """configs/variant_thought_dropout.yaml with a shorter warm-up and one GRPO step: warmed up on the worked
    solutions with every thought kept, the tiny model answers held-out chains with a think block and gets some
    right (the random init answers none); with every thought dropped (rate 1) it answers with the empty thought only,
    in fewer characters."""
    from mmgrpo.loader import load_config
    from mmgrpo.trainer import train

    common = [
        *("steps=1", "warmup.steps=100", "task.args.eval_size=60", "eval.every=0", "eval.after=false"),
        *("algorithm.prompts_per_step=2", "logging.progress=false", "logging.trackers=[]", "logging.plot=false"),
    ]
    runs = {}
    for rate in (0.0, 1.0):
        over = [*common, f"warmup.thought_dropout={rate}", f"output_dir={tmp_path / str(rate)}"]
        cfg = load_config("configs/variant_thought_dropout.yaml", over)
        runs[rate] = train(cfg)
    kept, dropped = runs[0.0], runs[1.0]
    assert kept["eval/before/accuracy"] == 0.0 and kept["eval/warmup/accuracy"] >= 0.1, kept
    assert kept["eval/warmup/thought_share"] >= 0.9 and dropped["eval/warmup/thought_share"] == 0.0, (kept, dropped)
    assert dropped["eval/warmup/reply_chars"] < 0.8 * kept["eval/warmup/reply_chars"], (kept, dropped)
