"""The dependency rule of docs/architecture.md: tasks → rewards → core; modalities → core; the core imports
neither modalities nor tasks (they register through ``mmgrpo.plugins``); between the core and rewards one direction:
rewards (and tools) import only the core's base (errors, registry, suggest), and only the orchestration layer
(loader, preflight, cli, trainer, row_check, demo) imports rewards."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = [
    "mmgrpo",
    "mmgrpo.advantage_steps",
    "mmgrpo.advantages",
    "mmgrpo.cache",
    "mmgrpo.checkpoint",
    "mmgrpo.cli",
    "mmgrpo.compat",
    "mmgrpo.config",
    "mmgrpo.credit",
    "mmgrpo.loader",
    "mmgrpo.losses",
    "mmgrpo.options",
    "mmgrpo.plugins",
    "mmgrpo.preflight",
    "mmgrpo.registry",
    "mmgrpo.run_dir",
    "mmgrpo.shaping",
    "mmgrpo.trainer",
    "mmgrpo.types",
]


def _imported_after(modules: list[str]) -> list[str]:
    """``mmgrpo.*`` modules loaded by importing ``modules`` in a fresh interpreter."""
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('mmgrpo'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.split()


def test_core_imports_neither_modalities_nor_tasks():
    loaded = _imported_after(CORE)
    assert "mmgrpo.trainer" in loaded  # the probe ran
    bad = [m for m in loaded if m.startswith(("mmgrpo.modalities", "mmgrpo.tasks"))]
    assert not bad, f"core modules imported {bad}"


@pytest.mark.parametrize(
    "modules, forbidden",
    [
        (["mmgrpo.modalities"], ("mmgrpo.tasks",)),
        (["mmgrpo.rewards"], ("mmgrpo.tasks", "mmgrpo.modalities")),
        (["mmgrpo.tools"], ("mmgrpo.tasks", "mmgrpo.modalities")),
    ],
)
def test_modalities_and_rewards_do_not_import_upwards(modules, forbidden):
    loaded = _imported_after(modules)
    assert modules[0] in loaded
    bad = [m for m in loaded if m.startswith(forbidden)]
    assert not bad, f"{modules[0]} imported {bad}"


# ---------------------------------------------------------------------------------------------- import circle

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {
    "mmgrpo": ROOT / "mmgrpo",
    "mmgrpo.modalities": ROOT / "modalities",
    "mmgrpo.rewards": ROOT / "rewards",
    "mmgrpo.tools": ROOT / "tools",
}


def _modules() -> dict[str, Path]:
    """Every module of the installed package ``mmgrpo`` (pyproject's package-dir map), by dotted name."""
    mods = {}
    for pkg, folder in PACKAGE_DIRS.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """``module -> the mmgrpo modules it imports``, from every import statement, at module level or inside a
    function (a deferred import still ties the two modules together)."""
    mods = _modules()

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, f in mods.items():
        here = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]) if node.level else node.module
                base = base.rstrip(".")
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            targets |= {t for t in map(owner, names) if t is not None and t != mod}
        graph[mod] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package():
    """No two modules of mmgrpo (core, modalities, rewards, tasks, demo) import each other, directly or through
    others: the schema (config) is below the registries (plugins), the loader above both (docs/architecture.md)."""
    graph = import_graph()
    assert graph["mmgrpo.loader"] >= {"mmgrpo.config", "mmgrpo.plugins"}  # the graph sees imports
    assert "mmgrpo.modalities" in graph["mmgrpo.loader"]  # ... deferred ones too
    assert cycles(graph) == []


# ---------------------------------------------------------------------------- core ↔ rewards: one direction

