"""A locally generated text task: one-step arithmetic word problems ("Tom has 8 apples. Tom gets 5 more apples.
How many apples does Tom have now?"), answered in free text and scored by the last number of the reply.

For text-only causal LMs through ``model.adapter: vlm`` (rows hold ``prompt`` and ``answer`` only). The reward
and the held-out metric are ``last_number`` (mmgrpo/rewards/text.py): a small instruct model answers
"Tom has 8 + 5 = 13 apples." without tags, so a pretrained model starts from its own accuracy, not from 0.

Each problem draws an operation from ``ops``, two operands in ``[min_value, max_value]`` (subtraction keeps the
result positive, multiplication uses operands up to ``max_factor``), a name, an item and one of a few phrasings.
Train and held-out rows come from different seeds, and a train problem whose text equals a held-out one is drawn
again, so every held-out question is unseen in training.

Worked solutions (``reasoning``, for the step-wise variants of docs/variants.md). With ``terms: 3`` (or 4) a problem
is a chain of + / - changes to a running count ("Tom has 3 apples. Tom gets 4 more apples. Tom gives away 2
apples. How many apples does Tom have now?"), one intermediate result per change; ``phrasing: symbols`` writes it
"What is 3 + 4 - 2?" (the built-in tiny model did not learn to find the numbers in the word problems within a
warm-up of 200 steps; it does in symbols). With ``reasoning`` other than
``none`` every row carries its key steps (column ``key_steps``: ``["3 + 4 = 7", "7 - 2 = 5"]``, the form the
``step_rar`` reward matches) and the task has warm-up rows: the first ``warmup_size`` train rows with their worked
solution as the target, in one of two formats:

- ``steps``: R1-VL's structured reasoning (StepGRPO, arXiv 2503.12937 §3; the format its StepRVR reward checks,
  ``rewards/variants.py::step_rvr``): ``### Image Description:`` (here "none": a text task), ``### Rationales:``,
  ``### Step n:`` with one key step each, ``### The final answer is: 5``;
- ``think``: ``<think>3 + 4 = 7. 7 - 2 = 5.</think><answer>5</answer>``, the think block that TON's thought dropout
  empties (``warmup.thought_dropout``, mmgrpo/thoughts.py; arXiv 2505.16854 §3.1).

The warm-up teaches the format and, from ``warmup_size`` worked problems, some of the arithmetic; GRPO trains on
the whole train split, and held-out problems are never in it (with small ranges there are few distinct chains: 1-5
and two changes give about 290, so the held-out problems are the combinations that training never shows). The
``steps`` format's fixed headers cost about 60 of its ~88 tokens with the tiny model's tokenizer, which spells them
nearly letter by letter.

Hint tiers (``hints: true``, for Scaf-GRPO's scaffolding, ``mmgrpo.scaffold``): every row also carries
``hint_knowledge`` (what each of its operations means), ``hint_planning`` ("Start from 3.", "Add 4.", "Subtract 2.":
the order, no results) and ``hint_solution`` (its key steps with their results: for a one-step problem, the answer),
derived from the drawn numbers after the draw, so every other field of every row is unchanged.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards

THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)

NAMES = ["Tom", "Anna", "Sam", "Lily", "Ben", "Mia", "Leo", "Emma", "Max", "Zoe"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "shells"]
TEMPLATES = {
    "+": [
        "{n} has {a} {x}. {n} gets {b} more {x}. How many {x} does {n} have now?",
        "{n} has {a} {x} and buys {b} more. How many {x} does {n} have in total?",
        "There are {a} {x} in a box. {n} puts {b} more {x} in the box. How many {x} are in the box now?",
    ],
    "-": [
        "{n} has {a} {x}. {n} gives away {b} {x}. How many {x} does {n} have left?",
        "{n} had {a} {x} and lost {b} of them. How many {x} does {n} have now?",
        "There are {a} {x} in a box. {n} takes {b} {x} out. How many {x} are left in the box?",
    ],
    "*": [
        "{n} has {a} bags with {b} {x} in each bag. How many {x} does {n} have?",
        "There are {a} boxes and each box holds {b} {x}. How many {x} are there in all?",
    ],
}


@dataclass
class ArithmeticArgs:
    """Options under ``task.args`` for ``task.name: arithmetic``."""

    ops: Annotated[list[Literal["+", "-", "*"]], Range(ge=1)] = field(default_factory=lambda: ["+", "-"])
    """Operations to mix, drawn uniformly: + (gets more) | - (gives away; the result stays positive) | * (groups)."""
    min_value: Annotated[int, Range(ge=0)] = 2
    """Smallest operand of + and -."""
    max_value: Annotated[int, Range(ge=1)] = 20
    """Largest operand of + and -."""
    max_factor: Annotated[int, Range(ge=2)] = 9
    """Largest operand of * (both factors in [2, max_factor])."""
    instruction: str = ""
    """Text appended to every question after a space (e.g. "Answer with a number."); empty: the question alone."""
    train_size: Annotated[int, Range(ge=1)] = 1000
    """Rows in the train split."""
    eval_size: Annotated[int, Range(ge=1)] = 100
    """Rows in the held-out split."""
    seed: int = 1234
    """Base seed of the generator (train and eval use different derived seeds)."""
    terms: Annotated[int, Range(ge=2, le=4)] = 2
    """Numbers per problem: 2 = one operation (the default); 3 or 4 = a chain of + / - changes to a running count,
    one sentence each, the result of every step positive (``ops`` may then hold only + and -)."""
    reasoning: Literal["none", "steps", "think"] = "none"
    """Worked solutions: none (rows hold prompt and answer; no warm-up rows) | steps (R1-VL's ``### Step n:``
    format) | think (``<think>…</think><answer>…</answer>``); the latter two add the ``key_steps`` column and
    warm-up rows (see the module docstring)."""
    warmup_size: Annotated[int, Range(ge=1)] = 200
    """With ``reasoning``: the warm-up targets are the worked solutions of the first this many train rows."""
    phrasing: Literal["words", "symbols"] = "words"
    """Chains (``terms`` > 2) as word problems, or as symbols ("What is 3 + 4 - 2?"): the numbers at fixed places,
    which a model as small as the built-in tiny one can read (it did not learn to find them in the word problems)."""
    hints: bool = False
    """Add Scaf-GRPO's hint tiers to every row (``mmgrpo.scaffold``), derived from its key steps, least help first:
    ``hint_knowledge`` (what each operation means), ``hint_planning`` (the order of the operations, no results) and
    ``hint_solution`` (the key steps with their results); the rows' other fields are unchanged."""


