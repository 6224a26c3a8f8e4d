"""The code policy: a config is code, a run directory from elsewhere is code (docs/reliability.md).

Rewards named by ``module:function`` must be plain Python functions outside the standard library; checking a
config (``--dry-run``) imports none of them; ``mmgrpo demo`` loads only registered rewards unless
``--trust-run-config``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo.cli import main
from mmgrpo.config import ConfigError, dump_config
from mmgrpo.loader import load_config
from mmgrpo.rewards import RewardRunner, load_reward
from mmgrpo.rewards.registry import (
    NotLoadedReward,
    RewardCodeError,
    RewardNotLoadedError,
    check_reward_spec,
    reward_code_policy,
)

ROOT = Path(__file__).resolve().parents[1]
CFG = str(ROOT / "configs/quickstart.yaml")

MODULE = """
from pathlib import Path

Path(__file__).with_name("MARKER_{name}").write_text("top-level code ran")


def reward(completions, *, scale: float = 1.0, **columns):
    return [scale] * len(completions)


def strict(completions, scale: float = 1.0):
    return [scale] * len(completions)


class Scorer:
    def __call__(self, completions, **columns):
        return [0.0] * len(completions)


def make_scorer(value: float = 0.5):
    class Constant:
        def __call__(self, completions, **columns):
            return [value] * len(completions)

    return Constant()


def make_class():
    return Scorer


