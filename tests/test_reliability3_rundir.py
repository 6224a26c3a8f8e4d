"""Issue 37 (Reliability 3): one run directory whatever the path names it, and resume checks what it loads
(docs/reliability.md, "A run directory has one live run" and "Resume checks what it loads").

Each checkpoint case damages the newest of two checkpoints of one tiny run (trained once per module, copied per
test) and checks that resume passes over it for the previous one with one line saying why, or, with nothing left
or a checkpoint named explicitly, stops with one line."""

import dataclasses
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mmgrpo import checkpoint as ckpt
from mmgrpo import manifest, run_dir
from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer, train
from tests.test_reliability import QUICK, TINY, _cfg, _snapshot, _steps

RUN = ("checkpoint.every=1", "checkpoint.keep_last=5", "checkpoint.save_final=false")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, mmgrpo_cache):
    out = tmp_path_factory.mktemp("trained") / "run"
    train(_cfg(out, "steps=2", *RUN))
    return out


@pytest.fixture
def run(trained, tmp_path):
    """A copy of a finished 2-step run with checkpoints step-000001 and step-000002."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def _resume(out, *extra: str) -> Trainer:
    return Trainer(_cfg(out, "steps=3", *RUN, "resume=latest", *extra))


def _rewrite(path: Path, change) -> None:
    """Load a safetensors file, let ``change`` edit the dict of tensors, write it back."""
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _first_float(path: Path) -> str:
    with safe_open(str(path), framework="pt") as f:
        return next(k for k in sorted(f.keys()) if f.get_slice(k).get_dtype() == "F32" and f.get_slice(k).get_shape())


def _set_trainer_step(state: Path, step) -> None:
    saved = json.loads((state / "trainer.json").read_text())
    saved["trainer"]["step"] = step
    (state / "trainer.json").write_text(json.dumps(saved))


def _nan_weight(state: Path) -> None:
    key = _first_float(state / "model.safetensors")
    _rewrite(state / "model.safetensors", lambda t: t[key].view(-1).__setitem__(0, float("nan")))


def _inf_moment(state: Path) -> None:
    _rewrite(state / "optimizer.safetensors", lambda t: t["state.0.exp_avg"].view(-1).__setitem__(0, float("inf")))


def _int_moment(state: Path) -> None:
    _rewrite(state / "optimizer.safetensors", lambda t: t.__setitem__("state.0.exp_avg", t["state.0.exp_avg"].long()))


def _renamed_moment(state: Path) -> None:
    _rewrite(state / "optimizer.safetensors", lambda t: t.__setitem__("state.x.exp_avg", t.pop("state.0.exp_avg")))


PRE_MODEL = {  # damage to the files alone: refused before the model loads, named in the warning
    "nan weight": (_nan_weight, r"state/model\.safetensors\[[\w.]+\] is not finite"),
    "inf optimizer moment": (_inf_moment, r"state/optimizer\.safetensors\[state\.0\.exp_avg\] is not finite"),
    "int optimizer moment": (_int_moment, r"state/optimizer\.safetensors\[state\.0\.exp_avg\] is I64, not floating"),
    "optimizer key of no parameter": (_renamed_moment, r"'state\.x\.exp_avg' names no parameter of the optimizer"),
    "negative step": (lambda s: _set_trainer_step(s, -5), r"state/trainer\.json: step -5 is not a non-negative int"),
    "step of another directory": (
        lambda s: _set_trainer_step(s, 7),
        r"state/trainer\.json: step 7 does not match the checkpoint's step 2",
    ),
    "non-integer step": (lambda s: _set_trainer_step(s, 2.5), r"state/trainer\.json: step 2\.5 is not a non-negative"),
    "deleted config.yaml": (lambda s: (s.parent / "config.yaml").unlink(), r"config\.yaml is missing"),
    "deleted optimizer.safetensors": (
        lambda s: (s / "optimizer.safetensors").unlink(),
        r"state/optimizer\.safetensors is missing",
    ),
    "deleted RNG state (json)": (lambda s: (s / "rng-0.json").unlink(), r"state/rng-0\.json is missing"),
    "deleted RNG state (tensors)": (lambda s: (s / "rng-0.safetensors").unlink(), r"state/rng-0\.safetensors is"),
}


def _skipped_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipped damaged checkpoint(s)" in r.getMessage()]


# ----------------------------------------------------------------------------------------- run directory


def test_a_dotdot_path_through_a_missing_folder_is_the_run_it_names(run, tmp_path):
    """``output_dir=<parent>/missing/../run`` on a finished run: refused as ``output_dir=<parent>/run`` is (nothing
    written, no ``missing`` folder made); with ``overwrite=true`` the old run is moved aside intact."""
    before = _snapshot(run)
    alias = f"{tmp_path}/missing/../run"
    with pytest.raises(ConfigError) as err:
        Trainer(_cfg(alias, "steps=1", *RUN))
    assert "\n" not in str(err.value) and str(err.value).startswith(f"output_dir={run} already holds a run")
    assert _snapshot(run) == before and not (tmp_path / "missing").exists()
    assert not run_dir.lock_path(run).exists()  # released
    train(_cfg(alias, "steps=1", "overwrite=true"))
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert _snapshot(aside) == before  # the old run, whole
    assert _steps(run) == [1] and (run / "checkpoints/final/COMPLETE").is_file()


def test_a_symlink_to_a_live_run_takes_the_same_lock(run, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    live = _resume(run)
    try:
        with pytest.raises(ckpt.RunDirError, match=f"output_dir={run} is in use by mmgrpo process"):
            _resume(link)
        assert run_dir.lock_path(link) == run_dir.lock_path(run)
        assert [p.name for p in run.iterdir() if p.name.endswith(".mmgrpo-lock")] == [
            ".mmgrpo-lock"
        ]  # issue 54: inside
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".mmgrpo-lock")]  # none beside, none in the link
    finally:
        live.close()
    other = _resume(link)  # free once the live run ended: the link resumes the run it points to
    assert other.out == run and other._resume_dir == run / "checkpoints/step-000002"
    other.close()


def test_an_empty_output_dir_is_one_line(mmgrpo_cache):
    with pytest.raises(ConfigError, match=r"^output_dir: empty; name the run's directory, e\.g\. output_dir=runs/"):
        load_config(QUICK, [*TINY, "output_dir="])
    cfg = dataclasses.replace(load_config(QUICK, TINY), output_dir="")  # a config built in code: the same line
    with pytest.raises(ConfigError, match=r"^output_dir: empty;"):
        Trainer(cfg)


# ------------------------------------------------------------------------------------------ resume checks


@pytest.mark.parametrize("case", list(PRE_MODEL))
def test_a_checkpoint_failing_a_check_is_skipped_for_the_previous_one(run, caplog, case):
    damage, reason = PRE_MODEL[case]
    damage(run / "checkpoints/step-000002/state")
    caplog.set_level(logging.WARNING)
    trainer = _resume(run)
    try:
        assert trainer._resume_dir == run / "checkpoints/step-000001"
        (line,) = _skipped_lines(caplog)
        assert "\n" not in line
        assert line.startswith("resume=latest: skipped damaged checkpoint(s) step-000002: ")
        assert line.endswith(f"; resuming from {run / 'checkpoints/step-000001'}, the newest complete one")
        assert re.search(reason, line), line
    finally:
        trainer.close()


def test_a_deleted_optimizer_file_falls_back_and_trains_on(run, caplog):
    """Not 'free disk space': the previous checkpoint is resumed and the run reaches its steps."""
    (run / "checkpoints/step-000002/state/optimizer.safetensors").unlink()
    caplog.set_level(logging.WARNING)
    summary = _resume(run).run()
    assert summary["train/steps"] == 3 and _steps(run) == [1, 2, 3]
    assert "step-000002: state/optimizer.safetensors is missing" in _skipped_lines(caplog)[0]


def _wrong_shape_weight(state: Path) -> str:
    key = _first_float(state / "model.safetensors")
    _rewrite(
        state / "model.safetensors", lambda t: t.__setitem__(key, torch.zeros(*t[key].shape[:-1], t[key].shape[-1] + 1))
    )
    manifest.write(state.parent)  # a whole checkpoint of another model (issue 54's manifest agrees): found at load
    return key


def _wrong_shape_moment(state: Path) -> str:
    _rewrite(state / "optimizer.safetensors", lambda t: t.__setitem__("state.0.exp_avg", torch.zeros(2, 3)))
    manifest.write(state.parent)
    return "state.0.exp_avg"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_wrong_shape_weight, r"state/model\.safetensors\[{key}\] has shape \[[\d, ]+\], the model's is \["),
        (_wrong_shape_moment, r"state/optimizer\.safetensors\[{key}\] has shape \[2, 3\], its parameter's is \["),
    ],
    ids=["model tensor", "optimizer tensor"],
)
def test_a_tensor_of_the_wrong_shape_is_skipped_before_anything_is_loaded(run, caplog, damage, reason):
    """Shapes are compared with the built model and optimizer (headers only) when the checkpoint is loaded: the
    newest checkpoint is passed over for step 1, whose state is then loaded (no 31-line traceback, no silent
    optimizer state of another shape)."""
    key = damage(run / "checkpoints/step-000002/state")
    caplog.set_level(logging.WARNING)
    trainer = _resume(run)
    try:
        assert trainer._maybe_resume() and trainer.state.step == 1
        (line,) = _skipped_lines(caplog)
        assert "\n" not in line and line.endswith(
            f"resuming from {run / 'checkpoints/step-000001'}, the newest complete one"
        )
        assert re.search(reason.format(key=re.escape(key)), line), line
    finally:
        trainer.close()
    named = Trainer(_cfg(tmp := run.parent / "named", "steps=3", *RUN, f"resume={run / 'checkpoints/step-000002'}"))
    with pytest.raises(ckpt.CheckpointError) as err:  # named explicitly: one line, no fallback
        named.run()
    assert "\n" not in str(err.value) and str(err.value).startswith(f"resume={run / 'checkpoints/step-000002'}: ")
    assert not (tmp / "metrics.jsonl").exists()


def test_a_deleted_config_is_not_a_skipped_comparison(run):
    """The newest checkpoint's config.yaml (and the run's) deleted: the comparison is made with the previous
    checkpoint's, so a changed learning rate is still refused."""
    (run / "checkpoints/step-000002/config.yaml").unlink()
    (run / "config.yaml").unlink()
    with pytest.raises(ConfigError) as err:
        _resume(run, "optim.lr=0.01")
    message = str(err.value)
    assert "\n" not in message and "optim.lr: 0.001 -> 0.01" in message
    assert f"the saved {run / 'checkpoints/step-000001/config.yaml'}" in message


