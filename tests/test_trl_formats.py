"""TRL's dataset and reward conventions, as TRL 1.16 publishes and passes them, work unchanged.

- Vision datasets as TRL's docs write them (``docs/source/dataset_formats.md``, "Vision datasets"): a
  conversational ``prompt`` whose content is a string plus an ``images`` list column (or one ``image``); TRL adds
  the ``{"type": "image"}`` parts itself (``trl.data_utils.prepare_multimodal_messages``), and so do we: the
  rows' prompts equal TRL's output (without the image payload, which stays in the column).
- Every function of ``trl.rewards`` (the factories with their kwargs) runs from a YAML reward list, and the
  ``completion_ids`` / ``trainer_state`` / ``log_metric`` keyword arguments reach the rewards in a training step,
  as ``GRPOTrainer._calculate_rewards`` passes them.
"""

import json
import math

import pytest
from PIL import Image

from mmgrpo.cli import main
from mmgrpo.loader import load_config
from mmgrpo.rewards import RewardRunner, register_reward
from mmgrpo.rewards.registry import REWARDS
from mmgrpo.tasks.dataset import build_dataset_task

trl_rewards = pytest.importorskip("trl.rewards")
datasets = pytest.importorskip("datasets")
from trl.data_utils import prepare_multimodal_messages  # noqa: E402

QUESTION = "What colour is the square? Answer in <answer></answer>."


def _image(colour) -> Image.Image:
    return Image.new("RGB", (28, 28), colour)


def _strip_payload(messages: list) -> list:
    return [
        {**m, "content": [{k: v for k, v in p.items() if k != "image"} for p in m["content"]]}
        if isinstance(m.get("content"), list)
        else m
        for m in messages
    ]


def _trl_vision_dataset(path, column="images"):
    """TRL's prompt-only conversational vision format: string content + an images (or image) column."""
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]
    names = ["red", "green", "blue", "yellow"]
    data = {
        "prompt": [
            [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}] for _ in names
        ],
        column: [[_image(c)] for c in colours] if column == "images" else [_image(c) for c in colours],
        "solution": names,
    }
    features = datasets.Features(
        {
            "prompt": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
            column: datasets.Sequence(datasets.Image()) if column == "images" else datasets.Image(),
            "solution": datasets.Value("string"),
        }
    )
    datasets.Dataset.from_dict(data, features=features).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("column", ["images", "image"])
def test_trl_vision_dataset_gets_the_image_parts_trl_adds(tmp_path, column):
    path = _trl_vision_dataset(tmp_path / "vision", column)
    task = build_dataset_task({"train": str(path)})
    raw = datasets.load_from_disk(str(path))
    for i in range(len(raw)):
        row = task.train_rows()[i]
        images = raw[i]["images"] if column == "images" else [raw[i]["image"]]
        assert row["prompt"] == _strip_payload(prepare_multimodal_messages(raw[i]["prompt"], images))
        assert row["prompt"][1]["content"][0] == {"type": "image"}


def test_trl_vision_jsonl_with_image_paths_and_a_part_mismatch(tmp_path, capsys):
    _image((200, 0, 0)).save(tmp_path / "a.png")
    rows = [{"prompt": [{"role": "user", "content": QUESTION}], "images": ["a.png"], "answer": "red"}] * 3
    bad = {"prompt": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}], "images": ["a.png"]}
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [*rows, bad]))
    task = build_dataset_task({"train": str(data), "check_rows": 3})
    assert task.train_rows()[0]["prompt"][0]["content"] == [{"type": "image"}, {"type": "text", "text": QUESTION}]
    args = ["train", "configs/dataset_trl_conversational.yaml", "--dry-run", f"task.args.train={data}"]
    assert main([*args, "task.args.eval_fraction=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{data}: line 4" in err
    assert "0 {'type': 'image'} part(s) but the row has 1 image(s)" in err


def test_the_tiny_vlm_encodes_a_trl_vision_row(tmp_path, tiny_vlm_path):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    task = build_dataset_task({"train": str(_trl_vision_dataset(tmp_path / "vision"))})
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4})
    enc = adapter._encode_prompt(task.train_rows()[0])
    assert enc["image_grid_thw"].shape == (1, 3)
    # the adapter adds the same parts to a custom task's TRL-style row (string content + images)
    raw = {"prompt": [{"role": "user", "content": QUESTION}], "images": [_image((0, 0, 200))]}
    assert adapter._encode_prompt(raw)["image_grid_thw"].shape == (1, 3)


