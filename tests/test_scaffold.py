"""Scaf-GRPO's hint scaffolding (mmgrpo/scaffold.py): the diagnosis, the levels, the minimal hint and the augmented
group's advantage worked by hand; its refusals at load; a tiny-model run where only a planning hint succeeds."""

import json
from pathlib import Path

import pytest
import torch

from mmgrpo import advantages as adv_lib
from mmgrpo import scaffold
from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.tasks.arithmetic import ArithmeticArgs, ArithmeticTask, hint_tiers

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/variant_scaf_grpo.yaml"


def test_a_stuck_group_takes_the_least_hint_that_succeeds_and_its_advantage_worked_by_hand():
    combined = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [float("nan"), 0.0, 0.0, 0.0]])  # [P, G]
    assert scaffold.stuck_groups(combined, success=1.0).tolist() == [True, False, True]  # NaN is no success
    # stuck prompt 0: knowledge fails, planning and solution succeed -> level 2 (index 1); prompt 2: none succeeds
    assert scaffold.minimal_level([[False, True, True], [False, False, False]]) == [1, -1]
    # the hinted success replaces slot 0: rewards (1, 0, 0, 0); GRPO, unbiased std: mean 1/4, std sqrt(3/4 / 3) = 1/2
    augmented = torch.tensor([[1.0, 0.0, 0.0, 0.0]])[..., None]  # [P, G, K]
    adv, _ = adv_lib.compute_advantages(
        augmented, torch.ones(1), combine="sum_then_normalize", estimator="grpo", scale="group", unbiased=True, eps=0.0
    )
    assert torch.allclose(adv, torch.tensor([[1.5, -0.5, -0.5, -0.5]]), atol=1e-6)


def test_hint_levels_go_tier_by_tier_each_part_by_part():
    row = {"prompt": "q", "hint_knowledge": ["K1", "K2"], "hint_planning": "P1", "hint_solution": ["S1", "S2", "S3"]}
    o = scaffold.ScaffoldOptions(max_parts=2)
    assert scaffold.hint_levels(row, o) == [
        "\nKnowledge Hints: K1",
        "\nKnowledge Hints: K1 K2",
        "\nPlanning Hints: P1",
        "\nSolution Hints: S1",
        "\nSolution Hints: S1 S2",  # max_parts = 2: S3 never shown
    ]
    assert scaffold.hint_levels({"prompt": "q"}, o) == []  # no tier columns: never hinted


def test_arithmetic_hint_tiers_come_from_the_key_steps_and_leave_the_rows_as_they_were():
    assert hint_tiers(["3 + 4 = 7", "7 - 2 = 5"]) == {
        "hint_knowledge": [
            "Getting or putting in more means adding: the new amount is the first number plus the second.",
            "Giving away, losing or taking out means subtracting: what is left is the first number minus the second.",
        ],
        "hint_planning": ["Start from 3.", "Add 4.", "Subtract 2."],
        "hint_solution": ["3 + 4 = 7.", "7 - 2 = 5."],
    }
    plain = ArithmeticTask(ArithmeticArgs(train_size=20, eval_size=5)).train_rows()
    hinted = ArithmeticTask(ArithmeticArgs(train_size=20, eval_size=5, hints=True)).train_rows()
    assert [{k: v for k, v in r.items() if not k.startswith("hint_")} for r in hinted] == plain
    assert all(r["hint_solution"][0].endswith(f"= {r['answer']}.") for r in hinted)  # one step: it gives the answer


def test_unsupported_combinations_are_refused_at_load_in_one_line():
    base = ["algorithm.rollout_steps={scaffold: {}}"]
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.scaffold: not combined with gt_injection"):
        load_config(CONFIG, [*base, "algorithm.gt_injection.enabled=true"])
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.scaffold: not combined with .*dynamic_sampl"):
        load_config(CONFIG, [*base, "algorithm.dynamic_sampling.enabled=true"])
    with pytest.raises(ConfigError, match=r"labels: 1 labels for 3 tiers; give one label per tier$"):
        load_config(CONFIG, ["algorithm.rollout_steps={scaffold: {labels: [Hint]}}"])
    unknown = r"^unknown field .algorithm\.rollout_steps\.scaffold\.exemption.; .*did you mean .exemption_steps.\?$"
    with pytest.raises(ConfigError, match=unknown):
        load_config(CONFIG, ["algorithm.rollout_steps={scaffold: {exemption: 3}}"])
    flow = ROOT / "configs/flow_grpo.yaml"  # the flow adapter has no hinted prompts to splice in
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.scaffold needs an adapter with splice_states"):
        load_config(flow, base)
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.scaffold is not supported with rollout\.tools"):
        load_config(ROOT / "configs/zoom_tools.yaml", base)


def planning_reward(completions: list, prompts: list, **columns) -> list[float]:
    """1 when the prompt carries a planning hint, whatever the reply: only the planning tier succeeds."""
    return [float("Planning Hints" in str(p)) for p in prompts]


def test_only_the_planning_hint_succeeds_so_each_group_takes_it_on_policy(tmp_path, mmgrpo_cache):
    from mmgrpo.trainer import train

    over = [
        "rewards=[{name: 'tests.test_scaffold:planning_reward'}]",
        "algorithm.rollout_steps={scaffold: {exemption_steps: 1}}",
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=4",
        "algorithm.minibatch_size=8",  # one update per step: its ratio is exactly the first one
        "model.args.max_new_tokens=4",
        "task.args.train_size=16",
        "task.args.eval_size=4",
        "eval.before=false",
        "eval.after=false",
        "steps=2",
        f"output_dir={tmp_path / 'run'}",
    ]
    train(load_config(CONFIG, over))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    first, second = [r for r in map(json.loads, lines) if "loss/policy" in r]
    assert first["scaffold/stuck_groups"] == 0.0 and first["scaffold/hinted_groups"] == 0.0  # the exemption
    assert first["advantage/zero_std_fraction"] == 1.0
    # step 2: every group stuck; levels knowledge (1 part), planning (2 parts), solution (1 part) sampled once each
    assert second["scaffold/stuck_groups"] == 1.0 and second["scaffold/hinted_groups"] == 1.0
    assert second["scaffold/hint_level"] == 2.0 and second["scaffold/hint_samples"] == 4.0
    assert second["advantage/zero_std_fraction"] == 0.0  # each group now holds one success among G = 4
    assert second["reward/mean"] == 0.25  # the trained groups' rewards: the hinted sample's 1 among 4
    # the hinted sample is scored under its hinted prompt, with the log-probs it was sampled with: ratio 1
    assert second["loss/ratio_max"] == pytest.approx(1.0, abs=1e-4)
