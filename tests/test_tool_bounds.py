"""Issue 54: tools bounded like rewards (tools/runner.py, tools/worker.py).

On the old tree each hung call left its thread (+1 thread a call), a tool's ``sleep`` child outlived the call, a
12000x12000 image was downscaled (seconds, outside the deadline) and accepted, and the downscale ran after the
deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from PIL import Image

from mmgrpo.tools import FunctionTool, Observation, ToolCall, ToolContext, run_tool_call
from mmgrpo.tools.worker import MAX_THREADS

ROOT = Path(__file__).resolve().parents[1]
RELEASE = threading.Event()
"""Set at the end of a test: hung thread-isolated calls then return (their slots are freed for later tests)."""


def hang(seconds: float) -> str:
    """Hang until released.

    Args:
        seconds: How long at most.
    """
    RELEASE.wait(seconds)
    return "late"


def spawn(pid_file: str, then_hang: bool) -> str:
    """Start a child `sleep` and return or hang.

    Args:
        pid_file: Where to write the child's pid.
        then_hang: Hang after starting it.
    """
    child = subprocess.Popen(["sleep", "120"])
    Path(pid_file).write_text(str(child.pid))
    if then_hang:
        time.sleep(120)
    return "started"


def huge(side: int) -> Image.Image:
    """Return a square image.

    Args:
        side: Its side in pixels.
    """
    return Image.new("L", (side, side))


def _call(fn, arguments: dict, **limits) -> Observation:
    return run_tool_call(ToolCall(fn.__name__, arguments, ""), [FunctionTool(fn)], ToolContext(), **limits)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_the_thread_count_stays_bounded_over_many_hung_calls(isolation):
    before = threading.active_count()
    try:
        answers = [_call(hang, {"seconds": 60}, timeout_s=0.05, isolation=isolation) for _ in range(24)]
        grown = threading.active_count() - before
        assert all(a.invalid for a in answers)
        assert "did not finish within 0.05 s" in answers[0].text
        if isolation == "process":  # the worker is killed: nothing is left of the call
            assert grown <= 0 and not psutil.Process().children(), grown
        else:  # abandoned threads hold their slots; the others are refused at once
            assert grown <= MAX_THREADS, grown
            assert "was not run" in answers[-1].text and "still running past their deadline" in answers[-1].text
    finally:
        RELEASE.set()
    time.sleep(0.2)
    RELEASE.clear()
    assert _call(hang, {"seconds": 0}, isolation=isolation).text == "late"  # the slots are free again


@pytest.mark.parametrize("then_hang", [False, True])
def test_a_tools_child_process_is_killed_with_its_worker(tmp_path, then_hang):
    pid_file = tmp_path / "pid"
    answer = _call(spawn, {"pid_file": str(pid_file), "then_hang": then_hang}, timeout_s=3.0)
    assert answer.invalid == then_hang, answer.text  # hangs: the deadline; returns: "started"
    assert _gone(int(pid_file.read_text())), "the tool's sleep outlived its call"
    assert not psutil.Process().children()


def test_a_huge_image_is_refused_and_the_downscale_is_inside_the_deadline(monkeypatch):
    t = time.monotonic()
    answer = _call(huge, {"side": 12000}, timeout_s=30)
    assert answer.invalid and "12000x12000 image, more than rollout.tool_limits.max_source_pixels" in answer.text
    assert time.monotonic() - t < 20
    import mmgrpo.tools.runner as runner

    shrink = runner._shrink

    def slow_shrink(image, max_pixels):  # stands for a costly downscale (the forked worker inherits it)
        time.sleep(5)
        return shrink(image, max_pixels)

    monkeypatch.setattr(runner, "_shrink", slow_shrink)
    for isolation in ("process", "thread"):
        t = time.monotonic()
        answer = _call(huge, {"side": 2000}, timeout_s=0.5, isolation=isolation)
        assert answer.invalid and "did not finish within 0.5 s" in answer.text, answer.text
        assert time.monotonic() - t < 3  # old tree: 5 s more, after the deadline
    monkeypatch.setattr(runner, "_shrink", shrink)
    small = _call(huge, {"side": 2000}, timeout_s=30)
    assert not small.invalid and small.images[0].width * small.images[0].height <= 2_000_000


def test_a_worker_still_running_at_exit_is_killed_with_its_children(tmp_path):
    """A call in flight when the process exits (a hung tool in another thread): its process group is killed."""
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(
        f"""
        import threading, time
        from pathlib import Path
        from mmgrpo.tools import FunctionTool, ToolCall, ToolContext, run_tool_call
        from tests.test_tool_bounds import spawn
        call = ToolCall("spawn", {{"pid_file": {str(pid_file)!r}, "then_hang": True}}, "")
        threading.Thread(target=run_tool_call, args=(call, [FunctionTool(spawn)], ToolContext()),
                         kwargs={{"timeout_s": 600}}, daemon=True).start()
        while not Path({str(pid_file)!r}).exists():
            time.sleep(0.05)
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120, env=dict(os.environ))
    assert _gone(int(pid_file.read_text())), "the tool's sleep outlived the process that ran the tool"
