"""Issue 54, first row: ``rollout.tools`` by import path go through the rewards' code policy (mmgrpo/tool_check.py).

On the old tree ``torch.hub:download_url_to_file``, ``os:fork`` and ``os:abort`` were accepted as tools, and
``--dry-run`` imported a tool's module (running its top-level code)."""

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from mmgrpo.cli import main
from mmgrpo.config import ConfigError
from mmgrpo.rewards.registry import reward_code_policy
from mmgrpo.tool_check import NotLoadedTool, resolve_tools
from mmgrpo.tools import FunctionTool, ToolCall, ToolContext, run_tool_call

TOOL = '''
def probe(word: str) -> str:
    """Echo a word.

    Args:
        word: The word to echo.
    """
    return word.upper()


class Box:
    pass
'''


def _project(tmp_path: Path, module: str, source: str, tools: list[str]) -> Path:
    """``tmp_path/<module>.py`` and a config next to it whose rollouts may call ``tools``."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    row = json.dumps({"prompt": "Say hi.", "answer": "HI"})
    (tmp_path / "rows.jsonl").write_text(f"{row}\n{row}\n")
    config = {
        "steps": 1,
        "model": {"adapter": "vlm", "args": {"name_or_path": "tiny-qwen2.5-vl-tools", "max_new_tokens": 8}},
        "task": {"name": "dataset", "args": {"train": "rows.jsonl", "check_rows": 2}},
        "rewards": [{"name": "format"}],
        "rollout": {"tools": tools, "max_turns": 2, "max_total_tokens": 96},
        "algorithm": {"group_size": 2, "prompts_per_step": 2},
        "eval": {"before": False, "after": False},
        "logging": {"trackers": [], "progress": False},
        "checkpoint": {"every": 0, "save_final": False},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "run.yaml"


def _dry_run(config: Path, tmp_path: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["train", str(config), "--dry-run", f"output_dir={tmp_path / 'out'}", *extra])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("torch.hub:download_url_to_file", "installed library torch.hub"),
        ("os:fork", "standard library module 'os'"),
        ("os:abort", "standard library module 'os'"),
        ("subprocess:run", "standard library module 'subprocess'"),
        ("tool_mod:Box", "is the class tool_mod.Box, not a tool"),
        ("tool_mod:nope", "has no attribute 'nope'"),
    ],
)
def test_library_and_stdlib_tools_are_refused_in_one_line(tmp_path, capsys, spec, expected):
    config = _project(tmp_path, "tool_mod", TOOL, [spec])
    code, err = _dry_run(config, tmp_path, capsys)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("mmgrpo: config error: rollout.tools"), err
    assert expected in err, err


def test_a_library_named_in_the_environment_variable_is_allowed(tmp_path, monkeypatch):
    from mmgrpo.tool_check import check_tools

    with pytest.raises(ConfigError, match=r"MMGRPO_TRUSTED_REWARD_MODULES=torch\.hub"):
        check_tools(["torch.hub:download_url_to_file"])
    monkeypatch.setenv("MMGRPO_TRUSTED_REWARD_MODULES", "torch.hub")
    check_tools(["torch.hub:download_url_to_file"])  # the person running the command vouches for it
    check_tools(["crop", "zoom"])  # built-in tools stay allowed


def test_dry_run_imports_no_tool_module_and_training_imports_it_checked(tmp_path, capsys, monkeypatch):
    marker = tmp_path / "imported.txt"
    source = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n" + TOOL
    config = _project(tmp_path, "sidefx_tool", source, ["sidefx_tool:probe"])
    code, err = _dry_run(config, tmp_path, capsys)
    assert code == 0 and not marker.exists(), err  # found in its source, not run
    monkeypatch.syspath_prepend(str(tmp_path))
    with reward_code_policy("check"):
        (placeholder,) = resolve_tools(["sidefx_tool:probe"])
    with reward_code_policy("registered"):  # the demo of an untrusted run: not even looked for
        (untrusted,) = resolve_tools(["sidefx_tool:probe"])
    assert isinstance(placeholder, NotLoadedTool) and isinstance(untrusted, NotLoadedTool) and not marker.exists()
    obs = run_tool_call(ToolCall("probe", {}, ""), [untrusted], ToolContext())
    assert obs.invalid and "--trust-run-config" in obs.text
    (tool,) = resolve_tools(["sidefx_tool:probe"])  # "import": training
    assert marker.exists() and isinstance(tool, FunctionTool) and tool.fn.__module__ == "sidefx_tool"
    assert run_tool_call(ToolCall("probe", {"word": "hi"}, ""), [tool], ToolContext()).text == "HI"
