"""Environment faults and run-time-wrong values end in one line, not a traceback (docs/reliability.md, "One line
for every fault"): values checked at load, missing or offline models, unwritable output directories, a full disk,
damaged checkpoints, runs stopped before their first checkpoint, diverged weights, interruptions."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmgrpo import checkpoint as ckpt
from mmgrpo import manifest
from mmgrpo.config import ConfigError, dump_config
from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer, train
from mmgrpo.types import DataError
from tests.test_reliability import QUICK, ROOT, TINY, _cfg, _steps


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=.inf", "optim.lr: must be a finite number, got inf"),
        ("optim.lr=1e30", r"optim.lr: must be > 0 and <= 1, got 1e\+30"),
        ("optim.weight_decay=-1", "optim.weight_decay: must be >= 0, got -1.0"),
        ("optim.max_grad_norm=-1", "optim.max_grad_norm: must be >= 0, got -1.0"),
        ("optim.betas=[0.9,1.5]", r"optim.betas\[1\]: must be >= 0 and < 1, got 1.5"),
        ("warmup.steps=-3", "warmup.steps: must be >= 0, got -3"),
        ("checkpoint.keep_last=0", "checkpoint.keep_last: must be >= 1, got 0"),
        (
            "algorithm.surrogate_args.clip_high=1e9",
            "algorithm.surrogate_args.clip_high: must be >= 0 and <= 10, got 1000000000.0",
        ),
        ("stop_after=500", "stop_after: 500 is past steps=300"),
    ],
)
def test_values_wrong_at_run_time_are_refused_at_load_and_by_dry_run(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(QUICK, [override])
    assert "\n" not in str(err.value)


def test_chunk_sizes_must_sum_to_the_flow_steps():
    with pytest.raises(ConfigError, match=r"chunk_sizes: \[2, 2, 3\] sums to 7, but each 'flow' sample has T=8"):
        load_config(ROOT / "configs/flow_chunk.yaml", ["algorithm.chunk_sizes=[2,2,3]"])
    assert sum(load_config(ROOT / "configs/flow_chunk.yaml").algorithm.chunk_sizes) == 8


def test_dry_run_checks_the_ranges():
    proc = subprocess.run(
        [sys.executable, "-m", "mmgrpo", "train", str(QUICK), "optim.lr=.inf", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 2 and proc.stderr == "mmgrpo: config error: optim.lr: must be a finite number, got inf\n"


@pytest.mark.parametrize(
    ("adapter", "name"),
    [
        ("whisper", "openai/whisper-tiny"),
        ("audio_llm", "Qwen/Qwen2-Audio-7B-Instruct"),
        ("ar_image", "deepseek-community/Janus-Pro-1B"),
        ("flow", "stabilityai/stable-diffusion-3.5-medium"),
        ("vlm", "Qwen/Qwen2.5-VL-3B-Instruct"),
        ("flow", "/no/such/pipeline"),
        ("whisper", "/no/such/model"),
    ],
)
def test_a_missing_or_offline_model_is_one_line_for_every_family(adapter, name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from mmgrpo.loader import load_builtins
    from mmgrpo.plugins import ADAPTERS

    load_builtins()
    with pytest.raises(ConfigError) as err:
        ADAPTERS.get(adapter)({"name_or_path": name})
    message = str(err.value)
    assert message.startswith(f"model.args.name_or_path: {name!r}") and "\n" not in message
    if name.startswith("/"):
        assert "does not exist (a local path)" in message
    else:
        assert "could not be loaded from the Hugging Face hub" in message and "HF_HUB_OFFLINE" in message


# ------------------------------------------------------------------------------------- output directory


def test_an_unwritable_output_dir_is_one_line_before_the_model_loads(tmp_path):
    with pytest.raises(ckpt.RunDirError) as err:
        Trainer(_cfg(Path("/proc/mmgrpo-run"), "steps=1"))
    assert str(err.value).startswith("output_dir=/proc/mmgrpo-run: cannot create the run lock")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        (OSError(errno.EROFS, "Read-only file system"), "the file system is read-only"),
        ("safetensors", "No space left on device); free some disk space"),
    ],
)
def test_a_full_or_read_only_disk_while_saving_keeps_the_last_checkpoint(
    tmp_path, mmgrpo_cache, monkeypatch, fault, reason
):
    """The write of the model fails as on a full disk (safetensors' own error, as it reports ENOSPC) or a file
    system remounted read-only mid-run: one line, no partial directory, the older checkpoint kept."""
    from safetensors import SafetensorError

    out = tmp_path / "run"
    trainer = Trainer(_cfg(out, "steps=2"))
    trainer._save(1)
    error = (
        SafetensorError("Error while serializing: No space left on device (os error 28)")
        if fault == "safetensors"
        else fault
    )

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(ckpt, "save_model", failing)
    with pytest.raises(ckpt.RunDirError) as err:
        trainer._save(2)
    message = str(err.value)
    assert message.startswith("cannot write checkpoint step-000002 under") and reason in message and "\n" not in message
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001"]
    trainer.close()


def test_a_run_stopped_before_its_first_checkpoint_can_be_started_again(tmp_path, mmgrpo_cache):
    """Only config.yaml (killed while loading or in warm-up): rerun accepted; leftovers of a run with steps but no
    checkpoint are moved aside (nothing deleted); resume=latest says to start again instead of circling back."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(
        ConfigError, match="stopped before its first checkpoint, so there is nothing to continue; start it"
    ):
        Trainer(_cfg(out, "steps=1", "resume=latest"))
    train(_cfg(out, "steps=1"))
    assert _steps(out) == [1]
    again = tmp_path / "again"
    again.mkdir()
    (again / "config.yaml").write_text("seed: 0\n")
    (again / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    train(_cfg(again, "steps=1"))
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("again.old-")]
    assert json.loads((aside / "metrics.jsonl").read_text())["reward/mean"] == 0.5  # kept, not deleted
    assert _steps(again) == [1]


