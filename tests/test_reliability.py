"""Faults that must not lose work or run foreign code: non-finite steps, a used output_dir, resume mistakes,
pickles planted in a checkpoint, SIGTERM, and what a saved model carries (docs/reliability.md)."""

import hashlib
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmgrpo import checkpoint as ckpt
from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer, train

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "configs/quickstart.yaml"
TINY = [
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=8",
    "model.args.max_new_tokens=4",
    "task.args.train_size=16",
    "task.args.eval_size=4",
    "warmup.steps=0",
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "logging.trackers=[]",
    "logging.progress=false",
    "logging.plot=false",
    "optim.lr=1e-3",
]


def _cfg(out: Path, *extra: str):
    return load_config(QUICK, TINY + [f"output_dir={out}", *extra])


def _steps(out: Path) -> list[int]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "reward/mean" in r]


def _all_finite(directory: Path) -> bool:
    tensors = load_file(str(directory / "state/model.safetensors"))
    return all(bool(torch.isfinite(t).all()) for t in tensors.values() if t.is_floating_point())


def _snapshot(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def inf_on_call(completions, *, counter: str = "", at: int = 0, **columns):
    """A reward that scores +inf for the first sample of its ``at``-th call (counted in a file: works across
    threads and worker processes) and 0 otherwise."""
    path = Path(counter)
    calls = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(calls))
    return [math.inf if (calls == at and i == 0) else 0.0 for i in range(len(completions))]


# ------------------------------------------------------------------------------------- non-finite guard


def test_nan_gradients_are_skipped_and_never_reach_a_checkpoint(tmp_path, mmgrpo_cache):
    """Inject NaN into the log-probs from step 2 on: updates are skipped and counted, the run stops after
    max_skipped_steps in a row, and the surviving (keep_last=1) checkpoint holds the last finite weights."""
    out = tmp_path / "run"
    trainer = Trainer(_cfg(out, "steps=8", "checkpoint.every=1", "checkpoint.keep_last=1", "optim.max_skipped_steps=2"))
    real_logprobs, before_nan = trainer.adapter.logprobs, {}

    def poisoned(rollout, idx):
        logp = real_logprobs(rollout, idx)
        if trainer.state.step < 1:
            return logp
        if not before_nan:  # the weights after step 1, before any NaN gradient
            before_nan.update({k: v.detach().clone() for k, v in trainer.adapter.model.state_dict().items()})
        return logp * float("nan")

    trainer.adapter.logprobs = poisoned
    with pytest.raises(FloatingPointError, match="2 optimizer updates in a row had non-finite gradients"):
        trainer.run()
    records = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert [records[s]["optim/skipped_steps"] for s in (1, 2)] == [0.0, 1.0] and 3 not in records
    assert math.isfinite(records[1]["optim/grad_norm"]) and records[2]["optim/grad_norm"] is None  # NaN: null
    assert [p.name for p in ckpt.complete_checkpoints(out)] == ["step-000002"]  # step 3 raised before saving
    saved = load_file(str(out / "checkpoints/step-000002/state/model.safetensors"))
    assert _all_finite(out / "checkpoints/step-000002")
    for k, v in before_nan.items():  # the skipped update left the weights untouched
        if k in saved:
            torch.testing.assert_close(saved[k], v, atol=0, rtol=0, msg=k)
    summary = train(
        _cfg(
            out, "steps=3", "checkpoint.every=1", "checkpoint.keep_last=1", "optim.max_skipped_steps=2", "resume=latest"
        )
    )
    assert summary["train/steps"] == 3 and _all_finite(out / "checkpoints/final")
    assert _steps(out) == [1, 2, 3]


