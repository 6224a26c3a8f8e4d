"""docs/architecture.md, "Where a new piece goes": every code block runs as written, registers what it says, and the
rollout-step example trains through the unchanged trainer. Run in a fresh interpreter, so the examples' registrations
do not reach the other tests' registries."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs/architecture.md"


def _section_blocks() -> list[str]:
    text = DOC.read_text()
    start = text.index("## Where a new piece goes")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


CHECK = r"""
import json, sys
blocks = json.loads(sys.stdin.read())
spaces = []
for block in blocks:  # each block on its own, as a reader would paste it
    namespace = {"__name__": "docs_example"}
    exec(compile(block, "docs/architecture.md", "exec"), namespace)
    spaces.append(namespace)

import torch
from mmgrpo.credit import CREDITS
from mmgrpo.loader import load_config
from mmgrpo.rewards import load_reward
from mmgrpo.rollout_steps import ROLLOUT_STEPS
from mmgrpo.tools import TOOLS
from mmgrpo.trainer import Trainer

out = {
    "rollout_step": "retry_flat" in ROLLOUT_STEPS and ROLLOUT_STEPS.options_class("retry_flat").__name__,
    "credit": "final_turn" in CREDITS,
    "tool": "bright_pixels" in TOOLS,
    "reward": load_reward("all_caps", bonus=2.0)(["HEY", "hey"], prompts=["p", "p"]),
}
# the rollout step in a run: the untrained tiny model scores 0 everywhere, so every step is flat and retried once
small = ["steps=2", "warmup.steps=0", "eval.before=false", "eval.after=false", "eval.every=0"]
small += ["algorithm.prompts_per_step=2", "algorithm.group_size=2", "algorithm.minibatch_size=4"]
small += ["model.args.max_new_tokens=3", "task.args.train_size=8", "task.args.eval_size=2"]
small += ["logging.trackers=[]", "logging.progress=false", "checkpoint.save_final=false"]
small += ["algorithm.rollout_steps={retry_flat: {tries: 1}}", "output_dir=" + sys.argv[1]]
trainer = Trainer(load_config(sys.argv[2], small))
trainer.run()
out["retries"] = [s.memory.get("retries") for s in trainer.rollout_steps if s.name == "retry_flat"]
try:
    load_config(sys.argv[2], ["algorithm.rollout_steps={retry_flat: {tries: 1, retries: 2}}"])
except Exception as e:
    out["bad_option"] = str(e)
# the credit mode on a hand-worked case: one group of G = 2, trajectory 0 has 2 turns, trajectory 1 one
from mmgrpo.credit import TurnInputs
mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # [B, S]
turns = TurnInputs(mask, torch.zeros(2, 2), torch.zeros(2, 2), [["a", "b"], ["a"]], torch.tensor([-1, -1]),
                   torch.tensor([0, 0]))
options = CREDITS.options_class("final_turn")(scale=2.0)
per_turn, _ = CREDITS.get("final_turn")(torch.tensor([[0.5, -0.5]]), torch.zeros(2), turns, options)
out["credit_values"] = per_turn.tolist()
print("RESULT " + json.dumps(out))
"""


def test_the_examples_run_and_register(tmp_path):
    blocks = _section_blocks()
    assert len(blocks) == 4  # rollout step, credit mode, tool, reward
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "run"), str(ROOT / "configs/quickstart.yaml")],
        input=json.dumps(blocks),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert out["rollout_step"] == "RetryFlatOptions" and out["credit"] and out["tool"]
    assert out["reward"] == [2.0, 0.0]
    assert out["retries"] == [2]  # one retry in each of the two steps, remembered across steps
    assert out["bad_option"].startswith("unknown field 'algorithm.rollout_steps.retry_flat.retries'")
    assert out["credit_values"] == [[0.0, 1.0], [-1.0, 0.0]]  # 2 x the advantage, on each trajectory's last turn
