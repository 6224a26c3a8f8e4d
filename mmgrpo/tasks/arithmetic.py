"""A locally generated text task: one-step arithmetic word problems ("Tom has 8 apples. Tom gets 5 more apples.
How many apples does Tom have now?"), answered in free text and scored by the last number of the reply.

For text-only causal LMs through ``model.adapter: vlm`` (rows hold ``prompt`` and ``answer`` only). The reward
and the held-out metric are ``last_number`` (mmgrpo/rewards/text.py): a small instruct model answers
"Tom has 8 + 5 = 13 apples." without tags, so a pretrained model starts from its own accuracy, not from 0.

Each problem draws an operation from ``ops``, two operands in ``[min_value, max_value]`` (subtraction keeps the
result positive, multiplication uses operands up to ``max_factor``), a name, an item and one of a few phrasings.
Train and held-out rows come from different seeds, and a train problem whose text equals a held-out one is drawn
again, so every held-out question is unseen in training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Annotated, Literal

from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards

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


def make_problem(rng: random.Random, op: str, args: ArithmeticArgs) -> tuple[str, int]:
    """One word problem of operation ``op`` and its integer answer."""
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
    return (f"{question} {args.instruction}" if args.instruction else question), answer


class ArithmeticTask:
    """See the module docstring."""

    def __init__(self, args: ArithmeticArgs):
        if args.min_value > args.max_value:
            raise ConfigError(f"task.args.min_value ({args.min_value}) must be <= max_value ({args.max_value})")
        self.args = args
        self._metrics = EvalRewards([{"name": "last_number"}], "arithmetic")
        self._eval = self._make(args.eval_size, args.seed * 2 + 2, exclude=set())
        self._train = self._make(args.train_size, args.seed * 2 + 1, exclude={r["prompt"] for r in self._eval})

    def _make(self, n: int, seed: int, exclude: set[str]) -> list[dict]:
        rng, rows = random.Random(seed), []
        for i in range(n):
            op = self.args.ops[i % len(self.args.ops)]
            for _ in range(1000):
                prompt, answer = make_problem(rng, op, self.args)
                if prompt not in exclude:
                    break
            else:
                raise ConfigError("task.args: too few distinct problems for the held-out split; widen the ranges")
            rows.append({"prompt": prompt, "answer": answer, "question_type": op})
        return rows

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """``accuracy``: the ``last_number`` reward's mean (greedy replies); ``answered``: replies with a number."""
        from mmgrpo.rewards.parsing import parse_number

        answered = sum(parse_number(o, which="last", fractions=False) is not None for o in outputs)
        return {"accuracy": self._metrics.score(outputs, rows)["last_number"], "answered": answered / len(outputs)}


build_arithmetic_task = TASKS.register("arithmetic")(
    TaskSpec(args=ArithmeticArgs, cls=ArithmeticTask, load=lambda a, seed: ArithmeticTask(a))
)
