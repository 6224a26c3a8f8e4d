"""Run K reward functions on a batch of B samples in parallel threads, with a timeout, routing and weights.

``RewardRunner(specs)(completions, prompts, columns) -> (rewards [B, K] float32, metrics)``. NaN marks "not
applicable" (the reward returned ``None``, the sample was routed away from it, or the reward failed with
``on_error="nan"``); the advantage pipeline combines the K columns with :attr:`RewardRunner.weights` and
``nansum``, as TRL does (``GRPOTrainer._calculate_rewards`` in trl/trainer/grpo_trainer.py).

Calling convention (a superset of TRL's, so a TRL reward works unchanged): each reward gets
``completions=`` (or positionally if it has no parameter of that name), ``prompts=`` and every column as a
keyword. A function without ``**kwargs`` gets only the columns it names. The keyword arguments of TRL 1.16's
``GRPOTrainer._calculate_rewards`` are all there: ``prompts``, ``completions``, ``completion_ids`` (a column: the
token adapters put each sample's token ids, up to and including its EOS, in ``Rollout.extras``; ``None`` for
adapters without tokens), ``trainer_state`` (the trainer passes a ``transformers.TrainerState`` with
``global_step``, ``max_steps``, ``epoch``; ``None`` outside training), ``log_metric(name, value)`` (lands in the
metrics as ``reward/<reward>/<name>``) and ``log_extra`` (accepted, dropped). The last three are not columns:
they reach a function that names them, and every ``**kwargs`` function that is not an mmgrpo built-in (TRL's
rewards and user functions written for TRL read them from ``kwargs``). ``async def`` rewards are awaited in
their thread.

Conversational prompts: when every prompt is a list of chat messages (``[{"role": ..., "content": ...}]``),
each text completion is passed as ``[{"role": "assistant", "content": text}]``, as TRL's ``GRPOTrainer`` does,
so TRL's rewards (``completion[0]["content"]``) run unchanged; the built-in rewards read both forms.

A column named like one of a reward's options (a keyword-only parameter of a registered reward, or a kwarg
bound in the spec) is not passed to it: options come from the config (a warning says so once).

Isolation and timeouts (``isolation``): ``"thread"`` runs a reward call in a daemon thread of this process;
one still running after ``timeout_s`` is **abandoned** (Python cannot kill a thread: it runs on in the
background and its result is dropped), and a reward that holds the GIL (a catastrophic regex, a huge integer
power) stalls the whole process. ``"process"`` runs each call in a forked worker process that is **killed** at
the deadline, so such a reward costs at most ``timeout_s``; the call pays a fork (milliseconds) and the result
comes back through a pipe, so a process reward's side effects on its own objects (caches, counters) are lost.
``"auto"`` (default) uses processes for rewards loaded from an import path (``"module:function"``) or an entry
point — code the toolkit does not know — and for built-ins registered with ``unbounded=True`` (``math_accuracy``,
``numeric`` and ``regression``, which run sympy / math-verify on model output), and threads for the other
registry names and for callables passed directly.

Non-finite rewards: a value that is ``inf``, ``-inf``, NaN or larger in magnitude than :data:`MAX_ABS_REWARD`
(whose batch mean would overflow float32) is an error of that sample: ``on_error="raise"`` stops with one line
naming the reward and the sample index; ``on_error="nan"`` scores NaN for that sample only. Return ``None`` for
"not applicable". A batch in which every reward is NaN for every sample logs a warning (nothing to learn from).

Metrics (namespace ``reward/``): ``reward/<name>`` = mean over the samples where reward ``<name>`` is not NaN
(NaN if there are none); ``reward/<name>_nan_fraction`` = fraction of the B samples where it is NaN;
``reward/errors`` = number of (reward, sample) scores that are NaN because of an error in this batch
(``on_error="nan"``): a non-finite value or a sample on which the reward raises counts 1, a timed-out call
counts its samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import multiprocessing
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmgrpo.errors import ConfigError

from .registry import REWARDS, load_reward

logger = logging.getLogger("mmgrpo.rewards")

MAX_ABS_REWARD = 1e30
"""Largest reward magnitude accepted: float32 holds up to 3.4e38, so a batch mean of values up to 1e30 cannot
overflow for any batch below 3e8 samples."""

ISOLATIONS = ("auto", "thread", "process")

_TRL_EXTRAS = ("completion_ids", "trainer_state", "log_metric", "log_extra", "environments")


class RewardError(RuntimeError):
    """A reward failed: it raised, timed out, returned the wrong length or a non-number, or needs a column
    the batch does not have. ``reward`` names it; ``index`` is the first failing sample (``None`` if unknown)."""

    def __init__(self, message: str, *, reward: str | None = None, index: int | None = None):
        super().__init__(message)
        self.reward = reward
        self.index = index


def _short(x: Any, limit: int = 80) -> str:
    """A short repr of a completion (text cut to ``limit`` characters; images as mode and size)."""
    size = getattr(x, "size", None)
    if getattr(x, "mode", None) is not None and isinstance(size, tuple):
        return f"<image {x.mode} {size[0]}x{size[1]}>"
    r = repr(x)
    return r if len(r) <= limit else r[: limit - 5] + "…" + r[-4:]


class _Caller:
    """How to call one reward: which keywords it takes, and how to pass ``completions``."""

    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
            self.var_kw = True
        else:
            self.var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        self.params = {n: p for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        self.completions_kw = "completions" in self.params and self.params["completions"].kind is not (
            inspect.Parameter.POSITIONAL_ONLY
        )
        positional = [n for n, p in self.params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.first_positional = None if self.completions_kw or not positional else positional[0]
        if self.var_kw and self.first_positional in ("prompts", *_TRL_EXTRAS):  # e.g. TRL's f(completion_ids, **kw)
            self.completions_kw, self.first_positional = True, None  # as TRL calls it: everything by keyword
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 - an async __call__
        # A reward's options (keyword-only parameters of a registered reward, or kwargs bound from the config)
        # are configuration: a dataset column with the same name (say "threshold") must not override them.
        target = getattr(fn, "func", fn)
        self.options = set(getattr(target, "reward_options", ())) | set(getattr(fn, "keywords", {}) or {})
        module = getattr(target, "__module__", None) or type(target).__module__ or ""
        # TRL passes its extras to every reward (they take **kwargs); the built-ins' **columns get columns only
        self.trl_style = self.var_kw and not module.startswith("mmgrpo")
        self._warned: set[str] = set()

    def __call__(
        self,
        completions: list,
        prompts: list,
        columns: dict[str, Any],
        log_metric: Callable,
        trainer_state: Any = None,
    ) -> Any:
        shadowed = self.options.intersection(columns)
        if shadowed - self._warned:
            self._warned |= shadowed
            logger.warning(
                "reward %r: column(s) %s have the names of its options and are not passed to it (options come "
                "from the config)",
                self.name,
                sorted(shadowed),
            )
        kw: dict[str, Any] = {"prompts": prompts, **{k: v for k, v in columns.items() if k not in shadowed}}
        if not self.var_kw:
            kw = {k: v for k, v in kw.items() if k in self.params}
        extras = {"completion_ids": None, "trainer_state": trainer_state, "log_metric": log_metric}
        extras["log_extra"] = _ignore
        for extra, value in extras.items():  # to functions that name them, and to TRL-style **kwargs functions
            if extra not in kw and (extra in self.params or (self.trl_style and value is not None)):
                kw[extra] = value
        skip = {"completions", self.first_positional}
        missing = [
            n
            for n, p in self.params.items()
            if n not in skip and n not in kw and p.default is p.empty and p.kind is not p.POSITIONAL_ONLY
        ]
        if missing:
            raise RewardError(
                f"reward {self.name!r} needs column(s) {missing} that this batch does not have; "
                f"available: {sorted(columns)} (add them to the dataset, or give them defaults)",
                reward=self.name,
            )
        if self.completions_kw:
            kw["completions"] = completions
            kw.pop(self.first_positional, None)
            out = self.fn(**kw)
        else:
            kw.pop(self.first_positional, None)
            out = self.fn(completions, **kw)
        if self.is_async or inspect.isawaitable(out):
            out = asyncio.run(_await(out))
        return out


def _ignore(*args: Any, **kwargs: Any) -> None:
    """TRL's ``log_extra(column, values)`` (extra columns of its completions table): accepted and dropped."""


