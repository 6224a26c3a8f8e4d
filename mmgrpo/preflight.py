"""The one load-time check: build the task and its first rows exactly as training will, before any model loads.

``mmgrpo train --dry-run`` and :class:`~mmgrpo.trainer.Trainer` call the same :func:`preflight`; the trainer
then trains on the task it returns, so there is no second path that could accept what the first refuses. It
checks, on the first ``check_rows`` rows (``task.args.check_rows`` for dataset tasks, else
:data:`CHECK_ROWS`) of the training and the held-out split:

- the task builds: data files, prompt files of recipes (``t2i_prompts``), splits, column mapping, eval split
  resolution (``task.args.eval_split`` without ``eval``: that split of ``train``);
- every row builds: media files open, media inside ``media_root``, prompt templates format, conversational
  prompts get (or hold) one ``{"type": kind}`` part per image / video / audio
  (:func:`mmgrpo.media.add_media_parts`, the function the VLM adapter calls too);
- the media kinds of every row are ones the adapter reads, a speech adapter's rows have audio, and the rows'
  audio and video decode (:mod:`mmgrpo.row_check`);
- the columns the built-in rewards read exist in those rows: each registered reward's ground-truth column
  (its ``answer_key`` option, default ``answer``; a reward declares others with a ``data_columns`` attribute, a
  tuple of its option names), for the rows its ``reward_types`` route to it. Rewards given as
  ``module:function`` are never imported or called here;
- every registered reward's ``load_check`` passes (:func:`mmgrpo.rewards.register_reward`): model-based rewards
  (``pickscore``, ``clip_score``) find their weights as a local path, in the Hugging Face cache, or (not
  offline) on a hub that answers one quick request (:mod:`mmgrpo.rewards.weights`), so a missing model is one
  line naming the reward and the option to set, before the policy loads, not minutes of hub retries after it;
- routing columns: when a reward has ``reward_types``, each row has the ``reward_type`` column they route on
  (Video-R1's type is its ``problem_type`` column: ``task.args.columns: {reward_type: problem_type}``);
- the prompt shape a reward reads: a reward whose ``completions`` are annotated as chats (TRL's
  ``list[list[dict[str, str]]]``, e.g. ``trl.rewards:accuracy_reward``, which reads ``completion[0]["content"]``)
  gets chat completions only from conversational prompts, so a plain-string prompt routed to it is refused
  (read from the source, never imported: :func:`mmgrpo.rewards.registry.completions_annotation`);
- with ``rollout.environment``, the rows' prompts are strings (the first observation is appended to them); one's own
  environment by reference (``module:Class``) is found in its source at ``--dry-run`` and, for training, imported
  under the rewards' code policy, built, reset from the first training row and stepped once (:mod:`mmgrpo.env_check`);
- ``rollout.tools`` by import path: under the same code policy, found in source at ``--dry-run`` and, for training,
  imported, checked and their schemas built (:mod:`mmgrpo.tool_check`);
- the supervised warm-up has rows: ``warmup.target_column`` is in the rows and ``warmup.target_template``
  formats, or the task has warm-up rows of its own;
- with ``rollout.engine: vllm``, the rollout server answers at ``rollout.url``; colocated
  (``rollout.vllm_mode: colocate``), vllm is importable in the training environment.

Every failure is one line naming the file and row (or the task and row) and the option to change:
:class:`~mmgrpo.config.ConfigError` for options, :class:`~mmgrpo.types.DataError` for rows.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

from mmgrpo.config import ConfigError, TrainConfig
from mmgrpo.env_check import check_environment
from mmgrpo.igpo import check_row as check_probe_row
from mmgrpo.igpo import probe_options
from mmgrpo.media import add_media_parts, media_counts
from mmgrpo.row_check import LoadReport, RowMediaCheck
from mmgrpo.tool_check import resolve_tools
from mmgrpo.types import DataError, WarmupTask

logger = logging.getLogger(__name__)

CHECK_ROWS = 8
"""Rows of each split checked for tasks that have no ``check_rows`` option."""

DEFAULT_DATA_COLUMNS = ("answer_key",)
"""Options of a registered reward that name a dataset column it reads, when it declares no ``data_columns``."""

_NOT_COLUMNS = {"completions", "prompts", "completion_ids", "trainer_state", "log_metric", "log_extra", "environments"}


def preflight(cfg: TrainConfig, report: LoadReport | None = None) -> Any:
    """Build ``cfg``'s task and check its first rows, rewards' columns and warm-up (module docstring); ``report``
    (when given) counts what was checked, for ``--dry-run``'s summary line.

    Returns the built task. Raises :class:`ConfigError` or :class:`DataError` (one line each)."""
    from mmgrpo.loader import load_builtins
    from mmgrpo.plugins import TASKS

    load_builtins()
    task = TASKS.get(cfg.task.name)(cfg.task.args, seed=cfg.seed)
    n = cfg.task.args.get("check_rows", CHECK_ROWS) if cfg.task.name == "dataset" else CHECK_ROWS
    _check_warmup_source(cfg, task)
    needs = reward_column_needs(cfg)
    chats = chat_rewards(cfg)
    e = cfg.eval
    if (e.before or e.after or e.every) and len(task.eval_rows()) == 0:
        logger.warning(
            "task %r has no held-out rows, so eval.before / eval.after / eval.every evaluate nothing; give "
            "task.args.eval, task.args.eval_split or task.args.eval_fraction (or set them false)",
            cfg.task.name,
        )
    media = RowMediaCheck(cfg.model.adapter, report)  # media kinds the adapter reads; audio and video decoded
    probe = probe_options(cfg.rollout.ground_truth_probe)  # IGPO's ground truth, read from each training row
    for split, rows in (("train", task.train_rows()), ("eval", task.eval_rows())):
        for i in range(min(n, len(rows))):
            where = row_name(cfg, rows, split, i)
            row = rows[i]  # DataError from a dataset already names its file and row
            _check_routing(cfg, row, where)
            _check_row(cfg, row, where, needs, warmup=split == "train")
            if probe is not None and split == "train":
                check_probe_row(probe, row, where)
            _check_prompt_shape(cfg, row, where, chats)
            _check_environment_prompt(cfg, row, where)
            media(row, where)
        if report is not None:
            report.rows[split] = min(n, len(rows))
    train = task.train_rows()
    check_environment(cfg, train[0] if len(train) else None)  # own environments: code policy, protocol probe
    resolve_tools(cfg.rollout.tools)  # own tools: imported and checked for training, read in source at --dry-run
    _check_reward_loads(cfg)
    _check_adapter_loads(cfg)
    _check_engine(cfg)
    return task


def _check_adapter_loads(cfg: TrainConfig) -> None:
    """The adapter's own ``load_check`` (``AdapterSpec.load_check``: a named model it can find); one line."""
    from mmgrpo.plugins import ADAPTERS

    spec = ADAPTERS.get(cfg.model.adapter)
    if spec.load_check is not None and (problem := spec.load_check(spec.options(cfg.model.args))) is not None:
        raise ConfigError(problem)


