"""The zoom task (mmgrpo/tasks/zoom.py): the answer is hardly legible at the policy's input resolution and plain in
the crop of the prompt's box; the warm-up targets teach the crop call of that box."""

import numpy as np
from PIL import Image

from mmgrpo.tasks.shapes import COLOURS
from mmgrpo.tasks.zoom import ZoomArgs, ZoomTask
from mmgrpo.tools import ToolContext, get_tool, parse_tool_calls


def _oracle(image: Image.Image, colours: list[str]) -> str:
    """A matched filter that knows the palette: the colour most aligned with the most deviant 14-pixel patch."""
    a = np.asarray(image, dtype=float)
    n = a.shape[0] // 14
    patches = a[: n * 14, : n * 14].reshape(n, 14, n, 14, 3).mean((1, 3)).reshape(-1, 3)
    mean = patches.mean(0)
    scores = {}
    for c in colours:
        v = np.array(COLOURS[c], dtype=float) - mean
        scores[c] = float(((patches - mean) @ (v / np.linalg.norm(v))).max())
    return max(scores, key=scores.get)


def test_the_crop_of_the_prompts_box_makes_the_answer_legible():
    task = ZoomTask(ZoomArgs(train_size=60, eval_size=1))
    crop = get_tool("crop")
    full = cropped = 0
    for row in task.train_rows():
        assert str(row["box"]) in row["prompt"]
        x1, y1, x2, y2 = (c // 4 for c in row["box"])  # the box at the policy's 112 x 112 input
        small = row["image"].resize((112, 112), Image.Resampling.BICUBIC).crop((x1, y1, x2, y2))
        full += _oracle(small, task.args.colours) == row["answer"]
        obs = crop({"bbox_2d": row["box"]}, ToolContext(images=[row["image"]]))
        assert obs.error is None and obs.images[0].size == (112, 112)
        cropped += _oracle(obs.images[0], task.args.colours) == row["answer"]
    assert full / 60 < 0.55 and cropped / 60 > 0.8, (full, cropped)


def test_warmup_targets_teach_the_crop_call_then_a_random_answer():
    task = ZoomTask(ZoomArgs(train_size=40, eval_size=1))
    rows = task.warmup_rows(seed=0)
    for row in rows:
        call, answer = row["target"]
        (parsed,), errors = parse_tool_calls(call)
        assert not errors and parsed.name == "crop" and parsed.arguments == {"bbox_2d": row["box"]}
        assert answer.startswith("<answer>") and answer.endswith("</answer>")
    agree = sum(row["target"][1] == f"<answer>{row['answer']}</answer>" for row in rows)
    assert agree < 20  # random answers (chance 1/4), not the truth
    plain = ZoomTask(ZoomArgs(tools=False, train_size=4, eval_size=1))
    assert all(isinstance(r["target"], str) and "crop" not in r["prompt"] for r in plain.warmup_rows(0))
    assert [r["image"].tobytes() for r in plain.train_rows()] == [r["image"].tobytes() for r in rows[:4]]


def test_score_reads_the_last_answer_and_counts_tool_calls():
    task = ZoomTask(ZoomArgs(train_size=1, eval_size=2))
    rows = task.eval_rows()
    outputs = [f'<tool_call>{{"name": "crop"}}</tool_call>\n<answer>{rows[0]["answer"]}</answer>', "<answer>x</answer>"]
    assert task.score(outputs, rows) == {"accuracy": 0.5, "tool_call_rate": 0.5, "chance": 0.25}
