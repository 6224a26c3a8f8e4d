"""The shapes task's multi-answer ``colours`` question (TW-GRPO's multi-choice soft reward) and the one-answer
questions' rows it must leave unchanged."""

import hashlib
import random

import pytest

from mmgrpo.rewards import multiple_choice_partial
from mmgrpo.rewards.parsing import parse_choice_set
from mmgrpo.tasks.shapes import COLOURS, ShapesArgs, ShapesTask, render, render_shapes


def _fingerprint(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(r["prompt"].encode() + r["answer"].encode() + r["image"].tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(
    "questions, digest",
    [
        (["colour"], "776daf406ac13dcb"),
        (["shape"], "0c14113a2d036aa4"),
        (["count"], "bc4e998d0c22e183"),
        (["colour", "shape", "count"], "e1c99b7bbaa08dc1"),
    ],
)
def test_one_answer_rows_unchanged(questions, digest):
    """Prompts, answers and image bytes of the existing question types (the quickstart's rows), as before the
    ``colours`` question existed (digests taken from the code without it)."""
    task = ShapesTask(ShapesArgs(questions=questions, train_size=12, eval_size=4))
    assert _fingerprint(task.train_rows() + task.eval_rows()) == digest


def test_render_is_render_shapes_with_one_kind_and_colour():
    a = render(random.Random(3), 56, 3, "circle", "red")
    b = render_shapes(random.Random(3), 56, [("circle", "red")] * 3)
    assert a.tobytes() == b.tobytes()


def test_colours_rows_by_hand():
    task = ShapesTask(ShapesArgs(questions=["colours"], train_size=50, eval_size=10))
    rows = task.train_rows()
    assert rows[0]["prompt"] == (
        "Which colours are in the image? A red, B green, C blue, D yellow, E purple, F orange. "
        "Answer with the letters of all that apply, e.g. <answer>A, C</answer>."
    )
    for r in rows:
        letters = r["answer"].split(", ")
        assert 2 <= len(letters) <= 3 and letters == sorted(set(letters)) and set(letters) <= set("ABCDEF")
        # the colours in the image are exactly the answer's: each present colour has pixels near its RGB
        # (jitter ±20), no other colour has any
        pixels = {rgb for _, rgb in r["image"].getcolors(maxcolors=56 * 56)}
        present = {
            letter for letter, rgb in zip("ABCDEF", COLOURS.values())
            if any(all(abs(p[k] - rgb[k]) <= 20 for k in range(3)) for p in pixels)
        }  # fmt: skip
        assert present == set(letters), r["answer"]
    assert {len(r["answer"].split(", ")) for r in rows} == {2, 3}
    assert len(task.answers("colours")) == 15 + 20  # C(6,2) + C(6,3) letter sets
    assert task.answers("colours")[:2] == ["A, B", "A, B, C"]


def test_colours_with_a_subset_of_colours():
    task = ShapesTask(ShapesArgs(questions=["colours"], colours=["blue", "red"], train_size=5, eval_size=1))
    assert "A blue, B red." in task.train_rows()[0]["prompt"]
    assert {r["answer"] for r in task.train_rows()} == {"A, B"}
    assert task.answers("colours") == ["A, B"]


def test_colours_warmup_targets_are_image_independent_letter_sets():
    task = ShapesTask(ShapesArgs(questions=["colours"], train_size=200, eval_size=1))
    targets = [r["target"] for r in task.warmup_rows(seed=0)]
    assert all(t.startswith("<answer>") and t[8:-9] in task.answers("colours") for t in targets)
    hits = sum(t[8:-9] == r["answer"] for t, r in zip(targets, task.train_rows()))
    assert hits < 200 * 0.1  # about 1 in 35 by chance
    assert targets == [r["target"] for r in task.warmup_rows(seed=0)]


def test_partial_reward_and_score_on_a_row():
    task = ShapesTask(ShapesArgs(questions=["colours"], train_size=1, eval_size=3))
    rows = task.eval_rows()
    gt = rows[0]["answer"]
    g = sorted(parse_choice_set(gt))
    wrong = next(c for c in "ABCDEF" if c not in g)
    replies = [f"<answer>{gt}</answer>", f"<answer>{g[0]}</answer>", f"<answer>{g[0]}, {wrong}</answer>"]
    rewards = multiple_choice_partial(replies, answer=[gt] * 3)
    assert rewards == [1.0, pytest.approx(1 / len(g)), 0.0]
    # score: exact set in any order counts for set_accuracy, not for the exact-match accuracy
    reordered = ", ".join(sorted(parse_choice_set(rows[1]["answer"]), reverse=True))
    outputs = [f"<answer>{rows[0]['answer']}</answer>", f"<answer>{reordered}</answer>", "<answer>Z</answer>"]
    metrics = task.score(outputs, rows)
    assert metrics["set_accuracy"] == pytest.approx(2 / 3)
    assert metrics["accuracy"] == pytest.approx(1 / 3)
    assert metrics["partial"] == pytest.approx(2 / 3)
    assert metrics["chance"] == pytest.approx(1 / 35)


def test_score_of_one_answer_questions_has_no_set_metrics():
    task = ShapesTask(ShapesArgs(train_size=1, eval_size=2))
    rows = task.eval_rows()
    assert set(task.score([f"<answer>{r['answer']}</answer>" for r in rows], rows)) == {"accuracy", "format", "chance"}