async def _await(x: Any) -> Any:
    return await x


def _to_floats(out: Any, rows: list[int], name: str) -> tuple[list[float], list[tuple[int, float]]]:
    """The reward's output as ``len(rows)`` floats (``None`` → NaN) and ``(position into rows, value)`` of the
    non-finite or out-of-range values, which are NaN in the list. A wrong length or a non-number raises."""
    n = len(rows)
    if isinstance(out, torch.Tensor):
        out = out.detach().cpu().reshape(-1).tolist()
    elif hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        raise RewardError(
            f"reward {name!r} returned {type(out).__name__}; a reward returns a list of B={n} floats "
            "(None = not applicable)",
            reward=name,
        )
    if len(out) != n:
        raise RewardError(
            f"reward {name!r} returned {len(out)} values for {n} samples; it must return one per sample", reward=name
        )
    vals, bad = [], []
    for i, v in enumerate(out):
        if v is None:
            vals.append(math.nan)
            continue
        if isinstance(v, (str, bytes)):  # "1" is not converted: a reward returning text is a mistake, said here
            raise RewardError(
                f"reward {name!r} returned {_short(v)} ({type(v).__name__}) at sample {rows[i]}; expected a float "
                "or None (a string is not converted: return float(...))",
                reward=name,
                index=rows[i],
            )
        try:
            x = float(v)
        except (TypeError, ValueError, OverflowError):
            raise RewardError(
                f"reward {name!r} returned {_short(v)} ({type(v).__name__}) at sample {rows[i]}; "
                "expected a float or None",
                reward=name,
                index=rows[i],
            ) from None
        if not (math.isfinite(x) and abs(x) <= MAX_ABS_REWARD):
            bad.append((i, x))
            x = math.nan
        vals.append(x)
    return vals, bad


