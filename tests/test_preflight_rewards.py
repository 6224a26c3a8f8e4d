"""The load-time check on rewards (issue 36): what a reward needs is found at ``--dry-run``, and at the start of
``train`` before the policy loads, in one line naming the reward and the fix: model-based rewards' weights
(offline-aware), factories written without ``()``, the prompt shape a TRL reward reads, routing columns, reward
name typos, and a reward module next to the config."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from mmgrpo.cli import main

NO_MODEL = os.path.dirname(os.path.abspath(__file__))  # a folder without a model: never loaded (issue 53: the
# name is checked at load, so it must exist; the load-time checks under test come first)

ROOT = Path(__file__).resolve().parents[1]
FLOW = str(ROOT / "configs/flow_grpo.yaml")


def _run(capsys, config, *args, dry_run=True) -> tuple[int, str]:
    rc = main(["train", str(config), *(["--dry-run"] if dry_run else []), *args])
    return rc, capsys.readouterr().err.strip()


def _one_line(err: str) -> str:
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture
def no_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache, and a hub that refuses connections (as on a machine without network)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return tmp_path


@pytest.mark.parametrize("offline", [True, False])
@pytest.mark.parametrize(
    "reward, option",
    [("pickscore", "kwargs.model_name"), ("clip_score", "kwargs.pretrained")],
)
def test_model_based_reward_weights_are_found_before_the_policy_loads(
    no_hub, capsys, monkeypatch, reward, option, offline
):
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = [
        f"rewards=[{{name: {reward}}}]",
        f"model.args.name_or_path={NO_MODEL}",  # never loaded: the check comes first
        f"output_dir={no_hub / 'run'}",
        "logging.trackers=[]",
    ]
    start = time.monotonic()
    rc, err = _run(capsys, FLOW, *args)
    assert time.monotonic() - start < 30  # one quick probe, no retry storm
    assert rc == 2 and f"rewards[0] ({reward}): cannot load its weights" in _one_line(err)
    assert option in err and "hf download" in err
    assert ("HF_HUB_OFFLINE is set" in err) == offline
    assert offline or "cannot be reached" in err
    assert _run(capsys, FLOW, *args, dry_run=False) == (2, err)  # `train`: the same line, not the policy's error


def test_model_based_reward_weights_from_local_paths_pass(no_hub, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (no_hub / "pick").mkdir()
    (no_hub / "proc").mkdir()
    (no_hub / "clip.bin").write_bytes(b"")
    base = ["logging.trackers=[]", f"output_dir={no_hub / 'run'}"]
    kwargs = f"model_name: {no_hub / 'pick'}, processor_name: {no_hub / 'proc'}"
    pick = f"rewards=[{{name: pickscore, kwargs: {{{kwargs}}}}}]"
    assert _run(capsys, FLOW, *base, pick)[0] == 0
    clip = f"rewards=[{{name: clip_score, kwargs: {{pretrained: {no_hub / 'clip.bin'}}}}}]"
    assert _run(capsys, FLOW, *base, clip)[0] == 0
    assert _run(capsys, FLOW, *base, "rewards=[{name: clip_score, kwargs: {pretrained: null}}]")[0] == 0


QUICKSTART = str(ROOT / "configs/quickstart.yaml")


def test_a_factory_written_without_parentheses_is_named_with_its_spelling(tmp_path, capsys, monkeypatch):
    kwargs = "kwargs: {max_completion_len: 512, soft_punish_cache: 64}"
    base = [f"output_dir={tmp_path / 'run'}", "logging.trackers=[]"]
    rc, err = _run(
        capsys, QUICKSTART, *base, f"rewards=[{{name: 'trl.rewards:get_soft_overlong_punishment', {kwargs}}}]"
    )
    assert rc == 2 and "a factory" in _one_line(err)
    assert "write name: 'trl.rewards:get_soft_overlong_punishment()'" in err
    assert (
        _run(capsys, QUICKSTART, *base, f"rewards=[{{name: 'trl.rewards:get_soft_overlong_punishment()', {kwargs}}}]")[
            0
        ]
        == 0
    )
    (tmp_path / "own_factories.py").write_text(
        "def make_length(scale):\n"
        "    def length(completions, **columns):\n"
        "        return [scale * len(c) for c in completions]\n"
        "    return length\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, err = _run(capsys, QUICKSTART, *base, "rewards=[{name: 'own_factories:make_length', kwargs: {scale: 2}}]")
    assert rc == 2 and "write name: 'own_factories:make_length()'" in _one_line(err)
    assert (
        _run(capsys, QUICKSTART, *base, "rewards=[{name: 'own_factories:make_length()', kwargs: {scale: 2}}]")[0] == 0
    )


def _dataset(tmp_path, rows, *args) -> list[str]:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        "model.adapter=vlm",
        f"model.args.name_or_path={NO_MODEL}",  # never loaded: the check comes first
        "task.name=dataset",
        f"task.args.train={data}",
        f"task.args.eval={data}",
        "logging.trackers=[]",
        f"output_dir={tmp_path / 'run'}",
        *args,
    ]


@pytest.fixture
def empty(tmp_path):
    (tmp_path / "empty.yaml").write_text("{}\n")
    return tmp_path / "empty.yaml"


def test_a_trl_chat_reward_on_plain_string_prompts_is_one_line_at_load(tmp_path, capsys, empty):
    rows = [{"prompt": "What is 1+1?", "solution": "2"}, {"prompt": "What is 2+2?", "solution": "4"}]
    args = _dataset(tmp_path, rows, "rewards=[{name: 'trl.rewards:accuracy_reward'}]")
    rc, err = _run(capsys, empty, *args)
    assert rc == 2 and "reward 'trl.rewards:accuracy_reward' (rewards[0]) reads chat completions" in _one_line(err)
    assert "line 1" in err and "task.args.system_prompt" in err
    assert _run(capsys, empty, *args, dry_run=False) == (2, err)  # `train`: before the model loads
    assert _run(capsys, empty, *args, "task.args.system_prompt=Answer.")[0] == 0  # chats: it works
    assert _run(capsys, empty, *args[:-1], "rewards=[{name: 'trl.rewards:think_format_reward'}]")[0] == 2
    assert _run(capsys, empty, *args[:-1], "rewards=[{name: accuracy, kwargs: {answer_key: solution}}]")[0] == 0


def test_per_type_rewards_without_a_reward_type_column_name_the_mapping(tmp_path, capsys, empty):
    rows = [  # Video-R1's rows: the type is problem_type
        {"problem": "2+2?", "problem_type": "numerical", "solution": "<answer>4</answer>"},
        {"problem": "Left or right?", "problem_type": "multiple choice", "solution": "<answer>A</answer>"},
    ]
    rewards = (
        "rewards=[{name: numeric, reward_types: [numerical]}, {name: multiple_choice, reward_types: [multiple choice]}]"
    )
    args = _dataset(tmp_path, rows, "task.args.columns={prompt: problem, answer: solution}", rewards)
    rc, err = _run(capsys, empty, *args)
    assert rc == 2 and "rewards[0] (numeric) has reward_types ['numerical']" in _one_line(err)
    assert "task.args.columns: {reward_type: problem_type}" in err and "line 1" in err
    assert _run(capsys, empty, *args, dry_run=False) == (2, err)  # `train`: before the model loads
    mapped = "task.args.columns={prompt: problem, answer: solution, reward_type: problem_type}"
    assert _run(capsys, empty, *_dataset(tmp_path, rows, mapped, rewards))[0] == 0


def test_a_reward_module_next_to_the_config_is_found_from_another_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "my_rewards_next_to_config", raising=False)
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "my_rewards_next_to_config.py").write_text(
        "def brevity(completions, **columns):\n    return [1.0 / (1 + len(str(c))) for c in completions]\n"
    )
    config = project / "config.yaml"
    config.write_text(Path(QUICKSTART).read_text() + "\n")
    monkeypatch.chdir(elsewhere)
    args = ["rewards=[{name: 'my_rewards_next_to_config:brevity'}]", f"output_dir={tmp_path / 'run'}"]
    rc, err = _run(capsys, config, *args)
    assert rc == 0, err
    assert sys.path.index(str(project)) == len(sys.path) - 1  # after sys.path: it shadows nothing
    from mmgrpo.rewards import load_reward

    assert load_reward("my_rewards_next_to_config:brevity")(["ab"], prompts=["p"]) == [1.0 / 3]


def test_a_task_eval_reward_weights_are_found_at_load_too(no_hub, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prompts = no_hub / "prompts.txt"
    prompts.write_text("a red circle top left\na blue square\n")
    args = [
        "task.name=dataset",
        f"task.args={{train: {prompts}, eval: {prompts}, eval_rewards: [{{name: pickscore}}]}}",
        f"model.args.name_or_path={NO_MODEL}",
        f"output_dir={no_hub / 'run'}",
        "logging.trackers=[]",
    ]
    rc, err = _run(capsys, FLOW, *args)
    assert rc == 2 and "task.args.eval_rewards[0] (pickscore): cannot load its weights" in _one_line(err)


@pytest.fixture
def fake_hub(no_hub, monkeypatch):
    """A local hub that knows one model, ``org/known``: ``HEAD /api/models/<id>`` answers 200 or 404."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200 if self.path == "/api/models/org/known" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield no_hub
    server.shutdown()
    server.server_close()


def test_a_hub_that_answers_is_enough_and_an_unknown_repo_is_named(fake_hub, capsys):
    base = ["logging.trackers=[]", f"output_dir={fake_hub / 'run'}"]
    ok = "rewards=[{name: pickscore, kwargs: {model_name: org/known, processor_name: org/known}}]"
    assert _run(capsys, FLOW, *base, ok)[0] == 0  # not cached, but the hub has it: downloaded when loaded
    missing = "rewards=[{name: pickscore, kwargs: {model_name: org/known, processor_name: org/typo}}]"
    rc, err = _run(capsys, FLOW, *base, missing)
    assert rc == 2 and "processor_name 'org/typo' is not in the Hugging Face cache" in _one_line(err)
    assert "has no model 'org/typo' (HTTP 404)" in err and "kwargs.processor_name" in err