Hidden = type("Hidden", (), {{"__call__": lambda self, completions, **kw: [0.0] * len(completions)}})
builtin_len = len
instance = Scorer()
"""


def _module(tmp_path: Path, monkeypatch, name: str) -> Path:
    """A reward module in ``tmp_path`` (on sys.path) whose top-level code writes ``MARKER_<name>`` when it runs."""
    (tmp_path / f"{name}.py").write_text(MODULE.format(name=name))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path / f"MARKER_{name}"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("{name: 'subprocess:Popen', kwargs: {args: 'touch M', shell: true}}", "standard library module 'subprocess'"),
        ("{name: 'os:system', kwargs: {command: 'touch M'}}", "standard library module 'os'"),
        ("{name: 'builtins:eval'}", "standard library module 'builtins'"),
        ("{name: 'policy_mod_a:Scorer'}", "is the class policy_mod_a.Scorer, not a function"),
        ("{name: 'policy_mod_a:Scorer()'}", "is the class policy_mod_a.Scorer, not a function"),
    ],
)
def test_classes_builtins_and_the_standard_library_are_refused_at_load_in_one_line(
    spec, message, tmp_path, monkeypatch, capsys
):
    marker = _module(tmp_path, monkeypatch, "policy_mod_a")
    monkeypatch.chdir(tmp_path)
    override = f"rewards=[{spec}]"
    with pytest.raises(ConfigError, match="rewards\\[0\\]"):
        load_config(CFG, [override])  # what `mmgrpo train` does first: nothing is built, nothing runs
    assert main(["train", CFG, override, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("mmgrpo: config error: rewards[0]") and "\n" not in err, err
    assert not marker.exists() and not (tmp_path / "M").exists()


def test_what_the_source_does_not_show_is_refused_when_loaded(tmp_path, monkeypatch):
    """Names bound by assignment cannot be judged from the source: the config check says so, loading refuses."""
    marker = _module(tmp_path, monkeypatch, "policy_mod_b")
    hidden = (
        ("Hidden", "is the class policy_mod_b.Hidden"),
        ("builtin_len", "is a built-in function"),
        ("instance", "is a Scorer object"),
    )
    for attr, _ in hidden:
        assert "when training starts" in check_reward_spec(f"policy_mod_b:{attr}")
    assert not marker.exists()
    for attr, kind in hidden:
        with pytest.raises(RewardCodeError, match=kind):
            RewardRunner([(f"policy_mod_b:{attr}", 1.0, {})])  # as the trainer builds its rewards
    assert marker.exists()  # loading for training imports the module: the check above could fail
    with pytest.raises(RewardCodeError, match="the factory returned a class"):
        load_reward("policy_mod_b:make_class()")


def test_functions_and_factories_of_ones_own_code_load(tmp_path, monkeypatch):
    marker = _module(tmp_path, monkeypatch, "policy_mod_c")
    for imported in (False, True):  # checked from the source, then on the imported function: same messages
        with pytest.raises(
            ValueError, match=r"unknown argument\(s\) \['scal'\]; it accepts \['completions', 'scale'\]"
        ):
            check_reward_spec("policy_mod_c:strict", {"scal": 1})
        with pytest.raises(ValueError, match=r"unknown argument\(s\) \['valu'\]"):
            check_reward_spec("policy_mod_c:make_scorer()", {"valu": 1})
        assert marker.exists() is imported
        load_reward("policy_mod_c:reward")
    assert load_reward("policy_mod_c:reward", scale=2.0)(["a", "b"], prompts=["p", "p"]) == [2.0, 2.0]
    assert load_reward("policy_mod_c:make_scorer()", value=0.25)(["a"], prompts=["p"]) == [0.25]


def test_a_cwd_module_does_not_run_during_dry_run(tmp_path):
    """`python -m mmgrpo train ... --dry-run` with a reward in ./policy_mod_d.py: its top-level code (which writes a
    marker file) does not run; the dry-run says the function is checked when training starts."""
    (tmp_path / "policy_mod_d.py").write_text(MODULE.format(name="policy_mod_d"))
    args = [sys.executable, "-m", "mmgrpo", "train", CFG, "rewards=[{name: 'policy_mod_d:reward'}]", "--dry-run"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "policy_mod_d:reward" in out.stdout  # the resolved config
    assert "reward 'policy_mod_d:reward' is code: reward() in" in out.stderr
    assert "checked to be a plain function, when training starts" in out.stderr
    assert not (tmp_path / "MARKER_policy_mod_d").exists()
    script = "from mmgrpo.rewards import load_reward; load_reward('policy_mod_d:reward')"  # what training does
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True, timeout=120)
    assert (tmp_path / "MARKER_policy_mod_d").exists()


def test_check_policy_returns_placeholders_without_importing(tmp_path, monkeypatch):
    """Under ``reward_code_policy("check")`` (what --dry-run builds tasks under) an import path is checked and
    stands as a placeholder; a refused one still fails."""
    marker = _module(tmp_path, monkeypatch, "policy_mod_e")
    with reward_code_policy("check"):
        fn = load_reward("policy_mod_e:reward", scale=3.0)
        with pytest.raises(RewardCodeError, match="is the class"):
            load_reward("policy_mod_e:Scorer")
        assert load_reward("accuracy").__name__ == "accuracy"  # registry names load as usual
    assert isinstance(fn, NotLoadedReward) and not marker.exists()
    with pytest.raises(RewardNotLoadedError, match="not loaded"):
        fn(["a"], prompts=["p"])


# ------------------------------------------------------------------------------------------------ the demo


def _crafted_run_dir(tmp_path: Path, monkeypatch, **model_args) -> tuple[Path, Path]:
    marker = _module(tmp_path, monkeypatch, "policy_mod_demo")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(CFG, [f"output_dir={run_dir}"])
    cfg.model.args.update(model_args)
    text = dump_config(cfg).replace("rewards:\n", "rewards:\n- name: policy_mod_demo:reward\n  weight: 1.0\n", 1)
    (run_dir / "config.yaml").write_text(text)
    return run_dir, marker


def test_demo_on_a_crafted_run_dir_runs_no_code_without_trust(tmp_path, monkeypatch, caplog):
    gr = pytest.importorskip("gradio", reason="the demo needs the demo extra")
    from mmgrpo.demo import Models, build_app, load_run_config

    run_dir, marker = _crafted_run_dir(tmp_path, monkeypatch)
    cfg = load_run_config(run_dir)
    assert cfg.rewards[0].name == "policy_mod_demo:reward"
    models = Models(cfg, None)
    app = build_app(run_dir, models, cfg)
    page = " ".join(str(getattr(b, "value", "")) for b in app.blocks.values() if isinstance(b, gr.Markdown))
    assert "'policy_mod_demo:reward' not loaded" in page and "--trust-run-config" in page
    with models.policy():
        runner = models._rewards()
    assert runner.names == ["accuracy", "format"]
    assert "--trust-run-config" in caplog.text
    assert not marker.exists()
    trusted = Models(cfg, None, trust_run_config=True)
    assert trusted.skipped_rewards == []
    with trusted.policy():
        assert trusted._rewards().names == ["reward", "accuracy", "format"]
    assert marker.exists()  # with --trust-run-config the named code runs: the check above could fail


def test_demo_refuses_remote_code_without_trust(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gradio", reason="the demo needs the demo extra")
    from mmgrpo.demo import DemoError, load_run_config

    run_dir, _ = _crafted_run_dir(tmp_path, monkeypatch, trust_remote_code=True)
    with pytest.raises(DemoError, match=r"model\.args\.trust_remote_code: true .*--trust-run-config"):
        load_run_config(run_dir)
    assert load_run_config(run_dir, trust_run_config=True).model.args["trust_remote_code"] is True
    assert main(["demo", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--trust-run-config" in err and "\n" not in err


# ------------------------------------------------------------------------- the policy: where reward code comes from


class _Planted:
    """Unpickling this creates the file ``path``: a planted pickle that shows whether anything loaded it."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


