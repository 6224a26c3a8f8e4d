"""mmgrpo/hostmem.py: a fixed glibc mmap threshold gives freed tensors back to the OS; glibc's dynamic one keeps
them. Each case runs in its own process (the threshold is process-wide)."""

import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo.hostmem import fix_mmap_threshold

ROOT = Path(__file__).resolve().parents[1]

FREE_HALF = """
import sys, torch
from mmgrpo.hostmem import fix_mmap_threshold
def rss():
    return [int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmRSS")][0]
assert fix_mmap_threshold(None if sys.argv[1] == "none" else 128) == (sys.argv[1] == "fixed")
warm = torch.ones(1 << 18); del warm  # a freed 1 MiB block: glibc's dynamic threshold rises past 1 MiB
blocks = [torch.ones(1 << 18) for _ in range(200)]  # 200 × 1 MiB
before = rss()
del blocks[::2]  # free every other block: holes in the heap, which free() cannot give back
print(before - rss())
"""


def _freed_mb(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", FREE_HALF, mode], capture_output=True, text=True, cwd=ROOT, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_a_fixed_mmap_threshold_gives_freed_tensors_back():
    """100 freed 1 MiB tensors among live ones: with the threshold fixed RSS falls by ~100 MB; under glibc's
    default (the threshold rose after the first free) it does not move."""
    assert _freed_mb("fixed") >= 90
    assert _freed_mb("none") <= 10


def test_the_environment_variable_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert fix_mmap_threshold(128) is False
    assert fix_mmap_threshold(None) is False
