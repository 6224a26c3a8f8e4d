"""Replay of past completions into the group: RePO's replay buffer and AVATAR's reward-diverse off-policy replay.

RePO (Li et al. 2025, "RePO: Replay-Enhanced Policy Optimization", arXiv 2506.09340; seed 002:27) keeps, per prompt,
a bounded buffer of the completions sampled at earlier steps and adds ``R`` of them, chosen by a replay strategy, to
the prompt's G fresh samples: the objective is J_on(θ) + J_off(θ; S) (§3, the objective's two terms; the public code,
``SihengLi99/RePO`` ``src/replay_grpo_trainer.py``: ``_replay_step``, ``_update_cache``, ``_compute_loss``). AVATAR
(Kulkarni & Fazli 2025, "AVATAR: Reinforcement Learning to See, Hear, and Reason Over Video", arXiv 2508.03100;
seed 002:55) reuses past experiences "with greater reward diversity" to resolve vanishing advantages (abstract; its
``StratifiedReplayBuffer`` in ``yogkul2000/AVATAR`` ``ms-swift/swift/rlhf_trainers/grpo_tas_trainer.py``).

What is implemented (``algorithm.rollout_steps: {replay: {...}}``, a ``batch`` rollout step):

* the buffer: per dataset row (the sampler's index), the last ``buffer_size`` finished completions (text, their K
  reward scores, the step, the behaviour policy's log-probs μ of their units), entries older than ``max_staleness``
  steps dropped (RePO's deque ``max_cache_size``; the staleness bound is ours: RePO bounds only the size);
* retrieval before this step's samples enter the buffer (RePO: ``_replay_step`` then ``_update_cache``), ``R =
  num_replays`` entries per group by ``select``:

  - ``recent``: the R newest (RePO ``recent_k``, "recency-based");
  - ``highest``: the R with the largest combined reward (RePO ``highest_k``, "reward-oriented");
  - ``reward_diverse``: the R-subset whose combined rewards have the largest population variance, ties to the
    larger sum (RePO ``max_variance_k``, "variance-driven"; AVATAR's "greater reward diversity" — its stratified
    difficulty tiers are not implemented);

* the replayed completions join the group, which becomes G + R samples; the advantage is the configured estimator
  over all G + R (RePO's ``adv_norm_mode: mixed``; the paper's Figure 1 normalises on- and off-policy samples
  separately, its ``split`` mode, which is not implemented here). A group with fewer than R eligible entries fills
  the rest with masked slots (NaN rewards, mask 0: no statistic, no loss);
* each replayed text is teacher-forced into its slot (:class:`mmgrpo.injection.TeacherForcing`), which gives its
  units and π_old, the current policy's log-probs; ``correction`` then sets the importance correction:

  - ``clip`` (RePO's code, AVATAR's code): the slot's old log-probs are the stored μ, so the surrogate's ratio is
    π_θ / μ and PPO's clip bounds it (``_compute_loss``: ``old_per_token_logps`` of the buffer);
  - ``truncate``: old log-probs stay π_old (ratio 1 before the update) and each unit is weighted by
    min(π_old / μ, C) (:func:`mmgrpo.importance.engine_is_weights`, through ``Rollout.engine_logprobs``: the
    ``rollout.is_mode`` / ``is_clip_max`` settings apply; the ``engine/*`` metrics then measure the replay);
  - ``none``: trained as if on-policy (ratio against π_old, no weight).

Departures (our reading, the paper's J_off equation could not be retrieved verbatim): one aggregation over on- and
off-policy samples (RePO aggregates them separately and weights the off-policy loss by ``off_policy_loss_coef``; with
coefficient 1 and ``seq_mean_token_mean`` the two agree up to the G / (G + R) share); the KL term covers replayed
samples too (RePO: on-policy only). A completion is stored only when it finished (EOS) and its text re-encodes to
the same number of units, so its μ aligns with the teacher-forced units. Token families only (VLM, video,
audio_llm: ``inject`` and ``merge_states``); single-turn only.

Shape glossary: ``P`` prompts, ``G`` fresh samples per group, ``R`` replayed slots, ``K`` rewards, ``T`` units.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from accelerate.utils import gather_object
from torch import Tensor

from mmgrpo import advantages as adv_lib
from mmgrpo.config import ConfigError, Range
from mmgrpo.losses import GROUP_SURROGATES
from mmgrpo.types import Rollout

DIVERSE_MAX_BUFFER = 16
"""``reward_diverse`` searches every R-subset of the buffer: at most C(16, 8) = 12870 subsets per group."""


@dataclass(frozen=True)
class ReplayOptions:
    """``algorithm.rollout_steps.replay`` (RePO, AVATAR; see the module docstring)."""

    buffer_size: Annotated[int, Range(ge=1)] = 8
    """Completions kept per dataset row (the oldest go first; RePO ``max_cache_size``)."""
    max_staleness: Annotated[int, Range(ge=1)] = 8
    """Entries sampled more than this many steps ago are dropped (never replayed)."""
    num_replays: Annotated[int, Range(ge=1)] = 2
    """R: replayed slots added to each group of G (RePO ``num_replays``)."""
    select: Literal["recent", "highest", "reward_diverse"] = "recent"
    """Which R entries a group replays: the newest, the highest combined reward, or the most diverse rewards
    (the R-subset of largest reward variance)."""
    correction: Literal["clip", "truncate", "none"] = "clip"
    """Importance correction of the replayed samples: ``clip``: ratio π_θ/μ with PPO's clip (RePO); ``truncate``:
    ratio π_θ/π_old times min(π_old/μ, rollout.is_clip_max) (rollout.is_mode); ``none``: no correction."""

    def __post_init__(self) -> None:
        if self.num_replays > self.buffer_size:
            raise ConfigError(
                f"algorithm.rollout_steps.replay.num_replays={self.num_replays} exceeds "
                f"buffer_size={self.buffer_size}; raise buffer_size or lower num_replays"
            )
        if self.select == "reward_diverse" and self.buffer_size > DIVERSE_MAX_BUFFER:
            raise ConfigError(
                f"algorithm.rollout_steps.replay.buffer_size={self.buffer_size}: select=reward_diverse searches every "
                f"subset, at most buffer_size={DIVERSE_MAX_BUFFER}; lower buffer_size"
            )


# ------------------------------------------------------------------------------------------- pure selection


def eligible(entries: list[dict], step: int, max_staleness: int) -> list[dict]:
    """The entries sampled at an earlier step, at most ``max_staleness`` steps ago (oldest first)."""
    return [e for e in entries if 0 < step - e["step"] <= max_staleness]


def choose(rewards: list[float], k: int, rule: str) -> list[int]:
    """Indices (ascending) of the ``k`` entries replayed from a buffer with combined ``rewards`` (oldest first).

    ``recent``: the last k; ``highest``: the k largest rewards (ties: the newer); ``reward_diverse``: the k-subset of
    largest population variance of its rewards, ties to the larger sum, then to the first in lexicographic order
    (RePO ``max_variance_k``)."""
    n = len(rewards)
    k = min(k, n)
    if rule == "recent":
        return list(range(n - k, n))
    if rule == "highest":
        order = sorted(range(n), key=lambda i: (rewards[i], i), reverse=True)
        return sorted(order[:k])
    best, best_key = (), None
    for subset in itertools.combinations(range(n), k):
        r = torch.tensor([rewards[i] for i in subset], dtype=torch.float64)  # [k]
        key = (float(r.var(unbiased=False)) if k > 1 else 0.0, float(r.sum()))
        if best_key is None or key > best_key:
            best, best_key = subset, key
    return list(best)


def remember(entries: list[dict], new: list[dict], step: int, o: ReplayOptions) -> list[dict]:
    """The row's buffer after adding ``new`` at ``step``: stale entries dropped, the newest ``buffer_size`` kept."""
    kept = [e for e in entries + new if step - e["step"] < o.max_staleness]  # still eligible at the next step
    return kept[-o.buffer_size :]


