"""Finding rewards: registry names, import paths, entry points of installed packages, errors that teach."""

import functools
import sys
import textwrap

import pytest

import mmgrpo.rewards as R
from mmgrpo.registry import Registry
from mmgrpo.rewards import REWARDS, RewardRunner, UnknownRewardError, list_rewards, load_reward, register_reward

CONTRACT_NAMES = {"format", "accuracy"}


def test_registry_type_and_builtins():
    assert isinstance(REWARDS, Registry)
    names = dict(list_rewards())
    assert set(names) >= CONTRACT_NAMES
    for name, desc in names.items():
        assert desc and "\n" not in desc, name
    for name in REWARDS.names():  # every built-in documents formula and source
        doc = REWARDS.get(name).__doc__ or ""
        assert "Source" in doc, name


def test_load_by_registry_name_and_kwargs_binding():
    fmt = load_reward("format")
    assert fmt is R.format_reward
    bound = load_reward("format", think=False)
    assert isinstance(bound, functools.partial) and bound.__name__ == "format_reward"
    assert bound(["<answer>x</answer>"], prompts=["p"]) == [1.0]
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['thinking'\]; it accepts"):
        load_reward("format", thinking=False)


def test_load_by_import_path_function_and_class():
    fn = load_reward("mmgrpo.rewards.text:accuracy", which="first")
    assert fn(["<answer>a</answer><answer>b</answer>"], prompts=["p"], answer=["a"]) == [1.0]
    with pytest.raises(UnknownRewardError, match="has no attribute 'nope'"):
        load_reward("mmgrpo.rewards.text:nope")
    with pytest.raises(UnknownRewardError, match=r"cannot import module 'no_such_pkg_xyz.mod'"):
        load_reward("no_such_pkg_xyz.mod:f")


def test_unknown_name_suggests_the_closest_name_and_the_three_ways():
    with pytest.raises(UnknownRewardError) as info:
        load_reward("acuracy")
    msg = str(info.value)
    assert "unknown reward 'acuracy'; did you mean 'accuracy'?" in msg and "format" not in msg
    assert "registry name" in msg and "package.module:function" in msg and "mmgrpo.rewards" in msg
    assert isinstance(info.value, KeyError) and not msg.startswith("'")


def test_register_reward_decorator_and_duplicate():
    @register_reward("test_rewards_tmp_len", description="length of the completion")
    def length(completions, *, prompts=None, scale: float = 1.0, **columns):
        return [scale * len(c) for c in completions]

    try:
        assert ("test_rewards_tmp_len", "length of the completion") in list_rewards()
        assert load_reward("test_rewards_tmp_len", scale=2.0)(["abc"], prompts=["p"]) == [6.0]
        with pytest.raises(ValueError, match="already registered"):
            register_reward("test_rewards_tmp_len")(lambda completions, **kw: [])
    finally:
        REWARDS._items.pop("test_rewards_tmp_len", None)
        R.registry._DESCRIPTIONS.pop("test_rewards_tmp_len", None)


def _install_fake_distribution(root, module: str, body: str, entry_points: str) -> None:
    """What pip leaves on sys.path for an installed package: the module and a *.dist-info with entry points."""
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_user_reward_in_another_installed_package_is_found_by_entry_point(tmp_path, monkeypatch):
    _install_fake_distribution(
        tmp_path,
        "acme_rewards",
        '''
        def shout_reward(completions, prompts=None, **kwargs):
            """1 if the completion is upper case (a user's plug-in)."""
            return [float(c.isupper()) for c in completions]

        class Bonus:
            """Constant bonus (a model-based-style class)."""
            def __init__(self, value=0.5):
                self.value = value
            def __call__(self, completions, *, prompts=None, **columns):
                return [self.value] * len(completions)
        ''',
        """
        [mmgrpo.rewards]
        shout = acme_rewards:shout_reward
        bonus = acme_rewards:Bonus
        broken = acme_rewards:does_not_exist
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "acme_rewards", raising=False)

    shout = load_reward("shout")
    assert shout.__module__ == "acme_rewards"
    assert shout(["HEY", "hey"], prompts=["p", "p"]) == [1.0, 0.0]
    assert load_reward("bonus", value=2.0)(["a"], prompts=["p"]) == [2.0]
    listed = dict(list_rewards())
    assert listed["shout"] == "1 if the completion is upper case (a user's plug-in)."
    assert "failed to load" in listed["broken"]
    with pytest.raises(UnknownRewardError, match=r"entry point 'acme_rewards:does_not_exist'.*failed to load"):
        load_reward("broken")
    with pytest.raises(UnknownRewardError, match=r"did you mean 'shout'\?"):
        load_reward("shoutt")
    with pytest.raises(UnknownRewardError, match=r"valid names: .*shout"):
        load_reward("zzqqxx")

    rewards, metrics = RewardRunner([("shout", 1.0, {}), ("bonus", 0.1, {"value": 3.0})])(["OK", "no"], ["p", "p"], {})
    assert rewards.tolist() == [[1.0, 3.0], [0.0, 3.0]]
    assert "reward/shout" in metrics and "reward/bonus" in metrics


def test_registry_wins_over_entry_point_with_same_name(tmp_path, monkeypatch):
    _install_fake_distribution(
        tmp_path,
        "shadow_rewards",
        "def format(completions, **kw):\n    return [42.0] * len(completions)\n",
        "[mmgrpo.rewards]\nformat = shadow_rewards:format\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("format") is R.format_reward


def test_readme_counts_the_built_ins_that_mmgrpo_rewards_list_prints(tmp_path):
    """README's "N built-ins" is what `mmgrpo rewards list` prints in a fresh process (no plug-ins installed here)."""
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "mmgrpo", "rewards", "list"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    claimed = re.search(r"\*\*Rewards\*\*: (\d+) built-ins", (root / "README.md").read_text())
    assert claimed is not None and int(claimed.group(1)) == len(out.stdout.strip().splitlines())
