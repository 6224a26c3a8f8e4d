"""Training configuration: dataclasses with a docstring per field, YAML for values, dotted CLI overrides.

``load_config(path, overrides)`` reads a YAML file, applies ``key.sub=value`` overrides (values parsed as YAML
scalars/lists), builds the nested dataclasses and validates them. Every mistake raises :class:`ConfigError`
with one line naming the field and what is allowed, never a traceback from deep inside the library.

Adapter- and task-specific options live under ``model.args`` and ``task.args``; each builder validates them
against its own dataclass with :func:`from_dict`, so they get the same errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from mmgrpo import strict_yaml
from mmgrpo.errors import ConfigError  # defined below the schema so rewards and tools raise it without importing it
from mmgrpo.suggest import unknown_field


@dataclass(frozen=True)
class Range:
    """Bounds of a numeric option, checked by :func:`from_dict`: ``x: Annotated[float, Range(gt=0)] = 1.0``.

    A value with a Range must also be finite (``.inf`` / ``1e999`` would pass a lower bound and fail at run time).
    On a list the bounds are of its length: ``Annotated[list[Choice], Range(ge=1)]`` is a non-empty list."""

    gt: float | None = None
    """Exclusive lower bound."""
    ge: float | None = None
    """Inclusive lower bound."""
    lt: float | None = None
    """Exclusive upper bound."""
    le: float | None = None
    """Inclusive upper bound."""

    def check(self, value: float | list, where: str) -> None:
        what, x = ("the number of items ", len(value)) if isinstance(value, list) else ("", value)
        if isinstance(x, float) and not math.isfinite(x):  # inf passes any one-sided bound: refused here
            raise ConfigError(f"{where}: must be a finite number, got {value}")
        bounds = [
            (">", self.gt, x > (self.gt or 0)),
            (">=", self.ge, x >= (self.ge or 0)),
            ("<", self.lt, x < (self.lt or 0)),
            ("<=", self.le, x <= (self.le or 0)),
        ]
        if any(bound is not None and not ok for _, bound, ok in bounds):
            wanted = " and ".join(f"{op} {bound}" for op, bound, _ in bounds if bound is not None)
            raise ConfigError(f"{where}: {what}must be {wanted}, got {value}")


# --------------------------------------------------------------------------------------------- sections


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train a LoRA adapter (peft) instead of the full model; the reference policy is the adapter disabled."""
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: list[str] | str = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names (or suffixes) that get LoRA layers, or peft's ``all-linear`` (every linear layer but the
    output head), passed to ``peft.LoraConfig`` as given."""


@dataclass
class ModelConfig:
    adapter: str = "vlm"
    """Model family adapter (registry name in mmgrpo.plugins.ADAPTERS), e.g. vlm, flow."""
    args: dict[str, Any] = field(default_factory=dict)
    """Adapter options (model name or tiny builder, sampling settings...); validated by the adapter."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA options."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype: float32 | bfloat16 | float16. Log-ratio math is always fp32."""


@dataclass
class TaskConfig:
    name: str = "shapes"
    """Prompt source (registry name in mmgrpo.plugins.TASKS)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Task options (split sizes, difficulty...); validated by the task."""


@dataclass
class RewardSpec:
    name: str = ""
    """Registry name, ``package.module:function``, or an entry point of group ``mmgrpo.rewards``."""
    weight: float = 1.0
    """Weight of this reward when rewards are combined."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments bound to the reward function (or passed to a reward class)."""
    reward_types: list[str] | None = None
    """Apply only to samples whose ``reward_type`` column is in this list (others: not applicable)."""


@dataclass
class RewardRuntimeConfig:
    timeout_s: float = 60.0
    """Seconds one reward call may take before it is abandoned."""
    on_error: Literal["raise", "nan"] = "raise"
    """What a raising or hanging reward does: raise (stop with its name and the sample) | nan (score NaN, count it)."""
    workers: int = 4
    """Reward calls that run in parallel (threads or worker processes)."""
    isolation: Literal["auto", "thread", "process"] = "auto"
    """Where reward calls run: auto (worker processes for rewards given by import path or entry point, threads
    for registry names) | thread | process (killed on timeout, so a reward holding the GIL cannot hang the run)."""
    load_check: bool = True
    """Run each reward once on a synthetic rollout before the model loads (mmgrpo/reward_check.py), so one that cannot
    be scored stops the run in one line; false for a reward with effects outside the run that must see training
    calls only (a file it counts calls in, a paid API)."""


