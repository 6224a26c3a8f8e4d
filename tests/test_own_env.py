"""Issue 53, first bullet: one's own environment by reference (``rollout.environment: my_env:LineWorld``).

- the worked example of docs/agents.md (``examples/own_env``) trains 2 steps from the command line, both spellings
  (``module:Class``, ``module:factory()``);
- each protocol mistake (``step`` returning 2 values, the wrong order, the wrong types; ``reset`` returning a str; a
  method that raises; a build that raises) is one line naming the method, what it returned and what the protocol
  expects, before the model loads; the code policy is the rewards' (the standard library, an installed library, a
  function without ``()``) and ``--dry-run`` imports nothing;
- mid-run, an environment that raises, times out, breaks the protocol or returns too much ends that trajectory,
  counted in ``env/error_fraction``, and the run finishes (no traceback).
"""

import json
import math
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmgrpo.cli import main
from mmgrpo.config import RolloutConfig
from mmgrpo.tools import Observation
from mmgrpo.tools.env import REFERENCES
from mmgrpo.tools.env_guard import EnvironmentFault, EnvLimits, checked_reset, checked_step, start_episode

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "own_env" / "line_world.yaml"
QUICK = ["eval.after=false", "algorithm.group_size=2", "model.args.max_new_tokens=8"]

GOOD = """
from mmgrpo.tools import Observation

class Env:
    def __init__(self, size: int = 3):
        self.size, self.n = size, 0

    def reset(self, row):
        self.n = 0
        return Observation(text=f"level {row['seed']}")

    def step(self, action_text):
        self.n += 1
        return Observation(text="moved"), 0.5, self.n >= self.size
"""


def _project(tmp_path: Path, module: str, source: str, environment: str, seeds=range(6), **rollout) -> Path:
    """``tmp_path/<module>.py`` (``source``) and a config next to it playing ``environment`` on rows of ``seeds``."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": "Play.", "seed": s}) + "\n" for s in seeds))
    config = {
        "steps": 2,
        "model": {"adapter": "vlm", "args": {"name_or_path": "tiny-qwen2.5-vl", "max_new_tokens": 8}},
        "task": {"name": "dataset", "args": {"train": "rows.jsonl", "check_rows": 2}},
        "rewards": [{"name": "env_return"}],
        "rollout": {"environment": environment, "max_turns": 3, "max_total_tokens": 96, **rollout},
        "algorithm": {"group_size": 2, "prompts_per_step": 2},
        "eval": {"before": False, "after": False},
        "logging": {"trackers": [], "progress": False},
        "checkpoint": {"every": 0, "save_final": False},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "run.yaml"


class _NoModel:
    """Stands for the adapter registry in the trainer: building the model fails the test."""

    @staticmethod
    def get(name):
        raise AssertionError("the model was loaded")


def _refused(config: Path, tmp_path: Path, capsys, monkeypatch, *extra: str) -> str:
    """Train ``config``; it must stop with exit code 2 and one line, before the model loads. Returns the line."""
    monkeypatch.setattr("mmgrpo.trainer.ADAPTERS", _NoModel)
    assert main(["train", str(config), f"output_dir={tmp_path / 'out'}", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mmgrpo: config error: ") and "rollout.environment" in err, err
    return err


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------- the worked example


def test_the_worked_example_trains_two_steps_from_the_command_line(tmp_path, capsys):
    assert main(["train", str(EXAMPLE), f"output_dir={tmp_path / 'a'}", *QUICK]) == 0, capsys.readouterr().err
    steps = [m for m in _metrics(tmp_path / "a") if "env/error_fraction" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["env/error_fraction"] == 0.0 for m in steps)
    assert "line_world:LineWorld" in REFERENCES  # imported by reference, next to the config


def test_the_factory_spelling_loads_and_passes_the_load_check(tmp_path):
    from mmgrpo.env_check import check_environment
    from mmgrpo.loader import load_config

    spec = "line_world:make_line_world()"
    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", f"rollout.environment={spec}"])
    check_environment(cfg, {"prompt": "Play.", "seed": 0})  # imported, built, reset and stepped once
    assert REFERENCES[spec].__name__ == "make_line_world"


def test_the_example_environment_plays_by_the_protocol():
    """LineWorld by hand: the level of a seed, a move toward the goal, an invalid reply, the goal's reward."""
    import sys

    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        from line_world import LineWorld
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    env = LineWorld(length=7, max_steps=10)
    limits = EnvLimits()
    checked_reset(env, {"seed": 0}, limits)
    start, goal = env.position, env.goal
    move = "right" if goal > start else "left"
    obs, reward, done = checked_step(env, "no action here", limits)
    assert obs.invalid and env.position == start and reward == -0.1 and not done
    for k in range(abs(goal - start)):
        obs, reward, done = checked_step(env, f"<action>{move}</action>", limits)
        assert done == (k == abs(goal - start) - 1)
    assert reward == 1.0 and env.position == goal