TRL_FROM_YAML = {
    "trl.rewards:accuracy_reward": {},
    "trl.rewards:reasoning_accuracy_reward": {},
    "trl.rewards:think_format_reward": {},
    "trl.rewards:get_cosine_scaled_reward()": {"max_len": 20},
    "trl.rewards:get_repetition_penalty_reward()": {"ngram_size": 2, "max_penalty": -1.0},
    "trl.rewards:get_soft_overlong_punishment()": {"max_completion_len": 10, "soft_punish_cache": 5},
}


def test_every_trl_reward_runs_from_yaml(tmp_path):
    pytest.importorskip("math_verify")
    public = {name for names in trl_rewards._import_structure.values() for name in names}
    assert {s.split(":")[1].rstrip("()") for s in TRL_FROM_YAML} == public  # a new TRL reward fails here
    config = tmp_path / "c.yaml"
    entries = "".join(f"  - {{name: '{n}', kwargs: {json.dumps(k)}}}\n" for n, k in TRL_FROM_YAML.items())
    config.write_text(f"task: {{name: shapes}}\nrewards:\n{entries}")
    cfg = load_config(config)
    runner = RewardRunner([(r.name, r.weight, r.kwargs) for r in cfg.rewards], isolation="thread")
    chat = [{"role": "user", "content": "What is 1 + 2?"}]
    completions = ["<think>1 and 2</think>\\boxed{3}", "\\boxed{4}"]
    ids = [[5] * 4, [7, 8, 7, 8, 7, 8, 7, 8]]  # 4 tokens; 8 tokens that repeat one bigram
    rewards, metrics = runner(completions, [chat, chat], {"solution": ["$3$", "$3$"], "completion_ids": ids})
    got = dict(zip(runner.names, rewards.T.tolist()))
    assert metrics["reward/errors"] == 0
    assert got["accuracy_reward"] == [1.0, 0.0]
    assert got["reasoning_accuracy_reward"] == [1.0, 0.0]
    assert got["think_format_reward"] == [1.0, 0.0]
    cos = [0.5 + 0.25 * (1 + math.cos(math.pi * 4 / 20)), -0.5 - 0.25 * (1 + math.cos(math.pi * 8 / 20))]
    assert got["get_cosine_scaled_reward()"] == pytest.approx(cos)
    assert got["get_repetition_penalty_reward()"] == pytest.approx([-(1 - 1 / 3), -(1 - 2 / 7)])
    assert got["get_soft_overlong_punishment()"] == pytest.approx([0.0, (10 - 5 - 8) / 5])


SEEN: list[dict] = []


def _record(completions, completion_ids=None, trainer_state=None, **kwargs):
    """A TRL-style reward: it records TRL's keyword arguments. Source: this test (the registry asks every reward
    for one)."""
    SEEN.append({"completions": completions, "ids": completion_ids, "state": trainer_state, "kwargs": set(kwargs)})
    kwargs["log_metric"]("seen", float(len(completions)))
    return [0.0] * len(completions)


if "test_record_trl_kwargs" not in REWARDS:
    register_reward("test_record_trl_kwargs")(_record)