# ------------------------------------------------------------------------------------------- the group


def expand(adapter: Any, rollout: Rollout, R: int) -> Rollout:
    """The rollout with R extra slots after each group's G samples (copies of its first samples, to be replaced).

    Shape:
        rollout: B = P·G samples → P·(G + R)
    """
    P, G = rollout.batch_size // rollout.group_size, rollout.group_size
    source = (torch.arange(P)[:, None] * G + torch.cat([torch.arange(G), torch.arange(R) % G])).flatten()  # [P(G+R)]
    pick = lambda t: None if t is None else t[source].clone()
    return Rollout(
        outputs=[rollout.outputs[i] for i in source.tolist()],
        old_logprobs=pick(rollout.old_logprobs),
        mask=pick(rollout.mask),
        group_size=G + R,
        prompt_index=torch.arange(P).repeat_interleave(G + R),
        truncated=pick(rollout.truncated),
        state=adapter.merge_states([(rollout.state, source, torch.arange(P))]),
        unit_sigmas=pick(rollout.unit_sigmas),
        unit_values=pick(rollout.unit_values),
        engine_logprobs=pick(rollout.engine_logprobs),
        turn_of_token=pick(rollout.turn_of_token),
        extras={key: [col[i] for i in source.tolist()] for key, col in rollout.extras.items()},
    )


def place(values: list[float], mask: Tensor) -> Tensor:
    """``values`` (one per valid unit) written at the valid units of ``mask``, 0 elsewhere. Shape: [T] → [T]."""
    out = torch.zeros_like(mask, dtype=torch.float32)  # [T]
    out[mask > 0] = torch.tensor(values, dtype=torch.float32)
    return out


# ------------------------------------------------------------------------------------------- the step


