"""Issue 54 (Reliability 4): checkpoints that prove they are whole (docs/reliability.md, "Checkpoints carry a
manifest").

Each case damages the newest of two checkpoints of one tiny run (trained once per module, copied per test) in a way
that every earlier check passes (finite weights, right sizes and names) and checks that resume passes over it for
the previous one with one line naming the file; a checkpoint written before manifests resumes with a one-line note.
"""

import json
import logging
import shutil
from pathlib import Path

import pytest

from mmgrpo import manifest
from mmgrpo import sharded_checkpoint as sc
from mmgrpo.resume_checks import damage, problem
from mmgrpo.trainer import Trainer, train
from tests.test_reliability import _cfg

RUN = (
    "checkpoint.every=1",
    "checkpoint.keep_last=5",
    "checkpoint.save_final=false",
    "rewards=[{name: 'tests.test_reliability4_checkpoints:length_reward'}]",  # a real update at each step
)


def length_reward(completions, **columns):
    """Longer completions score higher: varies within the groups of the untrained tiny VLM, so each step moves the
    weights (two checkpoints whose files differ)."""
    return [len(str(c)) / 10.0 for c in completions]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, mmgrpo_cache):
    out = tmp_path_factory.mktemp("trained4") / "run"
    train(_cfg(out, "steps=2", *RUN))
    return out


