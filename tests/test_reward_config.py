"""Reward mistakes are caught when the config loads (so --dry-run fails), in one line, exit status 2."""

import subprocess
import sys
import textwrap

import pytest

from mmgrpo.cli import main

CFG = "configs/quickstart.yaml"


@pytest.mark.parametrize(
    "override, message",
    [
        ("rewards=[{name: acuracy}]", "rewards[0] (acuracy): unknown reward 'acuracy'; did you mean 'accuracy'?"),
        ("rewards=[{name: zzqqxx}]", "rewards[0] (zzqqxx): unknown reward 'zzqqxx'; valid names: accuracy, "),
        ("rewards=[{name: accuracy, kwargs: {answer_kye: x}}]", "got unknown argument(s) ['answer_kye']"),
        ("rewards=[{name: no_such_module_xyz:fn}]", "cannot import module 'no_such_module_xyz'"),
        ("rewards=[{name: mmgrpo.rewards.text:nope}]", "has no attribute 'nope'"),
        ("rewards=[{name: accuracy, weight: .nan}]", "rewards[0].weight: is NaN"),
        ("rewards=[{name: accuracy, weight: -1}]", "weight: must be a finite number >= 0"),
        ("rewards=[{name: 'mmgrpo.rewards.text:normalize_answer()', kwargs: {txt: 1}}]", "unknown argument(s) ['txt']"),
        ("reward_runtime.timeout_s=0", "reward_runtime.timeout_s: must be > 0"),
        ("reward_runtime.workers=0", "reward_runtime.workers: must be >= 1"),
        ("reward_runtime.isolation=fork", "reward_runtime.isolation"),
    ],
)
def test_reward_mistakes_fail_dry_run_in_one_line(override, message, capsys):
    assert main(["train", CFG, override, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err, err
    assert err.count("\n") == 0 and "Traceback" not in err


def test_good_reward_specs_pass_dry_run(capsys):
    ok = (
        "rewards=[{name: accuracy, kwargs: {answer_key: answer}}, "
        "{name: 'mmgrpo.rewards.text:format_reward', weight: 0.5}]"
    )
    assert main(["train", CFG, ok, "--dry-run"]) == 0


def test_reward_module_with_an_import_error_is_one_line_when_training_loads_it(tmp_path, capsys, monkeypatch):
    """--dry-run does not import a reward module (a config is code); loading it for training does, and a failing
    import is one line naming the module and the missing package."""
    (tmp_path / "broken_rewards.py").write_text(
        "import not_installed_pkg_xyz\n\n\ndef f(completions, **kw):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["train", CFG, "rewards=[{name: broken_rewards:f}]", "--dry-run"]) == 0
    err = capsys.readouterr().err.strip()
    assert "reward 'broken_rewards:f' is code" in err and "when training starts" in err and "\n" not in err
    from mmgrpo.config import ConfigError
    from mmgrpo.rewards import load_reward

    with pytest.raises(ConfigError) as info:
        load_reward("broken_rewards:f")
    msg = str(info.value)
    assert "cannot import module 'broken_rewards'" in msg and "not_installed_pkg_xyz" in msg and "\n" not in msg


def test_console_script_imports_a_reward_module_from_the_current_directory(tmp_path):
    """`mmgrpo` (the console script, whose sys.path[0] is its bin/ folder) finds ./my_rewards.py."""
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def short(completions, **kw):
                return [1.0 if len(str(c)) < 20 else 0.0 for c in completions]
            """
        )
    )
    import mmgrpo

    root = __import__("pathlib").Path(mmgrpo.__file__).resolve().parents[1]
    script = "import sys; sys.path.pop(0); from mmgrpo.cli import main; sys.exit(main())"  # like the console script
    args = [sys.executable, "-c", script, "train", str(root / CFG), "rewards=[{name: my_rewards:short}]", "--dry-run"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "my_rewards:short" in out.stdout
