"""Where a tool call runs: a forked worker process killed with its process group at the deadline, or one of a bounded
set of threads. Whatever the tool does, the caller waits at most ``timeout_s`` and is left with no thread or process
of it beyond the bound.

**Process** (``isolation: process``; ``auto`` for every tool that is not mmgrpo's own — a function or Tool named by
import path, or registered by one's own module): the call runs in a child forked for it (the arguments and the
:class:`~mmgrpo.tools.ToolContext` are inherited, not pickled), which first makes itself the leader of a new session
(``setsid``), so whatever it starts (``subprocess.Popen(["sleep", ...])``) is in its process group. The child runs the
tool **and the post-processing** (``finish``: the observation's size bounds, an image's downscale) and sends the
bounded observation back through a pipe; at the deadline, after the answer, or when the caller is interrupted, the
whole group is sent SIGKILL before the child is reaped, and :func:`kill_all` (at exit) ends any group still live. A
call pays a fork (milliseconds); the tool's side effects on its own objects are lost, as a reward's in
``reward_runtime.isolation: process`` (``rewards/runner.py``). A tool that needs the GPU cannot run in a forked child:
``isolation: thread`` for it.

**Thread** (``isolation: thread``; ``auto`` for the built-in tools, which bound their own work): the call runs in a
daemon thread; one still running at the deadline is abandoned (Python cannot kill a thread) but keeps its slot, and at
most :data:`MAX_THREADS` run at once: with every slot held by a hung call, a call is answered with an error at once
instead of starting another thread (the thread count stays bounded however many calls hang).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import pickle
import queue
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

ISOLATIONS = ("auto", "process", "thread")
"""Values of ``rollout.tool_limits.isolation`` (module docstring)."""

MAX_THREADS = 8
"""Most tool calls running in threads at once, hung ones included."""

_SLOTS = threading.BoundedSemaphore(MAX_THREADS)
_LIVE: set[int] = set()
"""Process groups (their leader's pid) of worker processes not reaped yet."""


class Busy(Exception):
    """Every thread slot is held by a call still running (hung past its deadline)."""


def _deadline(timeout_s: float | None) -> float | None:
    return None if timeout_s is None or math.isinf(timeout_s) else max(0.0, float(timeout_s))


def in_thread(work: Callable[[], Any], timeout_s: float | None, name: str) -> tuple[bool, Any]:
    """``(finished, work() or the exception it raised)`` from a daemon thread holding one of :data:`MAX_THREADS`
    slots until ``work`` returns (module docstring); :class:`Busy` when every slot is held."""
    if not _SLOTS.acquire(blocking=False):
        raise Busy(f"{MAX_THREADS} earlier tool calls are still running past their deadline")
    box: queue.Queue = queue.Queue(maxsize=1)

    def run() -> None:
        try:
            box.put((True, work()))
        except BaseException as e:  # returned to the caller as a value
            box.put((True, e))
        finally:
            _SLOTS.release()

    threading.Thread(target=run, daemon=True, name=f"mmgrpo-tool-{name}").start()
    try:
        return box.get(timeout=_deadline(timeout_s))
    except queue.Empty:
        return False, None


class RemoteError(Exception):
    """An exception the tool raised in its worker process, as its type name and message."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name


def in_process(work: Callable[[], Any], timeout_s: float | None, name: str) -> tuple[bool, Any]:
    """``(finished, work() or a RemoteError)`` from a forked worker in its own session; its process group is killed
    when the answer is in, at the deadline, or on any way out (module docstring). ``work()``'s value must pickle.
    ``name``: the tool's, for errors."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        os.close(read)
        _child(work, write)
    os.close(write)  # the child holds the only write end: EOF once it exits or is killed
    _LIVE.add(pid)
    try:
        data = _read_all(read, _deadline(timeout_s))
        if data is None:
            return False, None
        if not data:
            return True, RemoteError("WorkerExit", f"the worker process of {name} exited before answering")
        ok, value = pickle.loads(data)  # written by our own fork
        return True, value if ok else RemoteError(*value)
    finally:
        os.close(read)
        _kill(pid)  # its group: the tool's children too (a pid not reaped yet cannot be reused)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # killed before it made its own group (a deadline of 0)
        os.waitpid(pid, 0)
        _LIVE.discard(pid)


def _read_all(fd: int, timeout_s: float | None) -> bytes | None:
    """Everything written to ``fd`` until EOF, or ``None`` when the deadline passes first."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    chunks = []
    while True:
        left = None if end is None else max(0.0, end - time.monotonic())
        if not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _child(work: Callable[[], Any], write: int) -> None:
    """In the forked worker: a session of its own, then ``work()``'s value (or its exception's name and message),
    pickled to ``write``; exits without running the parent's exit handlers."""
    try:
        os.setsid()
        try:
            message = (True, work())
        except BaseException as e:
            message = (False, (type(e).__name__, (str(e).splitlines() or [""])[0][:200]))
        try:
            data = pickle.dumps(message)
        except Exception as e:  # a value that does not pickle
            data = pickle.dumps((False, (type(e).__name__, f"its result could not be sent back: {str(e)[:200]}")))
        with os.fdopen(write, "wb") as f:
            f.write(data)
    finally:
        os._exit(0)


def _kill(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def kill_all() -> None:
    """SIGKILL to every worker process group not reaped yet (registered at exit)."""
    for group in list(_LIVE):
        _kill(group)


atexit.register(kill_all)
