"""The training loop: sample → reward → advantage → update → log, on accelerate. Reads top to bottom.

One step (DESIGN.md §3):
  1. ``adapter.rollout(rows, G)``: B = P·G samples with ``old_logprobs [B, T]`` (no grad).
  2. rewards ``[P, G, K]`` from the reward runner (NaN = not applicable).
  3. advantages ``[P, G]`` (estimator, scale, multi-reward combination), optional zero-variance filter,
     then per-unit shaping to ``[B, T]``.
  4. μ epochs × ``updates_per_epoch`` optimizer updates, each accumulating gradients over minibatches:
     log-ratio → ratio level → surrogate → aggregation (+ β·KL) → backward; clip; step.
  5. metrics to ``metrics.jsonl`` and the accelerate trackers; checkpoints (atomic) every N steps.

Each process holds whole groups (P prompts per process), so group statistics never cross processes.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, gather_object, set_seed

from mmgrpo import advantages as adv_lib
from mmgrpo import checkpoint as ckpt
from mmgrpo import losses, shaping
from mmgrpo.config import ConfigError, TrainConfig, dump_config
from mmgrpo.plugins import ADAPTERS, TASKS, load_builtins


@dataclass
class TrainerState:
    """What resume needs beyond model/optimizer/RNG: registered with accelerate for checkpointing."""

    step: int = 0  # GRPO steps completed
    warmup_done: bool = False

    def state_dict(self) -> dict:
        return {"step": self.step, "warmup_done": self.warmup_done}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.warmup_done = int(state["step"]), bool(state["warmup_done"])


class PromptSampler:
    """Deterministic prompt order: epoch e is a permutation seeded by (seed, e); the position is step-derived.

    Process r takes prompts [r·P, (r+1)·P) of each global batch of W·P, so resuming at a step reproduces the
    exact prompts an uninterrupted run would have seen.
    """

    def __init__(self, n_rows: int, prompts_per_step: int, world: int, rank: int, seed: int):
        self.n, self.P, self.world, self.rank, self.seed = n_rows, prompts_per_step, world, rank, seed

    def indices(self, step: int) -> list[int]:
        start = (step * self.world + self.rank) * self.P
        out = []
        for pos in range(start, start + self.P):
            epoch, offset = divmod(pos, self.n)
            perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100003 + epoch))
            out.append(int(perm[offset]))
        return out


def lr_lambda(step: int, warmup: int, total: int, schedule: str) -> float:
    """Learning-rate multiplier: linear warm-up over ``warmup`` steps, then constant / cosine / linear decay."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    return 1.0


def reward_columns(rows: list[dict], group_size: int, extras: dict[str, list]) -> tuple[list, dict[str, list]]:
    """Prompts and dataset columns repeated G times (group-major), as the reward functions receive them."""
    prompts = [row["prompt"] for row in rows for _ in range(group_size)]
    keys = [k for k in rows[0] if k != "prompt"]
    columns = {k: [row.get(k) for row in rows for _ in range(group_size)] for k in keys}
    columns.update(extras)
    return prompts, columns


