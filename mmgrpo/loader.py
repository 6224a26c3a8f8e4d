"""Loading a training config: read it (:func:`mmgrpo.config.read_config`), then check it against the registries
and across fields (:func:`validate`) — before any model is built.

This is the layer above the schema (:mod:`mmgrpo.config`, which imports no registry) and the registries
(:mod:`mmgrpo.plugins`, losses, advantages, rewards, ...): it loads the built-in adapters and tasks
(:func:`load_builtins`) and checks names, each builder's options dataclass and capabilities. Nothing below it
imports it, so the config ↔ plugins ↔ tasks import circle of earlier versions cannot come back
(``tests/test_layout.py``).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmgrpo import advantages, losses, multiturn, options, rollout_steps, sampling, schedules, shaping, tas
from mmgrpo import entropy_control as _entropy  # noqa: F401  (registers entropy_bonus and the aepo step)
from mmgrpo import llds as _llds  # noqa: F401  (registers the llds loss term, as tas registers its shaper)
from mmgrpo.config import (
    AlgorithmConfig,
    ConfigError,
    TrainConfig,
    read_config,
    variant_methods,
)
from mmgrpo.config_paths import resolve_data_paths
from mmgrpo.plugins import ADAPTERS, TASKS, AdapterSpec, TaskSpec
from mmgrpo.rewards import check_reward_spec
from mmgrpo.rewards.agents import ROLLOUT_NEEDS
from mmgrpo.sizing import check_step_fits
from mmgrpo.types import EngineRollout, capabilities, capability_text, has_method, required_capabilities


def load_builtins() -> None:
    """Import the built-in adapters and tasks so they register."""
    import mmgrpo.modalities
    import mmgrpo.tasks  # noqa: F401


def load_engine(cfg: TrainConfig, timeout_s: float | None = None) -> EngineRollout | None:
    """The rollout engine of ``cfg`` (``rollout.engine``), which the trainer owns: None for ``native``; with ``vllm``
    the client of the server at ``rollout.url``, checked to answer now (``health``, one line otherwise), or, with
    ``rollout.vllm_mode: colocate``, vLLM started in this process. ``timeout_s`` overrides ``rollout.timeout_s``
    (the ``--dry-run`` probe's shorter wait). This and :func:`load_builtins` are where the core reaches the token
    families' engine code (``tests/test_layout.py``)."""
    if cfg.rollout.engine == "native":
        return None
    if cfg.rollout.vllm_mode == "colocate":
        from mmgrpo.modalities.tokens.colocate import ColocateEngine, colocate_args

        return ColocateEngine(colocate_args(cfg))
    from mmgrpo.modalities.tokens.engine import VLLMClient

    client = VLLMClient(cfg.rollout.url, cfg.rollout.timeout_s if timeout_s is None else timeout_s)
    client.health()  # unreachable, or it would refuse this trainer's pushes: one line now, before any step
    return client


def rollout_server(cfg: TrainConfig, python: str | None = None) -> tuple[list[str], bool, Callable[[], int]]:
    """``mmgrpo rollout-server``'s parts for ``cfg``: the command serving its policy on vLLM
    (``modalities/tokens/engine.py`` ``server_command``), whether ``rollout.url``'s address is taken already, and
    the function that runs the command until stopped (its push secret in a 0600 key file for this user)."""
    from mmgrpo.modalities.tokens.engine import address_taken, run_server, server_command
    from mmgrpo.modalities.tokens.engine_http import secret_file

    cmd = server_command(cfg, python)
    return (
        cmd,
        address_taken(cfg.rollout.url),
        functools.partial(run_server, cmd, secret_path=secret_file(cfg.rollout.url)),
    )


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Read ``path`` (YAML), apply ``key.sub=value`` overrides, build and validate a :class:`TrainConfig`.

    The config's folder is appended to ``sys.path`` (after every other entry, so it shadows nothing): a reward
    module next to the config (``my_rewards:fn``) is found from any working directory; the dataset task's data paths
    resolve against that folder too (:func:`mmgrpo.config_paths.resolve_data_paths`)."""
    if path is not None:
        add_import_dir(Path(path).resolve().parent)
    cfg = read_config(path, overrides)
    resolve_data_paths(cfg, path, overrides)  # data paths: against the config's folder (mmgrpo/config_paths.py)
    validate(cfg)
    return cfg


def add_import_dir(folder: Path) -> None:
    """Append ``folder`` to ``sys.path`` unless an entry is that folder already (``""`` is the working directory)."""
    if all(Path(p or ".").resolve() != folder for p in sys.path if isinstance(p, str)):
        sys.path.append(str(folder))


def _check_capabilities(cfg: TrainConfig, adapter_builder: Any, task_builder: Any) -> None:
    """The optional adapter/task capabilities (``mmgrpo.types``) the config needs, checked on the classes the
    specs declare (:class:`~mmgrpo.plugins.AdapterSpec` ``cls``, :class:`~mmgrpo.plugins.TaskSpec` ``cls``), so no
    model is built. Plain-function plugins (no spec) are checked by the trainer once built."""
    adapter_class = adapter_builder.cls if isinstance(adapter_builder, AdapterSpec) else None
    if adapter_class is not None:
        have = capabilities(adapter_class)
        need = required_capabilities(
            kl=cfg.algorithm.kl,
            ratio_norm=cfg.algorithm.ratio_norm,
            warmup_steps=cfg.warmup.steps,
            engine=cfg.rollout.engine,
            tools=cfg.rollout.multi_turn,
        )
        for name, why in need.items():
            if name not in have:
                offer = ", ".join(sorted(have)) or "none"
                raise ConfigError(
                    f"{why} needs an adapter with {capability_text(name)}; model.adapter {cfg.model.adapter!r} has not "
                    f"(its optional capabilities: {offer}); change that setting or the adapter"
                )
        a = cfg.algorithm  # the variants' adapter hooks (docs/variants.md), by method name
        hooks = {**variant_methods(a), **rollout_steps.check_config(a, cfg.rollout.multi_turn)}
        for method, why in hooks.items():
            if not has_method(adapter_class, method):
                raise ConfigError(
                    f"{why} needs an adapter with {method}(); model.adapter {cfg.model.adapter!r} has none "
                    f"({VARIANT_HOOK_OWNERS.get(method, 'token adapters vlm and video')} have it); change that "
                    "setting or the adapter"
                )
    task_class = task_builder.cls if isinstance(task_builder, TaskSpec) else None
    if (
        cfg.warmup.steps > 0
        and not cfg.warmup.target_column
        and task_class is not None
        and not has_method(task_class, "warmup_rows")
    ):
        raise ConfigError(
            f"warmup.steps: {cfg.warmup.steps} but task {cfg.task.name!r} has no warm-up rows of its own; set "
            "warmup.target_column to the column that holds the target outputs, or warmup.steps: 0"
        )


def _check_engine_sampling(cfg: TrainConfig, adapter_builder: Any) -> None:
    """Top-k / top-p with ``rollout.engine: vllm`` is refused. vLLM reports the log-probs of the distribution it
    sampled from after truncation (its ``processed_logprobs``); the trainer scores the untruncated distribution, as
    TRL and verl do. The importance weights π_old / π_engine (mmgrpo.importance) would then carry the truncated mass
    of every token — log π_old − log π_engine = log(kept probability mass) < 0, a bias, not noise."""
    if cfg.rollout.engine != "vllm" or not isinstance(adapter_builder, AdapterSpec):
        return
    options = adapter_builder.options(cfg.model.args)
    for key, off in (("top_p", 1.0), ("top_k", 0)):
        value = vars(options).get(key, off)
        if value != off:
            raise ConfigError(
                f"model.args.{key}: {value} with rollout.engine: vllm: the engine's log-probs are of the truncated "
                f"distribution and the trainer's of the full one, so the importance weights would be biased; set "
                f"model.args.{key}: {off}, or rollout.engine: native"
            )


def _check_weight_sync(r: Any) -> None:
    """``rollout.weight_sync: nccl`` (modalities/tokens/weight_sync.py) needs a vLLM server, CUDA here and vllm in
    this environment (TRL's client makes the same ``StatelessProcessGroup`` + ``PyNcclCommunicator``): asked for
    without them, one line with the fix — never a silent fall back to HTTP."""
    if r.weight_sync == "http" or r.engine != "vllm":
        return
    import torch

    why = None
    if r.vllm_mode == "colocate":
        why = "a colocated engine takes the trainer's tensors in-process; use rollout.weight_sync: http there"
    elif not torch.cuda.is_available():
        why = "it broadcasts from the trainer's GPU to the engine's, and this machine has no CUDA; use http"
    elif importlib.util.find_spec("vllm") is None:
        why = (
            "it needs vllm in the training environment (its StatelessProcessGroup and PyNcclCommunicator): run the "
            "trainer from .venv-colocate (bash scripts/setup_colocate.sh), or use rollout.weight_sync: http"
        )
    if why is not None:
        raise ConfigError(f"rollout.weight_sync: nccl: {why}")


def _check_chunk_sizes(cfg: TrainConfig, adapter_builder: Any) -> None:
    """``algorithm.chunk_sizes`` must sum to the units per sample T, checked at load where the adapter builder
    declares T as a function of its ``model.args`` (``AdapterSpec.units_per_sample``, e.g. the flow adapter's
    ``num_steps``); otherwise the chunk ratio checks it on the first update."""
    a = cfg.algorithm
    units = adapter_builder.units_per_sample if isinstance(adapter_builder, AdapterSpec) else None
    if a.ratio_level != "chunk" or not a.chunk_sizes or units is None:
        return
    T = units(adapter_builder.options(cfg.model.args))
    if T is not None and sum(a.chunk_sizes) != T:
        raise ConfigError(
            f"algorithm.chunk_sizes: {a.chunk_sizes} sums to {sum(a.chunk_sizes)}, but each {cfg.model.adapter!r} "
            f"sample has T={T} units (its model.args); give chunk sizes that sum to {T}"
        )


def _check_choice(path: str, value: Any, allowed: list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{path}: {value!r} is not allowed; choose one of: {', '.join(allowed)}")


def validate(cfg: TrainConfig) -> None:
    """Cross-field and registry checks that types alone cannot express."""
    load_builtins()
    a = cfg.algorithm
    for path, value, reg in [
        ("model.adapter", cfg.model.adapter, ADAPTERS),
        ("task.name", cfg.task.name, TASKS),
        ("algorithm.estimator", a.estimator, advantages.ESTIMATORS),
        ("algorithm.surrogate", a.surrogate, losses.SURROGATES),
        ("algorithm.aggregation", a.aggregation, losses.AGGREGATIONS),
        ("algorithm.ratio_level", a.ratio_level, losses.RATIO_LEVELS),
        ("algorithm.shaping", a.shaping, shaping.SHAPERS),
        ("algorithm.kl", a.kl, losses.KL_ESTIMATORS),
    ]:
        _check_choice(path, value, reg.names())
    for registry, name, args in [(ADAPTERS, cfg.model.adapter, cfg.model.args), (TASKS, cfg.task.name, cfg.task.args)]:
        spec = registry.get(name)
        if isinstance(spec, (AdapterSpec, TaskSpec)):  # the options dataclass, checked before anything is built
            spec.options(args)
    positive = {
        "steps": cfg.steps,
        "algorithm.group_size": a.group_size,
        "algorithm.prompts_per_step": a.prompts_per_step,
        "algorithm.epochs": a.epochs,
        "algorithm.minibatch_size": a.minibatch_size,
        "algorithm.updates_per_epoch": a.updates_per_epoch,
        "logging.every": cfg.logging.every,
        "eval.batch_size": cfg.eval.batch_size,
        "warmup.batch_size": cfg.warmup.batch_size,
    }
    for path, value in positive.items():
        if value < 1:
            raise ConfigError(f"{path}: must be >= 1, got {value}")
    if a.group_size < 2:
        raise ConfigError("algorithm.group_size: group-relative advantages need at least 2 samples per prompt")
    if a.estimator == "rloo" and a.group_size < 2:
        raise ConfigError("algorithm.group_size: rloo needs group_size >= 2")
    if a.ratio_level == "chunk" and not a.chunk_sizes:
        raise ConfigError("algorithm.chunk_sizes: ratio_level=chunk needs chunk sizes, e.g. [2, 3, 5]")
    _check_chunk_sizes(cfg, ADAPTERS.get(cfg.model.adapter))
    if not cfg.output_dir.strip():  # (Path("") is the working directory, which no run should take over)
        raise ConfigError("output_dir: empty; name the run's directory, e.g. output_dir=runs/my-run")
    check_step_fits(cfg, ADAPTERS.get(cfg.model.adapter))  # sizes no model could fit (mmgrpo/sizing.py)
    if cfg.stop_after is not None and cfg.stop_after > cfg.steps:
        raise ConfigError(
            f"stop_after: {cfg.stop_after} is past steps={cfg.steps}, so the run would never stop there; "
            f"set stop_after <= {cfg.steps} or raise steps"
        )
    if cfg.checkpoint.after_warmup and cfg.warmup.steps == 0:
        raise ConfigError(
            "checkpoint.after_warmup: true but warmup.steps is 0, so there is no warm-up to save; set both"
        )
    if a.surrogate == "reinforce" and a.epochs != 1:
        raise ConfigError("algorithm.epochs: surrogate=reinforce is on-policy; set epochs=1 or use ppo_clip")
    if a.updates_per_epoch > a.group_size * a.prompts_per_step:
        raise ConfigError(
            "algorithm.updates_per_epoch: more updates than samples per step (group_size * prompts_per_step)"
        )
    options.resolve(shaping.SHAPERS, a.shaping, a.shaping_args, "algorithm.shaping_args")
    tas.check_config(a)  # shaping: tas with a surrogate that averages per-token advantages away
    _validate_variants(a)
    rollout_steps.check_config(a, cfg.rollout.multi_turn)  # names, options, combinations (the hooks: below)
    objective = (cfg.model.args or {}).get("objective", "logprob")  # DGPO: the flow adapter's DSM units
    if (a.surrogate == "dgpo") != (objective == "dgpo"):
        raise ConfigError(
            "algorithm.surrogate: dgpo and model.args.objective: dgpo go together (DGPO's units are DSM losses, not "
            f"log-probs); got surrogate={a.surrogate!r}, objective={objective!r}: set both or neither"
        )
    if objective == "dgpo" and (a.ratio_level != "token" or a.ratio_norm):
        raise ConfigError(
            "algorithm.ratio_level / ratio_norm: with model.args.objective: dgpo the units are DSM losses, scored one "
            f"by one; use ratio_level: token and ratio_norm: false (got {a.ratio_level!r}, {a.ratio_norm})"
        )
    if objective == "dgpo" and a.beta > 0 and a.kl != "gaussian_exact":
        raise ConfigError(
            "algorithm.kl: with model.args.objective: dgpo the KL term is DGPO's mean_D |v - v_ref|^2, "
            f"algorithm.kl: gaussian_exact; got {a.kl!r}"
        )
    if cfg.rollout.vllm_mode == "colocate" and cfg.rollout.engine != "vllm":
        raise ConfigError(
            "rollout.vllm_mode: colocate places the vLLM rollout engine in the training process; it needs "
            f"rollout.engine: vllm (got {cfg.rollout.engine!r})"
        )
    _check_weight_sync(cfg.rollout)
    _check_capabilities(cfg, ADAPTERS.get(cfg.model.adapter), TASKS.get(cfg.task.name))
    _check_reward_needs(cfg)  # rewards that read what a multi-turn rollout records
    multiturn.check_config(cfg)  # rollout.tools and algorithm.credit (docs/agents.md)
    _check_engine_sampling(cfg, ADAPTERS.get(cfg.model.adapter))
    _check_trackers(cfg.logging.trackers)
    bad = [k for k in cfg.eval.pass_k if not 1 <= k <= cfg.eval.pass_samples]
    if bad:
        raise ConfigError(f"eval.pass_k: {bad} not in [1, eval.pass_samples={cfg.eval.pass_samples}]; lower k")
    if len(cfg.optim.betas) != 2:
        raise ConfigError(f"optim.betas: expected two numbers, got {cfg.optim.betas}")
    if not cfg.rewards:
        raise ConfigError("rewards: list at least one reward, e.g. rewards: [{name: accuracy}]")
    for i, spec in enumerate(cfg.rewards):
        if not spec.name:
            raise ConfigError(f"rewards[{i}].name: is empty; give a registry name or package.module:function")
    _validate_rewards(cfg)


VARIANT_HOOK_OWNERS = {"augment_video": "video adapters such as video"}
"""The built-in adapters that have a variant hook, where not every token adapter has it (for the load error)."""


def _validate_variants(a: AlgorithmConfig) -> None:
    """β schedule, advantage transforms, prompt sampler and group-coupled surrogates (docs/variants.md)."""
    _check_choice("algorithm.beta_schedule", a.beta_schedule, schedules.BETA_SCHEDULES.names())
    schedule = options.resolve(
        schedules.BETA_SCHEDULES, a.beta_schedule, a.beta_schedule_args, "algorithm.beta_schedule_args"
    )
    try:  # the schedule's own checks (bounds, beta_max = algorithm.beta), once at load rather than at step 0
        schedules.beta_at(a.beta_schedule, 0, 2, a.beta, options.as_kwargs(schedule))
    except ValueError as e:
        raise ConfigError(f"algorithm.beta_schedule_args ({a.beta_schedule}): {e}") from None
    for name in a.advantage_transform:
        _check_choice("algorithm.advantage_transform", name, advantages.ADVANTAGE_TRANSFORMS.names())
    _check_group_transforms(a)
    for name, args in a.advantage_transform_args.items():
        if name not in a.advantage_transform:
            raise ConfigError(
                f"algorithm.advantage_transform_args.{name}: {name!r} is not in algorithm.advantage_transform "
                f"{a.advantage_transform}; add it there or remove its options"
            )
        options.resolve(advantages.ADVANTAGE_TRANSFORMS, name, args, f"algorithm.advantage_transform_args.{name}")
    _check_choice("algorithm.sampler", a.sampler, sampling.SAMPLERS.names())
    if a.sampler == sampling.SEQUENTIAL and a.sampler_args:
        raise ConfigError(f"algorithm.sampler_args: the sequential sampler has no options, got {a.sampler_args}")
    options.resolve(sampling.SAMPLERS, a.sampler, a.sampler_args, "algorithm.sampler_args")
    losses.resolve_options(a)  # surrogate_args, aggregation_args, kl_args against each component's dataclass
    extra = set(a.token_weighting_args) - ({"alpha", "chunk"} if a.token_weighting == "tw_grpo" else set())
    if extra:
        raise ConfigError(
            f"algorithm.token_weighting_args: {sorted(extra)} not allowed for token_weighting={a.token_weighting!r}; "
            "tw_grpo takes alpha and chunk"
        )
    if a.token_weighting != "none":
        where = "algorithm.token_weighting_args"
        options.resolve(shaping.TOKEN_WEIGHTINGS, a.token_weighting, a.token_weighting_args, where)
    if a.surrogate in losses.GROUP_SURROGATES:  # the loss normalises over groups: minibatches hold whole groups
        G = a.group_size
        if a.minibatch_size % G or a.prompts_per_step % a.updates_per_epoch:
            raise ConfigError(
                f"algorithm.surrogate={a.surrogate} normalises over each group, so every minibatch must hold whole "
                f"groups: set algorithm.minibatch_size to a multiple of group_size={G} (got {a.minibatch_size}) "
                f"and prompts_per_step to a multiple of updates_per_epoch (got {a.prompts_per_step} and "
                f"{a.updates_per_epoch})"
            )


def _check_group_transforms(a: AlgorithmConfig) -> None:
    """Advantage transforms that replace the estimator's advantages (``advantages.REPLACES_ADVANTAGES``: LENS,
    NGRPO, the unlikeliness reward) come first, one at most; NGRPO and the unlikeliness reward compute GRPO's own
    group statistics, so they need its settings; NGRPO trains the all-wrong groups the zero-variance filter drops;
    SEED-GRPO's answer pattern compiles (docs/variants.md)."""
    names = a.advantage_transform
    replacing = [n for n in names if n in advantages.REPLACES_ADVANTAGES]
    if replacing and (len(replacing) > 1 or names[0] != replacing[0]):
        raise ConfigError(
            f"algorithm.advantage_transform: {replacing[-1]} ({advantages.REPLACES_ADVANTAGES[replacing[-1]]}) "
            f"replaces the advantages, so transforms before it "
            f"would be lost; list it first, and only one of {sorted(advantages.REPLACES_ADVANTAGES)}, got {names}"
        )
    own = [n for n in names if n in ("ngrpo", "unlikeliness")]
    if own and (a.estimator != "grpo" or a.scale not in ("auto", "group") or a.combine != "sum_then_normalize"):
        raise ConfigError(
            f"algorithm.advantage_transform: {own[0]} computes GRPO's group mean and std itself and replaces the "
            f"estimator's advantages; set estimator: grpo, scale: auto (or group), combine: sum_then_normalize "
            f"(got {a.estimator}, {a.scale}, {a.combine})"
        )
    if "ngrpo" in names and a.filter_zero_variance:
        raise ConfigError(
            "algorithm.filter_zero_variance: true drops the all-wrong groups that advantage_transform ngrpo exists "
            "to train; set filter_zero_variance: false"
        )
    if "seed_grpo" in names:
        pattern = (a.advantage_transform_args.get("seed_grpo") or {}).get("answer_pattern", r"<answer>(.*?)</answer>")
        try:
            re.compile(str(pattern))
        except re.error as e:
            raise ConfigError(
                f"algorithm.advantage_transform_args.seed_grpo.answer_pattern: {pattern!r} is not a regular "
                f"expression ({e}); give one whose last match is the answer, e.g. '<answer>(.*?)</answer>'"
            ) from None


def _check_reward_needs(cfg: TrainConfig) -> None:
    """A reward that reads what a multi-turn rollout records (:data:`mmgrpo.rewards.agents.ROLLOUT_NEEDS`: tool
    calls, turn rewards) needs the setting that makes one (``rollout.tools`` / ``rollout.environment``)."""
    r = cfg.rollout
    for reward in cfg.rewards:
        need = ROLLOUT_NEEDS.get(reward.name)
        if need and not (r.environment is not None if need == "rollout.environment" else r.multi_turn):
            raise ConfigError(
                f"rewards: {reward.name!r} reads what a multi-turn rollout records (tool calls, turn rewards), but "
                f"this config has no {need}; set it, or use a one-turn reward such as accuracy"
            )


def _validate_rewards(cfg: TrainConfig) -> None:
    """Reward names, kwargs and weights resolve at load (``mmgrpo.rewards.check_reward_spec``); runtime ranges."""
    rt = cfg.reward_runtime
    if not rt.timeout_s > 0:
        raise ConfigError(f"reward_runtime.timeout_s: must be > 0 seconds, got {rt.timeout_s}")
    if rt.workers < 1:
        raise ConfigError(f"reward_runtime.workers: must be >= 1, got {rt.workers}")
    for i, spec in enumerate(cfg.rewards):
        try:
            check_reward_spec(spec.name, spec.kwargs, spec.weight)
        except ValueError as e:
            raise ConfigError(f"rewards[{i}] ({spec.name}): {e}") from None


_TRACKER_MODULES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "comet_ml": "comet_ml",
    "aim": "aim",
    "clearml": "clearml",
    "dvclive": "dvclive",
}


def _check_trackers(trackers: list[str]) -> None:
    """Every requested tracker is known and installed (accelerate would otherwise drop it with a warning)."""
    for name in trackers:
        _check_choice("logging.trackers", name, list(_TRACKER_MODULES))
        if importlib.util.find_spec(_TRACKER_MODULES[name]) is None:
            raise ConfigError(
                f"logging.trackers: {name!r} is not installed; pip install {name} "
                f"or remove it (logging.trackers=[] for none)"
            )