def _check_reward_loads(cfg: TrainConfig) -> None:
    """Each registered reward's ``load_check`` (its weights can be found); :class:`ConfigError` naming it."""
    from mmgrpo.rewards.registry import REWARDS, reward_load_check

    for k, spec in enumerate(cfg.rewards):
        if spec.name in REWARDS:
            problem = reward_load_check(spec.name, spec.kwargs)
            if problem is not None:
                raise ConfigError(f"rewards[{k}] ({spec.name}): cannot load its weights: {problem}")


def _check_engine(cfg: TrainConfig) -> None:
    """``rollout.engine: vllm``: the server answers at ``rollout.url`` now, before any model loads (one line with
    the command that starts it otherwise, :class:`~mmgrpo.types.EngineError`); colocated (``rollout.vllm_mode:
    colocate``), vllm is importable in this Python environment (:class:`ConfigError` naming the environment that
    has it otherwise)."""
    if cfg.rollout.engine == "native":
        return
    if cfg.rollout.vllm_mode == "colocate":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                f"rollout.vllm_mode: colocate runs vLLM inside the training process, and this Python ({sys.prefix}) "
                "has no vllm (vLLM pins its own torch): run `bash scripts/setup_colocate.sh` and use "
                "`.venv-colocate/bin/mmgrpo train ...`, or rollout.vllm_mode: server (docs/scale.md)"
            )
        return
    from mmgrpo.loader import load_engine  # (the loader imports the engine code, the core does not)

    load_engine(cfg, timeout_s=min(cfg.rollout.timeout_s, 30.0))  # the server's client, checked to answer