def _nonfinite_message(name: str, value: Any, index: int) -> str:
    return (
        f"reward {name!r} returned {value!r} at sample {index}; rewards must be finite numbers with |r| <= "
        f"{MAX_ABS_REWARD:g} (return None for 'not applicable')"
    )


def _take(values: Any, rows: list[int]) -> Any:
    if isinstance(values, torch.Tensor):
        return values[torch.as_tensor(rows, dtype=torch.long)]
    if hasattr(values, "shape") and hasattr(values, "__array__"):  # numpy
        return values[rows]
    return [values[i] for i in rows]


@dataclass(eq=False)
class _Job:
    k: int
    caller: _Caller
    rows: list[int]  # global sample indices routed to this reward
    completions: list
    prompts: list
    columns: dict[str, Any]
    values: list[float] | None = None
    bad: list[tuple[int, float]] = field(default_factory=list)  # (sample index, value): non-finite values
    failed: list[int] = field(default_factory=list)  # samples scored NaN because the reward raised on them
    exc: BaseException | None = None
    where: str = ""  # "sample i (completion: ...)" once located
    index: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    finished: threading.Event = field(default_factory=threading.Event)
    timed_out: bool = False  # set by the main thread when it abandons the job
    proc: Any = None  # the worker process of an isolated call
    trainer_state: Any = None  # TRL's ``trainer_state`` keyword (global_step, max_steps...)


