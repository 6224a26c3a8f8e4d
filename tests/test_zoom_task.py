"""The zoom task (mmgrpo/tasks/zoom.py): every box holds a square of its own colour; the prompt's box's colour is
hardly legible at the policy's input resolution and plain in the crop of that box; the warm-up's crop calls are drawn
at random among the boxes and its answers are the colour of the box cropped; the rows are deterministic."""

import numpy as np
import pytest
from PIL import Image

from mmgrpo.config import ConfigError
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


def _solid_squares(image: Image.Image, side: int, colours: list[str]) -> list[str]:
    """The colours of which ``image`` holds a solid ``side`` × ``side`` square (exact pixel values; the 4-pixel
    checkerboard of random palette colours practically never makes one)."""
    a = np.asarray(image).astype(int)
    found = []
    for c in colours:
        hit = (a == np.array(COLOURS[c])).all(-1).astype(int)  # [H, W]
        s = np.pad(hit.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
        window = s[side:, side:] - s[:-side, side:] - s[side:, :-side] + s[:-side, :-side]
        if (window == side * side).any():
            found.append(c)
    return found


def test_the_crop_of_the_prompts_box_makes_the_answer_legible():
    """At the configs' policy input (the 448-px image at 56 x 56, max_pixels 3136) a box is one 7-px region and its
    24-px square 3 x 3 pixels of a checkerboard that averages out: the patch-mean oracle reads the prompt's box's
    colour on 0.515 of 200 rows (chance 0.25; the other boxes' squares shift the view's mean); on the crop of that
    box (56 x 56, shown 1 : 1) on 0.975."""
    task = ZoomTask(ZoomArgs(train_size=200, eval_size=1))
    crop = get_tool("crop")
    full = cropped = 0
    for row in task.train_rows():
        assert str(row["box"]) in row["prompt"] and row["box"] in task.boxes()
        assert sorted(row["colours"]) == sorted(task.args.colours)  # one square per box, each its own colour
        assert row["answer"] == row["colours"][task.boxes().index(row["box"])]
        view = row["image"].resize((56, 56), Image.Resampling.BICUBIC)  # what the policy sees
        full += _oracle(view, [c // 8 for c in row["box"]], task.args.colours) == row["answer"]
        obs = crop({"bbox_2d": row["box"]}, ToolContext(images=[row["image"]]))
        assert obs.error is None and obs.images[0].size == (56, 56)
        cropped += _oracle(obs.images[0], [0, 0, 56, 56], task.args.colours) == row["answer"]
    assert full / 200 < 0.6 and cropped / 200 > 0.9 and cropped - full > 70, (full, cropped)


def test_warmup_targets_crop_a_random_box_and_answer_what_the_crop_shows():
    """With tools: each target crops one of the boxes, the prompt's on about 1 / 4 of the rows (a uniform draw,
    independent of the prompt), and answers the colour of the square in that crop (the only solid 24-px square
    there), which is the prompt's answer exactly when the prompt's box was cropped."""
    task = ZoomTask(ZoomArgs(train_size=400, eval_size=1))
    crop, boxes, hits = get_tool("crop"), task.boxes(), 0
    called = set()
    for row in task.warmup_rows(seed=0):
        call, answer = row["target"]
        (parsed,), errors = parse_tool_calls(call)
        assert not errors and parsed.name == "crop" and parsed.arguments["bbox_2d"] in boxes
        box = parsed.arguments["bbox_2d"]
        called.add(tuple(box))
        hits += box == row["box"]
        obs = crop({"bbox_2d": box}, ToolContext(images=[row["image"]]))
        seen = _solid_squares(obs.images[0], task.args.target, task.args.colours)
        assert seen == [row["colours"][boxes.index(box)]] and answer == f"<answer>{seen[0]}</answer>"
        assert (answer == f"<answer>{row['answer']}</answer>") == (box == row["box"])
    assert len(called) == 4 and 0.18 < hits / 400 < 0.32, (called, hits)
    always = ZoomTask(ZoomArgs(train_size=50, eval_size=1, warmup_call_hit_rate=1.0)).warmup_rows(seed=0)
    assert all(r["target"] == [crop_call(r["box"]), f"<answer>{r['answer']}</answer>"] for r in always)


def test_the_no_tool_warmup_answers_the_prompts_box_on_the_same_images():
    tools = ZoomTask(ZoomArgs(train_size=4, eval_size=1))
    plain = ZoomTask(ZoomArgs(tools=False, train_size=4, eval_size=1))
    rows = plain.warmup_rows(0)
    assert all(r["target"] == f"<answer>{r['answer']}</answer>" and "crop" not in r["prompt"] for r in rows)
    assert [r["image"].tobytes() for r in rows] == [r["image"].tobytes() for r in tools.train_rows()]
    assert [r["answer"] for r in rows] == [r["answer"] for r in tools.train_rows()]


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
    with pytest.raises(ConfigError, match="one colour per box"):
        ZoomTask(ZoomArgs(grid=4, box=None, train_size=1, eval_size=1))
    assert ZoomTask(ZoomArgs(grid=1, box=None, train_size=1, eval_size=1)).boxes() == [[0, 0, 448, 448]]


def test_rows_are_deterministic():
    a, b = ZoomTask(ZoomArgs(train_size=3, eval_size=2)), ZoomTask(ZoomArgs(train_size=3, eval_size=2))
    for x, y in zip(a.train_rows() + a.eval_rows(), b.train_rows() + b.eval_rows()):
        assert x["image"].tobytes() == y["image"].tobytes() and x["prompt"] == y["prompt"] and x["box"] == y["box"]
        assert x["colours"] == y["colours"]
    assert a.train_rows()[0]["image"].tobytes() != a.eval_rows()[0]["image"].tobytes()
    assert a.warmup_rows(0) == b.warmup_rows(0) and a.warmup_rows(0) != a.warmup_rows(1)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 9, 16, 17, 100, 2**31 - 1])
def test_randbelow_many_draws_what_the_randrange_loop_draws(n):
    """The bulk draw (numpy's MT19937 at the generator's state) gives the loop's numbers and leaves the generator
    where the loop leaves it, so every later draw of the task is unchanged."""
    import random

    from mmgrpo.tasks.zoom import randbelow_many

    for count in (0, 1, 7, 1000):
        loop_rng, bulk_rng = random.Random(n * 31 + count), random.Random(n * 31 + count)
        loop = [loop_rng.randrange(n) for _ in range(count)]
        assert randbelow_many(bulk_rng, n, count).tolist() == loop
        assert bulk_rng.getstate() == loop_rng.getstate()


def test_render_equals_the_per_cell_loop():
    """The checkerboard drawn in bulk is the image the per-cell ``putdata`` loop drew (pixels and the generator's
    state after), on 20 seeds."""
    import random

    from PIL import Image

    from mmgrpo.tasks.zoom import COLOURS, render

    a = ZoomArgs(tools=True)
    squares = list(zip(a.colours, ZoomTask(ZoomArgs(tools=True, train_size=1, eval_size=1)).boxes()))

    def by_loop(rng):
        n = a.image_size // a.cell
        palette = [COLOURS[c] for c in a.colours]
        small = Image.new("RGB", (n, n))
        small.putdata([palette[rng.randrange(len(palette))] for _ in range(n * n)])
        image = small.resize((n * a.cell, n * a.cell), Image.Resampling.NEAREST)
        if image.size != (a.image_size, a.image_size):
            image = image.crop((0, 0, a.image_size, a.image_size))
        for colour, (x1, y1, x2, y2) in squares:
            margin = max(0, (x2 - x1 - a.target) // 4)
            x = rng.randint(x1 + margin, x2 - a.target - margin)
            y = rng.randint(y1 + margin, y2 - a.target - margin)
            image.paste(Image.new("RGB", (a.target, a.target), COLOURS[colour]), (x, y))
        return image

    for seed in range(20):
        loop_rng, bulk_rng = random.Random(seed), random.Random(seed)
        assert render(bulk_rng, a, squares).tobytes() == by_loop(loop_rng).tobytes()
        assert bulk_rng.getstate() == loop_rng.getstate()
