"""The compatibility list (issue 35 item 1, ``mmgrpo/compat.py``): every private or version-fragile touchpoint of
vLLM, diffusers, transformers, tensorboard and torch is present in the installed version (vLLM's in the engine's
environment), the check reports a missing one by name, and no private attribute or deep import of those libraries
in the source is missing from the list."""

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

SOURCES = [p for d in ("mmgrpo", "modalities", "rewards") for p in (ROOT / d).rglob("*.py")]
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