# ------------------------------------------------------------------------------------------- checkpoints


def test_a_truncated_newest_checkpoint_falls_back_to_the_newest_complete_one(tmp_path, mmgrpo_cache, caplog):
    out = tmp_path / "run"
    train(_cfg(out, "steps=2", "checkpoint.every=1", "checkpoint.keep_last=5", "checkpoint.save_final=false"))
    newest = out / "checkpoints/step-000002/state/model.safetensors"
    os.truncate(newest, newest.stat().st_size // 2)
    run = ("checkpoint.every=1", "checkpoint.keep_last=5", "checkpoint.save_final=false")
    with pytest.raises(FileNotFoundError, match="step-000002: the checkpoint is damaged"):  # named: no fallback
        ckpt.find(out, str(out / "checkpoints/step-000002"))
    trainer = Trainer(_cfg(out, "steps=3", *run, "resume=latest"))
    assert trainer._resume_dir == out / "checkpoints/step-000001"
    assert "skipped damaged checkpoint(s) step-000002: state/model.safetensors is unreadable" in caplog.text
    trainer.run()
    assert _steps(out) == [1, 2, 3]


def test_a_resumed_finished_run_with_fewer_steps_says_so(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    train(_cfg(out, "steps=2"))
    with pytest.raises(ConfigError, match=r"resume=latest: .*final is at step 2, past steps=1; set steps above 2"):
        Trainer(_cfg(out, "steps=1", "resume=latest"))


def test_a_checkpoint_of_another_model_setting_is_one_line(tmp_path, mmgrpo_cache):
    """A LoRA checkpoint whose config.yaml was replaced by a full fine-tune's (a lost config.yaml is refused before
    the model loads: tests/test_reliability3_rundir.py), resumed by a full fine-tune config: one line, not the list
    of every missing tensor, before anything is loaded."""
    lora = tmp_path / "lora"
    train(_cfg(lora, "steps=1", "model.lora.enabled=true"))
    full = _cfg(tmp_path / "full", "steps=2", f"resume={lora / 'checkpoints/final'}")
    (lora / "checkpoints/final/config.yaml").write_text(dump_config(full))
    manifest.write(lora / "checkpoints/final")  # its manifest agrees (issue 54): whole, but of another setting
    trainer = Trainer(full)
    with pytest.raises(ckpt.CheckpointError) as err:
        trainer.run()
    assert "\n" not in str(err.value) and str(err.value).startswith(
        f"resume={lora / 'checkpoints/final'}: state/model.safetensors does not match the model this config builds ("
    )


# --------------------------------------------------------------------------------------------- training


def test_weights_that_diverge_stop_the_run_naming_the_learning_rate(tmp_path, mmgrpo_cache):
    """What optim.lr=1e30 did: a finite update made the weights inf, sampling drew from NaN probabilities and
    failed with 'index 1 is out of bounds' in noise.py; now the first non-finite gradient names the cause."""
    out = tmp_path / "run"
    trainer = Trainer(_cfg(out, "steps=4", "checkpoint.every=1"))
    step = trainer.optimizer.step

    def exploding_step(*args, **kwargs):
        step(*args, **kwargs)
        with torch.no_grad():
            next(iter(trainer.adapter.trainable_parameters())).fill_(float("inf"))

    trainer.optimizer.step = exploding_step
    trainer.cfg.algorithm.filter_zero_variance = False

    def train_until_an_update():  # the tiny model may see no reward variance at first: train until one happens
        for _ in range(4):
            trainer.train_step(trainer.state.step)
            trainer.state.step += 1

    with pytest.raises(FloatingPointError, match=r"the policy's weights are no longer finite .* lower optim.lr"):
        train_until_an_update()
    trainer.close()


def test_a_bad_json_line_in_a_prompt_file_is_one_data_error(tmp_path):
    from mmgrpo.tasks.t2i_prompts import read_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a red cube"}\n{"prompt": "a blue\n')
    with pytest.raises(DataError, match=rf"{path} line 2: not valid JSON \(Unterminated string"):
        read_prompts(str(path))


def test_accelerate_cpu_flag_with_two_processes_is_refused(tmp_path):
    """accelerate launch --num_processes 2 --cpu starts one process; it stops with one line saying how to get two."""
    accelerate = Path(sys.executable).parent / "accelerate"
    proc = subprocess.run(
        [str(accelerate), "launch", "--num_processes", "2", "--cpu", "-m", "mmgrpo", "train", str(QUICK), *TINY]
        + [f"output_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mmgrpo:")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert "--num_processes 2 --cpu starts one process" in lines[0] and "cpu_2proc.yaml" in lines[0]
    assert "mmgrpo/trainer.py" not in proc.stderr  # (accelerate's launcher prints its own CalledProcessError)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def _terminal_sigint() -> None:
    """In the child before exec: SIGINT default and unblocked, as a shell starts a command. Both are inherited, and
    Python installs its KeyboardInterrupt handler only for a default SIGINT; in the suite (two pytest-xdist workers)
    the child's Ctrl-C was twice never delivered after other tests had run in the same worker."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_warm_up_is_one_line_and_the_run_can_start_again(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "mmgrpo", "train", str(QUICK), *TINY, f"output_dir={out}", "steps=1"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [*args, "warmup.steps=100000", "warmup.batch_size=2"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_terminal_sigint,  # as from a shell: an earlier test of this worker may leave SIGINT ignored/blocked
    )
    deadline = time.time() + 300
    while not (out / "config.yaml").exists():  # written after the model loaded, just before the warm-up
        assert proc.poll() is None and time.time() < deadline, "run ended before its warm-up"
        time.sleep(0.1)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()  # never leave a 100,000-step warm-up running under the rest of the suite
        raise
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert (
        lines[-1].startswith("mmgrpo: interrupted; no checkpoint was saved in") and "run the same command" in lines[-1]
    )
    assert subprocess.run(args, env=env, timeout=300).returncode == 0  # the same command starts it again
    assert _steps(out) == [1]