@dataclass
class DynamicSamplingConfig:
    """DAPO dynamic sampling (arXiv 2503.14476 §3.2; verl algorithm.filter_groups): refill zero-variance groups."""

    enabled: bool = False
    """Replace the groups whose combined rewards are all equal by groups of fresh prompts (mmgrpo/dynamic_sampling.py;
    token adapters)."""
    max_num_gen_batches: Annotated[int, Range(ge=1)] = 4
    """Generation batches of P prompts per step at most, the step's own included; slots still empty after them keep
    zero-variance groups (counted in data/dynamic_short_groups)."""


@dataclass
class GroundTruthInjectionConfig:
    """TempSamp-R1 off-policy ground-truth injection (mmgrpo/injection.py, docs/variants.md); token adapters."""

    enabled: bool = False
    """Replace one sample of every group by the row's ground-truth answer, teacher-forced (ratio 1 at the first
    update, as the public re-implementation recomputes its old log-probs with the policy)."""
    column: str = "answer"
    """Dataset column holding the ground truth; rows without it keep all G sampled completions."""
    template: str = "<answer>{answer}</answer>"
    """The GT completion: str.format with ``answer`` = the column's value, e.g.
    ``<answer>{answer[0]:g} to {answer[1]:g}</answer>`` for a [start, end] span."""
    slot: int = -1
    """Which sample of the group is replaced (-1 = the last, the re-implementation's ``gt_replace_index``)."""


@dataclass
class DifficultyAugmentationConfig:
    """DeepVideo-R1 difficulty-aware augmentation (arXiv 2506.07464; mmgrpo/augmentation.py, docs/variants.md)."""

    enabled: bool = False
    """After each step's rollout, ΔR = (mean reward of the last ``window`` steps) − (the group's mean reward): hard
    groups (ΔR > 0) get a reasoning hint appended to the prompt, easy ones (ΔR < 0) Gaussian noise on their video
    frames; the step's P prompts are then rolled out again, augmented, and trained on (video adapter)."""
    window: Annotated[int, Range(ge=1)] = 100
    """W: steps (batches) in the reference window of mean rewards (the paper's 100)."""
    hint_column: str = "reasoning"
    """Row column with the ground-truth reasoning whose prefix is the hint; rows without it get no hint."""
    hint_template: str = "\n{hint}"
    """Appended to a hard row's (string) prompt: str.format with ``hint`` = the first round(ΔR) + 1 units."""
    hint_separator: str | None = None
    """What splits the reasoning into units: null = whitespace (words), e.g. "\n" for lines or ". " for sentences."""
    noise_std: Annotated[float, Range(gt=0)] = 10.0
    """Base σ of the frame noise in pixel values (0–255): an easy row's frames get N(0, (noise_std·(|ΔR| + 1))²)."""