class Trainer:
    """Holds the pieces of one run; ``run()`` executes it. See the module docstring for the step."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self.acc = Accelerator(
            log_with=cfg.logging.trackers or None,
            project_config=ProjectConfiguration(project_dir=str(self.out), logging_dir=str(self.out / "logs")),
        )
        load_builtins()
        set_seed(cfg.seed)
        self.task = TASKS.get(cfg.task.name)(cfg.task.args, seed=cfg.seed)
        self.adapter = ADAPTERS.get(cfg.model.adapter)(
            cfg.model.args,
            seed=cfg.seed,
            lora=cfg.model.lora,
            dtype=cfg.model.dtype,
            need_reference=cfg.algorithm.beta > 0,
        )
        from mmgrpo.rewards import RewardRunner

        rt = cfg.reward_runtime
        self.rewards = RewardRunner(
            [(r.name, r.weight, r.kwargs) for r in cfg.rewards],
            timeout_s=rt.timeout_s,
            on_error=rt.on_error,
            max_workers=rt.workers,
            reward_types=[r.reward_types for r in cfg.rewards],
        )
        if cfg.algorithm.kl == "gaussian_exact" and not hasattr(self.adapter, "exact_kl"):
            raise ConfigError(
                f"algorithm.kl: gaussian_exact needs an adapter with Gaussian transitions (flow); "
                f"{cfg.model.adapter!r} has none, use k1, k2 or k3"
            )
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.adapter.trainable_parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_lambda(s, o.warmup_steps, cfg.steps, o.schedule)
        )
        self.adapter.model, self.optimizer = self.acc.prepare(self.adapter.model, self.optimizer)
        self.state = TrainerState()
        self.acc.register_for_checkpointing(self.scheduler, self.state)
        if getattr(self.adapter, "reference", None) is not None:  # a frozen copy, synced after warm-up: save it
            self.acc.register_for_checkpointing(self.adapter.reference)
        self.sampler = PromptSampler(
            len(self.task.train_rows()), cfg.algorithm.prompts_per_step, self.acc.num_processes,
            self.acc.process_index, cfg.seed,
        )  # fmt: skip
        set_seed(cfg.seed, device_specific=True)  # different sampling noise per process, same weights
        self.summary: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------- run

    def run(self) -> dict:
        cfg, acc = self.cfg, self.acc
        if acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            ckpt.atomic_write_text(self.out / "config.yaml", dump_config(cfg))
        resumed = self._maybe_resume()
        acc.init_trackers("mmgrpo", config=_flat_hparams(cfg))
        if not resumed:
            if cfg.eval.before:
                self._evaluate("before")
            if cfg.warmup.steps > 0:
                self._warmup()
        bar = _progress(cfg, acc, initial=self.state.step)
        t_start = time.perf_counter()
        while self.state.step < cfg.steps:
            metrics = self.train_step(self.state.step)
            self.state.step += 1
            step = self.state.step
            if step % cfg.logging.every == 0 or step == cfg.steps:
                self._log(metrics, step)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.steps:
                self._evaluate(f"step{step}", step=step)
            if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or step == cfg.stop_after:
                ckpt.save(acc, self.adapter, self.out, step, keep_last=cfg.checkpoint.keep_last)
            if cfg.stop_after is not None and step >= cfg.stop_after:
                bar.close()
                acc.end_training()
                return self.summary
        bar.close()
        self.summary["train/wall_s"] = time.perf_counter() - t_start
        if cfg.eval.after:
            self._evaluate("after")
        self._finish()
        return self.summary

    # ------------------------------------------------------------------------------------- one step

    def train_step(self, step: int) -> dict[str, float]:
        cfg, a = self.cfg, self.cfg.algorithm
        t0 = time.perf_counter()
        rows = [self.task.train_rows()[i] for i in self.sampler.indices(step)]
        rollout = self.adapter.rollout(rows, a.group_size)
        t1 = time.perf_counter()

        prompts, columns = reward_columns(rows, a.group_size, rollout.extras)
        scores, reward_metrics = self.rewards(rollout.outputs, prompts, columns)  # [B, K]
        rewards = scores.view(len(rows), a.group_size, -1)  # [P, G, K]
        t2 = time.perf_counter()

        scale = adv_lib.DEFAULT_SCALE[a.estimator] if a.scale == "auto" else a.scale
        advantages, adv_metrics = adv_lib.compute_advantages(
            rewards, self.rewards.weights, combine=a.combine, estimator=a.estimator, scale=scale,
            unbiased=a.std_unbiased, eps=a.eps,
        )  # [P, G]  # fmt: skip
        combined = adv_lib.combine_rewards(rewards, self.rewards.weights)  # [P, G]
        mask = rollout.mask.clone()  # [B, T]
        if a.filter_zero_variance:
            keep = ~adv_lib.zero_variance_groups(combined)  # [P]
            mask = mask * keep.repeat_interleave(a.group_size)[:, None].float()
            adv_metrics["advantage/kept_group_fraction"] = keep.float().mean()
        inputs = shaping.ShapingInputs(mask, combined, rollout.unit_sigmas, rollout.unit_values)
        unit_adv = shaping.shape_advantages(a.shaping, advantages, inputs, a.shaping_args)  # [B, T]
        ref = None
        if a.beta > 0 and a.kl != "gaussian_exact":  # sample-based estimators need reference log-probs
            ref = torch.cat([self.adapter.ref_logprobs(rollout, idx).cpu() for idx in self._chunks(rollout.batch_size)])

        update_metrics = self._update(rollout, unit_adv, mask, ref)
        t3 = time.perf_counter()

        metrics = {k: float(v) for k, v in {**adv_metrics, **update_metrics}.items()}
        metrics.update(reward_metrics)
        metrics.update(_completion_summary(rollout, mask))
        metrics.update(
            {
                "perf/rollout_s": t1 - t0,
                "perf/reward_s": t2 - t1,
                "perf/update_s": t3 - t2,
                "perf/step_s": t3 - t0,
                "optim/lr": self.scheduler.get_last_lr()[0],
            }
        )
        self.scheduler.step()
        return metrics

    def _chunks(self, n: int, shuffle: bool = False) -> list[torch.Tensor]:
        order = torch.randperm(n) if shuffle else torch.arange(n)
        return list(order.split(self.cfg.algorithm.minibatch_size))

    def _update(self, rollout, unit_adv: torch.Tensor, mask: torch.Tensor, ref: torch.Tensor | None) -> dict:
        """μ epochs; each epoch's B samples are split into ``updates_per_epoch`` optimizer updates."""
        a = self.cfg.algorithm
        surrogate = losses.SURROGATES.get(a.surrogate)
        aggregate = losses.AGGREGATIONS.get(a.aggregation)
        ratio_level = losses.RATIO_LEVELS.get(a.ratio_level)
        kl_fn = None if a.kl == "gaussian_exact" else losses.KL_ESTIMATORS.get(a.kl)
        sums: dict[str, torch.Tensor] = {}
        count = 0
        device = self.acc.device
        for _ in range(a.epochs):
            order = torch.randperm(rollout.batch_size) if a.epochs > 1 else torch.arange(rollout.batch_size)
            for update in order.tensor_split(a.updates_per_epoch):
                minibatches = update.split(a.minibatch_size)
                for i, idx in enumerate(minibatches):
                    sync = i == len(minibatches) - 1
                    with self.acc.no_sync(self.adapter.model) if not sync else nullcontext():
                        logp = self.adapter.logprobs(rollout, idx)  # [n, T] with grad
                        m = mask[idx].to(device)  # [n, T]
                        log_ratio = logp - rollout.old_logprobs[idx].to(device)  # [n, T]
                        if a.ratio_norm:
                            sig = None if rollout.unit_sigmas is None else rollout.unit_sigmas[idx].to(device)
                            hook = getattr(self.adapter, "ratio_norm_inputs", None)  # flow: std, mean_D Δμ²
                            extra = hook(rollout, idx) if hook is not None else {}
                            log_ratio = shaping.ratio_norm(log_ratio, m, sig, **extra)
                        log_ratio = ratio_level(log_ratio, m, chunk_sizes=a.chunk_sizes)
                        per_unit, mets = surrogate(
                            log_ratio, unit_adv[idx].to(device), m, clip_low=a.clip_low, clip_high=a.clip_high,
                            dual_clip=a.dual_clip, tau_pos=a.tau_pos, tau_neg=a.tau_neg,
                        )  # [n, T]  # fmt: skip
                        policy_loss = aggregate(per_unit, m, max_units=m.shape[1])
                        loss = policy_loss
                        if a.beta > 0:
                            if a.kl == "gaussian_exact":  # closed form from the adapter's transition means
                                kl = self.adapter.exact_kl(rollout, idx).to(device) * m  # [n, T]
                            else:
                                kl = kl_fn(logp, ref[idx].to(device)) * m  # [n, T]
                            kl_loss = aggregate(kl, m, max_units=m.shape[1])
                            loss = loss + a.beta * kl_loss
                            mets["kl/mean"] = kl_loss.detach()
                        self.acc.backward(loss * (len(idx) / len(update)))
                    mets["loss/policy"] = policy_loss.detach()
                    for k, v in mets.items():
                        sums[k] = sums.get(k, 0.0) + v.detach().float()
                    count += 1
                grad_norm = self._optimizer_step()
                sums["optim/grad_norm"] = sums.get("optim/grad_norm", 0.0) + grad_norm * len(minibatches)
        return {k: v / count for k, v in sums.items()}

    def _optimizer_step(self) -> torch.Tensor:
        max_norm = self.cfg.optim.max_grad_norm
        params = self.adapter.trainable_parameters()
        if max_norm > 0:
            norm = self.acc.clip_grad_norm_(params, max_norm)
        else:
            grads = [p.grad.norm() for p in params if p.grad is not None]
            norm = torch.stack(grads).norm() if grads else torch.zeros(())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return torch.as_tensor(norm).detach().float().cpu()

    # ----------------------------------------------------------------------------- warm-up & evaluation

    def _warmup(self) -> None:
        """Optional supervised warm-up (e.g. output format); evaluated as its own stage ``eval/warmup/*``."""
        w = self.cfg.warmup
        if not hasattr(self.task, "warmup_rows") or not hasattr(self.adapter, "supervised_loss"):
            raise ValueError(f"warmup.steps > 0 but task {self.cfg.task.name!r} or the adapter has no warm-up")
        rows = self.task.warmup_rows(self.cfg.seed)
        rng = random.Random(self.cfg.seed * 7 + self.acc.process_index)
        opt = torch.optim.AdamW(self.adapter.trainable_parameters(), lr=w.lr)
        bar = _progress(self.cfg, self.acc, total=w.steps, desc="warm-up")
        for _ in range(w.steps):
            loss = self.adapter.supervised_loss(rng.sample(rows, min(w.batch_size, len(rows))))
            self.acc.backward(loss)
            self.acc.clip_grad_norm_(self.adapter.trainable_parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
        bar.close()
        self.state.warmup_done = True
        if hasattr(self.adapter, "sync_reference"):  # the KL anchors to the warmed-up policy
            self.adapter.sync_reference()
        self._evaluate("warmup")

    def _evaluate(self, stage: str, step: int | None = None) -> dict[str, float]:
        rows = self.task.eval_rows()[: self.cfg.eval.max_rows]
        outputs = []
        with self.acc.split_between_processes(list(range(len(rows)))) as mine:
            for start in range(0, len(mine), self.cfg.eval.batch_size):
                batch = [rows[i] for i in mine[start : start + self.cfg.eval.batch_size]]
                outputs += list(zip(mine[start : start + len(batch)], self.adapter.evaluate(batch)))
        outputs = sorted(gather_object(outputs), key=lambda t: t[0])
        scores = self.task.score([o for _, o in outputs], rows)
        result = {f"eval/{stage}/{k}": float(v) for k, v in scores.items()}
        self.summary.update(result)
        if self.acc.is_main_process:
            _append_jsonl(self.out / "metrics.jsonl", {"step": step if step is not None else self.state.step, **result})
            from mmgrpo import media  # text inline, images/video/audio as files next to samples_<stage>.json

            samples = media.write_samples(self.out, stage, [(rows[i], o) for i, o in outputs[:8]], step=self.state.step)
            media.log_samples(self.acc, stage, samples, self.out, self.state.step)
        self.acc.log(result, step=self.state.step)
        return result

    # ----------------------------------------------------------------------------------- bookkeeping

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.acc.log(metrics, step=step)
        if self.acc.is_main_process:
            _append_jsonl(self.out / "metrics.jsonl", {"step": step, **metrics})

    def _maybe_resume(self) -> bool:
        if not self.cfg.resume:
            return False
        directory = ckpt.find(self.out, self.cfg.resume)
        self.acc.load_state(str(directory))
        summary_path = self.out / "summary.json"
        if summary_path.is_file():
            self.summary.update(json.loads(summary_path.read_text()))
        return True

    def _finish(self) -> None:
        acc, cfg = self.acc, self.cfg
        if cfg.checkpoint.save_final:
            ckpt.save(acc, self.adapter, self.out, self.state.step, keep_last=cfg.checkpoint.keep_last, final=True)
        if acc.is_main_process:
            history = [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines()]
            rewards = [h["reward/mean"] for h in history if "reward/mean" in h]
            if rewards:
                tail = rewards[-max(1, len(rewards) // 10) :]
                self.summary["train/reward_first"] = rewards[0]
                self.summary["train/reward_last10pct"] = sum(tail) / len(tail)
            self.summary["train/steps"] = self.state.step
            ckpt.atomic_write_text(self.out / "summary.json", json.dumps(self.summary, indent=2, sort_keys=True))
            if cfg.logging.plot:
                from mmgrpo.plotting import plot_reward_curve

                plot_reward_curve(history, self.out / "reward_curve.png", title=cfg.output_dir)
        acc.end_training()


def _completion_summary(rollout, mask: torch.Tensor) -> dict[str, float]:
    """completion/* statistics (reward/* come from ``compute_advantages``)."""
    lengths = rollout.mask.sum(dim=1)  # [B]
    return {
        "completion/units_mean": float(lengths.mean()),
        "completion/truncated_fraction": float(rollout.truncated.float().mean()),
        "completion/trained_fraction": float((mask.sum(1) > 0).float().mean()),
    }


def _append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _flat_hparams(cfg: TrainConfig) -> dict:
    """Scalars of the config, flattened with dots (what TensorBoard's hparams accept)."""
    from mmgrpo.config import to_dict

    flat: dict = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(node, (int, float, str, bool)):
            flat[prefix] = node

    walk("", to_dict(cfg))
    return flat


def _progress(cfg: TrainConfig, acc: Accelerator, initial: int = 0, total: int | None = None, desc: str = "grpo"):
    from tqdm.auto import tqdm

    return tqdm(
        total=total if total is not None else cfg.steps,
        initial=initial,
        desc=desc,
        disable=not (cfg.logging.progress and acc.is_main_process),
        dynamic_ncols=True,
    )


def train(cfg: TrainConfig) -> dict:
    """Run training as configured; returns the summary (eval/before|warmup|after/*, train/*)."""
    return Trainer(cfg).run()
