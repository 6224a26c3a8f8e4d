"""Issue 54 (Reliability 4): one line for the rest (docs/reliability.md, "One line for every fault").

Duplicate YAML keys refused with both line numbers; sizes that cannot fit (``task.args.image_size``) and seeds
outside NumPy's range refused at load; a reward returning NaN with ``on_error: raise`` is one line; a decompression
bomb is one line at ``--dry-run`` and skipped and counted mid-run; an engine's token id outside the vocabulary is
one line. Each case failed on the old tree (a silent last-key-wins, an OOM kill, a traceback)."""

import json
import math
import struct
import zlib

import pytest
from PIL import Image

from mmgrpo.cli import main
from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.media import open_image
from mmgrpo.tasks.dataset import build_dataset_task
from mmgrpo.types import DataError, EngineError
from mmgrpo.warmup import read_rows
from tests.test_reliability import QUICK, TINY

# ------------------------------------------------------------------------------------------------ config


def test_a_key_written_twice_is_refused_with_both_line_numbers(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seed: 1\noptim:\n  lr: 1.0e-5\n  weight_decay: 0.0\n  lr: 1.0e-3\nsteps: 5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: key 'lr' is written twice in one mapping (lines 3 and 5); YAML keeps only one, so delete the other"
    )
    path.write_text("seed: 1\nsteps: 5\nseed: 2\n")  # at the top level too
    with pytest.raises(ConfigError, match=r"key 'seed' is written twice in one mapping \(lines 1 and 3\)"):
        load_config(path)


def test_merge_keys_still_override_and_every_shipped_config_has_unique_keys(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: &b {lr: 1.0e-5, weight_decay: 0.0}\n")  # a merge overridden in place is not a duplicate
    from mmgrpo.strict_yaml import load

    assert load("a: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", "t")["c"] == {"x": 3, "y": 2}
    from pathlib import Path

    for config in sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml")):
        load(config.read_text(), str(config))  # no shipped config repeats a key


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("task.args.image_size=100000", "task.args.image_size: must be >= 28 and <= 3584, got 100000"),
        ("seed=-1", "seed: must be >= 0 and <= 2147483647, got -1"),
        ("seed=4294967296", "seed: must be >= 0 and <= 2147483647, got 4294967296"),
    ],
)
def test_sizes_and_seeds_that_cannot_work_are_one_line_at_load_and_dry_run(capsys, override, line):
    """The old tree was OOM-killed at 20 GB drawing a 100000² image, and raised a NumPy ValueError at step 1 for a
    negative seed."""
    with pytest.raises(ConfigError) as err:
        load_config(QUICK, [override])
    assert str(err.value) == line
    assert main(["train", str(QUICK), "--dry-run", override]) == 2
    assert capsys.readouterr().err.strip() == f"mmgrpo: config error: {line}"


# ------------------------------------------------------------------------------------------------ rewards


def nan_reward(completions, **columns):
    """NaN for every sample of a training step's batch (2 prompts x 4), so that the load check (4 synthetic samples,
    which refuses a NaN before the model loads) passes and the NaN comes at run time."""
    return [math.nan if len(completions) == 8 else 0.5] * len(completions)


def test_a_reward_returning_nan_with_on_error_raise_is_one_line(tmp_path, capsys, mmgrpo_cache):
    """The old tree ended in a 28-line RewardError traceback."""
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            str(QUICK),
            *TINY,
            "steps=1",
            f"output_dir={out}",
            "reward_runtime.on_error=raise",
            "rewards=[{name: 'tests.test_reliability4_bounds:nan_reward'}]",
        ]
    )
    stderr = capsys.readouterr().err
    err = [line for line in stderr.splitlines() if line.startswith("mmgrpo:")]  # (progress bars aside)
    assert rc == 1 and len(err) == 1 and "Traceback" not in stderr, stderr
    assert err[0].startswith("mmgrpo: error: reward 'nan_reward' returned nan at sample 0; rewards must be finite")
    assert "run the same command again to start over" in err[0]


# ------------------------------------------------------------------------------------------------ images


def _bomb(path):
    """A PNG of 65 bytes whose header says 30000 x 30000 (Pillow's DecompressionBombError before any pixel)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    path.write_bytes(data)
    return path


def test_a_decompression_bomb_is_a_data_error(tmp_path):
    bomb = _bomb(tmp_path / "bomb.png")
    assert bomb.stat().st_size < 100  # tens of bytes
    with pytest.raises(DataError) as err:
        open_image(str(bomb))
    assert str(err.value).startswith(f"image file {str(bomb)!r} is a decompression bomb (its header claims more")


def _rows(tmp_path, bad_at: int):
    Image.new("RGB", (16, 16), "red").save(tmp_path / "ok.png")
    _bomb(tmp_path / "bomb.png")
    rows = [{"prompt": "What colour?", "image": "ok.png", "answer": "red"} for _ in range(4)]
    rows[bad_at]["image"] = "bomb.png"
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_decompression_bomb_mid_run_is_skipped_and_counted(tmp_path):
    task = build_dataset_task({"train": str(_rows(tmp_path, 2)), "check_rows": 2})
    bad: set[int] = set()
    got, skipped = read_rows(task.train_rows(), [2, 3], bad)
    assert skipped == 1 and bad == {2} and len(got) == 2  # the bomb skipped for the next row


def test_a_decompression_bomb_among_the_first_rows_is_one_line_at_dry_run(tmp_path, capsys):
    data = _rows(tmp_path, 0)
    (tmp_path / "empty.yaml").write_text("{}\n")
    args = ["task.name=dataset", f"task.args.train={data}", "rewards=[{name: format}]", "logging.trackers=[]"]
    rc = main(["train", str(tmp_path / "empty.yaml"), "--dry-run", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{data}: line 1" in err and "is a decompression bomb" in err


# ------------------------------------------------------------------------------------------------ engine


def test_an_engine_token_outside_the_vocabulary_is_one_line(mmgrpo_cache):
    """An engine answering token id 10⁹: the old tree failed with an IndexError traceback in the embedding."""
    from mmgrpo.modalities.tokens.engine import EngineClient
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    class Faulty(EngineClient):
        def _media_item(self, kind, item):
            return item

        def _generate(self, body):
            n = body["n"]
            sample = {"token_ids": [5, 10**9, 7], "logprobs": [-1.0, -1.0, -1.0]}
            return {"version": 0, "outputs": [[sample] * n for _ in body["requests"]], "prompts": []}

    adapter = build_vlm_adapter({"name_or_path": "tiny-qwen2.5-vl", "max_new_tokens": 4}, seed=0)
    adapter.use_engine(Faulty())
    rows = ShapesTask(ShapesArgs(train_size=2, eval_size=1)).train_rows()[:2]
    with pytest.raises(EngineError) as err:
        adapter.rollout(rows, 2)
    message = str(err.value)
    assert "\n" not in message and message.startswith("the rollout engine returned token id 1000000000 (sample 0, ")
    assert "outside the policy's vocabulary of" in message

    class Garbled(Faulty):
        def _generate(self, body):
            answer = super()._generate(body)
            answer["outputs"][0][0] = {"token_ids": ["x", 1.5], "logprobs": [-1.0, -1.0]}
            return answer

    adapter.use_engine(Garbled())
    with pytest.raises(EngineError, match=r"returned token_ids that are not non-negative integers \(prompt 0"):
        adapter.rollout(rows, 2)
