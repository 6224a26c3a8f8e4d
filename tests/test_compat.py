"""The compatibility list (issue 35 item 1, ``mmgrpo/compat.py``): every private or version-fragile touchpoint of
vLLM, diffusers, transformers, tensorboard and torch is present in the installed version (vLLM's in the engine's
environment), the check reports a missing one by name, and no private attribute or deep import of those libraries
in the source is missing from the list. Issue 49: a private attribute of a library's object (or any ``getattr(x,
"_name")`` string) appears nowhere but in ``mmgrpo/compat.py``, reached through the function its touchpoint names."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from mmgrpo import compat
from mmgrpo.compat import TOUCHPOINTS, Touchpoint

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("MMGRPO_VLLM_PYTHON", ROOT / ".venv-vllm/bin/python"))
HERE = [tp for tp in TOUCHPOINTS if tp.library != "vllm"]
VLLM = [tp for tp in TOUCHPOINTS if tp.library == "vllm"]
LIBRARIES = ("transformers", "diffusers", "vllm", "tensorboard", "torch")


@pytest.mark.parametrize("tp", HERE, ids=lambda tp: tp.target)
def test_each_touchpoint_is_in_the_installed_version(tp: Touchpoint):
    top = tp.target.partition(":")[0].split(".")[0]
    if importlib.util.find_spec(top) is None:
        pytest.skip(f"{top} is not installed here")
    assert compat.problem(tp) is None


@pytest.fixture(scope="module")
def vllm_problems() -> dict:
    """The vLLM touchpoints checked by the engine environment's interpreter (``-P``: this folder's ``types.py``
    must not shadow the standard library's)."""
    if not VLLM_PYTHON.is_file():
        pytest.skip("no .venv-vllm: run `bash scripts/setup_vllm.sh` (CI does) for the vLLM touchpoints")
    out = subprocess.run(
        [str(VLLM_PYTHON), "-P", str(ROOT / "mmgrpo" / "compat.py"), "vllm"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["vllm"]


@pytest.mark.parametrize("tp", VLLM, ids=lambda tp: tp.target)
def test_each_vllm_touchpoint_is_in_the_engine_environment(tp: Touchpoint, vllm_problems: dict):
    assert vllm_problems[tp.target] is None


def test_a_missing_touchpoint_is_one_line_naming_it_and_its_use():
    gone = Touchpoint("torch", "torch:_C._no_such_hook", "modalities/x.py", "what breaks")
    message = compat.problem(gone)
    assert message is not None and "\n" not in message
    assert message.startswith("torch touchpoint torch:_C._no_such_hook is gone (AttributeError")
    assert message.endswith("used in modalities/x.py: what breaks")
    renamed = Touchpoint("os", "os.path:join", "here", "why", parameter="no_such_parameter")
    assert "no parameter 'no_such_parameter'" in compat.problem(renamed)
    assert compat.problem(Touchpoint("torch", "torch.nn:Module()._forward_hooks", "here", "why")) is None


# ------------------------------------------------------------------------------------ the list is complete

SOURCES = [p for d in ("mmgrpo", "modalities", "rewards", "tools") for p in (ROOT / d).rglob("*.py")]
STDLIB_PRIVATE = {"_exit"}  # os._exit


def _our_names(trees: list[ast.AST]) -> set[str]:
    """Underscore names our code defines: functions, classes, parameters, module names, ``self._x = ...``."""
    names = set()
    for tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.arg):
                names.add(n.arg)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name):
                if n.value.id in ("self", "cls"):
                    names.add(n.attr)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names | {p.stem for p in SOURCES}


def unlisted(trees: dict[str, ast.AST], listed: set[str]) -> list[str]:
    """``file: name`` of every ``x._name`` our code does not define and the list does not hold, and of every deep
    import ``from <library>.<sub> import name`` of the libraries whose name the list does not hold."""
    ours = _our_names(list(trees.values()))
    out = []
    for path, tree in trees.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
                known = ours | listed | STDLIB_PRIVATE
                if n.attr not in known and not n.attr.startswith("_mmgrpo"):  # _mmgrpo*: ours on a library's objects
                    out.append(f"{path}: {n.attr}")
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                top, _, sub = n.module.partition(".")
                public = top == "transformers" and sub == "cache_utils"  # Cache is transformers.Cache
                if top in LIBRARIES and sub and not public and top != "torch":
                    out += [f"{path}: {n.module}.{a.name}" for a in n.names if a.name not in listed]
    return out


def test_every_private_touchpoint_in_the_source_is_listed():
    trees = {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in SOURCES}
    listed = {part for tp in TOUCHPOINTS for part in tp.target.replace(":", ".").replace("()", "").split(".")}
    assert unlisted(trees, listed) == []


def test_the_completeness_check_finds_an_unlisted_touchpoint():
    code = "from diffusers.pipelines.x import _y\n\ndef f(pipe):\n    return pipe._unpack(1) + pipe._pack_latents\n"
    tree = ast.parse(code)
    assert sorted(unlisted({"m.py": tree}, {"_pack_latents"})) == ["m.py: _unpack", "m.py: diffusers.pipelines.x._y"]