CHAIN_SENTENCES = {"+": "{n} gets {b} more {x}.", "-": "{n} gives away {b} {x}."}
RATIONALE = "in order"  # short: the tiny tokenizer spells these headers nearly letter by letter
STEPS_HEADER = "### Image Description: none\n### Rationales: " + RATIONALE


def make_problem(rng: random.Random, op: str, args: ArithmeticArgs) -> tuple[str, int]:
    """One word problem of operation ``op`` and its integer answer."""
    question, answer, _ = make_worked_problem(rng, op, args)
    return question, answer


def make_worked_problem(rng: random.Random, op: str, args: ArithmeticArgs) -> tuple[str, int, list[str]]:
    """One word problem, its integer answer and its key steps (``"a + b = c"``, one per operation); ``op`` is the
    operation of a one-step problem (``terms: 2``), chains draw theirs from ``args.ops``."""
    if args.terms > 2:
        return make_chain(rng, args)
    if op == "*":
        a, b = rng.randint(2, args.max_factor), rng.randint(2, args.max_factor)
        answer = a * b
    else:
        a, b = rng.randint(args.min_value, args.max_value), rng.randint(args.min_value, args.max_value)
        if op == "-":
            a, b = max(a, b) + (a == b), min(a, b)  # a > b: a positive answer
        answer = a + b if op == "+" else a - b
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    question = rng.choice(TEMPLATES[op]).format(n=name, a=a, b=b, x=item)
    return _with_instruction(question, args), answer, [f"{a} {op} {b} = {answer}"]


