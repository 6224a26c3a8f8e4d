"""The dependency rule of docs/architecture.md: tasks → rewards → core; modalities → core; the core imports
neither modalities nor tasks (they register through ``mmgrpo.plugins``)."""

import subprocess
import sys

import pytest

CORE = [
    "mmgrpo",
    "mmgrpo.advantages",
    "mmgrpo.cache",
    "mmgrpo.checkpoint",
    "mmgrpo.cli",
    "mmgrpo.config",
    "mmgrpo.losses",
    "mmgrpo.plugins",
    "mmgrpo.registry",
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
    ],
)
def test_modalities_and_rewards_do_not_import_upwards(modules, forbidden):
    loaded = _imported_after(modules)
    assert modules[0] in loaded
    bad = [m for m in loaded if m.startswith(forbidden)]
    assert not bad, f"{modules[0]} imported {bad}"