# ------------------------------------------------------------------ private attributes only inside compat.py

COMPAT = "mmgrpo/compat.py"
ATTRIBUTE_BY_NAME = {"getattr", "hasattr", "setattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _by_name(n: ast.AST) -> str | None:
    """The attribute name of ``getattr(x, "name")`` (``hasattr`` / ``setattr`` / ``delattr``), else None."""
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ATTRIBUTE_BY_NAME and len(n.args) > 1:
        name = n.args[1]
        return name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
    return None


def outside_compat(trees: dict[str, ast.AST]) -> list[str]:
    """``file:line: what`` of every private attribute of another library's object (``x._name`` our code does not
    define, read or set) and of every ``getattr(x, "_name")`` string (of any object, ours too: a private member
    reached by name hides from the checks above) in a file other than ``mmgrpo/compat.py``."""
    ours = _our_names(list(trees.values())) | STDLIB_PRIVATE
    out = []
    for path, tree in trees.items():
        if path == COMPAT:
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in ours:
                if not n.attr.startswith("_mmgrpo"):  # _mmgrpo*: ours, set on a library's objects
                    out.append(f"{path}:{n.lineno}: {ast.unparse(n)}")
            elif _private(_by_name(n) or ""):
                out.append(f"{path}:{n.lineno}: {ast.unparse(n)}")
    return out


def test_no_private_touchpoint_outside_compat():
    """Every private attribute of transformers, diffusers, torch, tensorboard objects is read (or set) through a
    named function of ``mmgrpo/compat.py``; ``getattr(x, "_name")`` strings nowhere else (issue 49)."""
    trees = {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in SOURCES}
    assert COMPAT in trees and any(path.startswith("tools/") for path in trees)  # the scan covers compat and tools
    assert outside_compat(trees) == []


def test_the_outside_check_finds_private_reads_and_getattr_strings():
    code = (
        "import torch\n\ndef f(model, x):\n    model._hidden = 1\n    y = getattr(x, '_ours', None)\n"
        "    hasattr(torch, '__version__')\n    return torch._C._graph(), getattr(x, 'public')\n"
    )
    trees = {"modalities/m.py": ast.parse(code), COMPAT: ast.parse(code)}
    assert outside_compat(trees) == [
        "modalities/m.py:4: model._hidden",
        "modalities/m.py:5: getattr(x, '_ours', None)",
        "modalities/m.py:7: torch._C._graph",
        "modalities/m.py:7: torch._C",
    ]


def _reads(function: ast.FunctionDef) -> set[str]:
    """The private attribute names a function of compat.py reads or sets (``x._name`` and ``getattr(x, "_name")``)."""
    names = {n.attr for n in ast.walk(function) if isinstance(n, ast.Attribute) and _private(n.attr)}
    return names | {_by_name(n) for n in ast.walk(function)} - {None}


def test_each_private_touchpoint_has_its_accessor_and_each_accessor_its_touchpoint():
    """A touchpoint whose target ends in a private attribute names the compat.py function that reaches it, and that
    function touches it; every other public function of compat.py beyond the checks is such an accessor."""
    tree = ast.parse((ROOT / COMPAT).read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    private = [tp for tp in TOUCHPOINTS if _private(tp.name)]
    assert {tp.name for tp in private} >= {"_no_split_modules", "_attn_implementation", "_current_graph_task_id"}
    for tp in private:
        assert tp.accessor in functions, f"{tp.target}: accessor {tp.accessor!r} is not a function of compat.py"
        assert tp.name in _reads(functions[tp.accessor]), f"{tp.accessor} does not touch {tp.name}"
    accessors = {tp.accessor for tp in TOUCHPOINTS if tp.accessor is not None}
    public = {name for name in functions if not name.startswith("_")} - {"resolve", "problem", "problems"}
    assert public == accessors
    assert callable(compat.graph_task_id) and compat.no_split_modules(object()) == []


def test_every_dependency_declares_the_floor_the_floor_job_installs(tmp_path):
    """scripts/test_floor.sh installs ``name==floor`` for every dependency (scripts/floor_requirements.py); one
    without a ``>=`` bound has no floor to test and is reported."""
    import importlib.util as iu

    spec = iu.spec_from_file_location("floor_requirements", ROOT / "scripts" / "floor_requirements.py")
    module = iu.module_from_spec(spec)
    spec.loader.exec_module(module)
    reqs, missing = module.floors()
    assert missing == [] and "torch==2.13" in reqs and all("==" in r for r in reqs)
    toy = tmp_path / "pyproject.toml"
    toy.write_text('[project]\ndependencies = ["a>=1.2,<2", "b", "c-d>=0.3  "]\n')
    assert module.floors(toy) == (["a==1.2", "c-d==0.3"], ["b"])