LOADERS = [  # third-party functions that load files or objects, named as reward factories
    ("torch", "{name: 'torch:load()', kwargs: {f: '{file}', weights_only: false}}"),
    ("pandas", "{name: 'pandas:read_pickle()', kwargs: {filepath_or_buffer: '{file}'}}"),
    ("joblib", "{name: 'joblib:load()', kwargs: {filename: '{file}'}}"),
]


@pytest.mark.parametrize("library, spec", LOADERS, ids=[name for name, _ in LOADERS])
def test_library_functions_that_load_objects_are_refused_in_one_line(library, spec, tmp_path, monkeypatch, capsys):
    pytest.importorskip(library)
    import pickle

    monkeypatch.delenv("MMGRPO_TRUSTED_REWARD_MODULES", raising=False)
    marker = tmp_path / "UNPICKLED"
    (tmp_path / "planted.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    override = "rewards=[" + spec.replace("{file}", str(tmp_path / "planted.pkl")) + "]"
    for args in (["--dry-run"], []):  # the dry-run, and `train` (which checks the config first)
        assert main(["train", CFG, override, f"output_dir={tmp_path / 'run'}", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("mmgrpo: config error: rewards[0]") and "\n" not in err and "Traceback" not in err
        assert f"code of the installed library {library}" in err
        assert f"MMGRPO_TRUSTED_REWARD_MODULES={library}" in err and "docs/rewards.md#code-policy" in err
    assert not marker.exists()


def test_the_policy_holds_without_importing_and_through_re_exports(tmp_path):
    """In a fresh process (the library not imported: checked from its file's place) and through an own module that
    re-exports the library function; the documented opt-in allows it; trl.rewards and own code pass."""
    (tmp_path / "reexport_mod.py").write_text("from joblib import load\n")
    env = {k: v for k, v in os.environ.items() if k != "MMGRPO_TRUSTED_REWARD_MODULES"}

    def dry_run(reward: str, **extra: str) -> subprocess.CompletedProcess:
        args = [sys.executable, "-m", "mmgrpo", "train", CFG, f"rewards=[{reward}]", "--dry-run"]
        args.append(f"output_dir={tmp_path / 'run'}")
        return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**env, **extra})

    out = dry_run("{name: 'joblib:load()', kwargs: {filename: x.pkl}}")
    assert out.returncode == 2 and "code of the installed library joblib" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = dry_run("{name: 'reexport_mod:load()', kwargs: {filename: x.pkl}}")
    assert out.returncode == 2 and "installed library joblib" in out.stderr, out.stderr
    out = dry_run("{name: 'joblib:load()', kwargs: {filename: x.pkl}}", MMGRPO_TRUSTED_REWARD_MODULES="joblib")
    assert out.returncode == 0, out.stderr
    assert "installed library" not in dry_run("{name: 'trl.rewards:think_format_reward'}").stderr  # allow-listed
