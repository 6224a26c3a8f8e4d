"""The zoom task (mmgrpo/tasks/zoom.py): the answer is hardly legible at the policy's input resolution and plain in
the crop of the prompt's box; the warm-up targets teach the crop call of that box; the rows are deterministic."""

import numpy as np
from PIL import Image

from mmgrpo.tasks.shapes import COLOURS
from mmgrpo.tasks.zoom import ZoomArgs, ZoomTask, crop_call
from mmgrpo.tools import ToolContext, get_tool, parse_tool_calls


def _oracle(view: Image.Image, box: list[int], colours: list[str]) -> str:
    """A matched filter on 14-pixel patch means (what one ViT patch averages) that knows the box and the palette:
    the colour most aligned with the box's most deviant patch, relative to the mean patch of the whole view."""
    a = np.asarray(view, dtype=float)
    n = a.shape[0] // 14
    patches = a[: n * 14, : n * 14].reshape(n, 14, n, 14, 3).mean((1, 3))  # [n, n, 3]
    mean = patches.reshape(-1, 3).mean(0)
    x1, y1, x2, y2 = box[0] // 14, box[1] // 14, -(-box[2] // 14), -(-box[3] // 14)  # every patch the box touches
    inside = patches[y1:y2, x1:x2].reshape(-1, 3)
    scores = {}
    for c in colours:
        v = np.array(COLOURS[c], dtype=float) - mean
        scores[c] = float(((inside - mean) @ (v / np.linalg.norm(v))).max())
    return max(scores, key=scores.get)


def test_the_crop_of_the_prompts_box_makes_the_answer_legible():
    """At the configs' policy input (the 448-px image at 56 x 56, max_pixels 3136) the box is one 7-px region and the
    24-px square 3 x 3 pixels of a checkerboard that averages out: the patch-mean oracle reads 0.43 on 200 rows
    (chance 0.25); on the crop of the box (56 x 56, shown 1 : 1) it reads 0.975."""
    task = ZoomTask(ZoomArgs(train_size=200, eval_size=1))
    crop = get_tool("crop")
    full = cropped = 0
    for row in task.train_rows():
        assert str(row["box"]) in row["prompt"] and row["box"] in task.boxes()
        view = row["image"].resize((56, 56), Image.Resampling.BICUBIC)  # what the policy sees
        full += _oracle(view, [c // 8 for c in row["box"]], task.args.colours) == row["answer"]
        obs = crop({"bbox_2d": row["box"]}, ToolContext(images=[row["image"]]))
        assert obs.error is None and obs.images[0].size == (56, 56)
        cropped += _oracle(obs.images[0], [0, 0, 56, 56], task.args.colours) == row["answer"]
    assert full / 200 < 0.5 and cropped / 200 > 0.9, (full, cropped)


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
    assert task.score(outputs, rows) == {"accuracy": 0.5, "tool_call_rate": 0.5, "crop_hits_box": 0.0, "chance": 0.25}
    hit = [crop_call(rows[0]["box"]) + "\n<answer>x</answer>", crop_call([0, 0, 56, 56]) + "<answer>x</answer>"]
    assert task.score(hit, rows)["crop_hits_box"] == (0.5 if rows[1]["box"] != [0, 0, 56, 56] else 1.0)


def test_boxes_are_centred_in_the_grid_cells():
    assert ZoomTask(ZoomArgs(train_size=1, eval_size=1)).boxes() == [
        [84, 84, 140, 140],
        [308, 84, 364, 140],
        [84, 308, 140, 364],
        [308, 308, 364, 364],
    ]
    assert ZoomTask(ZoomArgs(grid=4, box=None, image_size=448, train_size=1, eval_size=1)).boxes()[5] == [
        112,
        112,
        224,
        224,
    ]


def test_rows_are_deterministic():
    a, b = ZoomTask(ZoomArgs(train_size=3, eval_size=2)), ZoomTask(ZoomArgs(train_size=3, eval_size=2))
    for x, y in zip(a.train_rows() + a.eval_rows(), b.train_rows() + b.eval_rows()):
        assert x["image"].tobytes() == y["image"].tobytes() and x["prompt"] == y["prompt"] and x["box"] == y["box"]
    assert a.train_rows()[0]["image"].tobytes() != a.eval_rows()[0]["image"].tobytes()