@dataclass
class AlgorithmConfig:
    group_size: int = 8
    """G: samples per prompt."""
    prompts_per_step: Annotated[int, Range(ge=1)] = 4
    """P: prompts per training step (per process)."""
    estimator: str = "grpo"
    """Group advantage estimator: grpo | dr_grpo | rloo."""
    scale: Literal["auto", "group", "batch", "none"] = "auto"
    """Advantage scaling: auto (the estimator's paper default) | group | batch | none."""
    std_unbiased: bool = True
    """Unbiased (n-1) group std as torch's default and the GRPO anchors; false = population std."""
    eps: Annotated[float, Range(ge=0)] = 1e-4
    """Added to the std before dividing (>= 0)."""
    combine: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """Multi-reward combination: sum_then_normalize | normalize_then_sum (GDPO)."""
    filter_zero_variance: bool = False
    """Drop groups whose rewards are all equal from the update (DAPO dynamic sampling, without resampling)."""
    shaping: str = "none"
    """Per-unit advantage shaping (registry mmgrpo.shaping.SHAPERS): none | chunk | temporal | value_anchored..."""
    shaping_args: dict[str, Any] = field(default_factory=dict)
    """Options of the shaper."""
    ratio_level: str = "token"
    """Importance-ratio level: token | sequence (GSPO) | sequence_token | chunk (Chunk-GRPO)."""
    chunk_sizes: list[Annotated[int, Range(ge=1)]] | None = None
    """Unit counts of each chunk for ratio_level=chunk (must sum to T, e.g. the flow adapter's model.args.num_steps)."""
    ratio_norm: bool = False
    """GRPO-Guard RatioNorm: normalise per-step log-ratios before the surrogate (flow models)."""
    surrogate: str = "ppo_clip"
    """Per-unit surrogate: ppo_clip | sapo | gmpo | cispo | reinforce | reg_grpo | dgpo (flow objective: dgpo)."""
    surrogate_args: dict[str, Any] = field(default_factory=dict)
    """Options of the surrogate, checked against its dataclass in mmgrpo/losses.py: ppo_clip {clip_low: 0.2,
    clip_high: 0.28, dual_clip: null} | sapo {tau_pos: 1.0, tau_neg: 1.05} | gmpo {log_clip_low: 0.4,
    log_clip_high: 0.4} | cispo {clip_high: 0.28} | reg_grpo {eps: 1e-4, reduction: sum} | dgpo {beta_dpo: 100} |
    reinforce {}."""
    aggregation: str = "token_mean"
    """Loss aggregation: token_mean | seq_mean_token_mean | seq_sum_const_norm (Dr.GRPO)."""
    aggregation_args: dict[str, Any] = field(default_factory=dict)
    """Options of the aggregation (checked against its dataclass in mmgrpo/losses.py; the built-in ones have none)."""
    beta: Annotated[float, Range(ge=0)] = 0.0
    """KL coefficient to the reference policy; 0 loads no reference log-probs."""
    kl: str = "k3"
    """KL estimator: k1 | k2 | k3 (sample-based, from log-probs) | gaussian_exact (closed form from the
    transition means, flow/diffusion adapters)."""
    kl_args: dict[str, Any] = field(default_factory=dict)
    """Options of the KL estimator (checked against its dataclass in mmgrpo/losses.py; the built-in ones have none)."""
    epochs: Annotated[int, Range(ge=1)] = 1
    """mu: optimisation passes over each rollout batch."""
    updates_per_epoch: Annotated[int, Range(ge=1)] = 1
    """Optimizer updates per epoch: the B samples are split into this many parts, each one update whose
    gradient is accumulated over its minibatches (1 = one on-policy update per rollout when epochs=1)."""
    minibatch_size: Annotated[int, Range(ge=1)] = 8
    """Samples per forward/backward (gradient accumulation inside an update)."""
    beta_schedule: str = "constant"
    """β over the steps (registry mmgrpo.schedules.BETA_SCHEDULES; algorithm.beta is its peak): constant | othink
    (GRPO-D, OThink-MR1) | linear | cosine. Logged as ``kl/beta``."""
    beta_schedule_args: dict[str, Any] = field(default_factory=dict)
    """Options of the β schedule (othink: beta_min, exploration_ratio, beta_max = algorithm.beta; linear/cosine:
    beta_start)."""
    advantage_transform: list[str] = field(default_factory=list)
    """Advantage transforms [P, G] → [P, G] applied in order after the estimator (registry
    mmgrpo.advantages.ADVANTAGE_TRANSFORMS): difficulty (DGRPO) | negative_groups (LENS) | ngrpo (NGRPO) |
    unlikeliness (Rewarding the Unlikely) | seed_grpo (SEED-GRPO). docs/variants.md."""
    advantage_transform_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Options per transform, by name: difficulty {offset: 2.0} | negative_groups {alpha: 0.25, wrong_threshold: 0.0,
    eps: 1e-6} | ngrpo {max_reward: 1.0, virtual_samples: 1, eps: 1e-6} | unlikeliness {beta: 0.25, wrong_threshold:
    0.0, eps: 1e-6} | seed_grpo {alpha: 0.5, answer_pattern}, e.g. {negative_groups: {alpha: 0.5}}."""
    sampler: str = "sequential"
    """Prompt sampler (registry mmgrpo.sampling.SAMPLERS): sequential (seeded permutation per epoch) |
    variance (MMR1 / Temporal-RLT variance-aware re-weighting)."""
    sampler_args: dict[str, Any] = field(default_factory=dict)
    """Options of the prompt sampler (docs/variants.md)."""
    token_weighting: Literal["none", "tw_grpo"] = "none"
    """Per-position weights on the per-unit advantages: none | tw_grpo (TW-GRPO intra-group divergence weights;
    token adapters with vocab_logits(); one extra no-grad forward per step). docs/variants.md."""
    token_weighting_args: dict[str, Any] = field(default_factory=dict)
    """tw_grpo: alpha (the largest weight, default 1.4), chunk (positions per fp32 log-softmax, default 64)."""
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    """DAPO dynamic sampling: refill zero-variance groups with fresh prompts (docs/variants.md)."""
    gt_injection: GroundTruthInjectionConfig = field(default_factory=GroundTruthInjectionConfig)
    """TempSamp-R1 ground-truth injection: one slot per group is the row's answer (docs/variants.md)."""
    difficulty_augmentation: DifficultyAugmentationConfig = field(default_factory=DifficultyAugmentationConfig)
    """DeepVideo-R1 difficulty-aware augmentation: hints for hard groups, noisier video for easy ones, resampled
    (docs/variants.md; video adapter)."""
    rollout_steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Further rollout-level variants, by name → options, in pipeline order (registry
    mmgrpo.rollout_steps.ROLLOUT_STEPS; the built-in ones keep their own sections above). docs/architecture.md."""
    loss_terms: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Extra loss terms, by name → options (registry mmgrpo.losses.LOSS_TERMS), each aggregated like the policy loss
    and added to it: llds (the likelihood-preserving regulariser, arXiv 2512.04220). docs/variants.md."""
    credit: str = "trajectory"
    """Credit across the turns of multi-turn rollouts (registry mmgrpo.credit.CREDITS; rollout.tools, docs/agents.md):
    trajectory (one advantage per trajectory, every turn's tokens get it: GRPO) | gigpo (episode advantage + ω · step
    advantage within anchor-state groups, arXiv 2505.10978) | mt_grpo (turn-level advantage from per-turn rewards,
    arXiv 2505.11821)."""
    credit_args: dict[str, Any] = field(default_factory=dict)
    """Options of the credit assignment, checked against its dataclass in mmgrpo/credit.py: gigpo {gamma,
    step_advantage_w (ω), mode, invalid_penalty, eps, similarity_thresh, outcome_on_last_turn (default true: the
    configured reward is added to the last turn's; false with a reward that is the environment's return,
    env_return)} | mt_grpo {turn_advantage_coef, advantage_est, discount_factor, eps} | trajectory {}."""