def make_chain(rng: random.Random, args: ArithmeticArgs) -> tuple[str, int, list[str]]:
    """A chain of ``terms - 1`` changes to a running count and its key steps; a subtraction that would leave fewer
    than 1 becomes an addition."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(args.min_value, args.max_value)
    sentences, steps, symbols = [f"{name} has {total} {item}."], [], [str(total)]
    for _ in range(args.terms - 1):
        op, b = rng.choice(args.ops), rng.randint(args.min_value, args.max_value)
        op = "+" if op == "-" and total - b < 1 else op
        new = total + b if op == "+" else total - b
        sentences.append(CHAIN_SENTENCES[op].format(n=name, b=b, x=item))
        steps.append(f"{total} {op} {b} = {new}")
        symbols += [op, str(b)]
        total = new
    question = " ".join([*sentences, f"How many {item} does {name} have now?"])
    if args.phrasing == "symbols":
        question = f"What is {' '.join(symbols)}?"
    return _with_instruction(question, args), total, steps


def _with_instruction(question: str, args: ArithmeticArgs) -> str:
    return f"{question} {args.instruction}" if args.instruction else question


KNOWLEDGE = {
    "+": "Getting or putting in more means adding: the new amount is the first number plus the second.",
    "-": "Giving away, losing or taking out means subtracting: what is left is the first number minus the second.",
    "*": "Equal groups mean multiplying: the total is the number of groups times the amount in each group.",
}
PLANNING = {"+": "Add {b}.", "-": "Subtract {b}.", "*": "Multiply by {b}."}


def hint_tiers(steps: list[str]) -> dict[str, list[str]]:
    """Scaf-GRPO's three hint tiers of a problem from its key steps (``"a op b = c"``, one per operation), each a list
    of parts: knowledge (one per distinct operation), planning (the start, then each operation without its result),
    solution (the key steps)."""
    parsed = [step.split() for step in steps]  # [a, op, b, "=", c]
    ops = list(dict.fromkeys(op for _, op, *_ in parsed))
    planning = [f"Start from {parsed[0][0]}."] + [PLANNING[op].format(b=b) for _, op, b, *_ in parsed]
    return {
        "hint_knowledge": [KNOWLEDGE[op] for op in ops],
        "hint_planning": planning,
        "hint_solution": [f"{step}." for step in steps],
    }


def worked_solution(steps: list[str], answer: int, reasoning: str) -> str:
    """The warm-up target of a problem in format ``reasoning`` (steps | think; see the module docstring)."""
    if reasoning == "steps":
        body = "\n".join(f"### Step {i}: {step}" for i, step in enumerate(steps, 1))
        return f"{STEPS_HEADER}\n{body}\n### The final answer is: {answer}"
    if reasoning == "think":
        return f"<think>{' '.join(step + '.' for step in steps)}</think><answer>{answer}</answer>"
    raise ValueError(f"worked_solution: reasoning must be 'steps' or 'think', got {reasoning!r}")


class ArithmeticTask:
    """See the module docstring."""

    def __init__(self, args: ArithmeticArgs):
        if args.min_value > args.max_value:
            raise ConfigError(f"task.args.min_value ({args.min_value}) must be <= max_value ({args.max_value})")
        if args.terms > 2 and "*" in args.ops:
            raise ConfigError(
                f"task.args.ops: '*' makes one-step problems only; drop it or set terms: 2 (got {args.terms})"
            )
        self.args = args
        self._metrics = EvalRewards([{"name": "last_number"}], "arithmetic")
        self._eval = self._make(args.eval_size, args.seed * 2 + 2, exclude=set())
        self._train = self._make(args.train_size, args.seed * 2 + 1, exclude={r["prompt"] for r in self._eval})

    def _make(self, n: int, seed: int, exclude: set[str]) -> list[dict]:
        rng, rows = random.Random(seed), []
        for i in range(n):
            op = self.args.ops[i % len(self.args.ops)]
            for _ in range(1000):
                prompt, answer, steps = make_worked_problem(rng, op, self.args)
                if prompt not in exclude:
                    break
            else:
                raise ConfigError("task.args: too few distinct problems for the held-out split; widen the ranges")
            row = {"prompt": prompt, "answer": answer, "question_type": op if self.args.terms == 2 else "chain"}
            row = row if self.args.reasoning == "none" else dict(row, key_steps=steps)
            rows.append(row | hint_tiers(steps) if self.args.hints else row)
        return rows

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def warmup_rows(self, seed: int) -> list[dict]:
        """The first ``warmup_size`` train rows with their worked solution as ``target`` (``reasoning`` steps or
        think); without ``reasoning`` the task has no warm-up targets."""
        if self.args.reasoning == "none":
            raise ConfigError(
                "task.args.reasoning: none has no warm-up targets; set it to steps or think, or warmup.steps: 0"
            )
        rows = self._train[: self.args.warmup_size]
        return [dict(r, target=worked_solution(r["key_steps"], r["answer"], self.args.reasoning)) for r in rows]

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """``accuracy``: the ``last_number`` reward's mean (greedy replies); ``answered``: replies with a number.
        With ``reasoning``: ``reply_chars``, the mean reply length in characters, and ``thought_share``, the share
        of replies with a non-empty ``<think>`` block (TON's measure of when the policy thinks)."""
        from mmgrpo.rewards.parsing import parse_number

        answered = sum(parse_number(o, which="last", fractions=False) is not None for o in outputs)
        scores = {"accuracy": self._metrics.score(outputs, rows)["last_number"], "answered": answered / len(outputs)}
        if self.args.reasoning != "none":
            thought = sum(any(t.strip() for t in THINK.findall(o)) for o in outputs)
            scores |= {"reply_chars": sum(map(len, outputs)) / len(outputs), "thought_share": thought / len(outputs)}
        return scores


build_arithmetic_task = TASKS.register("arithmetic")(
    TaskSpec(args=ArithmeticArgs, cls=ArithmeticTask, load=lambda a, seed: ArithmeticTask(a))
)