def test_with_no_checkpoint_left_resume_is_one_line_naming_the_directory_and_the_fix(run):
    (run / "checkpoints/step-000001/config.yaml").unlink()
    _nan_weight(run / "checkpoints/step-000002/state")
    with pytest.raises(ConfigError) as err:
        _resume(run)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"resume=latest: no complete checkpoint under {run / 'checkpoints'} can be resumed (")
    assert "step-000002: state/model.safetensors[" in message and "step-000001: config.yaml is missing" in message
    assert message.endswith("start a new run (drop resume; overwrite=true moves the old run aside, nothing is deleted)")


def test_a_damaged_checkpoint_named_explicitly_is_refused_in_one_line(run):
    named = run / "checkpoints/step-000002"
    _set_trainer_step(named / "state", -5)
    with pytest.raises(ConfigError) as err:
        Trainer(_cfg(run.parent / "other", "steps=3", *RUN, f"resume={named}"))
    assert str(err.value) == (
        f"resume={named}: the checkpoint is damaged (state/trainer.json: step -5 is not a non-negative integer); "
        "resume from another one"
    )


def test_a_checkpoint_of_fewer_processes_says_how_many(run):
    """Resumed by more processes than saved it: the RNG states are missing for the extra ones, said as such."""
    from mmgrpo.resume_checks import problem

    step = run / "checkpoints/step-000002"
    assert problem(step, processes=1) is None
    assert problem(step, processes=2) == "it holds the RNG state of 1 process(es), not 2: resume with 1 process(es)"


def test_a_fallback_at_load_time_checks_the_older_checkpoint_too(run):
    """The newest does not fit the model (found at load time) and the older one has a NaN weight: nothing is
    loaded, one line names both."""
    key = _wrong_shape_weight(run / "checkpoints/step-000002/state")
    _nan_weight(run / "checkpoints/step-000001/state")
    trainer = _resume(run)
    try:
        with pytest.raises(ckpt.CheckpointError) as err:
            trainer._maybe_resume()
    finally:
        trainer.close()
    message = str(err.value)
    assert "\n" not in message and f"step-000002: state/model.safetensors[{key}] has shape" in message
    assert "step-000001: state/model.safetensors[" in message and "] is not finite" in message
    assert message.startswith(f"resume=latest: no complete checkpoint under {run / 'checkpoints'} can be resumed")