def _fresh_entries(ctx: Any, batch: Any) -> dict[str, list[dict]]:
    """This step's finished completions as buffer entries, by dataset row (strings: JSON keys)."""
    r, G = batch.rollout, batch.rollout.group_size
    units = r.mask.sum(1).long().tolist()  # [B]
    ids = ctx.adapter.tokenizer(list(r.outputs), add_special_tokens=False)["input_ids"]
    out: dict[str, list[dict]] = {}
    for b, text in enumerate(r.outputs):
        if bool(r.truncated[b]) or len(ids[b]) + 1 != units[b]:  # no EOS, or the text re-encodes differently
            continue
        out.setdefault(str(batch.indices[b // G]), []).append(
            {
                "text": text,
                "scores": batch.scores[b].tolist(),  # [K]
                "step": ctx.step,
                "logprobs": r.old_logprobs[b][r.mask[b] > 0].tolist(),  # μ of its valid units
            }
        )
    return out


def _combined(scores: list[list[float]], weights: Tensor) -> list[float]:
    """Combined rewards of stored entries (weighted nansum over K, :func:`mmgrpo.advantages.combine_rewards`)."""
    if not scores:
        return []
    return adv_lib.combine_rewards(torch.tensor([scores], dtype=torch.float32), weights.float().cpu())[0].tolist()


def apply(ctx: Any, batch: Any, o: ReplayOptions, memory: dict) -> Any:
    """Replay R stored completions into each group, then store this step's (see the module docstring); the step's
    :class:`~mmgrpo.rollout_steps.RolloutBatch` with groups of G + R."""
    buffer: dict[str, list[dict]] = memory.setdefault("buffer", {})
    P, G, R = len(batch.rows), batch.rollout.group_size, o.num_replays
    chosen = []  # [P] lists of entries
    for idx in batch.indices:
        entries = eligible(buffer.get(str(idx), []), ctx.step, o.max_staleness)
        picks = choose(_combined([e["scores"] for e in entries], ctx.weights), R, o.select)
        chosen.append([entries[i] for i in picks])
    fresh = _fresh_entries(ctx, batch)
    everyone = gather_object([fresh]) if ctx.acc.num_processes > 1 else [fresh]  # every process holds every buffer
    for part in everyone:
        for key, new in part.items():
            buffer[key] = remember(buffer.get(key, []), new, ctx.step, o)

    grown = expand(ctx.adapter, batch.rollout, R)
    scores = batch.scores.view(P, G, -1)  # [P, G, K]
    extra = torch.full((P, R, scores.shape[2]), float("nan"))  # [P, R, K] NaN: an empty slot
    slots = [(p, j, e) for p, entries in enumerate(chosen) for j, e in enumerate(entries)]
    for p, j, e in slots:
        extra[p, j] = torch.tensor(e["scores"])
    index = torch.tensor([p * (G + R) + G + j for p, j, _ in slots], dtype=torch.long)  # [n] replayed slots
    ctx.adapter.inject(grown, index, [e["text"] for _, _, e in slots])  # teacher-forced: units and π_old
    if o.correction == "truncate" and grown.engine_logprobs is None:
        grown.engine_logprobs = grown.old_logprobs.clone()  # fresh samples: π_old / π_old = 1
    for b, (_, _, e) in zip(index.tolist(), slots):
        mu = place(e["logprobs"], grown.mask[b])  # [T]
        if o.correction == "clip":
            grown.old_logprobs[b] = mu  # ratio π_θ / μ, clipped by the surrogate
        elif o.correction == "truncate":
            grown.engine_logprobs[b] = mu  # weight min(π_old / μ, C)
    empty = torch.ones(P, G + R, dtype=torch.bool)  # [P, G+R]
    empty[:, :G] = False
    for p, j, _ in slots:
        empty[p, G + j] = False
    grown.mask[empty.flatten()] = 0.0  # no loss, no KL
    grown.old_logprobs[empty.flatten()] = 0.0
    merged = torch.cat([scores, extra], dim=1).view(P * (G + R), -1)  # [P(G+R), K]
    ages = [ctx.step - e["step"] for _, _, e in slots]
    metrics = dict(batch.metrics)
    metrics["replay/replayed_fraction"] = len(slots) / max(1, P * R)
    metrics["replay/mean_age"] = sum(ages) / len(ages) if ages else 0.0
    metrics["replay/buffer_rows"] = float(len(buffer))
    metrics["replay/reward_mean"] = float(
        adv_lib.combine_rewards(extra, ctx.weights.float().cpu()).nanmean().nan_to_num(0)
    )
    return type(batch)(batch.rows, grown, merged, batch.indices, metrics)  # a RolloutBatch (no import: no cycle)


def check(a: Any, o: ReplayOptions) -> None:
    """Refuse, in one line, what replay cannot combine with: a loss over whole groups of a fixed G."""
    if a.surrogate in GROUP_SURROGATES:
        raise ConfigError(
            f"algorithm.rollout_steps.replay: surrogate {a.surrogate!r} reads groups of algorithm.group_size, and "
            "replay makes them G + num_replays; use a per-sample surrogate (e.g. ppo_clip)"
        )


def save(memory: dict) -> dict:
    """The buffer as the checkpoint keeps it (JSON: texts, scores, steps, log-probs)."""
    return {"buffer": memory.get("buffer", {})}


__all__ = ["ReplayOptions", "apply", "check", "choose", "eligible", "expand", "place", "remember", "save"]
