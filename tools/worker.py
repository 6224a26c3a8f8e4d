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
import multiprocessing
import os
import queue
import signal
import threading
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
    when the answer is in, at the deadline, or on any way out (module docstring). ``work()``'s value must pickle."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(work, send), daemon=True, name=f"mmgrpo-tool-{name}")
    proc.start()
    _LIVE.add(proc.pid)
    send.close()  # the child holds the only write end: a child that dies makes recv() raise EOFError
    try:
        if not receive.poll(_deadline(timeout_s)):
            return False, None
        try:
            ok, value = receive.recv()
        except (EOFError, OSError):
            return True, RemoteError("WorkerExit", "its worker process exited before answering")
        return True, value if ok else RemoteError(*value)
    finally:
        _kill(proc.pid)
        proc.kill()  # killed before it made its own group (a deadline of 0): the child itself
        proc.join()
        _LIVE.discard(proc.pid)
        receive.close()


def _child(work: Callable[[], Any], send: Any) -> None:
    """In the forked worker: a session of its own, then ``work()``'s value (or its exception's name and message)."""
    os.setsid()
    try:
        message = (True, work())
    except BaseException as e:
        message = (False, (type(e).__name__, (str(e).splitlines() or [""])[0][:200]))
    try:
        send.send(message)
    except Exception as e:  # a value that does not pickle
        send.send((False, (type(e).__name__, f"its result could not be sent back: {str(e)[:200]}")))
    send.close()


def _kill(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def kill_all() -> None:
    """SIGKILL to every worker process group not reaped yet (registered at exit)."""
    for group in list(_LIVE):
        _kill(group)


atexit.register(kill_all)
