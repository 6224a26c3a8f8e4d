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
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps: unknown rollout step 'rerun'; registered: "):
        load_config(QUICK, ["algorithm.rollout_steps={rerun: {}}"])
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


# --- a step's memory in the checkpoint: save/load hooks, keyed by step name, one state per process ------------------


def _count(ctx: RolloutContext, batch: RolloutBatch, options: DropLastGroupOptions, memory: dict) -> RolloutBatch:
    """Count the steps seen and remember the last step's dataset rows (a memory of plain JSON values)."""
    memory["calls"] = memory.get("calls", 0) + 1
    memory["rows"] = list(batch.indices)
    return batch


class _OneProcess:
    num_processes, process_index = 1, 0


def test_step_memory_round_trips_through_the_trainer_state_by_name():
    spec = RolloutStep("batch", _count, save=lambda m: {"calls": m["calls"]}, load=dict.update)
    if "test_counter" not in ROLLOUT_STEPS:
        ROLLOUT_STEPS.add("test_counter", spec, DropLastGroupOptions)
    steps = [rollout_steps.Step("test_counter", DropLastGroupOptions(), {"calls": 3, "scratch": object()})]
    steps.append(rollout_steps.Step(rollout_steps.OBSERVE, None, {"not": "saved"}))  # no hooks: not checkpointed
    saved = json.loads(json.dumps(rollout_steps.state_dict(steps, _OneProcess())))  # as trainer.json holds it
    assert saved == {"rollout_steps": {"test_counter": [{"calls": 3}]}}  # one state per process, by name
    fresh = [rollout_steps.Step("test_counter", DropLastGroupOptions())]
    fresh.append(rollout_steps.Step(rollout_steps.OBSERVE, None))
    rollout_steps.load_state_dict(fresh, saved, _OneProcess())
    assert fresh[0].memory == {"calls": 3} and fresh[1].memory == {}
    two = {"rollout_steps": {"test_counter": [{"calls": 1}, {"calls": 2}]}}  # saved by 2 processes: starts empty
    fresh = [rollout_steps.Step("test_counter", DropLastGroupOptions())]
    rollout_steps.load_state_dict(fresh, two, _OneProcess())
    assert fresh[0].memory == {}
    assert rollout_steps.state_dict(fresh[:0], _OneProcess()) == {}  # no step keeps memory: trainer.json unchanged


def test_a_resumed_run_gets_its_steps_memory_back(tmp_path, mmgrpo_cache):
    from mmgrpo.trainer import Trainer, train

    if "test_counter" not in ROLLOUT_STEPS:
        spec = RolloutStep("batch", _count, save=lambda m: {"calls": m["calls"]}, load=dict.update)
        ROLLOUT_STEPS.add("test_counter", spec, DropLastGroupOptions)
    small = ["steps=3", "warmup.steps=0", "eval.before=false", "eval.after=false", "eval.every=0"]
    small += ["algorithm.prompts_per_step=2", "algorithm.group_size=2", "algorithm.minibatch_size=4"]
    small += ["model.args.max_new_tokens=3", "task.args.train_size=8", "task.args.eval_size=2"]
    small += ["logging.trackers=[]", "logging.progress=false", "checkpoint.save_final=false"]
    small += ["algorithm.rollout_steps={test_counter: {}}", f"output_dir={tmp_path / 'run'}"]
    train(load_config(QUICK, [*small, "stop_after=2"]))
    trainer_json = json.loads((tmp_path / "run/checkpoints/step-000002/state/trainer.json").read_text())
    assert trainer_json["trainer"]["rollout_steps"] == {"test_counter": [{"calls": 2}]}
    resumed = Trainer(load_config(QUICK, [*small, "resume=latest"]))
    assert resumed.rollout_steps[0].memory == {}
    resumed._maybe_resume()
    resumed.close()
    assert resumed.rollout_steps[0].memory == {"calls": 2}  # what it had after step 2, not what a fresh run has