class RewardRunner:
    """Weighted, routed, parallel reward evaluation.

    Args:
        specs: ``(name_or_spec, weight, kwargs)`` per reward; the spec is anything :func:`load_reward` takes
            (a registry name, ``"package.module:attr"``, an entry-point name, or a callable).
        timeout_s: seconds one reward call may take before it is abandoned (see the module docstring); ``None``
            waits as long as the call takes (a task's held-out metrics, dense values inside a rollout).
        on_error: ``"raise"`` stops with a :class:`RewardError` naming the reward and the first failing sample;
            ``"nan"`` scores NaN for the failing samples of that reward (the samples it raises on alone, or
            returns a non-finite value for; the whole batch on a timeout or a failure no single sample shows),
            logs a warning and counts them in ``reward/errors``.
        max_workers: rewards running at once.
        reward_types: per reward, ``None`` (every sample) or the list of ``reward_type`` column values it applies
            to; other samples get NaN and the reward is called on the routed samples only.
        isolation: ``"auto"`` | ``"thread"`` | ``"process"`` (see the module docstring).

    Attributes:
        names: metric names of the K rewards (registry name, attribute name of an import path, or function
            name; repeated names get ``_2``, ``_3``...).
        weights: ``Tensor[K]`` float32.
    """

    def __init__(
        self,
        specs: Sequence[tuple[Any, float, dict] | tuple[Any, float]],
        *,
        timeout_s: float | None = 60.0,
        on_error: str = "raise",
        max_workers: int = 4,
        reward_types: list[list[str] | None] | None = None,
        isolation: str = "auto",
    ):
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        if on_error not in ("raise", "nan"):
            raise ValueError(f"on_error must be 'raise' or 'nan', got {on_error!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers!r}")
        if not specs:
            raise ValueError("RewardRunner needs at least one reward spec (name_or_spec, weight, kwargs)")
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.on_error, self.max_workers = on_error, int(max_workers)
        self.names: list[str] = []
        self._rewards: list[Any] = []
        self._callers: list[_Caller] = []
        self.isolated: list[bool] = []  # per reward: runs in a killable worker process
        weights = []
        for spec in specs:
            if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
                raise ValueError(f"a reward spec is (name_or_spec, weight, kwargs), got {spec!r}")
            target, weight, kwargs = spec[0], spec[1], (spec[2] if len(spec) == 3 else None) or {}
            fn = load_reward(target, **kwargs)
            name = self._unique(_metric_name(target))
            self.names.append(name)
            self._rewards.append(fn)
            self._callers.append(_Caller(name, fn))
            outside = isinstance(target, str) and target not in REWARDS  # import path, factory or entry point
            unbounded = bool(getattr(getattr(fn, "func", fn), "reward_unbounded", False))  # e.g. sympy on model text
            self.isolated.append(isolation == "process" or (isolation == "auto" and (outside or unbounded)))
            preload = getattr(getattr(fn, "func", fn), "reward_preload", None)
            if preload is not None and self.isolated[-1]:  # imports and warm caches: forked workers inherit them
                preload()
            weights.append(float(weight))
        self.weights = torch.tensor(weights, dtype=torch.float32)  # [K]
        if reward_types is not None and len(reward_types) != len(self.names):
            raise ValueError(f"reward_types has {len(reward_types)} entries for {len(self.names)} rewards {self.names}")
        self.reward_types = [None if t is None else set(t) for t in (reward_types or [None] * len(self.names))]
        self._closed = False

    def _unique(self, name: str) -> str:
        if name not in self.names:
            return name
        i = 2
        while f"{name}_{i}" in self.names:
            i += 1
        return f"{name}_{i}"

    def __call__(
        self, completions: list, prompts: list, columns: dict[str, list], *, trainer_state: Any = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Score B samples. Returns ``(rewards [B, K] float32 with NaN = not applicable, metrics)``.

        ``trainer_state`` is passed as TRL passes it (a ``transformers.TrainerState``: ``global_step``,
        ``max_steps``...), not as a column."""
        B = len(completions)
        jobs = self._jobs(completions, prompts, columns, trainer_state)
        rewards = torch.full((B, len(self.names)), math.nan, dtype=torch.float32)  # [B, K]
        metrics: dict[str, float] = {}
        errors = 0
        for job in self._run(jobs):
            name = job.caller.name
            metrics.update(job.metrics)
            if not job.timed_out and job.values is not None:
                rewards[job.rows, job.k] = torch.tensor(job.values, dtype=torch.float32)
                if job.bad and self.on_error == "raise":
                    index, value = job.bad[0]
                    raise RewardError(_nonfinite_message(name, value, index), reward=name, index=index)
                for index, value in job.bad:
                    logger.warning(
                        "%s; scoring NaN for this sample (on_error='nan')", _nonfinite_message(name, value, index)
                    )
                if job.failed:
                    logger.warning(
                        "%s; scoring NaN for the %d sample(s) it fails on: %s (on_error='nan')",
                        self._error(job),
                        len(job.failed),
                        job.failed[:10],
                    )
                errors += len(job.bad) + len(job.failed)
                continue
            errors += len(job.rows)
            err = self._error(job)
            if self.on_error == "raise":
                self._raise(err, job)
            logger.warning("%s; scoring NaN for this batch (on_error='nan')", err)
        for k, name in enumerate(self.names):
            col = rewards[:, k]  # [B]
            ok = ~torch.isnan(col)
            metrics[f"reward/{name}"] = float(col[ok].mean()) if bool(ok.any()) else math.nan
            metrics[f"reward/{name}_nan_fraction"] = float((~ok).float().mean()) if B else 0.0
        metrics["reward/errors"] = float(errors)
        if B and bool(torch.isnan(rewards).all()):
            logger.warning(
                "every reward is NaN or None for all %d samples of this batch (rewards %s): it carries no learning "
                "signal. Check that the rewards apply to this data (columns, reward_types, answer format)",
                B,
                self.names,
            )
        return rewards, metrics

    def check(
        self, completions: list, prompts: list, columns: dict[str, list], *, trainer_state: Any = None
    ) -> list[tuple[int, str, bool]]:
        """Run each reward once on these B samples, as :meth:`__call__` does, and return the failures instead of
        raising or scoring NaN: ``(reward index k, one-line message, broken)`` per failing reward. ``broken``: the
        reward breaks the calling contract whatever the data (it returns a non-list, a string, the wrong length or a
        non-finite value, or names a column the batch lacks); otherwise its own code raised or it timed out. The
        reward load check (``mmgrpo/reward_check.py``) calls it on a synthetic rollout.

        A reward function runs in a forked worker here, whatever ``isolation`` says, so the check leaves nothing in
        the run's process (a counter, a cache, a list of calls a reward keeps); a reward object (a model-based
        reward, whose model may be on the GPU, which a fork cannot use) runs in a thread."""
        failures = []
        forked = [inspect.isfunction(getattr(fn, "func", fn)) for fn in self._rewards]  # functools.partial: .func
        for job in self._run(self._jobs(completions, prompts, columns, trainer_state), forked):
            if job.timed_out or job.exc is not None:
                contract = isinstance(job.exc, RewardError) or getattr(job.exc, "is_reward_error", False)
                failures.append((job.k, self._error(job), contract and not job.timed_out))
            elif job.bad:
                index, value = job.bad[0]
                failures.append((job.k, _nonfinite_message(job.caller.name, value, index), True))
        return failures

    def _jobs(self, completions: list, prompts: list, columns: dict[str, list], trainer_state: Any) -> list[_Job]:
        """One job per reward on the samples routed to it (none where no sample is); chat prompts give chat
        completions (TRL's convention). Raises :class:`RewardError` for lengths that do not match."""
        if self._closed:
            raise RuntimeError("RewardRunner is closed")
        B = len(completions)
        if len(prompts) != B:
            raise RewardError(f"got {B} completions but {len(prompts)} prompts; pass one prompt per completion")
        for key, values in columns.items():
            if len(values) != B:
                raise RewardError(
                    f"column {key!r} has {len(values)} values for {B} completions; columns hold one value per sample"
                )
        if B and all(_is_chat(p) for p in prompts):  # TRL's convention for conversational prompts
            completions = [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]
        jobs = []
        for k, caller in enumerate(self._callers):
            rows = self._route(k, B, columns)
            if not rows:
                continue
            if len(rows) == B:
                job = _Job(k, caller, rows, list(completions), list(prompts), dict(columns))
            else:
                job = _Job(
                    k,
                    caller,
                    rows,
                    _take(completions, rows),
                    _take(prompts, rows),
                    {c: _take(v, rows) for c, v in columns.items()},
                )
            job.trainer_state = trainer_state
            jobs.append(job)
        return jobs

    def _route(self, k: int, B: int, columns: dict[str, list]) -> list[int]:
        allowed = self.reward_types[k]
        if allowed is None:
            return list(range(B))
        if "reward_type" not in columns:
            raise RewardError(
                f"reward {self.names[k]!r} is routed to reward_types {sorted(allowed)} but the batch has no "
                f"'reward_type' column (columns: {sorted(columns)})",
                reward=self.names[k],
            )
        return [i for i, t in enumerate(columns["reward_type"]) if t in allowed]

    def _run(self, jobs: list[_Job], isolated: list[bool] | None = None) -> list[_Job]:
        """Run the jobs, at most ``max_workers`` at once, each in a daemon thread or (``isolated``, default
        :attr:`isolated`, per reward) a worker process, with its own deadline."""
        isolated = self.isolated if isolated is None else isolated
        done: queue.Queue = queue.Queue()
        pending, running = deque(jobs), {}  # running: job -> deadline
        while pending or running:
            while pending and len(running) < self.max_workers:
                job = pending.popleft()
                if isolated[job.k]:
                    self._start_process(job, done)
                else:
                    threading.Thread(
                        target=self._work, args=(job, done), daemon=True, name=f"mmgrpo-reward-{job.caller.name}"
                    ).start()
                running[job] = math.inf if self.timeout_s is None else time.monotonic() + self.timeout_s
            wait = min(running.values()) - time.monotonic()  # inf: no deadline, wait for the next job to finish
            with contextlib.suppress(queue.Empty):
                running.pop(done.get(timeout=None if wait == math.inf else max(0.0, wait)), None)
            now = time.monotonic()
            for job, deadline in list(running.items()):
                if now >= deadline and not job.finished.is_set():
                    running.pop(job)  # abandoned: a thread runs on (its late result is ignored); a process is killed
                    job.timed_out = job.exc is None  # raised and still locating the sample: report the raise
                    if job.proc is not None:
                        job.proc.kill()
        return jobs

    def _work(self, job: _Job, done: queue.Queue) -> None:
        try:
            self._evaluate(job)
        finally:
            job.finished.set()
            done.put(job)

    def _evaluate(self, job: _Job) -> None:
        """Call the reward on the job's samples; fill ``values``/``bad`` or ``exc`` (+ the failing samples)."""
        name = job.caller.name

        def log_metric(key: str, value: float) -> None:
            job.metrics[f"reward/{name}/{key}"] = float(value)

        try:
            out = job.caller(job.completions, job.prompts, job.columns, log_metric, job.trainer_state)
            values, bad = _to_floats(out, job.rows, name)
            job.values, job.bad = values, [(job.rows[j], v) for j, v in bad]
        except RewardError as e:
            job.exc = e
            job.index = e.index
        except BaseException as e:
            job.exc = e
            if self.on_error == "nan":
                self._score_one_by_one(job, log_metric)
            else:
                self._locate(job, log_metric)

    def _score_one_by_one(self, job: _Job, log_metric: Callable) -> None:
        """After a batch call raised: score each sample alone, so only the samples that fail become NaN."""
        values, bad, failed = [], [], []
        for j, i in enumerate(job.rows):
            cols = {c: _take(v, [j]) for c, v in job.columns.items()}
            try:
                out = job.caller(
                    _take(job.completions, [j]), _take(job.prompts, [j]), cols, log_metric, job.trainer_state
                )
                (value,), b = _to_floats(out, [i], job.caller.name)
            except Exception:
                failed.append(i)
                value, b = math.nan, []
            values.append(value)
            bad += [(i, v) for _, v in b]
        if not failed:  # no single sample fails: the failure needs the whole batch
            job.where = "no single sample fails on its own (the failure needs the whole batch)"
            return
        job.index = failed[0]
        job.values, job.bad, job.failed = values, bad, failed

    def _start_process(self, job: _Job, done: queue.Queue) -> None:
        """Run the job in a forked worker process; a thread waits for its result (the process is killed at the
        deadline by :meth:`_run`)."""
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        job.proc = ctx.Process(
            target=self._child, args=(job, send), daemon=True, name=f"mmgrpo-reward-{job.caller.name}"
        )
        job.proc.start()
        send.close()  # the child holds the only write end: a killed child makes recv() raise EOFError
        threading.Thread(target=self._receive, args=(job, receive, done), daemon=True).start()

    def _child(self, job: _Job, send: Any) -> None:
        self._evaluate(job)
        exc = None if job.exc is None else _RemoteError.of(job.exc)
        send.send((job.values, job.bad, job.failed, job.index, job.where, job.metrics, exc))
        send.close()

    def _receive(self, job: _Job, receive: Any, done: queue.Queue) -> None:
        try:
            job.values, job.bad, job.failed, job.index, job.where, job.metrics, job.exc = receive.recv()
        except (EOFError, OSError):
            job.proc.join()
            if not job.timed_out:
                job.exc = RuntimeError(f"its worker process exited with code {job.proc.exitcode} before returning")
        finally:
            receive.close()
            job.proc.join()
            job.finished.set()
            done.put(job)

    def _locate(self, job: _Job, log_metric: Callable) -> None:
        """Re-run the reward one sample at a time to find the first that fails on its own."""
        if len(job.rows) == 1:
            job.index = job.rows[0]
            return
        for j, i in enumerate(job.rows):
            cols = {c: _take(v, [j]) for c, v in job.columns.items()}
            try:
                job.caller(_take(job.completions, [j]), _take(job.prompts, [j]), cols, log_metric, job.trainer_state)
            except Exception:
                job.index = i
                return
        job.where = "no single sample fails on its own (the failure needs the whole batch)"

    def _error(self, job: _Job) -> str:
        name = job.caller.name
        if job.timed_out or job.exc is None:
            fate = (
                "its worker process was killed"
                if job.proc is not None
                else "its thread was abandoned and keeps running in the background (reward_runtime.isolation: "
                "process kills it instead)"
            )
            return (
                f"reward {name!r} timed out after {self.timeout_s:g}s on a batch of {len(job.rows)} samples; {fate}. "
                "Make the reward faster, raise timeout_s, or set on_error='nan' to score NaN instead"
            )
        if isinstance(job.exc, RewardError) or getattr(job.exc, "is_reward_error", False):
            return str(job.exc)
        where = job.where
        if job.index is not None:
            j = job.rows.index(job.index)
            where = f"first failing sample: index {job.index} (completion: {_short(job.completions[j])})"
        kind = getattr(job.exc, "type_name", type(job.exc).__name__)
        return f"reward {name!r} raised {kind}: {job.exc}" + (f"; {where}" if where else "")

    def _raise(self, message: str, job: _Job) -> None:
        if isinstance(job.exc, RewardError):
            raise job.exc
        if getattr(job.exc, "is_reward_error", False):
            raise RewardError(message, reward=job.caller.name, index=job.index)
        raise RewardError(message, reward=job.caller.name, index=job.index) from job.exc

    def close(self) -> None:
        """Release model-based rewards (calls their ``close()``); the runner cannot be called afterwards."""
        for fn in self._rewards:
            target = getattr(fn, "func", fn)  # functools.partial
            close = getattr(target, "close", None)
            if callable(close) and not inspect.isclass(target):
                close()
        self._closed = True

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def score_rows(
    runner: RewardRunner,
    outputs: list,
    rows: list[dict],
    group_size: int = 1,
    extras: dict[str, list] | None = None,
    *,
    group_index: bool = False,
    **call_kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Score ``outputs`` against the dataset ``rows`` they answer: the one path from rows to a reward call.

    Each row is repeated ``group_size`` times, group-major (output ``b`` answers ``rows[b // G]``): its
    ``prompt`` becomes ``prompts``, every other key a column. The columns are the union of the keys of all rows,
    in first-seen order (a mixed dataset routed by ``reward_type`` has different keys per row); a row without a
    key gives ``None`` there. ``extras`` (one value per output, e.g. the adapter's ``completion_ids``) are added
    after, replacing a row column of the same name. ``group_index=True`` adds ``group_index`` (``b // G``, for
    group-aware rewards) unless the rows or ``extras`` have one. ``call_kwargs`` (``trainer_state``) go to the
    runner.

    Shape:
        outputs: B = len(rows) · G; returns ``(rewards [B, K] float32, NaN = not applicable; metrics)``.
    """
    G = group_size
    prompts = [row["prompt"] for row in rows for _ in range(G)]
    keys = dict.fromkeys(k for row in rows for k in row if k != "prompt")
    columns = {k: [row.get(k) for row in rows for _ in range(G)] for k in keys}
    columns.update(extras or {})
    if group_index:
        columns.setdefault("group_index", [b // G for b in range(len(prompts))])
    return runner(outputs, prompts, columns, **call_kwargs)


@dataclass
class WeightedScore:
    """``score(outputs, rows, group_size) -> Tensor[B]``: Σ_k w_k·reward_k of the B = P·G ``outputs`` answering the P
    ``rows`` (group-major, as :func:`score_rows`). A plain sum: a reward's None (NaN) makes that sample's score NaN.
    Built by :func:`weighted_scorer`; the flow adapter's dense values (``model.args.value_rewards``) are one,
    passed to it by its builder (``mmgrpo.plugins.BuildContext.reward_scorer``)."""

    runner: RewardRunner
    weights: list[float]
    """w_k, one per reward of ``runner``."""

    def __call__(self, outputs: list, rows: list[dict], group_size: int) -> torch.Tensor:
        scores, _ = score_rows(self.runner, outputs, rows, group_size)  # [B, K], NaN where a reward returned None
        total = torch.zeros(len(outputs))  # [B]
        for k, weight in enumerate(self.weights):
            total += weight * scores[:, k]
        return total


def weighted_scorer(entries: Sequence[tuple[Any, float, dict]], where: str) -> WeightedScore:
    """A :class:`WeightedScore` of ``entries`` ``(name_or_spec, weight, kwargs)`` (anything :func:`load_reward`
    takes): rewards run in threads (a fork would copy the GPU context) with no deadline, as a direct call would. A
    name or kwargs that do not load raise a :class:`~mmgrpo.errors.ConfigError` naming ``where[i]`` (the config
    field the entries came from, e.g. ``model.args.value_rewards``)."""
    fns = []
    for i, (target, weight, kwargs) in enumerate(entries):
        try:
            fns.append((load_reward(target, **kwargs), float(weight)))
        except (KeyError, TypeError) as e:
            raise ConfigError(f"{where}[{i}]: {e}") from None
    return WeightedScore(RewardRunner(fns, isolation="thread", timeout_s=None), [w for _, w in fns])


class _RemoteError(Exception):
    """An exception raised in a worker process, carried back as its type name and message (the original
    may not pickle)."""

    def __init__(self, message: str, type_name: str, is_reward_error: bool):
        super().__init__(message)
        self.type_name, self.is_reward_error = type_name, is_reward_error

    def __reduce__(self):
        return (_RemoteError, (str(self), self.type_name, self.is_reward_error))

    @classmethod
    def of(cls, exc: BaseException) -> _RemoteError:
        return cls(str(exc), type(exc).__name__, isinstance(exc, RewardError))


def _is_chat(prompt: Any) -> bool:
    """A conversational prompt: a non-empty list of ``{"role": ..., "content": ...}`` messages."""
    return (
        isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, dict) and "role" in m for m in prompt)
    )


def _metric_name(spec: Any) -> str:
    if isinstance(spec, str):
        return spec.rpartition(":")[2].rpartition(".")[2] if ":" in spec else spec
    return getattr(spec, "__name__", type(spec).__name__)