def test_a_training_step_passes_trl_keyword_arguments(tmp_path, tiny_vlm_path):
    """completion_ids (up to and including EOS), trainer_state and log_metric reach the rewards; TRL's soft
    overlong punishment and our length_cosine compute from those ids."""
    from mmgrpo.trainer import train

    data = _trl_vision_dataset(tmp_path / "vision")
    out = tmp_path / "run"
    SEEN.clear()
    cfg = load_config(
        None,
        [
            f"output_dir={out}",
            "steps=2",
            "model.adapter=vlm",
            f"model.args.name_or_path={tiny_vlm_path}",
            "model.args.max_new_tokens=6",
            "task.name=dataset",
            f"task.args.train={data}",
            "task.args.eval_fraction=0.25",
            "rewards=[{name: test_record_trl_kwargs}, {name: 'trl.rewards:get_soft_overlong_punishment()', "
            "kwargs: {max_completion_len: 6, soft_punish_cache: 4}}, {name: length_cosine, kwargs: {max_len: 6, "
            "answer_key: solution}}]",
            "algorithm.group_size=2",
            "algorithm.prompts_per_step=2",
            "eval.before=false",
            "logging.trackers=[]",
            "logging.progress=false",
            "logging.plot=false",
            "checkpoint.save_final=false",
        ],
    )
    summary = train(cfg)
    assert math.isfinite(summary["eval/after/reward/length_cosine"])  # held-out text re-tokenised for completion_ids
    assert math.isfinite(summary["eval/after/reward/get_soft_overlong_punishment()"])
    SEEN[:] = SEEN[:2]  # the two training steps (the held-out evaluation called the reward too)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/errors" in r]  # the training steps (not the evaluation record)
    assert [s["reward/errors"] for s in steps] == [0.0, 0.0]
    assert [seen["state"].global_step for seen in SEEN] == [0, 1] and SEEN[0]["state"].max_steps == 2
    assert {"log_metric", "log_extra", "prompts", "solution"} <= SEEN[0]["kwargs"]
    assert steps[0]["reward/test_record_trl_kwargs/seen"] == 4.0
    for seen, step in zip(SEEN, steps):
        lengths = [len(ids) for ids in seen["ids"]]
        assert all(1 <= n <= 6 for n in lengths)
        punish = [0.0 if n <= 2 else (2 - n) / 4 for n in lengths]
        assert step["reward/get_soft_overlong_punishment()"] == pytest.approx(sum(punish) / 4, abs=1e-6)
        assert step["reward/length_cosine_nan_fraction"] == 0.0


def test_token_adapters_put_completion_ids_in_the_reward_columns(tiny_vlm_path, mmgrpo_cache):
    """VLM and Whisper rollouts carry each sample's ids up to and including EOS; they decode to the completion."""
    pytest.importorskip("soxr")
    from mmgrpo.modalities.speech.adapter import build_whisper_adapter
    from mmgrpo.modalities.speech.tiny import resolve_model_path
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    vlm = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 5})
    rows = [{"prompt": QUESTION, "images": [_image((200, 0, 0))]}]  # a plain-text prompt + images (TRL's image key)
    speech = SpokenDigitsTask(SpokenDigitsArgs(train_size=2, eval_size=1, warmup_size=2)).train_rows()
    whisper = build_whisper_adapter({"name_or_path": resolve_model_path("tiny-whisper"), "max_new_tokens": 5})
    for adapter, batch in ((vlm, rows), (whisper, speech)):
        rollout = adapter.rollout(batch, 3)
        ids = rollout.extras["completion_ids"]
        assert len(ids) == rollout.batch_size and all(1 <= len(x) <= 5 for x in ids)
        for x, text, truncated in zip(ids, rollout.outputs, rollout.truncated.tolist()):
            assert adapter.tokenizer.decode(x, skip_special_tokens=True).strip() == text.strip()
            assert truncated == (len(x) == 5 and x[-1] not in _eos_ids(adapter))


def _eos_ids(adapter) -> list[int]:
    eos = getattr(adapter, "eos_ids", None)
    return eos.tolist() if eos is not None else [adapter.eos_id]