BASE = {"mmgrpo.errors", "mmgrpo.registry", "mmgrpo.suggest", "mmgrpo.hub"}
"""The small base of the core that the reward and tool packages may import: ConfigError, the Registry class,
did_you_mean, whether a hub id can load (mmgrpo.hub: model-based rewards' weights and the policy's name, issue 53).
It imports nothing of mmgrpo outside itself."""
LEAVES = ("mmgrpo.rewards", "mmgrpo.tools")
"""Packages that sit on the base alone (docs/architecture.md, "Dependency rule")."""
REWARD_USERS = (
    "mmgrpo.loader",
    "mmgrpo.preflight",
    "mmgrpo.cli",
    "mmgrpo.trainer",
    "mmgrpo.row_check",
    "mmgrpo.demo",
    "mmgrpo.tasks",
    "mmgrpo.env_check",
    "mmgrpo.tool_check",
    "mmgrpo.evaluation",
    "mmgrpo.reward_check",
)
"""The modules that load, check or run rewards (the orchestration layer, and the tasks above it): the only ones that
import ``mmgrpo.rewards``. The math, the schema, the registries, the rollout steps and the modalities take a scoring
callable as an argument instead (the flow adapter's value rewards: ``BuildContext.reward_scorer``)."""


def _within(module: str, packages: tuple[str, ...] | set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layering_problems(graph: dict[str, set[str]]) -> list[str]:
    """``"a imports b"`` for each import that breaks the one direction core → rewards → base: the base importing
    anything of mmgrpo outside itself, a reward or tool module importing anything but its own package and the base,
    or a module outside :data:`REWARD_USERS` importing a reward module (deferred imports included)."""
    out = []
    for m in sorted(graph):
        if m in BASE:
            bad = graph[m] - BASE
        elif _within(m, LEAVES):
            own = next(p for p in LEAVES if _within(m, (p,)))
            bad = {t for t in graph[m] if not _within(t, (own,)) and t not in BASE}
        elif not _within(m, REWARD_USERS):
            bad = {t for t in graph[m] if _within(t, ("mmgrpo.rewards",))}
        else:
            bad = set()
        out += [f"{m} imports {t}" for t in sorted(bad)]
    return out


def test_core_and_rewards_depend_in_one_direction():
    """docs/architecture.md's dependency rule on the AST import graph of every module of both sides: rewards and
    tools import only the base; only the orchestration layer imports rewards; the base imports neither."""
    graph = import_graph()
    assert graph["mmgrpo.rewards.registry"] >= {"mmgrpo.errors", "mmgrpo.registry"}  # the graph sees the base
    assert "mmgrpo.rewards" in graph["mmgrpo.trainer"] and "mmgrpo.rewards" in graph["mmgrpo.loader"]
    assert layering_problems(graph) == []


def test_the_layering_check_catches_each_wrong_direction():
    """Not vacuous: a reward importing the schema, the base importing a reward, a math module or an adapter importing
    a reward are each reported; the trainer and a task importing one are not."""
    graph = {
        "mmgrpo.rewards.runner": {"mmgrpo.config", "mmgrpo.errors", "mmgrpo.rewards.registry"},
        "mmgrpo.tools.env": {"mmgrpo.rewards.parsing", "mmgrpo.registry"},
        "mmgrpo.registry": {"mmgrpo.rewards"},
        "mmgrpo.advantages": {"mmgrpo.rewards.runner"},
        "mmgrpo.modalities.flow.adapter": {"mmgrpo.rewards"},
        "mmgrpo.trainer": {"mmgrpo.rewards"},
        "mmgrpo.tasks.shapes": {"mmgrpo.rewards.visual"},
    }
    assert layering_problems(graph) == [
        "mmgrpo.advantages imports mmgrpo.rewards.runner",
        "mmgrpo.modalities.flow.adapter imports mmgrpo.rewards",
        "mmgrpo.registry imports mmgrpo.rewards",
        "mmgrpo.rewards.runner imports mmgrpo.config",
        "mmgrpo.tools.env imports mmgrpo.rewards.parsing",
    ]


@pytest.mark.parametrize("package", LEAVES)
def test_importing_rewards_or_tools_loads_only_the_base_of_the_core(package):
    """At run time too: a fresh interpreter importing ``mmgrpo.rewards`` (or ``mmgrpo.tools``) loads no core
    module but the base (no config schema, no torch math, no trainer)."""
    loaded = _imported_after([package])
    assert package in loaded
    assert [m for m in loaded if m != "mmgrpo" and not _within(m, {package, *BASE})] == []


# ------------------------------------------------------------------------- the core reaches families via the loader

LOADER = "mmgrpo.loader"
FAMILY_CODE = ("mmgrpo.modalities",)


def _is_tiny_builder(module: str) -> bool:
    """A tiny-model builder module: ``modalities/<family>/tiny.py`` (and any other ``*.tiny`` / ``*_tiny``)."""
    last = module.rpartition(".")[2]
    return last == "tiny" or last.endswith("_tiny")


def core_reaches_families(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``core module -> the family / tiny-builder modules it imports`` (deferred imports included), for every module
    of ``mmgrpo/`` (the core, its tasks and demo) other than the loader, the one place allowed to."""
    core = [m for m in graph if not m.startswith(("mmgrpo.modalities", "mmgrpo.rewards")) and m != LOADER]
    bad = {m: {t for t in graph[m] if t.startswith(FAMILY_CODE) or _is_tiny_builder(t)} for m in core}
    return {m: targets for m, targets in bad.items() if targets}


def test_no_core_module_imports_a_family_or_a_tiny_builder_outside_the_loader():
    """docs/architecture.md's dependency rule, on the import graph (AST: function-level imports count): the trainer,
    preflight and CLI reach the vLLM engine code through ``mmgrpo.loader`` (``load_engine``, ``rollout_server``)."""
    graph = import_graph()
    assert graph[LOADER] >= {"mmgrpo.modalities", "mmgrpo.modalities.tokens.engine"}  # the loader is the one door
    assert core_reaches_families(graph) == {}


def test_the_family_import_check_catches_a_deferred_import():
    """The check of the test above fails on a core module with a function-level family import (not vacuous)."""
    graph = {"mmgrpo.trainer": {"mmgrpo.modalities.tokens.colocate"}, "mmgrpo.cli": {"mmgrpo.modalities.vlm.tiny"}}
    graph |= {LOADER: {"mmgrpo.modalities"}, "mmgrpo.modalities.tokens.colocate": set()}
    assert core_reaches_families(graph) == {
        "mmgrpo.trainer": {"mmgrpo.modalities.tokens.colocate"},
        "mmgrpo.cli": {"mmgrpo.modalities.vlm.tiny"},
    }


ENGINE = "mmgrpo.modalities.tokens.engine"


def test_the_engine_names_no_adapter_and_imports_no_tiny_builder():
    """``modalities/tokens/engine.py`` imports only the shared token machinery (no family's adapter or tiny model)
    and names no adapter: what a family serves comes from its ``AdapterSpec.engine_model``."""
    graph = import_graph()
    families = {m for m in graph[ENGINE] if m.startswith("mmgrpo.modalities.")}
    assert all(m.startswith(("mmgrpo.modalities.tokens", "mmgrpo.modalities._hf")) for m in families), families
    assert not any(_is_tiny_builder(m) for m in graph[ENGINE])
    from mmgrpo.loader import load_builtins
    from mmgrpo.plugins import ADAPTERS

    load_builtins()
    tree = ast.parse((ROOT / "modalities" / "tokens" / "engine.py").read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert "vlm" in ADAPTERS.names() and "whisper" in ADAPTERS.names()
    media_kinds = {"image", "video", "audio"}  # "video" is a media kind as well as an adapter's name
    assert strings & (set(ADAPTERS.names()) - media_kinds) == set(), "engine.py names an adapter"


def test_dgpo_reads_only_the_flow_adapters_public_surface():
    """modalities/flow/dgpo.py calls the adapter through :class:`FlowPolicy` (issue 35): no ``adapter._private``
    attribute, and every attribute it reads is declared on the protocol and public on ``FlowAdapter``."""
    from mmgrpo.modalities.flow.adapter import FlowAdapter
    from mmgrpo.modalities.flow.dgpo import FlowPolicy

    tree = ast.parse((ROOT / "modalities/flow/dgpo.py").read_text())
    read = {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        and n.value.id == "adapter"
    }  # fmt: skip
    declared = set(FlowPolicy.__annotations__) | {k for k in vars(FlowPolicy) if not k.startswith("_")}
    assert read and not {a for a in read if a.startswith("_")}, read
    assert read <= declared, read - declared
    assert all(a in vars(FlowAdapter) or a in ("args", "backend", "generator") for a in read), read
