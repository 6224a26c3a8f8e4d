"""Write small example datasets in the published formats that ``task.name: dataset`` reads (docs/datasets.md).

    python examples/make_example_datasets.py examples/data

Everything is generated here (nothing is downloaded): rendered shapes on a noisy background and short mp4 clips
of a moving square. The formats follow the projects' own data files:

- ``vlm_r1_rec/train.jsonl`` (+ ``images/``): VLM-R1's JSONL for your own data (om-ai-lab/VLM-R1 README, "For your
  own data"; ``src/open-r1-multimodal/src/open_r1/grpo_jsonl.py``): ``id``, ``image`` (a path relative to the
  image folder), ``conversations`` with a human turn holding ``<image>`` and the gpt turn holding the answer —
  for referring-expression comprehension a box ``[x1, y1, x2, y2]`` in pixels of the original image.
- ``video_r1/train.json`` (+ ``videos/``, ``images/``): Video-R1's JSON list (tulerfeng/Video-R1,
  ``Video-R1-260k.json``): ``problem_id``, ``problem``, ``data_type`` (image | video), ``problem_type``
  (multiple choice...), ``options``, ``solution`` (``<answer>B</answer>``), ``path`` (relative, ``./...``),
  ``data_source``.
- ``trl_conversational/``: a ``datasets.Dataset.save_to_disk`` directory in TRL's conversational vision format
  (a ``prompt`` list of chat messages with ``{"type": "image"}`` parts and an ``image`` column of
  ``datasets.Image``), plus an ``answer`` column.
- ``flow_grpo/train.txt`` and ``test.txt``: Flow-GRPO's prompt files (``dataset/pickscore/train.txt``: one
  prompt per line).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmgrpo.media import write_mp4

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 230), "yellow": (235, 215, 40)}


def _canvas(rng: random.Random, size: int) -> Image.Image:
    base = rng.randint(15, 60)
    noise = np.random.default_rng(rng.randrange(2**31)).integers(0, 40, (size, size, 1), dtype=np.uint8)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8).repeat(3, axis=2))


def rec_image(rng: random.Random, size: int = 56) -> tuple[Image.Image, str, list[int]]:
    """Two squares of different colours; the referred one's colour and its box [x1, y1, x2, y2] in pixels."""
    img = _canvas(rng, size)
    draw = ImageDraw.Draw(img)
    names = rng.sample(list(COLOURS), 2)
    boxes = []
    for k, name in enumerate(names):
        side = rng.randint(size // 5, size // 3)
        x0 = rng.randint(0, size // 2 - side) + k * size // 2
        y0 = rng.randint(0, size - side)
        box = [x0, y0, x0 + side, y0 + side]
        draw.rectangle(box, fill=COLOURS[name])
        boxes.append(box)
    return img, names[0], boxes[0]


def write_vlm_r1_rec(root: Path, n: int = 16, seed: int = 0) -> Path:
    """VLM-R1 JSONL (REC): ``id``, ``image``, ``conversations``; images under ``images/``."""
    rng = random.Random(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        img, colour, box = rec_image(rng)
        name = f"images/rec_{i:05d}.png"
        img.save(root / name)
        question = (
            "<image>Please provide the bounding box coordinate of the region this sentence describes: "
            f"the {colour} square."
        )
        lines.append(
            {
                "id": i,
                "image": name,
                "conversations": [
                    {"from": "human", "value": question},
                    {"from": "gpt", "value": json.dumps(box)},
                ],
            }
        )
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _moving_square(rng: random.Random, size: int, frames: int, direction: str) -> list[np.ndarray]:
    side = size // 4
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    span = size - side
    out = []
    for t in range(frames):
        frame = np.full((size, size, 3), 30, dtype=np.uint8)
        pos = round(span * t / max(1, frames - 1))
        px, py = (pos, y) if direction in ("left", "right") else (x, pos)
        if direction == "left":
            px = span - pos
        if direction == "up":
            py = span - pos
        frame[py : py + side, px : px + side] = COLOURS["yellow"]
        out.append(frame)
    return out


def write_video_r1(root: Path, n: int = 8, seed: int = 0, size: int = 56, frames: int = 8, fps: int = 4) -> Path:
    """Video-R1 JSON list: multiple-choice questions on mp4 clips (and one image row, as the mixed 260k set)."""
    rng = random.Random(seed)
    (root / "videos").mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(parents=True, exist_ok=True)
    directions = ["left", "right", "up", "down"]
    letters = "ABCD"
    rows = []
    for i in range(n):
        direction = rng.choice(directions)
        name = f"videos/clip_{i:05d}.mp4"
        write_mp4(root / name, _moving_square(rng, size, frames, direction), fps)
        rows.append(
            {
                "problem_id": i,
                "problem": "Which way does the square move?",
                "data_type": "video",
                "problem_type": "multiple choice",
                "options": [f"{letters[k]}. {d}" for k, d in enumerate(directions)],
                "solution": f"<answer>{letters[directions.index(direction)]}</answer>",
                "path": f"./{name}",
                "data_source": "synthetic-motion",
            }
        )
    img, colour, _ = rec_image(rng, size)
    img.save(root / "images" / "still_00000.png")
    options = [f"{letters[k]}. {c}" for k, c in enumerate(COLOURS)]
    rows.append(
        {
            "problem_id": n,
            "problem": "What colour is the left square?",
            "data_type": "image",
            "problem_type": "multiple choice",
            "options": options,
            "solution": f"<answer>{letters[list(COLOURS).index(colour)]}</answer>",
            "path": "./images/still_00000.png",
            "data_source": "synthetic-shapes",
        }
    )
    path = root / "train.json"
    path.write_text(json.dumps(rows, indent=1))
    return path


def write_trl_conversational(root: Path, n: int = 16, seed: int = 0) -> Path:
    """A TRL-style conversational vision dataset (``prompt`` messages + ``image`` column), save_to_disk."""
    import datasets

    rng = random.Random(seed)
    prompts, images, answers = [], [], []
    for _ in range(n):
        img, colour, _ = rec_image(rng)
        prompts.append(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image"},
                        {
                            "type": "text",
                            "text": "What colour is the left square? Answer with <answer>colour</answer>.",
                        },
                    ],
                }
            ]
        )
        images.append(img)
        answers.append(colour)
    features = datasets.Features(
        {
            "prompt": [
                {
                    "role": datasets.Value("string"),
                    "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}],
                }
            ],
            "image": datasets.Image(),
            "answer": datasets.Value("string"),
        }
    )
    ds = datasets.Dataset.from_dict({"prompt": prompts, "image": images, "answer": answers}, features=features)
    ds.save_to_disk(str(root))
    return root


def write_flow_grpo_prompts(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """Flow-GRPO prompt files, one prompt per line, in the vocabulary of the built-in tiny flow model
    (``a <colour> <shape> <position>``, which the ``flow_shape_match`` reward reads back from the prompt)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    positions = ["top left", "top right", "bottom left", "bottom right"]
    prompts = [f"a {c} {s} {p}" for c in COLOURS for s in ("circle", "square") for p in positions]
    rng.shuffle(prompts)
    (root / "train.txt").write_text("\n".join(prompts[:24]) + "\n")
    (root / "test.txt").write_text("\n".join(prompts[24:]) + "\n")
    return root / "train.txt", root / "test.txt"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="examples/data", help="folder to write the datasets into")
    out = Path(p.parse_args(argv).out)
    print(write_vlm_r1_rec(out / "vlm_r1_rec"))
    print(write_video_r1(out / "video_r1"))
    print(write_trl_conversational(out / "trl_conversational"))
    print(*write_flow_grpo_prompts(out / "flow_grpo"))


if __name__ == "__main__":
    main()