@pytest.fixture
def run(trained, tmp_path):
    """A copy of a finished 2-step run with checkpoints step-000001 and step-000002."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def _flip(path: Path, offset: int, count: int = 1) -> None:
    """Flip the lowest bit of ``count`` bytes of ``path`` from ``offset`` on (the size stays)."""
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 1
    path.write_bytes(bytes(data))


def _skipped(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipped damaged checkpoint(s)" in r.getMessage()]


def _resumes_from_step_1(out: Path, caplog, reason: str, *extra: str) -> None:
    caplog.set_level(logging.WARNING)
    trainer = Trainer(_cfg(out, "steps=3", *RUN, "resume=latest", *extra))
    try:
        assert trainer._resume_dir == out / "checkpoints/step-000001"
        (line,) = _skipped(caplog)
        assert "\n" not in line and line.startswith("resume=latest: skipped damaged checkpoint(s) step-000002: ")
        assert reason in line, line
    finally:
        trainer.close()


def test_every_file_is_listed_with_its_size_and_hash(run):
    step = run / "checkpoints/step-000002"
    listed = json.loads((step / manifest.NAME).read_text())["files"]
    on_disk = sorted(p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file())
    assert sorted(listed) == [n for n in on_disk if n != manifest.NAME]
    assert "COMPLETE" in listed and "state/model.safetensors" in listed and "model/config.json" in listed
    entry = listed["state/model.safetensors"]
    assert entry["size"] == (step / "state/model.safetensors").stat().st_size
    assert entry["sha256"] == manifest.sha256(step / "state/model.safetensors")
    assert (step / "COMPLETE").read_text().split() == ["2", "manifest"]
    assert problem(step) is None and damage(step) is None


def test_a_flipped_bit_in_a_finite_weight_falls_back(run, caplog):
    """The old tree resumed it silently (Δw ≈ 4e-3): the weight stays finite, every header and size is right."""
    weights = run / "checkpoints/step-000002/state/model.safetensors"
    _flip(weights, weights.stat().st_size - 3)  # a low mantissa bit of the last tensor's last value
    assert damage(run / "checkpoints/step-000002") is None  # the cheap check (headers, JSON) cannot see it
    _resumes_from_step_1(run, caplog, "state/model.safetensors does not match its sha256 in MANIFEST.json")


def test_a_model_file_replaced_by_an_older_steps_falls_back(run, caplog):
    steps = run / "checkpoints"
    older = (steps / "step-000001/state/model.safetensors").read_bytes()
    assert older != (steps / "step-000002/state/model.safetensors").read_bytes()  # the step moved the weights
    for name in ("state/model.safetensors", "model/model.safetensors"):
        shutil.copyfile(steps / "step-000001" / name, steps / "step-000002" / name)
    _resumes_from_step_1(run, caplog, "model.safetensors does not match its sha256 in MANIFEST.json")


def test_a_deleted_manifest_is_damage_when_complete_promises_one(run, caplog):
    (run / "checkpoints/step-000002" / manifest.NAME).unlink()
    _resumes_from_step_1(run, caplog, "MANIFEST.json is missing")


def test_a_file_of_another_size_is_named_with_both_sizes(run):
    config = run / "checkpoints/step-000002/config.yaml"
    config.write_text(config.read_text() + "\n")  # still a valid config: only the manifest sees it
    assert damage(run / "checkpoints/step-000002") is None  # the cheap check (headers, JSON) passes
    assert problem(run / "checkpoints/step-000002") == (
        f"config.yaml has {config.stat().st_size} bytes, MANIFEST.json says {config.stat().st_size - 1}"
    )


def test_a_checkpoint_without_a_manifest_resumes_with_a_one_line_note(run, caplog):
    """An older run: COMPLETE holds only the step and there is no MANIFEST.json."""
    step = run / "checkpoints/step-000002"
    (step / manifest.NAME).unlink()
    (step / "COMPLETE").write_text("2\n")
    caplog.set_level(logging.WARNING)
    trainer = Trainer(_cfg(run, "steps=3", *RUN, "resume=latest"))
    try:
        assert trainer._resume_dir == step
        notes = [r.getMessage() for r in caplog.records if "has no MANIFEST.json" in r.getMessage()]
        assert len(notes) == 1 and "\n" not in notes[0] and not _skipped(caplog)
        trainer.run()
    finally:
        trainer.close()
    assert problem(run / "checkpoints/step-000003") is None and manifest.promised(run / "checkpoints/step-000003")


def test_a_corrupt_distcp_shard_falls_back_in_one_line(tmp_path, mmgrpo_cache, caplog):
    """FSDP's sharded layout (single process here, the same files): 3 bytes flipped inside a shard gave a 175-line
    ``UnpicklingError`` on the old tree; now resume hashes the shards and falls back."""
    out = tmp_path / "run"
    train(_cfg(out, "steps=2", *RUN, "checkpoint.sharded=true"))
    state = out / "checkpoints/step-000002/state"
    assert sc.is_sharded(state)
    (shard,) = sorted((state / sc.DIR).glob("*.distcp"))
    listed = json.loads((state.parent / manifest.NAME).read_text())["files"]
    assert f"state/{sc.DIR}/{shard.name}" in listed and f"state/{sc.DIR}/.metadata" in listed
    _flip(shard, shard.stat().st_size // 2, 3)
    _resumes_from_step_1(
        out, caplog, f"state/{sc.DIR}/{shard.name} does not match its sha256", "checkpoint.sharded=true"
    )


def test_a_corrupt_shard_of_a_checkpoint_without_a_manifest_is_one_line(tmp_path, mmgrpo_cache):
    """An older sharded checkpoint (no manifest) whose shard's zip header is damaged: DCP's load fails; its report
    (every rank's traceback) becomes one line naming the shard's processes and the error."""
    from mmgrpo import checkpoint as ckpt

    out = tmp_path / "run"
    train(_cfg(out, "steps=2", *RUN, "checkpoint.sharded=true"))
    step = out / "checkpoints/step-000002"
    (step / manifest.NAME).unlink()
    (step / "COMPLETE").write_text("2\n")
    (shard,) = sorted((step / "state" / sc.DIR).glob("*.distcp"))
    _flip(shard, 0, 3)
    trainer = Trainer(_cfg(out, "steps=3", *RUN, "resume=latest", "checkpoint.sharded=true"))
    try:
        assert trainer._resume_dir == step  # nothing on the files says it is damaged (no manifest)
        with pytest.raises(ckpt.CheckpointError) as err:
            trainer._maybe_resume()
    finally:
        trainer.close()
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{step}: {sc.DIR}: a shard cannot be read on process(es) [0] (")


@pytest.mark.slow
def test_a_corrupt_distcp_shard_under_fsdp_falls_back_on_both_processes(tmp_path, mmgrpo_cache):
    """2 FSDP processes (gloo): 3 bytes flipped in process 1's shard of the newest checkpoint. The old tree stopped
    with a 175-line ``UnpicklingError`` on both ranks; now both pass over it for step 1 and train to the end."""
    from tests.test_fsdp import QUICK as FSDP_QUICK
    from tests.test_fsdp import REWARD, VLM_STEP, _launch

    (tmp_path / "length_rewards.py").write_text(REWARD)
    every = ["checkpoint.every=1", "checkpoint.keep_last=5"]
    _launch("fsdp_cpu_2proc", FSDP_QUICK, [*VLM_STEP, *every, "steps=3", "stop_after=2"], tmp_path / "run", tmp_path)
    step = tmp_path / "run/checkpoints/step-000002"
    shard = step / "state" / sc.DIR / "__1_0.distcp"
    assert json.loads((step / manifest.NAME).read_text())["files"][f"state/{sc.DIR}/__1_0.distcp"]
    _flip(shard, shard.stat().st_size // 2, 3)
    assert problem(step, 2) == f"state/{sc.DIR}/__1_0.distcp does not match its sha256 in MANIFEST.json (the file " + (
        "changed after it was saved)"
    )
    _launch("fsdp_cpu_2proc", FSDP_QUICK, [*VLM_STEP, *every, "steps=3", "resume=latest"], tmp_path / "run", tmp_path)
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "reward/mean" in r] == [1, 2, 3]  # step 2 trained again from step 1
    assert problem(step, 2) is None  # re-saved whole
