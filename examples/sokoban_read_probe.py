"""Can the built-in tiny Qwen2.5-VL learn to read a rendered Sokoban room at all? A supervised probe outside the
multi-turn trainer (docs/agents.md "The Sokoban task"): one image, one turn, the next token after ``<action>``
trained by cross-entropy (over the whole vocabulary) on a move computed from the room; accuracy (the likeliest of the
four moves' first tokens) on 200 train levels held back from the probe's training (never the task's held-out levels).

Labels (``--label``): ``solver`` — the first move of a shortest solution (:func:`mmgrpo.tasks.sokoban.expert_move`,
what the warm-up imitates); ``half`` — ``up`` when the player stands in the top half of the room, else ``down`` (a
label that needs only where one object is). The majority label's share is printed first: a model that does not read
the image stays at it.

    OMP_NUM_THREADS=1 python examples/sokoban_read_probe.py --label solver --lr 3e-3 --steps 400
    OMP_NUM_THREADS=1 python examples/sokoban_read_probe.py --label solver --cell 28 --floor coordinates --steps 1500

``--text`` sets the message's text (``task``: the task's default instruction, ``mmgrpo.tasks.sokoban.PROMPT``, and
"Your move?", what the rollout showed before the shipped configs set ``task.args.prompt: "Sokoban."``),
``--image_first`` puts the image before it (default: after it, next to the answer).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from mmgrpo.loader import load_config
from mmgrpo.tasks.sokoban import PROMPT, expert_move
from mmgrpo.tools.gridworld import ACTIONS, Sokoban
from mmgrpo.trainer import Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", choices=("solver", "half"), default="solver")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--cell", type=int, default=14)
    p.add_argument("--floor", choices=("plain", "coordinates"), default="plain")
    p.add_argument(
        "--text", default="Sokoban. Your move?", help="the message's text; 'task': the task's default instruction"
    )
    p.add_argument("--image_first", action="store_true", help="the image before the text (as the default rollout)")
    p.add_argument("--output_dir", default="runs/sokoban_read_probe")
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = load_config("configs/sokoban_grpo.yaml", [f"output_dir={a.output_dir}", "logging.progress=false"])
    trainer = Trainer(cfg)  # the shipped config's model and task (train levels only)
    model, processor = trainer.adapter.model, trainer.adapter.processor
    game = Sokoban(size=6, pulls=4, max_steps=5, cell=a.cell, floor=a.floor)

    def example(row: dict) -> tuple:
        game.reset(row)
        label = expert_move(game) if a.label == "solver" else ("up" if game.player[0] <= 2 else "down")
        return game.render(), label

    data = [example(r) for r in trainer.task.train_rows()]
    data, val = data[:-200], data[-200:]
    prefix = processor.tokenizer("<action>", add_special_tokens=False)["input_ids"]
    first = [processor.tokenizer(f"<action>{m}", add_special_tokens=False)["input_ids"][len(prefix)] for m in ACTIONS]
    words = PROMPT + "\nYour move?" if a.text == "task" else a.text
    parts = [{"type": "text", "text": words}, {"type": "image"}]
    messages = [{"role": "user", "content": parts[::-1] if a.image_first else parts}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True) + "<action>"

    def logits(items: list) -> tuple[torch.Tensor, torch.Tensor]:
        """The next-token logits over the whole vocabulary [n, V] and the label's first token ids [n]."""
        enc = processor(text=[text] * len(items), images=[[im] for im, _ in items], return_tensors="pt", padding=True)
        return model(**enc).logits[:, -1], torch.tensor([first[ACTIONS.index(m)] for _, m in items])

    labels = [m for _, m in val]
    print(f"majority share on the probe's validation levels: {max(map(labels.count, set(labels))) / len(labels):.3f}")
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=a.lr)
    rng, t0 = random.Random(0), time.time()
    for step in range(1, a.steps + 1):
        out, y = logits(rng.sample(data, a.batch))
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 100 == 0:
            with torch.no_grad():
                out, y = logits(val)
            acc = (torch.tensor(first)[out[:, first].argmax(-1)] == y).float().mean().item()  # among the 4 moves
            print(f"step {step}: loss {loss.item():.3f}, validation accuracy {acc:.3f}, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
