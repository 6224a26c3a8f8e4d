"""FSDP2 on two CPU processes (gloo): the same update as DDP, checkpoints that resume; DeepSpeed templates load.

The multi-process tests launch ``accelerate launch --config_file configs/accelerate/fsdp_cpu_2proc.yaml`` and
``cpu_2proc.yaml`` (DDP) on the same config and seed and compare the weights after one step.

Tolerance: FSDP reduce-scatters the gradients that DDP all-reduces, so the two sum in other orders and their
gradients agree within the step's backward rounding budget (tests/numerics.py: the tiny model's reductions, read
from its config, for the rollout, the training forward and its backward). The weights are then one AdamW step
apart as in tests/test_world_size.py (``assert_one_adamw_step_apart``, lr read from the runs' own ``optim/lr``):
99 % within 2·lr times that budget, and every weight within 2·lr, because AdamW's first update g/(|g| + ε) turns
a gradient element at rounding level into a whole step of either sign. The optimizer's moments (0.1·g and
0.001·g²) agree within the same budget relative to each tensor's largest entry (twice it for the square). The test
also requires the step to have moved the weights by far more than the budget. An FSDP run resumed from its
checkpoint repeats the uninterrupted run's kernels in the same order: compared exactly.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from tests.adapter_cases import CASES
from tests.numerics import assert_one_adamw_step_apart, weight_deltas
from tests.test_trainer import QUICK, ROOT, assert_trained_after
from tests.test_world_size import flow_budget, vlm_budget

FLOW = ROOT / "configs/flow_grpo.yaml"
ACCEL = ROOT / "configs/accelerate"

REWARD = '''
def length_reward(completions, **kwargs):
    """Longer completions score higher: varies within every group of the untrained tiny VLM (a learning signal)."""
    return [len(str(c)) / 10.0 for c in completions]
'''
VLM_STEP = [
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=4",
    "model.args.max_new_tokens=5",
    "task.args.train_size=32",
    "task.args.eval_size=8",
    "warmup.steps=0",
    "eval.every=0",
    "eval.before=false",
    "eval.after=false",
    "logging.trackers=[]",
    "logging.progress=false",
    "rewards=[{name: 'length_rewards:length_reward'}]",
]
FLOW_STEP = [  # eval.max_rows=3 over 2 processes: the padded split of the held-out rows runs too
    "algorithm.group_size=2",
    "algorithm.prompts_per_step=2",
    "algorithm.minibatch_size=2",
    "model.args.num_steps=4",
    "model.args.eval_num_steps=2",
    "eval.before=false",
    "eval.after=true",
    "eval.max_rows=3",
    "task.args.eval_seeds=1",
]


def _launch(
    accelerate_config: str, config: Path, overrides: list[str], out: Path, tmp_path: Path, cache: Path | None = None
) -> dict:
    """``accelerate launch --config_file configs/accelerate/<name>.yaml -m mmgrpo train ...`` on 2 CPU processes;
    returns summary.json (``{}`` for a run stopped by ``stop_after``, which writes none). ``cache``: the tiny-model
    cache of this launch (default: the session's)."""
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [
        str(accelerate),
        "launch",
        "--config_file",
        str(ACCEL / f"{accelerate_config}.yaml"),
        "--main_process_port",
        "0",  # any free rendezvous port, not 29500: launches on two test workers at once
        "-m",
        "mmgrpo",
        "train",
        str(config),
        *overrides,
        f"output_dir={out}",
    ]
    pythonpath = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", PYTHONPATH=pythonpath)
    if cache is not None:
        env["MMGRPO_CACHE"] = str(cache)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = out / "summary.json"
    return json.loads(summary.read_text()) if summary.is_file() else {}


def _initial_weights(config: Path, overrides: list[str]) -> dict[str, torch.Tensor]:
    """The policy's weights before training, built in this process from the same config (shared tiny-model cache)."""
    from mmgrpo.loader import load_builtins
    from mmgrpo.plugins import ADAPTERS

    load_builtins()
    cfg = load_config(config, overrides + ["output_dir=unused"])
    adapter = ADAPTERS.get(cfg.model.adapter)(cfg.model.args, seed=cfg.seed, lora=cfg.model.lora, dtype=cfg.model.dtype)
    return {k: v.detach().clone() for k, v in adapter.model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "config,overrides",
    [
        (QUICK, VLM_STEP + ["model.lora.enabled=true"]),
        (QUICK, VLM_STEP + ["model.lora.enabled=false"]),
        (FLOW, FLOW_STEP + ["model.lora.enabled=false"]),
    ],
    ids=["vlm_lora", "vlm_full", "flow_full"],
)
def test_fsdp_step_equals_ddp_step(config, overrides, tmp_path, mmgrpo_cache, monkeypatch):
    """One GRPO step under FSDP2 gives the weights of the same step under DDP, both on 2 processes."""
    (tmp_path / "length_rewards.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = [*overrides, "steps=1", "seed=0"]
    # Each launch builds the tiny VLM into its own empty cache: process 0 builds (drawing from the RNG) while
    # process 1 loads, so their LoRA draws differ. DDP starts from process 0's weights (it broadcasts them); FSDP
    # must too, or each process would train its own shard of a different initialisation.
    fsdp = _launch("fsdp_cpu_2proc", config, run, tmp_path / "fsdp", tmp_path, cache=tmp_path / "cache-fsdp")
    ddp = _launch("cpu_2proc", config, run, tmp_path / "ddp", tmp_path, cache=tmp_path / "cache-ddp")
    assert fsdp["train/processes"] == 2 and ddp["train/processes"] == 2
    assert fsdp["train/sharded"] == 1.0 and ddp["train/sharded"] == 0.0  # FSDP ran, not DDP under another name
    budget = flow_budget(steps=4) if config == FLOW else vlm_budget()
    a = load_file(str(tmp_path / "fsdp/checkpoints/final/state/model.safetensors"))
    b = load_file(str(tmp_path / "ddp/checkpoints/final/state/model.safetensors"))
    assert sorted(a) == sorted(b)  # the same keys: FSDP checkpoints drop tied aliases as DDP's save_model does
    lrs = {_step_lr(tmp_path / run) for run in ("fsdp", "ddp")}
    assert len(lrs) == 1, lrs
    lr = lrs.pop()
    assert_one_adamw_step_apart(weight_deltas(a, b), budget, lr)
    init = _initial_weights(config, run)  # the tiny model is built deterministically from the seed
    # lora_A starts random (its draw depends on the RNG state at build time); lora_B starts at 0, the base is frozen
    moved = max(float((b[k] - init[k]).abs().max()) for k in b if k in init and "lora_A" not in k)
    bulk = 2 * lr * budget.backward().tol()  # how far 99 % of the weights may differ
    assert moved > 100 * bulk, (moved, bulk)  # the step changed the weights: the comparison is not of untouched models
    for name in ("optimizer.safetensors", "optimizer.json"):  # optimizer state gathered to the same layout
        assert (tmp_path / "fsdp/checkpoints/final/state" / name).is_file()
    opt_a = load_file(str(tmp_path / "fsdp/checkpoints/final/state/optimizer.safetensors"))
    opt_b = load_file(str(tmp_path / "ddp/checkpoints/final/state/optimizer.safetensors"))
    assert sorted(opt_a) == sorted(opt_b)
    for k in opt_a:
        budget.backward().assert_close(opt_a[k], opt_b[k], factor=2, msg=k)


def _step_lr(run: Path) -> float:
    """The learning rate of a one-step run's step, from its own metrics.jsonl."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (lr,) = [r["optim/lr"] for r in records if "optim/lr" in r]
    return lr


@pytest.mark.slow
def test_fsdp_checkpoint_resumes(tmp_path, mmgrpo_cache):
    """A run stopped after step 1 under FSDP and resumed (resume=latest) ends where an uninterrupted FSDP run ends;
    the reward (length) varies within groups, so the resumed step moves the weights."""
    from mmgrpo import sharded_checkpoint as sc

    (tmp_path / "length_rewards.py").write_text(REWARD)
    run = [*VLM_STEP, "steps=2"]  # full fine-tuning with the k3 KL: policy, reference and optimizer state all resume
    full = _launch("fsdp_cpu_2proc", QUICK, run, tmp_path / "full", tmp_path)
    _launch("fsdp_cpu_2proc", QUICK, [*run, "stop_after=1"], tmp_path / "cut", tmp_path)
    assert [p.name for p in (tmp_path / "cut/checkpoints").iterdir()] == ["step-000001"]
    before, _ = sc.read(tmp_path / "cut/checkpoints/step-000001/state")  # the sharded step checkpoint, gathered
    resumed = _launch("fsdp_cpu_2proc", QUICK, [*run, "resume=latest"], tmp_path / "cut", tmp_path)
    assert resumed["train/processes"] == 2 and resumed["train/sharded"] == 1.0 and full["train/sharded"] == 1.0
    records = [json.loads(line) for line in (tmp_path / "cut/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "reward/mean" in r] == [1, 2]  # step 2 ran after the resume
    for name in ("model.safetensors", "optimizer.safetensors"):
        a = load_file(str(tmp_path / "full/checkpoints/final/state" / name))
        b = load_file(str(tmp_path / "cut/checkpoints/final/state" / name))
        assert sorted(a) == sorted(b)
        if name == "model.safetensors":
            assert_trained_after(before, b, tmp_path / "cut", 1)
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=f"{name}: {k}")  # same kernels, same order


@pytest.mark.slow
def test_a_sharded_checkpoint_saved_on_2_processes_resumes_on_1_and_on_2_with_identical_state(
    tmp_path, mmgrpo_cache, monkeypatch
):
    """Issue 35: under FSDP the step checkpoint is sharded (torch.distributed.checkpoint: each process wrote its own
    shards, nothing gathered, no model/ export). Resumed on 2 FSDP processes and on 1 plain process at its own step
    (``steps=1``: nothing left to train, the final save runs), each run's ``final/`` (gathered) holds exactly the
    weights and AdamW state the 2 processes saved; the 2-process one is also a normal Hugging Face directory. The
    length reward varies within groups: the saved weights differ from the initial ones."""
    from mmgrpo import sharded_checkpoint as sc

    (tmp_path / "length_rewards.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))  # the reward module, for _initial_weights' config
    run = [*VLM_STEP, "steps=2", "stop_after=1"]  # full fine-tuning: the reference copy and the optimizer too
    _launch("fsdp_cpu_2proc", QUICK, run, tmp_path / "cut", tmp_path)
    step = tmp_path / "cut/checkpoints/step-000001"
    assert sorted(p.name for p in (step / "state/sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (step / "state/model.safetensors").exists() and not (step / "model").exists()
    weights, optim = sc.read(step / "state")
    assert_trained_after(_initial_weights(QUICK, run), weights, tmp_path / "cut", 0)  # the saved state is trained
    names = [n for g in optim["param_groups"] for n in g["params"]]  # the optimizer's order: its state-dict index
    for world, out in ((2, "two"), (1, "one")):
        shutil.copytree(tmp_path / "cut", tmp_path / out)
        resume = [*VLM_STEP, "steps=1", "resume=latest"]
        if world == 2:
            summary = _launch("fsdp_cpu_2proc", QUICK, resume, tmp_path / out, tmp_path)
        else:
            summary = _run_one_process(QUICK, resume, tmp_path / out, tmp_path)
        assert summary["train/processes"] == world and summary["train/sharded"] == float(world == 2)
        final = tmp_path / out / "checkpoints/final"
        got = load_file(str(final / "state/model.safetensors"))
        assert got and set(got) <= set(weights)  # (tied aliases are saved once)
        for k, v in got.items():
            assert torch.equal(v, weights[k]), (world, k)
        moments = load_file(str(final / "state/optimizer.safetensors"))
        assert len(moments) == 3 * len(names)  # step, exp_avg, exp_avg_sq of every parameter
        for key, v in moments.items():
            _, i, name = key.split(".", 2)
            assert torch.equal(
                v.reshape(optim["state"][names[int(i)]][name].shape), optim["state"][names[int(i)]][name]
            )
        assert (final / "model/config.json").is_file() and (final / "model/model.safetensors").is_file()


def _run_one_process(config: Path, overrides: list[str], out: Path, tmp_path: Path) -> dict:
    """``python -m mmgrpo train`` in one process (no launcher, no process group); returns summary.json."""
    pythonpath = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=pythonpath)
    cmd = [sys.executable, "-m", "mmgrpo", "train", str(config), *overrides, f"output_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_every_family_rolls_out_and_trains_under_fsdp(tmp_path, mmgrpo_cache):
    """Every family of the contract table (tests/adapter_cases.py), sharded with FSDP2 on 2 processes, samples G
    completions of a different prompt on each process, scores them as the unsharded model does and back-propagates
    (tests/fsdp_rollout_worker.py). The token
    families decode in the one loop, which keeps stepping until every row of every process has ended: each forward
    of a sharded model is a collective, so a process that stopped on its own rows' end would leave the other one
    waiting (the launch's timeout would fail this test)."""
    out = tmp_path / "out"
    out.mkdir()
    cmd = [
        str(Path(sys.executable).parent / "accelerate"),
        "launch",
        "--config_file",
        str(ACCEL / "fsdp_cpu_2proc.yaml"),
        "--main_process_port",
        "0",  # any free rendezvous port, not 29500: launches on two test workers at once
        str(ROOT / "tests/fsdp_rollout_worker.py"),
        str(out),
        *CASES,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in CASES:
        ranks = [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in (0, 1)]
        for rec in ranks:
            assert rec["world"] == 2 and rec["sharded"], (name, rec)  # FSDP2 ran on 2 processes
            assert rec["rows"] == 2 and rec["units"] > 0, (name, rec)
            assert rec["grad_norm"] > 0, (name, rec)  # the backward reached this process's shard
            assert rec["max_diff_unsharded"] <= 1e-5, (name, rec)  # the sharded forward is the model's forward
        if name == "flow":  # no tokens: a fixed number of denoising steps
            continue
        # both processes ran the same decoding steps, as many as the longer of their rows needed
        assert ranks[0]["draws"] == ranks[1]["draws"] >= max(r["own_end"] for r in ranks) - 1, (name, ranks)
        if name != "ar_image":  # the families with an end token: process 0's rows ended first
            assert ranks[0]["own_end"] < ranks[1]["own_end"], (name, ranks)


@pytest.mark.parametrize("name", ["fsdp", "fsdp_cpu_2proc", "deepspeed_zero2", "deepspeed_zero3"])
def test_sharding_configs_load_through_accelerate(name, monkeypatch):
    """accelerate's launcher reads each file (its argument parser and validation, then the environment it passes to
    the processes) and its FSDP / DeepSpeed plugin is built from that environment, as in a launched process."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(ACCEL / f"{name}.yaml"), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if name.startswith("deepspeed"):
        assert args.use_deepspeed
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)  # as accelerate's launch_command sets it
        _, env = prepare_deepspeed_cmd_env(args)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        plugin = DeepSpeedPlugin()
        assert plugin.zero_stage == int(name[-1]) == plugin.deepspeed_config["zero_optimization"]["stage"]
        assert plugin.deepspeed_config["gradient_clipping"] == 1.0
    else:
        assert args.use_fsdp
        env = prepare_multi_gpu_env(args)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2  # FSDP1 needs a GPU and is refused by the trainer
        assert plugin.cpu_ram_efficient_loading is False  # the reference copy of full fine-tuning needs real weights
        assert plugin.reshard_after_forward is True
    assert args.num_processes == (2 if name.endswith("2proc") else 8)


def test_deepspeed_launch_is_refused_before_loading(tmp_path, monkeypatch):
    """A DeepSpeed launch stops with one line naming the reason and FSDP as the alternative (nothing loads)."""
    from mmgrpo.trainer import Trainer

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigError, match=r"DeepSpeed launches are not supported.*fsdp\.yaml"):
        Trainer(load_config(QUICK, [f"output_dir={tmp_path / 'run'}"]))
    assert not (tmp_path / "run").exists()


def test_fsdp_wraps_the_listed_blocks_the_model_contains(mmgrpo_cache):
    """LLaVA's ``_no_split_modules`` names CLIP's text embeddings, which its vision tower does not hold (accelerate's
    wrap policy raised on it); ``sharding.block_classes`` keeps the listed classes the model contains."""
    from mmgrpo import sharding
    from tests.adapter_cases import build

    model = build("vlm_llava", lora=False).model
    assert "CLIPTextEmbeddings" in model._no_split_modules
    assert sharding.block_classes(model) == ["CLIPEncoderLayer", "CLIPVisionEmbeddings", "LlamaDecoderLayer"]