_CHAT_COMPLETIONS = re.compile(r"list\[\s*list\[\s*dict")


def chat_rewards(cfg: TrainConfig) -> list[tuple[int, str, str]]:
    """``(reward index, name, annotation)`` of the rewards whose ``completions`` are chats (TRL's
    ``list[list[dict[str, str]]]``): they need conversational prompts."""
    from mmgrpo.rewards.registry import completions_annotation

    out = []
    for k, spec in enumerate(cfg.rewards):
        ann = completions_annotation(spec.name)
        if _CHAT_COMPLETIONS.search(ann):
            out.append((k, spec.name, ann))
    return out


def _check_routing(cfg: TrainConfig, row: dict, where: str) -> None:
    """Rewards with ``reward_types`` route on the row's ``reward_type`` column: the row must have it."""
    routed = [(k, spec) for k, spec in enumerate(cfg.rewards) if spec.reward_types is not None]
    if not routed or "reward_type" in row:
        return
    k, spec = routed[0]
    types = {t for _, s in routed for t in s.reward_types}
    guess = "problem_type" if "problem_type" in row else None  # Video-R1's name for it
    guess = guess or next((c for c, v in row.items() if isinstance(v, str) and v in types), None)
    mapping = f"{{reward_type: {guess or '<the column holding each row type>'}}}"
    how = f"task.args.columns: {mapping}" if cfg.task.name == "dataset" else "a 'reward_type' column in the task's rows"
    raise DataError(
        f"{where}: rewards[{k}] ({spec.name}) has reward_types {spec.reward_types}, which route each row by its "
        f"'reward_type' column, but the row has none (it has {sorted(row)}); map it with {how}, or remove reward_types"
    )


def _check_prompt_shape(cfg: TrainConfig, row: dict, where: str, chats: list[tuple[int, str, str]]) -> None:
    """A plain-string prompt gives string completions, which a reward reading chats cannot index."""
    if not isinstance(row.get("prompt"), str):
        return
    for k, name, ann in chats:
        spec = cfg.rewards[k]
        if spec.reward_types is not None and row.get("reward_type") not in spec.reward_types:
            continue
        make_chat = "set task.args.system_prompt, or give " if cfg.task.name == "dataset" else "give "
        raise DataError(
            f"{where}: reward {name!r} (rewards[{k}]) reads chat completions (completions: {ann}, as "
            "completion[0]['content']), but this row's prompt is a plain string, so its completions are strings; "
            f"{make_chat}prompts as chats ([{{role: user, content: ...}}]), or use a reward that reads strings"
        )


def _check_environment_prompt(cfg: TrainConfig, row: dict, where: str) -> None:
    """An environment's first observation is appended to the row's prompt text, so the prompt must be a string."""
    if cfg.rollout.environment is None or isinstance(row.get("prompt"), str):
        return
    chat = "task.args.system_prompt off and " if cfg.task.name == "dataset" else ""
    raise DataError(
        f"{where}: rollout.environment {cfg.rollout.environment!r} appends its first observation to the prompt "
        f"text, but this row's prompt is a chat ({type(row.get('prompt')).__name__}); give plain-string prompts "
        f"({chat}the prompt column as text), and the model's chat template wraps them"
    )


def row_name(cfg: TrainConfig, rows: Sequence, split: str, i: int) -> str:
    """``file: line N`` for dataset rows (their ``where``), else ``task 'name' <split> row i``."""
    where = getattr(rows, "where", None)
    return where(i) if callable(where) else f"task {cfg.task.name!r} {split} row {i}"


