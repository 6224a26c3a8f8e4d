"""The floor-version requirements of pyproject.toml: ``name==minimum`` for every ``[project].dependencies`` entry
with a ``>=`` bound (scripts/test_floor.sh installs them). Standard library only on Python >= 3.11 (tomllib;
tomli on 3.10).

    python scripts/floor_requirements.py            # one requirement a line
    python scripts/floor_requirements.py --check    # and exit 1 if a dependency has no >= bound (no floor to test)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: the same parser as a package
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_FLOOR = re.compile(r">=\s*([0-9][A-Za-z0-9.+!-]*)")


def floors(pyproject: Path = ROOT / "pyproject.toml") -> tuple[list[str], list[str]]:
    """(``name==floor`` requirements, dependencies without a ``>=`` floor)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out, missing = [], []
    for dep in deps:
        name, floor = _NAME.match(dep).group(1), _FLOOR.search(dep)
        if floor is None:
            missing.append(dep)
        else:
            out.append(f"{name}=={floor.group(1)}")
    return out, missing


if __name__ == "__main__":
    reqs, missing = floors()
    print("\n".join(reqs))
    if "--check" in sys.argv and missing:
        print(f"floor_requirements: no >= floor for {missing}; declare one", file=sys.stderr)
        sys.exit(1)
