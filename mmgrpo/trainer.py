"""The training loop: sample → reward → advantage → update → log, on accelerate. Reads top to bottom.

One step:
  1. ``adapter.rollout(rows, G)``: B = P·G samples with ``old_logprobs [B, T]`` (no grad); with
     ``rollout_noise: keyed`` each sample's noise is keyed by (seed, step, global prompt position, sample)
     (``mmgrpo/noise.py``), so the rollouts do not depend on the number of processes.
  2. rewards ``[P, G, K]`` from the reward runner (NaN = not applicable).
  3. advantages ``[P, G]`` (estimator, scale, multi-reward combination), optional zero-variance filter,
     then per-unit shaping to ``[B, T]``.
  4. μ epochs × ``updates_per_epoch`` optimizer updates, each accumulating gradients over minibatches:
     log-ratio → ratio level → surrogate → aggregation (+ β·KL) → backward; clip; step.
  5. metrics to ``metrics.jsonl`` and the accelerate trackers; checkpoints (atomic) every N steps.

Each process holds whole groups (P prompts per process), so group statistics never cross processes.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from accelerate.utils import DistributedType, gather_object, set_seed

from mmgrpo import (
    advantage_steps,
    evaluation,
    importance,
    losses,
    noise,
    on_policy,
    pass_at_k,
    reward_check,
    rollout_steps,
    run_dir,
    sampling,
    schedules,
    shaping,
    sharding,
    tracking,
    warmup,
)
from mmgrpo import advantages as adv_lib
from mmgrpo import checkpoint as ckpt
from mmgrpo import metrics as step_metrics
from mmgrpo.config import ConfigError, TrainConfig, dump_config, variant_methods
from mmgrpo.hostmem import fix_mmap_threshold
from mmgrpo.launch import StopSignal, make_accelerator
from mmgrpo.loader import load_builtins, load_engine
from mmgrpo.optim import build_optimizer
from mmgrpo.plugins import ADAPTERS
from mmgrpo.preflight import preflight
from mmgrpo.rewards import score_rows, weighted_scorer
from mmgrpo.types import (
    EngineRollout,
    ForwardRecord,
    SupervisedLoss,
    SyncReference,
    capability_text,
    frozen_reference,
    missing_method,
    required_capabilities,
)

logger = logging.getLogger(__name__)


class Trainer:
    """Holds the pieces of one run; ``run()`` executes it. See the module docstring for the step."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        fix_mmap_threshold(cfg.host_mmap_threshold_kib)  # before the model's and the step's allocations
        self.out = run_dir.resolve_output_dir(cfg.output_dir)  # one directory, one lock, whatever the path
        self.acc = make_accelerator(cfg, self.out)
        self._lock: run_dir.RunLock | None = None  # held (by process 0) until close(): run() ends, or __init__ fails
        self._lock = run_dir.take_run_lock(self.acc, self.out)
        try:  # the run-dir checks come before the model loads: a used output_dir fails fast
            self._resume_dir = run_dir.check_run_dir(cfg, self.acc, self.out)
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        """Task, adapter, rewards, optimizer and sampler (the part of ``__init__`` after the run-dir checks)."""
        cfg = self.cfg
        load_builtins()
        set_seed(cfg.seed)
        with self.acc.main_process_first():  # tiny models and data are built into a shared cache: once
            self.task = preflight(cfg)  # the --dry-run check: task, first rows, reward columns, warm-up rows
            self.rewards = reward_check.load_rewards(cfg, self.task.train_rows())  # run once on a synthetic rollout
            self.adapter = ADAPTERS.get(cfg.model.adapter)(
                cfg.model.args,
                seed=cfg.seed,
                lora=cfg.model.lora,
                dtype=cfg.model.dtype,
                need_reference=cfg.algorithm.beta > 0,
                reward_scorer=weighted_scorer,  # families that score their own outputs (flow value_rewards)
                rollout=cfg.rollout,  # tools / an environment: the adapter is built with its turn driver (agents.md)
            )
        a = cfg.algorithm  # plugins registered without a spec (no declared class) are checked here, once built
        need = required_capabilities(
            kl=a.kl,
            ratio_norm=a.ratio_norm,
            warmup_steps=cfg.warmup.steps,
            engine=cfg.rollout.engine,
            tools=cfg.rollout.multi_turn,
        )
        hooks = {**variant_methods(a), **rollout_steps.check_config(a, cfg.rollout.multi_turn)}  # docs/variants.md
        missing = missing_method(self.adapter, {**need, **hooks})
        if missing is not None:
            raise ConfigError(
                f"{missing[1]} needs an adapter with {capability_text(missing[0])}; {cfg.model.adapter!r} has none"
            )
        fsdp = self.acc.state.fsdp_plugin if self.acc.distributed_type == DistributedType.FSDP else None
        self.optimizer, self.scheduler = build_optimizer(self.adapter, cfg, fsdp=fsdp is not None)
        if fsdp is not None and not fsdp.cpu_ram_efficient_loading:  # (that option broadcasts process 0's itself)
            sharding.broadcast_from_main(self.adapter.model)  # as DDP does on wrapping; fully_shard keeps local values
        if fsdp is not None and fsdp.transformer_cls_names_to_wrap is None:  # not named in the accelerate config
            fsdp.transformer_cls_names_to_wrap = sharding.block_classes(self.adapter.model)
        self.adapter.model, self.optimizer = self.acc.prepare(self.adapter.model, self.optimizer)
        if (reference := frozen_reference(self.adapter)) is not None:  # prepare moved the policy, not its frozen copy
            reference.to(self.acc.device)
        self.engine = self._load_engine(fsdp is not None)  # vLLM: reachable (or started here) now, pushed each step
        if self.engine is not None:
            self.adapter.use_engine(self.engine)
            self.engine.configure_push(cfg.rollout, sender=self.acc.is_main_process)  # buckets, channel
        self.state = run_dir.TrainerState()  # checkpointed with the scheduler and the reference copy by checkpoint.save
        self.advantage_steps = advantage_steps.build(a)  # after the estimator: one declared list of steps
        self.sampler = sampling.build_sampler(
            cfg.algorithm, len(self.task.train_rows()), self.acc.num_processes, self.acc.process_index, cfg.seed
        )
        self.rollout_steps = rollout_steps.build(a)  # injection, augmentation, refill, the sampler's observation
        set_seed(cfg.seed, device_specific=True)  # per-process RNG (rollout_noise: per_process; dropout), same weights
        self.summary: dict[str, float] = {
            "train/processes": self.acc.num_processes,
            "train/sharded": float(self.acc.distributed_type == DistributedType.FSDP),  # 1: FSDP, parameters sharded
        }
        self.skipped_rows = 0  # training rows that could not be read (DataError), skipped and counted
        self._bad_rows: set[int] = set()
        self._no_signal_warned: set[str] = set()  # causes warned about once (metrics.warn_if_no_signal)

    # ------------------------------------------------------------------------------------------- run

    def close(self) -> None:
        """Release the run lock (idempotent; ``run()`` calls it however it ends)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def run(self) -> dict:
        """Train (or continue) the run; the run lock is released however this ends."""
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> dict:
        cfg, acc = self.cfg, self.acc
        resumed = self._maybe_resume()
        if acc.is_main_process:
            run_dir.write_config(cfg, self.out)
        acc.init_trackers("mmgrpo", config=tracking.flat_hparams(cfg), init_kwargs={"wandb": {"dir": str(self.out)}})
        if not resumed:
            if cfg.eval.before:
                self._evaluate("before")
            if cfg.warmup.steps > 0:
                self._warmup()
        on_policy.configure(self.adapter, cfg)  # μ = 1: the adapter skips its old-log-prob forward where it can
        bar = tracking.progress_bar(cfg, acc, initial=self.state.step)
        t_start = time.perf_counter()
        stop = StopSignal()  # SIGTERM / Ctrl-C: finish the step, checkpoint, return
        try:
            while self.state.step < cfg.steps:
                skipped_before = self._skipped_total
                metrics = self.train_step(self.state.step)
                metrics["optim/skipped_steps"] = float(self._skipped_total - skipped_before)
                self.state.step += 1
                step = self.state.step
                step_metrics.warn_if_no_signal(metrics, step, self.summary, self._no_signal_warned, acc.is_main_process)
                if step % cfg.logging.every == 0 or step == cfg.steps:
                    self._log(metrics, step)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
                if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.steps:
                    self._evaluate(f"step{step}", step=step)
                signalled = stop.received_anywhere(acc)
                if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or step == cfg.stop_after or signalled:
                    saved = self._save(step)
                if signalled and step < cfg.steps:
                    if acc.is_main_process:
                        print(
                            f"mmgrpo: {stop.received or 'signal'} received: saved {saved} at step {step}; "
                            "continue with resume=latest",
                            file=sys.stderr,
                        )
                    bar.close()
                    self._end_training()
                    return self.summary
                if cfg.stop_after is not None and step >= cfg.stop_after:
                    bar.close()
                    self._end_training()
                    return self.summary
        finally:
            stop.restore()
        bar.close()
        self.summary["train/wall_s"] = time.perf_counter() - t_start
        if cfg.eval.after:
            self._evaluate("after")
        self._finish()
        return self.summary

    # ------------------------------------------------------------------------------------- one step

    def train_step(self, step: int) -> dict[str, float]:
        a = self.cfg.algorithm
        t0 = time.perf_counter()
        self._rollout_s = 0.0
        self._sync_engine(step)
        ctx = self._rollout_context(step)  # what the rollout steps may use (mmgrpo/rollout_steps.py)
        first = self._rollout(ctx, self._sample_rows(step), self.sampler.indices(step), ctx.keys(self.cfg.seed))
        batch = rollout_steps.run(self.rollout_steps, ctx, first)  # augmentation, refill, the sampler's observation
        rollout = batch.rollout
        rewards = batch.groups.grid(batch.scores)  # [P, G, K] (G + R under replay; ragged budgets NaN-padded)
        is_weights, engine_metrics = importance.rollout_is_weights(rollout, self.cfg.rollout)  # [B, T] or None
        t2 = time.perf_counter()

        scale = adv_lib.DEFAULT_SCALE[a.estimator] if a.scale == "auto" else a.scale
        advantages, adv_metrics = adv_lib.compute_advantages(
            rewards,
            self.rewards.weights,
            combine=a.combine,
            estimator=a.estimator,
            scale=scale,
            unbiased=a.std_unbiased,
            eps=a.eps,
        )  # [P, G]
        combined = adv_lib.combine_rewards(rewards, self.rewards.weights)  # [P, G]
        shaped = advantage_steps.AdvantageState(advantages, combined, rollout.mask.clone(), rollout, self.adapter)
        shaped.groups = batch.groups
        shaped.metrics = adv_metrics  # transforms → zero-variance filter → shaping → token weights (declared)
        advantage_steps.run(self.advantage_steps, shaped)
        rollout, unit_adv, mask = shaped.rollout, shaped.unit, shaped.mask  # [B, T] each; a step may keep fewer (CPPO)

        beta = schedules.beta_at(a.beta_schedule, step, self.cfg.steps, a.beta, a.beta_schedule_args)
        update_metrics = self._update(rollout, unit_adv, mask, self._ref_logprobs(rollout), beta, is_weights)
        update_metrics["kl/beta"] = torch.tensor(beta)
        t3 = time.perf_counter()

        metrics = {k: float(v) for k, v in {**adv_metrics, **update_metrics, **engine_metrics}.items()}
        metrics.update(batch.metrics)  # the rewards' and the rollout steps' metrics
        metrics.update(step_metrics.completion_summary(rollout, mask))
        metrics.update(
            {
                "perf/rollout_s": self._rollout_s,
                "perf/reward_s": t2 - t0 - self._rollout_s,
                "perf/update_s": t3 - t2,
                **advantage_steps.saved_time(shaped, t3 - t2),  # the samples a step left out (CPPO)
                "perf/step_s": t3 - t0,
                "optim/lr": self.scheduler.get_last_lr()[0],
                "data/skipped_rows": float(self.skipped_rows),
            }
        )
        self.scheduler.step()
        if self.acc.num_processes > 1:
            metrics = step_metrics.reduce_metrics(
                self.acc, metrics, rewards, self.rewards.weights, self.rewards.names, a.std_unbiased
            )
        return metrics

    def _rollout(
        self, ctx: rollout_steps.RolloutContext, rows: list[dict], indices: list[int], keys, n: int = 0
    ) -> rollout_steps.RolloutBatch:
        """The one rollout of the step and of every rollout step: G samples per row (``n`` when given; noise ``keys``),
        the ``sample`` rollout steps (ground-truth injection), then the rewards: a
        :class:`~mmgrpo.rollout_steps.RolloutBatch`."""
        t0 = time.perf_counter()
        units = rollout_steps.plan(self.rollout_steps, ctx, rows, indices, keys, n or self.cfg.algorithm.group_size)
        rollout = self.adapter.rollout(units.rows, units.size, units.keys)  # G per row, or a budget per prompt
        steps_metrics = rollout_steps.apply_sample_steps(self.rollout_steps, ctx, units.rows, rollout)
        self._rollout_s += time.perf_counter() - t0
        scores, metrics = ctx.score(units.rows, rollout.outputs, rollout.extras, units.size)  # [B, K]
        metrics = {**steps_metrics, **metrics}
        return rollout_steps.RolloutBatch(rows, rollout, scores, list(indices), metrics, units.groups)

    def _rollout_context(self, step: int) -> rollout_steps.RolloutContext:
        """The run as the rollout steps see it during ``step``."""
        G, positions = self.cfg.algorithm.group_size, tuple(self.sampler.positions(step))
        keyed = self.cfg.rollout_noise == "keyed"  # noise per (seed, step, global prompt, sample): world-size invariant
        ctx = rollout_steps.RolloutContext(
            step=step,
            group_size=G,
            weights=self.rewards.weights,
            reward_names=self.rewards.names,
            adapter=self.adapter,
            positions=list(positions),
            seed=self.cfg.seed,
            keys=lambda seed, at=positions, n=G: noise.NoiseKeys(seed, step, tuple(at), n) if keyed else None,
            rollout=lambda rows, indices, keys, n=G: self._rollout(ctx, rows, indices, keys, n),  # (ctx: bound below)
            read_rows=lambda indices: self._sample_rows(step, indices),
            n_rows=len(self.task.train_rows()),
            acc=self.acc,
            sampler=self.sampler,
            score=lambda rows, outputs, extras, n=G: score_rows(  # extras: completion_ids; group_index: group-aware
                self.rewards, outputs, rows, n, extras, group_index=True, trainer_state=self._trl_state(step)
            ),
        )
        return ctx

    def _ref_logprobs(self, rollout) -> torch.Tensor | None:
        """The reference policy's log-probs [B, T] where the KL estimator reads them (β > 0), else None."""
        a = self.cfg.algorithm
        if a.beta > 0 and losses.options_class(losses.KL_ESTIMATORS.get(a.kl)).reads == "ref_logprobs":
            return torch.cat(
                [self.adapter.ref_logprobs(rollout, idx).cpu() for idx in self._chunks(rollout.batch_size)]
            )
        return None

    def _sync_engine(self, step: int) -> None:
        """Before the step's rollouts: the rollout engine (if any) gets the policy's weights as version step + 1."""
        if self.engine is not None:
            self._push_engine_weights(version=step + 1)

    def _sample_rows(self, step: int, indices: list[int] | None = None) -> list[dict]:
        """The step's rows (or ``indices``); a row that cannot be read is skipped (warned, counted) for the next one
        in file order."""
        wanted = self.sampler.indices(step) if indices is None else indices
        rows, skipped = warmup.read_rows(self.task.train_rows(), wanted, self._bad_rows)
        self.skipped_rows += skipped
        return rows

    def _chunks(self, n: int, shuffle: bool = False) -> list[torch.Tensor]:
        order = torch.randperm(n) if shuffle else torch.arange(n)
        return list(order.split(self.cfg.algorithm.minibatch_size))

    def _update(
        self,
        rollout,
        unit_adv: torch.Tensor,
        mask: torch.Tensor,
        ref: torch.Tensor | None,
        beta: float | None = None,
        is_weights: torch.Tensor | None = None,
    ) -> dict:
        """μ epochs; each epoch's B samples are split into ``updates_per_epoch`` optimizer updates.

        An update's gradient is that of one loss over all its samples on all processes: minibatch ``mb`` is
        weighted by its share D(mb) / D(update) of the units its aggregation divides by
        (the aggregation options' ``units``, summed over processes), times W because DDP averages gradients over
        the W processes. Logged loss terms are weighted the same way, so they are whole-update values.
        """
        a = self.cfg.algorithm
        beta = a.beta if beta is None else beta  # this step's β (algorithm.beta_schedule)
        surrogate = losses.SURROGATES.get(a.surrogate)
        aggregate = losses.AGGREGATIONS.get(a.aggregation)
        ratio_level = losses.RATIO_LEVELS.get(a.ratio_level)
        kl_fn = losses.KL_ESTIMATORS.get(a.kl)
        opts = losses.resolve_options(a)  # each component's own options (algorithm.surrogate_args, ...)
        grouped = a.surrogate in losses.GROUP_SURROGATES  # the loss needs whole groups per minibatch (config-checked)
        group_kw = {"group_size": a.group_size} if grouped else {}
        sums: dict[str, torch.Tensor] = {}
        maxima: dict[str, torch.Tensor] = {}
        count = 0
        device = self.acc.device
        world = self.acc.num_processes
        for _ in range(a.epochs):
            order = torch.randperm(rollout.batch_size) if a.epochs > 1 else torch.arange(rollout.batch_size)
            if grouped and a.epochs > 1:  # shuffle whole groups, keeping each group's samples together
                G = a.group_size
                order = (torch.randperm(rollout.batch_size // G)[:, None] * G + torch.arange(G)).flatten()
            for update in order.tensor_split(a.updates_per_epoch):
                minibatches = update.split(a.minibatch_size)
                total = opts.aggregation.units(mask[update]).to(device)  # [] this process
                if world > 1:
                    total = self.acc.reduce(total, reduction="sum")  # [] all processes
                for i, idx in enumerate(minibatches):
                    units = opts.aggregation.units(mask[idx]).to(device)  # []
                    share = float(world * units / total) if float(total) > 0 else 0.0
                    sync = i == len(minibatches) - 1
                    with self.acc.no_sync(self.adapter.model) if not sync else nullcontext():
                        logp, fwd = (  # [n, T] with grad; the forward's record (flow: its means) or None
                            self.adapter.logprobs_with_forward(rollout, idx)
                            if isinstance(self.adapter, ForwardRecord)
                            else (self.adapter.logprobs(rollout, idx), None)
                        )
                        m = mask[idx].to(device)  # [n, T]
                        old = on_policy.old_logprobs(rollout.old_logprobs[idx].to(device), logp)  # [n, T]
                        log_ratio = logp - old  # [n, T]
                        if a.ratio_norm:
                            sig = None if rollout.unit_sigmas is None else rollout.unit_sigmas[idx].to(device)
                            extra = self.adapter.ratio_norm_inputs(
                                rollout, idx, fwd
                            )  # std, mean_D Δμ² (config-checked)
                            log_ratio = shaping.ratio_norm(log_ratio, m, sig, **extra)
                        log_ratio = ratio_level(log_ratio, m, chunk_sizes=a.chunk_sizes)
                        per_unit, mets = surrogate(
                            log_ratio, unit_adv[idx].to(device), m, opts.surrogate, **group_kw
                        )  # [n, T]
                        if is_weights is not None:  # engine-sampled units: π_old / π_engine, bounded (TIS)
                            per_unit = per_unit * is_weights[idx].to(device)
                        policy_loss = aggregate(per_unit, m, opts.aggregation, max_units=m.shape[1])
                        loss = policy_loss
                        if a.beta > 0:
                            if opts.kl.reads == "exact_kl":  # closed form from the adapter's transition means
                                reference = self.adapter.exact_kl(rollout, idx, fwd)  # [n, T]
                            else:
                                reference = ref[idx]  # [n, T] reference log-probs
                            kl = kl_fn(logp, reference.to(device), opts.kl) * m  # [n, T]
                            kl_loss = aggregate(kl, m, opts.aggregation, max_units=m.shape[1])
                            loss = loss + beta * kl_loss
                            mets["kl/mean"] = kl_loss.detach()
                        inp = losses.LossTermInputs(logp, old, unit_adv[idx].to(device), m, rollout, idx, self.adapter)
                        extra, term_mets = losses.apply_loss_terms(opts.terms, inp, aggregate, opts.aggregation)
                        loss = loss + extra  # algorithm.loss_terms (LLDS, ...); no terms: + 0, the loss unchanged
                        mets.update(term_mets)
                        self.acc.backward(loss * share)
                    mets["loss/policy"] = policy_loss.detach()
                    for k, v in mets.items():
                        v = v.detach().float().cpu()
                        if k.endswith("_max"):  # a maximum, not a mean: the largest over minibatches
                            maxima[k] = torch.maximum(maxima[k], v) if k in maxima else v
                        else:
                            sums[k] = sums.get(k, 0.0) + share * v
                grad_norm = self._optimizer_step()
                sums["optim/grad_norm"] = sums.get("optim/grad_norm", 0.0) + grad_norm
                count += 1
        return {**{k: v / count for k, v in sums.items()}, **maxima}

    _skipped_total = 0  # optimizer updates skipped for non-finite gradients (this process, this run)
    _skipped_in_a_row = 0

    engine: EngineRollout | None = None  # the rollout engine this trainer owns (rollout.engine: vllm), else None

    def _load_engine(self, sharded: bool) -> EngineRollout | None:
        """The rollout engine (:func:`mmgrpo.loader.load_engine`): a vLLM server's client, vLLM in this process
        (``rollout.vllm_mode: colocate``), or None (``native``)."""
        if self.cfg.rollout.engine == "native":
            return None
        if sharded:
            raise ConfigError("rollout.engine: vllm does not push FSDP-sharded weights yet; use DDP processes")
        if self.cfg.rollout.vllm_mode == "colocate" and self.acc.num_processes > 1:
            raise ConfigError(
                "rollout.vllm_mode: colocate runs one training process (one engine per process is not wired); "
                "launch one process, or use rollout.vllm_mode: server with several"
            )
        return load_engine(self.cfg)

    def _push_engine_weights(self, version: int) -> None:
        """Send the policy's current weights to the rollout engine as ``version`` (process 0; the others wait and
        expect that version in the engine's answers)."""
        if self.acc.is_main_process:
            self.engine.push_model(self.adapter.model, version)
        else:
            self.engine.version = version
        self.acc.wait_for_everyone()

    def _optimizer_step(self) -> torch.Tensor:
        """Clip and step; an update whose gradient norm is NaN/inf is skipped (gradients dropped, weights kept).

        The norm is computed after DDP's gradient all-reduce, so every process takes the same decision.
        ``optim.max_skipped_steps`` skipped updates in a row stop the run with an error.
        """
        max_norm = self.cfg.optim.max_grad_norm
        params = self.adapter.trainable_parameters()
        if max_norm > 0:
            norm = self.acc.clip_grad_norm_(params, max_norm)
        elif self.acc.distributed_type == DistributedType.FSDP:  # sharded gradients: the norm over all shards
            norm = self.acc.clip_grad_norm_(params, math.inf)  # a factor of 1: nothing is clipped
        else:
            grads = [p.grad.norm() for p in params if p.grad is not None]
            norm = torch.stack(grads).norm() if grads else torch.zeros(())
        norm = torch.as_tensor(norm).detach().float().cpu()
        if not bool(torch.isfinite(norm)):
            self.optimizer.zero_grad(set_to_none=True)
            self._raise_if_weights_diverged(norm)
            self._skipped_total += 1
            self._skipped_in_a_row += 1
            limit = self.cfg.optim.max_skipped_steps
            if self._skipped_in_a_row >= limit:
                raise FloatingPointError(
                    f"{limit} optimizer updates in a row had non-finite gradients (norm {float(norm)}), stopping; "
                    "check the rewards for NaN/inf and lower optim.lr (checkpoints hold the last finite weights)"
                )
            if self.acc.is_main_process:
                logger.warning(
                    "optimizer update skipped: gradient norm is %s (%d in a row, limit %d)",
                    float(norm),
                    self._skipped_in_a_row,
                    limit,
                )
            return norm
        self._skipped_in_a_row = 0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _raise_if_weights_diverged(self, norm: torch.Tensor) -> None:
        """A non-finite gradient from non-finite *weights* (a finite update too large for them, e.g. a huge
        ``optim.lr``) cannot be skipped away: stop at once and say so (checked only on the skip path)."""
        model = self.acc.unwrap_model(self.adapter.model)
        bad = ckpt.non_finite_parameters(model)
        if self.acc.num_processes > 1:
            bad = sorted({n for names in gather_object([bad]) for n in names})
        if bad:
            raise FloatingPointError(
                f"the policy's weights are no longer finite ({len(bad)} tensor(s), first: {bad[0]}) after an update "
                f"at optim.lr={self.cfg.optim.lr}, so its samples and gradients are NaN (norm {float(norm)}); lower "
                "optim.lr (the checkpoints hold the last finite weights)"
            )

    # ----------------------------------------------------------------------------- warm-up & evaluation

    def _warmup(self) -> None:
        """Optional supervised warm-up (e.g. output format); evaluated as its own stage ``eval/warmup/*``."""
        if not isinstance(self.adapter, SupervisedLoss):  # checked at load (preflight, config); a last guard
            raise ConfigError(f"warmup.steps > 0 but model.adapter {self.cfg.model.adapter!r} has no supervised_loss()")
        rows = self.task.train_rows() if self.cfg.warmup.target_column else self.task.warmup_rows(self.cfg.seed)
        self.skipped_rows += warmup.supervised_warmup(self.cfg, self.acc, self.adapter, rows)
        self.state.warmup_done = True
        if isinstance(self.adapter, SyncReference):  # the KL anchors to the warmed-up policy
            self.adapter.sync_reference()
        self._evaluate("warmup")
        if self.cfg.checkpoint.after_warmup:  # step-0: resumable, and its model/ can start other runs
            self._save(0)

    def _evaluate(self, stage: str, step: int | None = None) -> dict[str, float]:
        """Held-out evaluation as stage ``eval/<stage>/*`` (:mod:`mmgrpo.evaluation`): the task's metric, or the
        configured rewards where the task has none."""
        rows = evaluation.held_out_rows(self.task.eval_rows(), self.cfg.eval.max_rows)
        if not rows:
            return {}
        outputs = evaluation.generate(self.acc, self.adapter, rows, self.cfg.eval.batch_size)
        scores = self.task.score([o for _, o in outputs], rows)
        if scores is None:  # no task metric: the configured rewards, each and combined
            scores = self._reward_scores([o for _, o in outputs], rows)
        scores = {**scores, **pass_at_k.sampled(self.acc, self.adapter, self.task, rows, self.cfg.eval, self.cfg.seed)}
        result = {f"eval/{stage}/{k}": float(v) for k, v in scores.items()}
        self.summary.update(result)
        if self.acc.is_main_process:
            record_step = step if step is not None else self.state.step
            evaluation.record(self.acc, self.out, stage, result, rows, outputs, record_step, self.state.step)
        self.acc.log(result, step=self.state.step)
        return result

    def _reward_scores(self, outputs: list, rows: list[dict]) -> dict[str, float]:
        """The configured rewards' held-out means, scored through the training path with the outputs' reward columns
        (:func:`mmgrpo.evaluation.reward_scores`)."""
        state = self._trl_state(self.state.step)
        return evaluation.reward_scores(self.rewards, self.adapter, outputs, rows, trainer_state=state)

    def _trl_state(self, step: int):
        """What TRL passes its rewards as ``trainer_state``: a ``transformers.TrainerState`` (steps completed so far,
        the run's total, epochs over the training rows), for rewards that shape by training progress."""
        from transformers import TrainerState

        n = max(1, len(self.task.train_rows()))
        seen = step * self.cfg.algorithm.prompts_per_step * self.acc.num_processes
        return TrainerState(global_step=step, max_steps=self.cfg.steps, epoch=seen / n)

    # ----------------------------------------------------------------------------------- bookkeeping

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.acc.log(metrics, step=step)
        if self.acc.is_main_process:
            tracking.append_jsonl(self.out / "metrics.jsonl", {"step": step, **metrics})

    def _maybe_resume(self) -> bool:
        """Load the checked checkpoint (:func:`mmgrpo.run_dir.load_checkpoint`); cut ``metrics.jsonl`` to its step."""
        if self._resume_dir is None:
            return False
        opt, sched = self.optimizer, self.scheduler
        saved = run_dir.load_checkpoint(self.cfg, self.acc, self.adapter, opt, sched, self._resume_dir)
        self.state.load_state_dict(saved)
        if "sampler" in saved:  # variance-aware samplers' statistics
            self.sampler.load_state_dict(saved["sampler"])
        rollout_steps.load_state_dict(self.rollout_steps, saved, self.acc)  # the steps' memory (replay buffers)
        if self.acc.is_main_process:
            run_dir.truncate_jsonl(self.out / "metrics.jsonl", self.state.step)
        self.acc.wait_for_everyone()
        self.summary.update(run_dir.saved_summary(self.out))
        return True

    def _save(self, step: int, final: bool = False) -> Path:
        """Checkpoint with the optimizer, scheduler, trainer state, config and model card (all processes)."""
        return ckpt.save(
            self.acc,
            self.adapter,
            self.out,
            step,
            keep_last=self.cfg.checkpoint.keep_last,
            final=final,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            trainer_state={  # + a stateful sampler's statistics (algorithm.sampler: variance)
                **self.state.state_dict(),
                **({"sampler": self.sampler.state_dict()} if self.sampler.observes else {}),
                **rollout_steps.state_dict(self.rollout_steps, self.acc),  # the steps' memory (a collective)
            },
            config_text=dump_config(self.cfg),
            model_files=run_dir.model_files(self.cfg, self.adapter, step),
            sharded=self.cfg.checkpoint.sharded,
        )

    def _finish(self) -> None:
        acc, cfg = self.acc, self.cfg
        if cfg.checkpoint.save_final:
            self._save(self.state.step, final=True)
        if acc.is_main_process:
            run_dir.write_summary(cfg, self.out, self.summary, self.state.step)
        self._end_training()

    def _end_training(self) -> None:
        """Stop the rollout engine, then accelerate (trackers, process group): a colocated vLLM tears down the
        torch.distributed group it made in this process itself, before accelerate destroys it under vLLM."""
        if self.engine is not None:
            self.engine.close()
        self.acc.end_training()


def train(cfg: TrainConfig) -> dict:
    """Run training as configured; returns the summary (eval/before|warmup|after/*, train/*)."""
    return Trainer(cfg).run()