def test_save_refuses_non_finite_weights_and_keeps_the_last_good_checkpoint(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    trainer = Trainer(_cfg(out, "steps=1"))
    trainer._save(1)
    _name, param = next(iter(trainer.adapter.model.named_parameters()))
    with torch.no_grad():
        param.view(-1)[0] = float("inf")
    with pytest.raises(ckpt.CheckpointError, match="refusing to save step-000002: 1 non-finite"):
        trainer._save(2)
    assert [p.name for p in ckpt.complete_checkpoints(out)] == ["step-000001"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001"]  # no partial directory
    assert _all_finite(out / "checkpoints/step-000001")


def test_inf_reward_never_produces_a_non_finite_checkpoint(tmp_path, mmgrpo_cache):
    """A reward returning +inf for one sample at step 2 (on_error=nan): the run goes on and every checkpoint,
    including the one kept by keep_last=1 and final/, is finite."""
    out = tmp_path / "run"
    spec = (
        f"{{name: 'tests.test_reliability:inf_on_call', weight: 1.0, kwargs: {{counter: '{tmp_path / 'n'}', at: 2}}}}"
    )
    cfg = _cfg(
        out,
        "steps=3",
        "checkpoint.every=1",
        "checkpoint.keep_last=1",
        "reward_runtime.on_error=nan",
        "reward_runtime.load_check=false",  # the reward counts its calls in a file: training calls only
        f"rewards=[{spec}]",
    )
    train(cfg)
    assert int((tmp_path / "n").read_text()) == 3  # the reward ran each step, +inf at step 2
    assert [p.name for p in ckpt.complete_checkpoints(out)] == ["step-000003"]
    assert _all_finite(out / "checkpoints/step-000003") and _all_finite(out / "checkpoints/final")


# ------------------------------------------------------------------------------ output_dir and resume


def test_second_run_into_a_used_output_dir_fails_in_one_line_and_leaves_the_first(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    train(_cfg(out, "steps=1"))
    before = _snapshot(out)
    proc = subprocess.run(
        [sys.executable, "-m", "mmgrpo", "train", str(QUICK), *TINY, "steps=1", f"output_dir={out}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "already holds a run" in lines[0] and "resume=latest" in lines[0] and "overwrite=true" in lines[0]
    assert _snapshot(out) == before
    train(_cfg(out, "steps=1", "overwrite=true"))  # moves the old run aside, never deletes it
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert _snapshot(aside) == before
    assert (out / "checkpoints/final/COMPLETE").is_file()


def test_resume_refuses_a_changed_config_and_replaces_re_run_metrics(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    train(_cfg(out, "steps=3", "checkpoint.every=2", "checkpoint.keep_last=5", "checkpoint.save_final=false"))
    assert _steps(out) == [1, 2, 3] and [p.name for p in ckpt.complete_checkpoints(out)] == ["step-000002"]
    with pytest.raises(ConfigError) as err:
        Trainer(
            _cfg(
                out,
                "steps=4",
                "checkpoint.every=2",
                "checkpoint.keep_last=5",
                "checkpoint.save_final=false",
                "resume=latest",
                "optim.lr=0.01",
                "seed=3",
            )
        )
    message = str(err.value)
    assert "\n" not in message and "optim.lr: 0.001 -> 0.01" in message and "seed: 0 -> 3" in message
    train(
        _cfg(
            out,
            "steps=4",
            "checkpoint.every=2",
            "checkpoint.keep_last=5",
            "checkpoint.save_final=false",
            "resume=latest",
        )
    )
    assert _steps(out) == [1, 2, 3, 4]  # step 3 re-run from the step-2 checkpoint: replaced, not duplicated


def test_resume_latest_without_step_checkpoints(tmp_path, mmgrpo_cache):
    """The quickstart saves no periodic checkpoints: resume=latest continues from final/ (its last step);
    with nothing saved it is one line saying what exists and what to do."""
    with pytest.raises(ConfigError, match=r"resume=latest: no complete checkpoint, .* does not exist; set checkpoint"):
        Trainer(_cfg(tmp_path / "never", "steps=2", "resume=latest"))
    out = tmp_path / "run"
    train(_cfg(out, "steps=2"))
    assert ckpt.find(out, "latest") == out / "checkpoints/final"
    summary = train(_cfg(out, "steps=3", "resume=latest"))
    assert summary["train/steps"] == 3 and ckpt.saved_step(out / "checkpoints/final") == 3
    assert _steps(out) == [1, 2, 3]


# ------------------------------------------------------------------------------------------ safe loading


class _Payload:
    """Unpickling this creates ``path``: stands for any code a crafted pickle could run."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_planted_in_a_checkpoint_is_never_unpickled(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    train(_cfg(out, "steps=2", "checkpoint.every=1", "checkpoint.keep_last=5", "checkpoint.save_final=false"))
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Payload(probe)))  # the payload is live: unpickling it does create the file
    assert probe.exists()
    sentinel = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(sentinel))
    target = out / "checkpoints/step-000002"
    for name in (
        "custom_checkpoint_0.pkl",
        "custom_checkpoint_1.pkl",
        "random_states_0.pkl",
        "optimizer.bin",
        "scheduler.bin",
        "pytorch_model.bin",
        "state/optimizer.pt",
        "state/rng-0.pkl",
        "model/training_args.bin",
    ):
        (target / name).write_bytes(payload)
    summary = train(
        _cfg(
            out,
            "steps=3",
            "checkpoint.every=1",
            "checkpoint.keep_last=5",
            "checkpoint.save_final=false",
            "resume=latest",
        )
    )
    assert summary["train/steps"] == 3 and _steps(out) == [1, 2, 3]
    assert not sentinel.exists()


def test_checkpoint_holds_one_rng_state_per_process_and_no_pickle(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    train(_cfg(out, "steps=1"))
    final = out / "checkpoints/final"
    names = {p.name for p in (final / "state").iterdir()}
    assert {"model.safetensors", "optimizer.json", "optimizer.safetensors", "trainer.json"} <= names
    assert {n for n in names if n.startswith("rng-")} == {"rng-0.json", "rng-0.safetensors"}
    assert not [p for p in final.rglob("*") if p.suffix in (".pkl", ".bin", ".pt", ".pth")]


# -------------------------------------------------------------------------------------- saved model


def test_saved_model_carries_a_model_card_and_sampling_settings(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    train(_cfg(out, "steps=1"))
    model = out / "checkpoints/final/model"
    card = (model / "README.md").read_text()
    assert "`tiny-qwen2.5-vl`" in card and "max_new_tokens: 4" in card and "## Training config" in card
    sampling = json.loads((model / "mmgrpo_sampling.json").read_text())
    assert sampling["adapter"] == "vlm" and sampling["model_args"]["max_new_tokens"] == 4


def test_flow_adapter_reports_the_prompt_length_it_encodes_with(mmgrpo_cache):
    from mmgrpo.modalities.flow.adapter import build_flow_adapter

    adapter = build_flow_adapter({"name_or_path": "tiny-sd3", "resolution": 32, "eval_num_steps": 3}, seed=0)
    settings = adapter.sampling_settings()
    t5 = adapter.pipe.tokenizer_3
    assert settings["max_sequence_length"] == min(256, t5.model_max_length) != 256  # diffusers' default differs
    assert settings["num_inference_steps"] == 3 and settings["height"] == 32


# ------------------------------------------------------------------------------------------- SIGTERM


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_at_the_end_of_the_step_and_resumes(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "mmgrpo", "train", str(QUICK), *TINY, f"output_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([*args, "steps=200"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not ((out / "metrics.jsonl").exists() and _steps(out)):
        assert proc.poll() is None and time.time() < deadline, "run ended before its first step"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    (saved,) = ckpt.complete_checkpoints(out)
    step = ckpt.saved_step(saved)
    assert "SIGTERM received" in stderr and 1 <= step < 200 and _steps(out) == list(range(1, step + 1))
    assert not (out / "checkpoints/final").exists() and _all_finite(saved)
    done = subprocess.run([*args, f"steps={step + 2}", "resume=latest"], env=env, timeout=300)
    assert done.returncode == 0
    assert _steps(out) == list(range(1, step + 3)) and ckpt.saved_step(out / "checkpoints/final") == step + 2