# ---------------------------------------------------------------------------- protocol mistakes, one line at load

MISTAKES = {
    "two_values": (
        "return Observation(text='x'), 0.0",
        "step(action_text) returned a tuple of 2 values",
    ),
    "wrong_order": (
        "return 0.0, Observation(text='x'), False",
        "step(action_text) returned (float, Observation, bool); the protocol expects a tuple (Observation, reward: "
        "float, done: bool), the Observation first",
    ),
    "reward_str": (
        "return Observation(text='x'), '1', False",
        "step(action_text) returned (Observation, str, bool) with reward '1'",
    ),
    "done_str": (
        "return Observation(text='x'), 0.0, 'no'",
        "step(action_text) returned (Observation, float, str) with done 'no'",
    ),
    "step_raises": (
        "raise KeyError('boom')",
        "step(action_text) raised KeyError: 'boom'",
    ),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_step_that_breaks_the_protocol_is_one_line_before_the_model_loads(name, tmp_path, capsys, monkeypatch):
    body, expected = MISTAKES[name]
    source = f"""
    from mmgrpo.tools import Observation

    class Env:
        def reset(self, row):
            return Observation(text="start")

        def step(self, action_text):
            {body}
    """
    err = _refused(_project(tmp_path, f"env_{name}", source, f"env_{name}:Env"), tmp_path, capsys, monkeypatch)
    assert expected in err and "the protocol expects a tuple (Observation, reward: float, done: bool)" in err, err


@pytest.mark.parametrize(
    "body, expected",
    [
        ("return 'You are at 0'", "reset(row) returned a str 'You are at 0'; the protocol expects an Observation"),
        ("raise ValueError('no seed column')", "reset(row) raised ValueError: no seed column"),
        ("return Observation(text='x' * 5000)", "reset(row) returned an Observation of 5000 characters"),
    ],
)
def test_a_reset_that_breaks_the_protocol_is_one_line_before_the_model_loads(
    body, expected, tmp_path, capsys, monkeypatch
):
    source = f"""
    from mmgrpo.tools import Observation

    class Env:
        def reset(self, row):
            {body}

        def step(self, action_text):
            return Observation(text="x"), 0.0, False
    """
    module = f"env_reset_{abs(hash(body)) % 10**8}"
    err = _refused(_project(tmp_path, module, source, f"{module}:Env"), tmp_path, capsys, monkeypatch)
    assert expected in err and "first training row" in err, err


def test_a_build_that_raises_or_unknown_options_are_one_line(tmp_path, capsys, monkeypatch):
    source = GOOD + "\n\nclass Broken(Env):\n    def __init__(self, size: int = 3):\n        raise RuntimeError('no')\n"
    config = _project(tmp_path, "env_build", source, "env_build:Broken")
    assert "building it with rollout.environment_args raised RuntimeError: no" in _refused(
        config, tmp_path, capsys, monkeypatch
    )
    err = _refused(
        config, tmp_path, capsys, monkeypatch, "rollout.environment=env_build:Env", "rollout.environment_args.sise=2"
    )
    assert "rollout.environment_args.sise" in err and "size" in err, err


def test_the_rewards_code_policy_applies(tmp_path, capsys, monkeypatch):
    """The standard library and an installed library are refused (the latter unless trusted by the same variable as
    rewards), as a function written without ``()`` and a class with it; at --dry-run too, importing nothing."""
    config = _project(tmp_path, "env_policy", GOOD + "\n\ndef make(size: int = 3):\n    return Env(size)\n", "x:y")
    cases = {
        "subprocess:Popen": "standard library",
        "torch.nn:Linear": "installed library torch.nn",
        "env_policy:make": "is a function: write 'env_policy:make()'",
        "env_policy:Env()": "is a class: write 'env_policy:Env'",
        "env_policy:Nope": "has no attribute 'Nope'",
        "no_such_module_here:Env": "cannot find module 'no_such_module_here'",
    }
    for spec, expected in cases.items():
        for dry in ([], ["--dry-run"]):
            err = _refused(config, tmp_path, capsys, monkeypatch, f"rollout.environment={spec}", *dry)
            assert expected in err, (spec, dry, err)
    monkeypatch.setenv("MMGRPO_TRUSTED_REWARD_MODULES", "torch.nn")  # trusted: imported, built, refused by the probe
    err = _refused(config, tmp_path, capsys, monkeypatch, "rollout.environment=torch.nn:Linear")
    assert "installed library" not in err and "building it with rollout.environment_args raised TypeError" in err, err


def test_dry_run_does_not_import_the_environment(tmp_path, capsys):
    marker = tmp_path / "imported.txt"
    source = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n" + GOOD
    config = _project(tmp_path, "env_sidefx", source, "env_sidefx:Env")
    assert main(["train", str(config), "--dry-run", f"output_dir={tmp_path / 'out'}"]) == 0, capsys.readouterr().err
    assert not marker.exists()  # found in its source, not run
    bad = _project(tmp_path, "env_sidefx", source, "env_sidefx:Missing")
    assert main(["train", str(bad), "--dry-run", f"output_dir={tmp_path / 'out'}"]) == 2
    assert "has no attribute 'Missing'" in capsys.readouterr().err and not marker.exists()


def test_dry_run_with_trust_config_runs_the_load_checks_train_runs(tmp_path, capsys):
    """``--dry-run --trust-config``: the config is the user's, so its code is imported and probed as ``train`` does
    before the model loads — an environment's protocol mistake and a reward returning None are one line here, where
    a plain ``--dry-run`` (source read, nothing run) passes them."""
    source = """
    from mmgrpo.tools import Observation

    class Env:
        def reset(self, row):
            return Observation(text="start")

        def step(self, action_text):
            return Observation(text="x"), 0.0
    """
    config = _project(tmp_path, "env_pair", source, "env_pair:Env")
    out = f"output_dir={tmp_path / 'out'}"
    assert main(["train", str(config), "--dry-run", out]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["train", str(config), "--dry-run", "--trust-config", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "step(action_text) returned a tuple of 2 values" in err, err

    (tmp_path / "none_reward.py").write_text("def score(completions, **kwargs):\n    return None\n")
    config = _project(tmp_path, "env_ok", GOOD, "env_ok:Env")
    rewards = "rewards=[{name: 'none_reward:score'}]"
    assert main(["train", str(config), "--dry-run", out, rewards]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["train", str(config), "--dry-run", "--trust-config", out, rewards]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none_reward:score" in err and "None" in err, err
    assert not (tmp_path / "out").exists()  # a dry run writes no run directory


# ------------------------------------------------------------------------------ mid-run: counted, never a traceback


def test_an_environment_that_raises_mid_run_ends_those_trajectories_counted(tmp_path, capsys, caplog):
    """reset raises on every level but the first row's (which the load check plays) and step on its second call:
    the run finishes, the faults counted in env/error_fraction, no traceback."""
    source = """
    from mmgrpo.tools import Observation

    class Flaky:
        def reset(self, row):
            if row["seed"] != 0:
                raise RuntimeError("level generator crashed")
            self.n = 0
            return Observation(text="start")

        def step(self, action_text):
            self.n += 1
            if self.n > 1:
                raise RuntimeError("physics exploded")
            return Observation(text="moved"), 0.0, False
    """
    config = _project(tmp_path, "env_flaky", source, "env_flaky:Flaky", seeds=[0, 1, 2, 3, 4, 5])
    assert main(["train", str(config), f"output_dir={tmp_path / 'out'}"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    logged = [r.getMessage() for r in caplog.records if "rollout.environment" in r.getMessage()]
    assert len(logged) == 1 and "reset(row) raised RuntimeError: level generator crashed" in logged[0]  # logged once
    fractions = [m["env/error_fraction"] for m in _metrics(tmp_path / "out") if "env/error_fraction" in m]
    assert len(fractions) == 2 and sum(fractions) > 0


class _Scripted:
    """An environment whose step does ``behaviour`` on its second call (the first is a plain move)."""

    def __init__(self, behaviour: str = "ok"):
        self.behaviour, self.n = behaviour, 0

    def reset(self, row):
        return Observation(text="start")

    def step(self, action_text):
        import time

        self.n += 1
        if self.n == 2 and self.behaviour == "sleep":
            time.sleep(2.0)
        if self.n == 2 and self.behaviour == "huge":
            return Observation(text="x" * 10_000_000), 0.0, False
        if self.n == 2 and self.behaviour == "pair":
            return Observation(text="x"), 0.0
        if self.n == 2 and self.behaviour == "raise":
            raise RuntimeError("physics exploded")
        return Observation(text="moved"), 1.0, False


@pytest.mark.parametrize("behaviour", ["sleep", "huge", "pair", "raise"])
def test_a_step_that_times_out_returns_too_much_or_breaks_the_protocol_ends_the_trajectory(
    behaviour, tiny_vlm_path, monkeypatch
):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from tests.test_turns import script

    monkeypatch.setitem(REFERENCES, "mine:Scripted", lambda: _Scripted(behaviour))
    settings = RolloutConfig(
        environment="mine:Scripted", max_turns=4, max_total_tokens=300, tool_limits={"timeout_s": 0.5}
    )
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 8}, rollout=settings)
    script(adapter, {b: ["<action>a</action>"] * 4 for b in range(2)})
    rollout = adapter.rollout([{"prompt": "Play.", "seed": 1}], group_size=2)
    ex = rollout.extras
    assert ex["env_errors"] == [1, 1] and ex["num_turns"] == [2, 2]  # the second step faulted: no third turn
    assert ex["turn_rewards"][0] == [1.0, 0.0] and rollout.truncated.tolist() == [True, True]


def test_the_ok_environment_counts_nothing(tiny_vlm_path, monkeypatch):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from tests.test_turns import script

    monkeypatch.setitem(REFERENCES, "mine:Scripted", _Scripted)
    settings = RolloutConfig(environment="mine:Scripted", max_turns=3, max_total_tokens=300)
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 8}, rollout=settings)
    script(adapter, {b: ["<action>a</action>"] * 3 for b in range(2)})
    ex = adapter.rollout([{"prompt": "Play.", "seed": 1}], group_size=2).extras
    assert ex["env_errors"] == [0, 0] and ex["num_turns"] == [3, 3] and ex["turn_rewards"][0] == [1.0, 1.0, 1.0]


# ------------------------------------------------------------------------------------------ the guard, by hand


def test_the_guard_checks_each_value_by_hand():
    limits = EnvLimits(timeout_s=None, max_observation_chars=10, max_images=1)

    class Env:
        out = None

        def reset(self, row):
            return self.out

        def step(self, action_text):
            return self.out

    env = Env()
    env.out = (Observation(text="ok"), np.float32(0.5), np.bool_(True))  # numpy scalars, as gymnasium returns
    obs, reward, done = checked_step(env, "", limits)
    assert math.isclose(reward, 0.5) and done is True and obs.text == "ok"
    for value, expected in [
        ((Observation(), float("nan"), False), "with reward nan"),
        ((Observation(), 1.0, False, {}), "a tuple of 4 values"),
        (Observation(), "returned a Observation"),
        ((Observation(text="x" * 11), 0.0, False), "an Observation of 11 characters"),
        ((Observation(text=3), 0.0, False), "whose text is a int"),
    ]:
        env.out = value
        with pytest.raises(EnvironmentFault, match=r"^step\(action_text\) ") as e:
            checked_step(env, "", limits)
        assert expected in str(e.value) and "\n" not in str(e.value)
    env.out = None
    with pytest.raises(EnvironmentFault, match=r"^reset\(row\) returned a NoneType None; the protocol expects"):
        checked_reset(env, {}, limits)


def test_a_failed_start_is_a_placeholder_that_faults(monkeypatch):
    monkeypatch.setitem(REFERENCES, "mine:Broken", lambda: 1 / 0)
    env, obs = start_episode("mine:Broken", {}, {}, EnvLimits())
    assert obs is None and "ZeroDivisionError" in env.reason
    with pytest.raises(EnvironmentFault, match="ZeroDivisionError"):
        env.step("")
    env, obs = start_episode("not:loaded", {}, {}, EnvLimits())  # a reference nobody loaded: the same, not a crash
    assert obs is None and "was not loaded" in env.reason


def test_the_demo_loads_an_own_environment_only_when_trusted(tmp_path):
    from mmgrpo.demo.answer import _eval_rows
    from mmgrpo.loader import load_config

    marker = tmp_path / "imported.txt"
    source = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n" + GOOD
    config = _project(tmp_path, "env_demo", source, "env_demo:Env")
    cfg = load_config(config, [f"output_dir={tmp_path / 'out'}"])
    _, problem = _eval_rows(cfg, trust_run_config=False)
    assert problem is None and not marker.exists() and "env_demo:Env" not in REFERENCES
    _, problem = _eval_rows(cfg, trust_run_config=True)
    assert problem is None and marker.exists() and "env_demo:Env" in REFERENCES


def test_hung_environment_calls_never_add_threads_past_the_bound():
    """An environment whose ``step`` hangs: each call faults at its deadline, the hung calls keep their slots, and once
    every slot is held the next call faults at once — the thread count stays within the tools' bound however many
    calls hang (issue 54: no thread leak)."""
    from mmgrpo.tools import worker

    release = threading.Event()

    class Hangs:
        def reset(self, row):
            return Observation(text="start")

        def step(self, action_text):
            release.wait(30)
            return Observation(text="late"), 0.0, True

    limits = EnvLimits(timeout_s=0.05)
    before = threading.active_count()
    messages = []
    try:
        for _ in range(3 * worker.MAX_THREADS):
            with pytest.raises(EnvironmentFault) as e:
                checked_step(Hangs(), "", limits)
            messages.append(str(e.value))
            assert threading.active_count() <= before + worker.MAX_THREADS
    finally:
        release.set()
    assert sum("did not return within 0.05 s" in m for m in messages) <= worker.MAX_THREADS
    assert sum("was not called" in m for m in messages) >= 2 * worker.MAX_THREADS
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:  # the released calls end
        time.sleep(0.01)
    assert threading.active_count() <= before
    obs, _, done = checked_step(Hangs(), "", limits)  # the slots are free again
    assert obs.text == "late" and done is True
