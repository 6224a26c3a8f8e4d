"""TRL's own reward functions (``trl.rewards``) run unchanged, in the runner and inside a real training step.

TRL passes each completion as ``[{"role": "assistant", "content": text}]`` when the prompts are conversational
(trl/trainer/grpo_trainer.py, ``_generate_and_score_completions``); its rewards read ``completion[0]["content"]``.
"""

import json

import pytest

from mmgrpo.loader import load_config
from mmgrpo.plugins import TASKS
from mmgrpo.rewards import RewardRunner

trl_rewards = pytest.importorskip("trl.rewards")
pytest.importorskip("math_verify")

SYSTEM = {"role": "system", "content": "Think in <think></think>, then answer in \\boxed{}."}


def _chat(question: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": question}]


class ChatSumsTask:
    """Sums as conversational prompts; the ground truth is TRL's ``solution`` column."""

    def __init__(self, args: dict, *, seed: int = 0):
        self._rows = [
            {"prompt": _chat(f"What is {a} + {b}?"), "solution": f"${a + b}$"} for a in range(4) for b in range(4)
        ]

    def train_rows(self) -> list[dict]:
        return self._rows

    def eval_rows(self) -> list[dict]:
        return self._rows[:4]

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        return {"n": float(len(outputs))}


if "trl_chat_sums" not in TASKS:
    TASKS.add("trl_chat_sums", ChatSumsTask)


def test_trl_rewards_score_chat_completions_in_the_runner():
    runner = RewardRunner([("trl.rewards:think_format_reward", 1.0, {}), ("trl.rewards:accuracy_reward", 1.0, {})])
    completions = ["<think>2 and 1</think>The answer is \\boxed{3}", "no think, \\boxed{4}"]
    prompts = [_chat("What is 2 + 1?")] * 2
    rewards, metrics = runner(completions, prompts, {"solution": ["$3$", "$3$"]})
    assert rewards.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert metrics["reward/errors"] == 0.0


def test_trl_rewards_run_unchanged_in_a_training_step(tmp_path, mmgrpo_cache):
    from mmgrpo.modalities.vlm.tiny import build_tiny_causal_lm
    from mmgrpo.trainer import train

    lm = build_tiny_causal_lm(tmp_path / "lm")
    out = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"output_dir={out}",
            "steps=1",
            "seed=0",
            "model.adapter=vlm",
            f"model.args.name_or_path={lm}",
            "model.args.max_new_tokens=6",
            "task.name=trl_chat_sums",
            "rewards=[{name: 'trl.rewards:think_format_reward'}, {name: 'trl.rewards:accuracy_reward'}]",
            "algorithm.group_size=4",
            "algorithm.prompts_per_step=2",
            "algorithm.minibatch_size=8",
            "algorithm.beta=0",
            "eval.before=false",
            "eval.after=false",
            "logging.trackers=[]",
            "logging.progress=false",
            "checkpoint.save_final=false",
        ],
    )
    train(cfg)
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert step["reward/errors"] == 0.0
    for name in ("think_format_reward", "accuracy_reward"):  # the tiny model is untrained: it scores 0, but scores
        assert step[f"reward/{name}"] == 0.0 and step[f"reward/{name}_nan_fraction"] == 0.0


def test_reward_factory_is_called_once_with_its_kwargs():
    """`module:factory()` builds the reward from kwargs, as TRL's get_soft_overlong_punishment(...) is used."""
    runner = RewardRunner(
        [("trl.rewards:get_soft_overlong_punishment()", 1.0, {"max_completion_len": 10, "soft_punish_cache": 5})]
    )
    ids = [[0] * 4, [0] * 8, [0] * 12]  # within, inside the soft cache, over the limit
    rewards, _ = runner(["a", "b", "c"], ["p", "p", "p"], {"completion_ids": ids})
    assert rewards[:, 0].tolist() == [0.0, pytest.approx(-0.6), -1.0]