def reward_column_needs(cfg: TrainConfig) -> list[tuple[int, str, str, str | None]]:
    """``(reward index, reward name, column, option)`` for each dataset column a registered reward reads.

    Only registered rewards (built-ins, and rewards registered by already-imported code) are looked at: their
    declared ``data_columns`` options (default :data:`DEFAULT_DATA_COLUMNS`) with the value the config binds
    (or the default), and, for a function without ``**kwargs``, its parameters without a default (TRL-style
    ``solution``). ``option`` is ``None`` for such a parameter."""
    from mmgrpo.rewards.registry import REWARDS

    out = []
    for k, spec in enumerate(cfg.rewards):
        if spec.name not in REWARDS:
            continue  # module:function, factories and entry points are not imported before training
        fn = REWARDS.get(spec.name)
        target = fn.__init__ if inspect.isclass(fn) else fn
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            continue
        declared = getattr(fn, "data_columns", None)
        for option in DEFAULT_DATA_COLUMNS if declared is None else declared:
            if option in params:
                column = spec.kwargs.get(option, params[option].default)
                if isinstance(column, str) and column:
                    out.append((k, spec.name, column, option))
        if inspect.isclass(fn) or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        skip = {positional[0].name} if positional and "completions" not in params else set()
        for name, p in params.items():
            required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY)
            if required and name not in _NOT_COLUMNS | skip | set(spec.kwargs):
                out.append((k, spec.name, name, None))
    return out


def _check_row(cfg: TrainConfig, row: dict, where: str, needs: list, warmup: bool) -> None:
    prompt = row.get("prompt") if isinstance(row, dict) else None
    if prompt is None:
        raise DataError(f"{where}: the row has no 'prompt' (keys: {sorted(row) if isinstance(row, dict) else row})")
    if isinstance(prompt, list):
        try:
            add_media_parts(prompt, media_counts(row))
        except DataError as e:
            raise DataError(f"{where}: column 'prompt': {e}") from None
    mapping = "task.args.columns.{column}: <the file's column>, or " if cfg.task.name == "dataset" else ""
    for k, name, column, option in needs:
        spec = cfg.rewards[k]
        if spec.reward_types is not None and row.get("reward_type") not in spec.reward_types:
            continue  # routed away from this reward
        if column not in row:
            fix = (
                f"set rewards[{k}].kwargs.{option} to the column that holds it"
                if option
                else f"add the column, or bind rewards[{k}].kwargs.{column}"
            )
            raise DataError(
                f"{where}: reward {name!r} (rewards[{k}]) needs the column {column!r}, which the row does not have "
                f"(it has {sorted(row)}); map it with {mapping.format(column=column)}{fix}"
            )
    w = cfg.warmup
    if warmup and w.steps > 0 and w.target_column:
        warmup_target(row, w.target_column, w.target_template, where)


def warmup_target(row: dict, column: str, template: str, where: str) -> str:
    """The supervised target of ``row``: ``template`` with ``{target}`` = the ``column`` value (and ``{name}`` =
    any other column). Raises :class:`DataError` naming ``warmup.target_column`` / ``warmup.target_template``."""
    if row.get(column) is None:
        raise DataError(
            f"{where}: warmup.target_column {column!r} is missing or null in this row (it has {sorted(row)}); "
            "set warmup.target_column to the column that holds the target outputs"
        )
    values = {k: _text(v) for k, v in row.items() if isinstance(v, (str, int, float, list, tuple))}
    values["target"] = _text(row[column])
    try:
        return template.format_map(values)
    except (KeyError, IndexError, ValueError) as e:
        raise DataError(
            f"{where}: warmup.target_template {template!r} cannot be formatted ({type(e).__name__}: {e}); "
            "use {target} and the row's column names"
        ) from None


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _check_warmup_source(cfg: TrainConfig, task: Any) -> None:
    w = cfg.warmup
    if w.steps <= 0 or w.target_column:
        return
    if not isinstance(task, WarmupTask):
        raise ConfigError(
            f"warmup.steps: {w.steps} but task {cfg.task.name!r} has no warm-up rows of its own; set "
            "warmup.target_column to the column that holds the target outputs (e.g. answer, with "
            "warmup.target_template: '<answer>{target}</answer>'), or warmup.steps: 0"
        )


__all__ = ["CHECK_ROWS", "chat_rewards", "preflight", "reward_column_needs", "row_name", "warmup_target"]
