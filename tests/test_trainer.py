"""The training loop end to end on the tiny VLM: metrics, checkpoints, resume, multi-process, learning."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmgrpo import checkpoint as ckpt
from mmgrpo.loader import load_config
from mmgrpo.sampling import PromptSampler
from mmgrpo.schedules import lr_lambda
from mmgrpo.trainer import train
from tests.numerics import elementwise_tol

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "configs/quickstart.yaml"
SMALL = [
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=4",
    "model.args.max_new_tokens=5",
    "task.args.train_size=32",
    "task.args.eval_size=8",
    "warmup.steps=3",
    "warmup.batch_size=4",
    "eval.every=0",
    "logging.trackers=[]",
    "logging.progress=false",
    "optim.lr=1e-3",
]


VARIED_REWARD = '''
import zlib


def score(completions, **kwargs):
    """CRC-32 of the completion's text mod 7, over 6: deterministic, and it varies within a group of 5-token
    completions (the quickstart's rewards are all 0 there, so the policy update would be zero)."""
    return [(zlib.crc32(str(c).encode()) % 7) / 6.0 for c in completions]
'''
VARIED = "rewards=[{name: 'varied_reward:score'}]"  # with VARIED_REWARD written to a folder on the path


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints/final/model/model.safetensors"))


def assert_trained_after(cut: dict[str, torch.Tensor], final: dict[str, torch.Tensor], run: Path, step: int) -> float:
    """The steps after ``step`` (the checkpoint ``cut`` was read from) moved the weights to ``final`` and had reward
    contrast (``advantage/zero_std_fraction`` < 1 on one of them in ``run``'s metrics): a resume compared on a
    zero update would prove nothing. Returns max |final - cut| over the weights."""
    shared = [k for k in final if k in cut]
    assert shared, "the checkpoint and the final weights have no tensor name in common"
    moved = max(float((final[k].float() - cut[k].float()).abs().max()) for k in shared)
    assert moved > 0, "the steps after the checkpoint left every weight unchanged"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    flat = [r["advantage/zero_std_fraction"] for r in records if r.get("step", 0) > step and "reward/mean" in r]
    assert flat and min(flat) < 1, flat  # some group had reward variance: a non-zero advantage
    print(f"{run.name}: max |w_final - w_step{step}| = {moved:.3e}")
    return moved


def test_prompt_sampler_is_deterministic_and_partitions_ranks():
    a = PromptSampler(10, 3, world=2, rank=0, seed=1)
    b = PromptSampler(10, 3, world=2, rank=1, seed=1)
    assert a.indices(4) == PromptSampler(10, 3, 2, 0, 1).indices(4)
    first_epoch = a.indices(0) + b.indices(0) + a.indices(1) + b.indices(1)[:1]  # positions 0..9
    assert sorted(first_epoch) == list(range(10))  # every row once per epoch, no overlap between ranks


def test_lr_schedule():
    assert lr_lambda(0, 4, 10, "constant") == 0.25 and lr_lambda(3, 4, 10, "constant") == 1.0
    assert lr_lambda(4, 4, 10, "cosine") == 1.0
    assert math.isclose(lr_lambda(7, 4, 10, "cosine"), 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert math.isclose(lr_lambda(10, 4, 10, "linear"), 0.0, abs_tol=1e-12)


def test_run_writes_metrics_summary_checkpoint_and_plot(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    cfg = load_config(QUICK, SMALL + [f"output_dir={out}", "steps=3", "logging.trackers=[tensorboard]"])
    summary = train(cfg)
    for stage in ("before", "warmup", "after"):
        assert 0.0 <= summary[f"eval/{stage}/accuracy"] <= 1.0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for key in ("loss/policy", "loss/clip_fraction", "perf/step_s", "optim/grad_norm", "reward/accuracy"):
        assert all(math.isfinite(r[key]) for r in steps), key
    saved = json.loads((out / "summary.json").read_text())
    assert saved["train/steps"] == 3 and "eval/after/accuracy" in saved
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert (out / "checkpoints/final/COMPLETE").is_file()
    assert (out / "checkpoints/final/model/config.json").is_file()
    assert list((out / "logs").rglob("events.out.tfevents*")), "no TensorBoard event file"
    assert load_config(out / "config.yaml").steps == 3  # the resolved config reloads


def test_resume_reaches_the_same_parameters(tmp_path, mmgrpo_cache, monkeypatch):
    """Stop after step 2 (checkpoint), resume to step 5 == an uninterrupted 5-step run, under a varied reward."""
    (tmp_path / "varied_reward.py").write_text(VARIED_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    common = SMALL + ["steps=5", "eval.before=false", "eval.after=false", VARIED]
    full, parts = tmp_path / "full", tmp_path / "parts"
    train(load_config(QUICK, common + [f"output_dir={full}"]))
    train(load_config(QUICK, common + [f"output_dir={parts}", "stop_after=2"]))
    assert [p.name for p in ckpt.complete_checkpoints(parts)] == ["step-000002"]
    assert not (parts / "checkpoints/final").exists()
    cut = load_file(str(parts / "checkpoints/step-000002/state/model.safetensors"))
    train(load_config(QUICK, common + [f"output_dir={parts}", "resume=latest"]))
    a, b = _final_weights(full), _final_weights(parts)
    assert a.keys() == b.keys()
    assert_trained_after(cut, load_file(str(parts / "checkpoints/final/state/model.safetensors")), parts, 2)
    for k in a:  # equal by construction: the same process and order; resume restores weights, optimizer and RNG
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=k)
    steps = [json.loads(x)["step"] for x in (parts / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s] == [1, 2, 3, 4, 5]


def test_incomplete_checkpoints_are_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step-000004").mkdir(parents=True)  # crashed before COMPLETE was written
    (root / ".tmp-step-000006").mkdir()
    (root / "step-000002").mkdir()
    (root / "step-000002/COMPLETE").write_text("2\n")
    assert ckpt.find(tmp_path, "latest") == root / "step-000002"
    with pytest.raises(FileNotFoundError, match="not a complete mmgrpo checkpoint"):
        ckpt.find(tmp_path, str(root / "step-000004"))
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ckpt.find(tmp_path / "empty", "latest")


def _cli(*args, path: Path | None = None, **kw):
    """``python -m mmgrpo train configs/quickstart.yaml *args``; ``path``: a folder put first on PYTHONPATH."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-m", "mmgrpo", "train", str(QUICK), *args], env=env, **kw)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_parameters(tmp_path, mmgrpo_cache):
    """SIGKILL a real run after its step-2 checkpoint, resume it, compare with an uninterrupted run (varied reward)."""
    (tmp_path / "varied_reward.py").write_text(VARIED_REWARD)
    common = SMALL + [
        "steps=6",
        "checkpoint.every=2",
        "checkpoint.keep_last=5",
        "eval.before=false",
        "eval.after=false",
        VARIED,
    ]
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert _cli(*common, f"output_dir={full}", path=tmp_path).wait(timeout=600) == 0
    proc = _cli(*common, f"output_dir={killed}", path=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (killed / "checkpoints/step-000002/COMPLETE").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before its first checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "checkpoints/final").exists()
    cut = load_file(str(killed / "checkpoints/step-000002/state/model.safetensors"))
    assert _cli(*common, f"output_dir={killed}", "resume=latest", path=tmp_path).wait(timeout=600) == 0
    a, b = _final_weights(full), _final_weights(killed)
    assert a.keys() == b.keys()
    assert_trained_after(cut, load_file(str(killed / "checkpoints/final/state/model.safetensors")), killed, 2)
    for k in a:  # equal by construction: one thread in both, resume restores weights, optimizer and RNG bit for bit
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=k)


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes(tmp_path, mmgrpo_cache):
    """The shipped CPU launch recipe starts two processes that train together (not two copies of one run)."""
    out = tmp_path / "ddp"
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [
        str(accelerate),
        "launch",
        "--config_file",
        str(ROOT / "configs/accelerate/cpu_2proc.yaml"),
        "--main_process_port",
        "0",  # any free rendezvous port, not 29500: launches on two test workers at once
        "-m",
        "mmgrpo",
        "train",
        str(QUICK),
        *SMALL,
        "steps=3",
        f"output_dir={out}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train/processes"] == 2  # the world size the trainer saw
    final = out / "checkpoints/final"
    assert (final / "COMPLETE").is_file()
    assert sorted(p.name for p in (final / "state").glob("rng-*.json")) == [
        "rng-0.json",
        "rng-1.json",
    ]  # one per process
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "reward/mean" in r] == [1, 2, 3]  # written once, not once per process
    assert sum(1 for r in records if "eval/after/accuracy" in r) == 1
    assert proc.stdout.count("mmgrpo: eval/") == 1  # the final message printed once
    assert "eval/after/accuracy" in summary


@pytest.mark.slow
def test_quickstart_learns(tmp_path, mmgrpo_cache):
    """The quickstart as shipped: held-out accuracy >= 0.9, and GRPO adds >= 0.3 over the warm-up."""
    out = tmp_path / "quickstart"
    summary = train(load_config(QUICK, [f"output_dir={out}", "logging.progress=false", "logging.trackers=[]"]))
    chance = summary["eval/before/chance"]
    assert summary["eval/warmup/accuracy"] < chance + 0.15, summary  # warm-up teaches format, not vision
    assert summary["eval/after/accuracy"] >= 0.9, summary
    assert summary["eval/after/accuracy"] - summary["eval/warmup/accuracy"] >= 0.3, summary


@pytest.mark.numerics  # a fused kernel's vectorised update: another SIMD width contracts it differently
def test_adamw_is_fused_by_default_as_trls_and_optional(tmp_path, mmgrpo_cache):
    """``optim.fused: null`` picks torch's fused AdamW on CPU/CUDA weights (TRL's default ``adamw_torch_fused``),
    ``optim.fused: false`` the per-tensor step; both step the same weights to the same values, up to the rounding of
    AdamW's elementwise update (about 12 roundings: decay, two moments, bias corrections, √, ε, the step) that a fused
    kernel orders and contracts differently (tests/numerics.py)."""
    from mmgrpo.optim import fused_adamw_fits
    from mmgrpo.trainer import Trainer

    def one(fused):
        cfg = load_config(QUICK, SMALL + [f"output_dir={tmp_path / str(fused)}", f"optim.fused={fused}"])
        t = Trainer(cfg)
        opt = getattr(t.optimizer, "optimizer", t.optimizer)
        params = [p for p in t.adapter.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.ones_like(p) * 1e-3
        opt.step()
        return bool(opt.defaults["fused"]), [p.detach().clone() for p in params]

    (on, w_on), (off, w_off) = one("null"), one("false")
    assert on and not off
    lr = load_config(QUICK, SMALL + ["output_dir=unused"]).optim.lr
    for a, b in zip(w_on, w_off):
        torch.testing.assert_close(a, b, rtol=0, atol=elementwise_tol(ops=12, scale=float(b.abs().max()) + lr))
    ints = torch.nn.Parameter(torch.zeros(2, dtype=torch.int32), requires_grad=False)
    assert not fused_adamw_fits([]) and not fused_adamw_fits([ints])


def test_lr_multipliers_give_named_modules_their_own_learning_rate(tmp_path, mmgrpo_cache):
    """``optim.lr_multipliers: {vision_model: 100, connector: 100}`` on the SmolVLM: one AdamW group per key at
    lr × multiplier, the rest at lr; AdamW's first step moves a weight by lr·g/(|g| + ε) (bias-corrected moments),
    so with equal gradients the vision tower moves 100 times as far as the language model; the schedule scales both;
    a key matching nothing is one ConfigError listing what names contain."""
    from mmgrpo.config import ConfigError
    from mmgrpo.trainer import Trainer

    over = ["model.args.name_or_path=tiny-smolvlm", "optim.fused=false", "optim.warmup_steps=0"]
    cfg = load_config(
        QUICK, SMALL + over + [f"output_dir={tmp_path / 'a'}", "optim.lr_multipliers={vision_model: 100}"]
    )
    t = Trainer(cfg)
    opt = getattr(t.optimizer, "optimizer", t.optimizer)
    assert [(g["name"], g["lr"]) for g in opt.param_groups] == [("vision_model", 0.1), ("base", 1e-3)]
    named = [(n, p) for n, p in t.adapter.model.named_parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in named}
    for _, p in named:
        p.grad = torch.full_like(p, 1e-2)
    opt.step()
    for n, p in named:
        step = float((before[n] - p.detach()).abs().max())  # |Δw| = lr · 1e-2 / (1e-2 + 1e-8)
        want = 0.1 if "vision_model" in n else 1e-3
        assert math.isclose(step, want * 1e-2 / (1e-2 + 1e-8), rel_tol=1e-3), (n, step)
    bad = load_config(QUICK, SMALL + over + [f"output_dir={tmp_path / 'b'}", "optim.lr_multipliers={visual: 10}"])
    with pytest.raises(ConfigError, match=r"optim\.lr_multipliers: \['visual'\] match no trainable parameter name"):
        Trainer(bad)
