"""Runs tell the user what happens when it happens (issue 36): evaluations printed as they finish, no third-party
deprecation notice in normal output, ``train --help`` names resume / overwrite, the demo names its own --share
flag, and held-out reward means are named ``reward/<name>`` (``reward/wer`` is 1 − WER; ``wer`` is a WER)."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmgrpo.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "steps=2",
    "warmup.steps=0",
    "eval.every=1",
    "eval.max_rows=2",
    "algorithm.group_size=2",
    "algorithm.prompts_per_step=2",
    "algorithm.minibatch_size=4",
    "model.args.max_new_tokens=4",
    "logging.trackers=[]",
    "logging.plot=false",
    "checkpoint.save_final=false",
]


def test_evaluations_print_as_they_finish_and_no_deprecation_noise(tmp_path, mmgrpo_cache):
    cmd = [sys.executable, "-m", "mmgrpo", "train", str(ROOT / "configs/quickstart.yaml"), *SMALL]
    env = dict(os.environ, OMP_NUM_THREADS="1", MMGRPO_CACHE=str(mmgrpo_cache))
    cmd.append(f"output_dir={tmp_path / 'run'}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("mmgrpo: eval ")]
    stages = [line.split(" (")[0].removeprefix("mmgrpo: eval ") for line in lines]
    assert stages == ["before", "step1", "after"]
    assert "(step 1): accuracy=" in lines[1]
    assert proc.stdout.count("mmgrpo: eval/") == 1  # the final summary line is still there, once
    assert "FutureWarning" not in proc.stderr and "past_key_values" not in proc.stderr


def test_train_help_names_resume_and_overwrite(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "resume=latest" in text and "overwrite=true" in text and "--print-config" in text


def test_held_out_reward_means_are_named_reward_slash_name():
    from mmgrpo.rewards.runner import RewardRunner
    from mmgrpo.trainer import Trainer

    trainer = SimpleNamespace(
        adapter=None,
        rewards=RewardRunner([("wer", 1.0, {})]),
        state=SimpleNamespace(step=0),
        _trl_state=lambda step: None,
    )
    rows = [{"prompt": "", "answer": "one two"}, {"prompt": "", "answer": "three four"}]
    scores = Trainer._reward_scores(trainer, ["one two", "three"], rows)
    assert set(scores) == {"reward/wer", "reward"}  # not "wer": that name is a WER (spoken_digits' metric)
    assert scores["reward/wer"] == pytest.approx((1.0 + 0.5) / 2)  # 1 - WER per row, averaged


_DEMO = """
import sys
from types import SimpleNamespace
import gradio as gr
from mmgrpo.demo import app as demo_app

class Tiny(gr.Blocks):
    scratch_dir = sys.argv[1]

def build(run_dir, models):
    with Tiny() as blocks:
        gr.Markdown("x")
    return blocks

demo_app.load_run_config = lambda run_dir, trust: None
demo_app.find_checkpoint = lambda run_dir, name: None
demo_app.Models = lambda *a: SimpleNamespace(get=lambda: None)
demo_app.build_app = build
demo_app.serve(sys.argv[1], port=None, block=False).close()
"""


def test_demo_names_its_share_flag(tmp_path):
    """The demo's own hint names ``--share`` (the flag of ``mmgrpo demo``), not Gradio's ``share=True``. Run in a
    subprocess: Gradio's server threads write to the streams of the process that started them."""
    pytest.importorskip("gradio")
    proc = subprocess.run(
        [sys.executable, "-c", _DEMO, str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--share" in proc.stdout and "share=True" not in proc.stdout + proc.stderr, proc.stdout
    assert "Running on local URL" in proc.stdout, proc.stdout


def test_speech_docs_name_the_metrics_as_logged():
    text = (ROOT / "docs" / "speech.md").read_text()
    assert "`eval/<stage>/reward/wer`" in text and "`eval/<stage>/wer`" in text


def test_the_kv_cache_goes_by_the_installed_transformers_name():
    """Our forwards pass and read the KV cache under the name the installed transformers uses (``cache`` in 5.x,
    where ``past_key_values`` raises a rename notice and goes in 5.40), so no rename notice is raised, and none is
    hidden: pyproject's filterwarnings turns such a notice into a test failure."""
    from dataclasses import fields

    from transformers.modeling_outputs import BaseModelOutputWithPast

    from mmgrpo.modalities import _hf

    name = "cache" if "cache" in {f.name for f in fields(BaseModelOutputWithPast)} else "past_key_values"
    marker = object()
    assert _hf.kv_cache(marker) == {name: marker}
    assert _hf.returned_cache(BaseModelOutputWithPast(**{name: marker})) is marker


def test_an_escaped_exception_is_noted_for_the_suites_count(tmp_path, monkeypatch):
    """``main`` notes an exception that escapes it (what the user would see as a traceback) in
    ``$MMGRPO_ESCAPED_ERRORS``, which tests/conftest.py counts over the session; one-line exits are not noted."""
    from mmgrpo import cli

    log = tmp_path / "escaped.txt"
    monkeypatch.setenv(cli.ESCAPES_ENV, str(log))
    assert main(["train", str(ROOT / "configs/quickstart.yaml"), "--dry-run", "algorithm.nope=1"]) == 2
    assert not log.exists()  # a config mistake: one line, nothing escaped

    def boom(argv):
        raise ValueError("unexpected\nsecond line")

    monkeypatch.setattr(cli, "_main", boom)
    with pytest.raises(ValueError):
        main(["train", "x.yaml"])
    assert log.read_text().splitlines() == ["ValueError: unexpected | argv ['train', 'x.yaml']"]
