"""The rollout-level variants as one declared pipeline (mmgrpo/rollout_steps.py): the registry, its checks at load,
and a new step added as one function plus its registration, run by the unchanged trainer."""

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mmgrpo import rollout_steps
from mmgrpo.config import AlgorithmConfig, ConfigError
from mmgrpo.loader import load_config
from mmgrpo.rollout_steps import ROLLOUT_STEPS, RolloutBatch, RolloutContext, RolloutStep

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "configs/quickstart.yaml"


def test_the_built_in_variants_are_registered_steps_with_typed_options():
    assert {"gt_injection", "difficulty_augmentation", "dynamic_sampling", rollout_steps.OBSERVE} <= set(ROLLOUT_STEPS)
    stages = {name: ROLLOUT_STEPS.get(name).stage for name in ROLLOUT_STEPS}
    assert stages["gt_injection"] == "sample" and stages["dynamic_sampling"] == "batch"
    assert ROLLOUT_STEPS.options_class("dynamic_sampling").__name__ == "DynamicSamplingConfig"
    assert ROLLOUT_STEPS.get("gt_injection").needs == "inject"


def test_the_pipeline_follows_the_config_in_declared_order():
    a = AlgorithmConfig()
    assert rollout_steps.configured(a) == []  # plain GRPO: no rollout step
    a.gt_injection.enabled = True
    a.dynamic_sampling.enabled = True
    a.sampler = "variance"
    names = [s.name for s in rollout_steps.build(a)]
    assert names == ["gt_injection", "dynamic_sampling", rollout_steps.OBSERVE]  # the observation sees the kept groups
    a.dynamic_sampling.enabled = False
    a.difficulty_augmentation.enabled = True
    with pytest.raises(ConfigError, match=r"^algorithm\.difficulty_augmentation: not combined with dynamic_sampling"):
        rollout_steps.check_config(a, multi_turn=False)


def test_rollout_steps_config_errors_are_one_line_at_load():
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps: unknown rollout step 'replay'; registered: "):
        load_config(QUICK, ["algorithm.rollout_steps={replay: {}}"])
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.dynamic_sampling: turned on by algorithm\."):
        load_config(QUICK, ["algorithm.rollout_steps={dynamic_sampling: {}}"])
    with pytest.raises(ConfigError, match=r"^algorithm\.gt_injection\.enabled is not supported with rollout\.tools"):
        load_config(ROOT / "configs/zoom_tools.yaml", ["algorithm.gt_injection.enabled=true"])
    flow = ROOT / "configs/flow_grpo.yaml"
    with pytest.raises(ConfigError, match=r"^algorithm\.gt_injection\.enabled needs an adapter with inject\(\)"):
        load_config(flow, ["algorithm.gt_injection.enabled=true"])


def test_train_step_keeps_at_most_three_ifs_and_reaches_no_variant_module():
    source = (ROOT / "mmgrpo/trainer.py").read_text()
    tree = ast.parse(source)
    (step,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "train_step"]
    assert sum(isinstance(n, ast.If) for n in ast.walk(step)) <= 3
    imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for alias in n.names}
    assert not {"injection", "augmentation", "dynamic_sampling"} & imported  # they plug in through ROLLOUT_STEPS


# --- a new variant: one function and its registration; the trainer is not touched --------------------------------


@dataclass(frozen=True)
class DropLastGroupOptions:
    """Options of the test step."""

    tag: float = 1.0
    """A value the step logs, to show its options reach it."""


CALLS: list[dict] = []


def _drop_last_group(ctx: RolloutContext, batch: RolloutBatch, options: DropLastGroupOptions, memory: dict):
    """Re-roll the last group under its own noise keys (a new batch step reaching the run only through ``ctx``)."""
    memory["calls"] = memory.get("calls", 0) + 1
    again = ctx.rollout(batch.rows[-1:], batch.indices[-1:], ctx.keys(ctx.seed + 1, ctx.positions[-1:]))
    CALLS.append({"step": ctx.step, "calls": memory["calls"], "G": again.rollout.batch_size})
    G = ctx.group_size
    scores = torch.cat([batch.scores[:-G], again.scores])  # [B, K]
    batch.metrics["test/tag"] = options.tag
    return RolloutBatch(batch.rows, batch.rollout, scores, batch.indices, batch.metrics)


def test_a_new_rollout_step_is_one_function_and_its_registration(tmp_path, mmgrpo_cache):
    from mmgrpo.trainer import train

    if "test_reroll_last" not in ROLLOUT_STEPS:
        ROLLOUT_STEPS.add("test_reroll_last", RolloutStep("batch", _drop_last_group), DropLastGroupOptions)
    with pytest.raises(ConfigError, match=r"^unknown field 'algorithm\.rollout_steps\.test_reroll_last\.bogus'"):
        load_config(QUICK, ["algorithm.rollout_steps={test_reroll_last: {bogus: 1}}"])
    small = ["steps=2", "warmup.steps=0", "eval.before=false", "eval.after=false", "eval.every=0"]
    small += ["algorithm.prompts_per_step=2", "algorithm.group_size=2", "algorithm.minibatch_size=4"]
    small += ["model.args.max_new_tokens=3", "task.args.train_size=8", "task.args.eval_size=2"]
    small += ["logging.trackers=[]", "logging.progress=false", "checkpoint.save_final=false"]
    over = [*small, "algorithm.rollout_steps={test_reroll_last: {tag: 2.5}}", f"output_dir={tmp_path / 'run'}"]
    CALLS.clear()
    train(load_config(QUICK, over))
    assert CALLS == [{"step": 0, "calls": 1, "G": 2}, {"step": 1, "calls": 2, "G": 2}]  # memory kept across steps
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["test/tag"] for r in records if "test/tag" in r] == [2.5, 2.5]