@dataclass
class OptimConfig:
    lr: Annotated[float, Range(gt=0, le=1)] = 1e-5
    """Peak learning rate (AdamW), in (0, 1]: an Adam update moves each weight by about lr, so lr > 1 replaces the
    weights by noise within a step (they overflow to inf, and sampling fails)."""
    weight_decay: Annotated[float, Range(ge=0)] = 0.0
    """AdamW weight decay (>= 0; a negative decay grows the weights every step)."""
    betas: list[Annotated[float, Range(ge=0, lt=1)]] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas, each in [0, 1) (torch.optim.AdamW's own bounds)."""
    max_grad_norm: Annotated[float, Range(ge=0)] = 1.0
    """Gradient-norm clipping; 0 disables."""
    warmup_steps: Annotated[int, Range(ge=0)] = 0
    """Linear learning-rate warm-up steps."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after warm-up: constant | cosine | linear."""
    fused: bool | None = None
    """AdamW's fused kernel (one pass over each tensor, no temporaries of the weights' size), as TRL's default
    ``optim: adamw_torch_fused``. None: fused where torch has the kernel for the weights' device (CPU, CUDA) and the
    weights are not FSDP shards; false: torch's per-tensor AdamW (TRL's ``optim: adamw_torch``)."""
    lr_multipliers: dict[str, Annotated[float, Range(gt=0)]] = field(default_factory=dict)
    """Per-module learning rates: a parameter whose name contains a key trains at ``lr`` × its value (the first
    matching key), the others at ``lr``; e.g. ``{vision_model: 100, connector: 100}`` for a fresh vision tower under a
    pretrained language model (LLaVA-NeXT's ``mm_vision_tower_lr``, Qwen2.5-VL's ``mm_projector_lr``). The schedule
    scales every group alike. A key that matches no trainable parameter is an error."""
    max_skipped_steps: Annotated[int, Range(ge=1)] = 3
    """Optimizer updates whose gradients hold NaN/inf are skipped (counted in ``optim/skipped_steps``); stop with
    an error once this many in a row were skipped (the weights are never updated with non-finite gradients)."""


@dataclass
class WarmupConfig:
    steps: Annotated[int, Range(ge=0)] = 0
    """Supervised warm-up steps before GRPO (0 = none). Reported as its own stage (eval/warmup/*)."""
    lr: Annotated[float, Range(gt=0, le=1)] = 1e-3
    """Warm-up learning rate, in (0, 1] (as ``optim.lr``)."""
    batch_size: int = 16
    """Rows per warm-up step."""
    target_column: str | None = None
    """Warm up on the task's own training rows: the column holding each row's target output (e.g. ``answer``).
    Needed when the task has no warm-up rows of its own (``task.name: dataset``)."""
    target_template: str = "{target}"
    """The supervised target built from a row when ``target_column`` is set: ``{target}`` is that column, any
    ``{column}`` another one, e.g. ``"<think>{reasoning}</think><answer>{target}</answer>"``."""
    thought_dropout: Annotated[float, Range(ge=0, le=1)] = 0.0
    """TON thought dropout: share of warm-up targets whose <think>…</think> is emptied (mmgrpo/thoughts.py)."""
    trainable: list[str] = field(default_factory=list)
    """Train only the parameters whose name contains one of these strings during the warm-up (the others keep their
    weights), e.g. ``[vision_model, connector]`` for a fresh vision tower under a pretrained language model (LLaVA's
    first stage, which trains the projector alone); empty: every trainable parameter. GRPO trains them all again."""


@dataclass
class EvalConfig:
    before: bool = True
    """Evaluate the held-out split before training."""
    after: bool = True
    """Evaluate the held-out split after training."""
    every: Annotated[int, Range(ge=0)] = 0
    """Also evaluate every N steps (0 = never)."""
    max_rows: Annotated[int, Range(ge=1)] | None = None
    """Evaluate at most this many held-out rows (None = all)."""
    batch_size: int = 32
    """Rows per evaluation batch."""
    pass_k: list[int] = field(default_factory=list)
    """Also report ``eval/<stage>/pass@k`` for each k (e.g. [1, 4, 16]): ``pass_samples`` sampled completions per
    held-out row, Chen et al.'s unbiased estimator (mmgrpo/pass_at_k.py); [] = none (each k <= pass_samples)."""
    pass_samples: Annotated[int, Range(ge=1)] = 16
    """n: completions sampled per held-out row for pass@k (the training sampler, keyed noise)."""
    pass_metric: str = "accuracy"
    """The task metric that marks a sampled completion correct for pass@k (0/1 per output)."""


@dataclass
class LoggingConfig:
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """accelerate trackers: tensorboard | wandb | mlflow | comet_ml | aim | clearml | dvclive; [] for none."""
    every: int = 1
    """Log metrics every N steps."""
    progress: bool = True
    """Show a progress bar with step, reward and time left."""
    plot: bool = True
    """Write reward_curve.png in the run directory at the end."""


@dataclass
class CheckpointConfig:
    every: Annotated[int, Range(ge=0)] = 0
    """Save a resumable checkpoint every N steps (0 = only at the end)."""
    keep_last: Annotated[int, Range(ge=1)] = 2
    """Step checkpoints to keep, >= 1 (older ones are deleted after a new one is complete; final/ is kept apart)."""
    save_final: bool = True
    """Save the final model in Hugging Face format under checkpoints/final."""
    after_warmup: bool = False
    """Also save a checkpoint right after the warm-up and its evaluation, as step 0 (``checkpoints/step-000000``).
    ``resume`` from it skips the warm-up; its ``model/`` directory, given as ``model.args.name_or_path`` with
    ``warmup.steps: 0``, starts other runs (another credit assignment, another GRPO setting) from the same warm-up
    (docs/agents.md, "The Sokoban task")."""
    sharded: bool | None = None
    """Step checkpoints in the sharded layout (``torch.distributed.checkpoint``: each process writes its own shards
    of the weights and optimizer state, nothing is gathered on one process; resumable on as many processes or fewer;
    no Hugging Face export in step checkpoints). None (default): sharded exactly when the policy is FSDP-sharded;
    false: always gathered on process 0 (the layout before); true: sharded without FSDP too. ``final/`` is always
    gathered, with the Hugging Face export. docs/scale.md, "Sharded checkpoints"."""


@dataclass
class RolloutConfig:
    engine: Literal["native", "vllm"] = "native"
    """Who samples the rollouts of a token family: native (the trainer's model, the one decode loop) | vllm (a vLLM
    server in its own environment: ``bash scripts/setup_vllm.sh``, then ``mmgrpo rollout-server CONFIG``;
    docs/scale.md). The trainer re-scores vLLM's samples with its own model and corrects the mismatch by
    importance sampling (``is_mode``)."""
    vllm_mode: Literal["server", "colocate"] = "server"
    """Where vLLM runs (TRL's ``vllm_mode``): server (its own process and environment, ``mmgrpo rollout-server``,
    reached at ``url``) | colocate (inside the training process, on the trainer's device, sleeping while the trainer
    updates on CUDA; the trainer must run in ``.venv-colocate``: ``bash scripts/setup_colocate.sh``, then
    ``.venv-colocate/bin/mmgrpo train ...``; one process). docs/scale.md."""
    vllm_gpu_memory_utilization: Annotated[float, Range(gt=0, le=1)] | None = None
    """Fraction of the GPU's memory vLLM takes for weights and KV cache (TRL's name; on vLLM's CPU backend the
    fraction of host memory). Default: 0.3 colocated on a GPU (TRL's colocate default: the trainer needs the rest),
    0.9 for a server on its own GPU, 0.1 on CPU."""
    vllm_enable_sleep_mode: bool = True
    """Colocate mode on CUDA: vLLM sleeps after each rollout (``sleep(level=1)``: weights to host memory, KV cache
    freed) and wakes before the next weight push, so the trainer's update has the GPU's memory (TRL's name; TRL's
    default is false). Ignored on CPU, where vLLM has no sleep mode, and in server mode."""
    url: str = "http://127.0.0.1:8100"
    """Address of the vLLM rollout server (``mmgrpo rollout-server`` prints it); unused by colocate mode."""
    timeout_s: Annotated[float, Range(gt=0)] = 600.0
    """Seconds one engine call (generate, weight push) may take before the run stops with one line."""
    push_bucket_mb: Annotated[float, Range(gt=0)] = 256.0
    """Largest bucket of a weight push, in MiB: the policy's tensors go to the engine in buckets of at most this many
    bytes, whole decoder layers at a time (a larger layer alone), loaded as they arrive, so a push holds at most about
    two buckets of extra host memory whatever the model's size (modalities/tokens/weight_sync.py; docs/scale.md,
    "Weight pushes")."""
    weight_sync: Literal["http", "nccl"] = "http"
    """How pushes reach a vLLM server: http (the buckets as safetensors bodies; any machine) | nccl (each bucket
    broadcast from the trainer's GPU to the engine's, TRL's approach; needs CUDA and vllm in the training environment,
    refused at load otherwise). A colocated engine takes the tensors in-process (http, the default, there)."""
    nccl_port: Annotated[int, Range(ge=1, le=65535)] = 51216
    """Port of the NCCL weight-sync group's rendezvous on the server's host (``weight_sync: nccl``; TRL's
    ``group_port`` default)."""
    is_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none"] = "token_truncate"
    """Importance-sampling correction of π_old / π_engine (mmgrpo/importance.py; TRL's
    ``vllm_importance_sampling_mode``): truncate (TIS) or mask, per token or per sequence; none: no correction."""
    is_clip_max: Annotated[float, Range(gt=0)] | None = 3.0
    """C_max: truncation bound (``*_truncate``) or upper mask bound (``*_mask``); TRL's default 3.0."""
    is_clip_min: Annotated[float, Range(ge=0)] | None = None
    """C_min: lower bound (masks ratios below it; lower-clamps the truncating modes)."""
    tools: list[str] = field(default_factory=list)
    """Tools the policy may call, by registry name (mmgrpo.tools.TOOLS: crop, zoom, select_frames) or
    ``package.module:function``; non-empty makes rollouts multi-turn (token families vlm and video): the policy's
    ``<tool_call>`` JSON is parsed, the tool run bounded, its observation (text, images) appended as the template's
    tool message with mask 0, until no call, ``max_turns`` or ``max_total_tokens``. docs/agents.md."""
    tool_limits: dict[str, Any] = field(default_factory=dict)
    """Bounds of each tool call (mmgrpo.tools.run_tool_call's keywords): timeout_s, max_argument_chars,
    max_observation_chars, max_images, max_frames, max_pixels, max_source_pixels, error_reward (verl's zoom tool:
    -0.05), isolation (auto | process | thread: where a call runs, tools/worker.py). An environment's reset/step are
    held to timeout_s and the observation sizes too (a fault ends the trajectory, tools/env_guard.py)."""
    max_turns: Annotated[int, Range(ge=1)] = 5
    """Assistant turns per trajectory at most (DeepEyes 5, Mini-o3 6); a tool call in the last turn is not run."""
    max_calls_per_turn: Annotated[int, Range(ge=1)] = 1
    """Tool calls run per assistant turn (verl's max_parallel_calls); further calls of the turn are answered with an
    error observation."""
    max_tool_calls: Annotated[int, Range(ge=1)] | None = None
    """Tool calls per trajectory at most (None: max_turns - 1 bounds them); past it a call gets an error observation."""
    max_total_tokens: Annotated[int, Range(ge=1)] = 1024
    """T of a multi-turn rollout: assistant and observation tokens after the prompt. Each turn samples at most
    model.args.max_new_tokens; a trajectory stops when its next observation and one more token would not fit."""
    max_images: Annotated[int, Range(ge=0)] = 8
    """Observation images (and video frames) per trajectory at most; further ones are left out and the
    observation's text says so."""
    observation_images: Literal["before_text", "after_text"] = "before_text"
    """Where a turn's images go in its message: before_text (as Qwen's and TRL's processors place a user message's
    media) | after_text (after the text, next to the policy's reply; the environment's first observation too). The
    tiny model trained from scratch reads a Sokoban room only with the image after the text (docs/agents.md)."""
    chat_template: str = "auto"
    """Chat template of tool-using rollouts: auto (the model's when it renders 'tool' messages, else
    qwen2.5_vl_tools) | model | qwen2.5_vl_tools (ours: Qwen2.5-VL + Qwen2.5's tool section, tool replies as a user
    turn <tool_response>...</tool_response>, modalities/tokens/turns.py) | qwen2.5_vl_tools_brief (the same with a
    one-line tool section: short prompts for small models trained from scratch) | a path to a Jinja file."""
    environment: str | None = None
    """A multi-step game the policy plays (registry name in mmgrpo.tools.ENVIRONMENTS, e.g. sokoban, or one's own by
    reference, module:Class or module:factory(), docs/agents.md#your-own-environment): one instance
    per trajectory, reset from its row (its first observation joins the prompt); each assistant turn is its action
    (env.step), its observation the next user turn (mask 0), its reward the turn's reward, until done or max_turns."""
    environment_args: dict[str, Any] = field(default_factory=dict)
    """Options of the environment's factory (e.g. sokoban {size: 6, boxes: 1, max_steps: 15})."""
    ground_truth_probe: dict[str, Any] | None = None
    """Before each turn, record the policy's mean log-prob of the row's ground truth as its next reply (IGPO's
    information gain, ``algorithm.credit: igpo``; mmgrpo/igpo.py ProbeOptions: column, template, score,
    batch_size; docs/variants.md). null: no probe."""
    tree: dict[str, Any] | None = None
    """Tree rollouts (mmgrpo/tree.py TreeOptions; docs/variants.md): the G trajectories of a prompt branch from shared
    prefixes of turns — Tree-GRPO's random expansion (select: random, G = trees·(1 + rounds·nodes·branches)) or ARPO's
    entropy-triggered forks after each response (select: entropy). null: G independent chains."""

    @property
    def multi_turn(self) -> bool:
        """Rollouts are multi-turn: tools or an environment answer the policy's turns."""
        return bool(self.tools or self.environment)


@dataclass
class TrainConfig:
    output_dir: str = "runs/default"
    """Run directory: config.yaml, metrics.jsonl, summary.json, checkpoints/."""
    seed: Annotated[int, Range(ge=0, le=2**31 - 1)] = 0
    """Seed for data order, sampling and initialisation (NumPy takes seeds in [0, 2^32), each process adds its
    index)."""
    rollout_noise: Literal["keyed", "per_process"] = "keyed"
    """Sampling noise of rollouts. ``keyed``: each sample draws from its own generator seeded by (seed, step,
    global prompt position, sample index), so 1 process × P prompts and W processes × P/W prompts sample the
    same rollouts (docs/architecture.md, "World-size invariance"; adapters that key their noise: vlm, video,
    audio-LLM via the KV-expanded sampler, flow). ``per_process``: each process's global RNG stream (seeded by
    seed and process index), the draws of HF ``generate`` for the token samplers."""
    steps: Annotated[int, Range(ge=1)] = 100
    """GRPO training steps (one rollout batch each)."""
    resume: str | None = None
    """Resume from a checkpoint directory, or 'latest' for the newest one under output_dir/checkpoints (step-* or
    final/). The config must equal the saved one except for ``steps`` (and resume/stop_after/overwrite)."""
    overwrite: bool = False
    """Start a new run in a non-empty output_dir by first moving the old run to ``<output_dir>.old-<time>``
    (nothing is deleted); without it (or ``resume``) a used output_dir is refused."""
    host_mmap_threshold_kib: Annotated[int, Range(ge=4, le=32768)] | None = None
    """glibc only, opt-in: allocations of at least this many KiB are mmapped and given back to the OS when freed
    (e.g. 128). Fixing it turns off glibc's rising threshold, under which freed tensors stay in the process's heap
    and add to later peaks; the price is fresh zeroed pages for every large tensor (mmgrpo/hostmem.py: on the
    real-vocabulary benchmark, peak RSS −90 MB but the CPU step 2–4× slower). None: glibc's default."""
    stop_after: Annotated[int, Range(ge=1)] | None = None
    """Stop (after checkpointing) once this step is reached, 1 <= stop_after <= steps; used to test interruption
    and resume."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy model."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts and held-out evaluation."""
    rewards: list[RewardSpec] = field(default_factory=list)
    """Reward functions, combined with their weights."""
    reward_runtime: RewardRuntimeConfig = field(default_factory=RewardRuntimeConfig)
    """How reward functions run."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage, surrogate, aggregation and KL choices."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Optional supervised warm-up."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metrics and trackers."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engine (native decode loop or a vLLM server) and its importance-sampling correction."""


# ---------------------------------------------------------------------------------- building & checking


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against annotation ``tp`` (after ``from __future__`` string resolution)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Annotated:
        inner, *extras = typing.get_args(tp)
        value = _coerce(value, inner, where)
        for extra in extras:
            if isinstance(extra, Range) and value is not None:
                extra.check(value, where)
        return value
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise ConfigError(f"{where}: null is not allowed here")
        errors = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                return _coerce(value, opt, where)
            except ConfigError as e:
                errors.append(str(e))
        scalars = [o for o in options if o is bool or typing.get_origin(o) is typing.Literal]
        if len(scalars) == len([o for o in options if o is not type(None)]) > 1:  # e.g. bool | Literal["auto"]
            allowed = [x for o in scalars for x in ((True, False) if o is bool else typing.get_args(o))]
            names = ", ".join(str(x).lower() if isinstance(x, bool) else str(x) for x in allowed)
            raise ConfigError(f"{where}: {value!r} is not allowed; choose one of: {names}")
        raise ConfigError(errors[0])
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {_type_name(tp)} fields, got {value!r}")
        return from_dict(tp, value, where)
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # PyYAML reads "3e-3" (no dot) as a string: accept what float() accepts
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if math.isnan(number):
            raise ConfigError(f"{where}: is NaN; give a number")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


MOVED_KEYS = {
    f"algorithm.{key}": "algorithm.surrogate_args"
    for key in ("clip_low", "clip_high", "dual_clip", "tau_pos", "tau_neg")
}
"""Config keys that moved, by dotted path → where they live now (each surrogate's options are its own dataclass,
mmgrpo/losses.py); :func:`from_dict` names the new place in its one-line error."""


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise :class:`ConfigError`.

    ``where`` is the dotted path used in messages (e.g. ``model.args``).
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if path in MOVED_KEYS:
            raise ConfigError(f"{path} moved: write {MOVED_KEYS[path]}: {{{key}: {value}}}")
        if key not in names:
            raise ConfigError(unknown_field(path, key, names, TrainConfig))  # (did you mean: every section's fields)
        kwargs[key] = _coerce(value, hints[key], path)
    return cls(**kwargs)


def check_kwargs(fn: Any, kwargs: dict[str, Any], where: str, skip: int = 0) -> dict[str, Any]:
    """Check ``kwargs`` against the keyword parameters of ``fn`` (after its first ``skip`` positional ones).

    Unknown names and values that do not fit the parameter's annotation (types, ``Literal``, ``Range``) raise
    :class:`ConfigError` naming ``where``; returns the coerced values.
    """
    params = list(inspect.signature(fn).parameters.values())[skip:]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable annotations: check names only
        hints = {}
    out = {}
    for key, value in (kwargs or {}).items():
        if key not in names and not takes_any:
            raise ConfigError(unknown_field(f"{where}.{key}", key, names))
        out[key] = _coerce(value, hints.get(key, Any), f"{where}.{key}")
    return out


def to_dict(obj: Any) -> dict[str, Any]:
    """A plain-dict copy of a config dataclass (for YAML dumping)."""
    return dataclasses.asdict(obj)


def field_docs(cls: type) -> dict[str, str]:
    """Field docstrings of a config dataclass (the string literal after each field), for ``--help``-style output."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for prev, node in itertools.pairwise(body):
        if isinstance(prev, ast.AnnAssign) and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docs[prev.target.id] = str(node.value.value)  # type: ignore[attr-defined]
    return docs


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one ``key.sub=value`` override to nested dict ``data`` in place (value parsed as YAML)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value (e.g. algorithm.beta=0.04)")
    key, raw = override.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {override!r}: value is not valid YAML ({e.problem})") from None
    parts = key.strip().split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parts[: i + 1])} is not a section")
        node = nxt
    node[parts[-1]] = value


def variant_methods(a: AlgorithmConfig) -> dict[str, str]:
    """Adapter methods the variants of docs/variants.md need: {method: the setting that needs it}."""
    need = {}  # the rollout steps' hooks: mmgrpo.rollout_steps.check_config
    if a.token_weighting == "tw_grpo":
        need["vocab_logits"] = "algorithm.token_weighting: tw_grpo"
    if "entropy_bonus" in a.loss_terms:  # the entropy of the sampling distribution (mmgrpo/entropy_control.py)
        need["logprobs_and_entropy"] = "algorithm.loss_terms.entropy_bonus"
    return need


def read_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Read ``path`` (YAML), apply ``key.sub=value`` overrides and build a :class:`TrainConfig` (types, ranges and
    choices of every field). The checks against the registries and across fields are
    :func:`mmgrpo.loader.load_config`'s, which users call."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            data = strict_yaml.load(p.read_text(), str(p)) or {}  # a key written twice: one line, both lines
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"{p}:{line} is not valid YAML ({getattr(e, 'problem', e)})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of config sections")
    for ov in overrides:
        apply_override(data, ov)
    return from_dict(TrainConfig, data)


def dump_config(cfg: TrainConfig) -> str:
    """The resolved config as YAML (what ``--dry-run`` prints and the run directory keeps)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
