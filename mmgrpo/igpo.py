"""IGPO: information-gain turn rewards and their turn-level advantages (``algorithm.credit: igpo``).

IGPO (Wang et al. 2025, "Information Gain-based Policy Optimization: A Simple and Effective Approach for Multi-Turn
LLM Agents", arXiv 2510.14967, §3; seed ``002:301``) rewards each turn of a multi-turn trajectory by how much it
raised the policy's own probability of the ground-truth answer a = (a_1..a_L), and the last turn by the outcome::

    π_θ(a | q, o_{≤t}) = exp( (1/L) Σ_j log π_θ(a_j | q, o_{≤t}, a_{<j}) )      teacher-forced, length-normalised
    r_{i,t} = π_θ(a | q, o_{≤t}) − π_θ(a | q, o_{≤t−1}),   1 ≤ t < T            information gain of turn t
    r_{i,T} = the outcome reward                                                 (the paper: answer F1)
    Â_{i,t} = (r_{i,t} − mean(R)) / std(R),   R = every r_{i,t} of the G trajectories of the prompt, all turns
    Ã_{i,t} = Σ_{k=t}^{T} γ^{k−t} Â_{i,k}                                       on every token of turn t

The definitions above are the paper's §3 as the public summaries quote them; the equation numbers of the paper could
not be retrieved here, so none are cited *(our reading)*. What the code does, and where this follows it:

* the probe (GuoqingWang1/IGPO ``scrl/llm_agent/generation.py``, the loop over ``max_turns``): before each turn's
  generation, the context so far (the prompt, the earlier turns and their observations, the next generation prompt)
  is followed by a pseudo response holding the ground truth, and ``exp(mean log-prob)`` of the ground truth's own
  tokens (``gt_idx``: the answer span, not the text around it) is kept; the gain of a turn is the next turn's value
  minus its own (``info_gain_rewards[i].append(cur_prob - gt_probs[i])``), so the last turn gets none
  (``verl/utils/reward_score/info_gain.py``: gains on the earlier turns, the outcome on the last);
* the normalisation and discount (the authors' updated code, public copy debajoycs98/IGPO
  ``verl/trainer/ppo/core_algos.py``: ``compute_grpo_outcome_advantage`` and ``_compute_turn_level_advantage``):
  each prompt's turn rewards are z-normalised together (``info_gain_norm_mode: joint``, the paper's; ``separate``
  normalises gains and outcomes apart) with the population std, a group of one item keeping std 1, ε = 1e-6 outside
  the root; then A_t = Â_t + γ·A_{t+1} backwards over the trajectory's turns (γ = 1.0 in its ``train.sh``); the
  gain is a probability difference (``info_gain_type: prob_diff``, the paper's) or a log-probability difference
  (``log_prob_diff``).

Here. :class:`ProbeOptions` (``rollout.ground_truth_probe``) makes the multi-turn driver
(``modalities/tokens/turns.py``) record ℓ_{b,s} = the mean log-prob of the row's ground truth given the context
before turn s, for every turn s of every trajectory b (column ``gt_logprobs``); :func:`igpo_advantages` turns
them, with the outcome (the configured rewards combined), into per-turn advantages ``[B, S]``; the credit step puts
each turn's advantage on its tokens (:func:`mmgrpo.credit.turn_to_token_advantages`).

Departures: the pseudo response is ``template`` (e.g. ``<answer>{answer}</answer>``) right after the generation
prompt, not the code's "Now there's enough information to answer …" after a ``<think>`` opening; the probe is a
separate no-grad forward per turn (the turn-0 context once per prompt, shared by its G trajectories); every turn
enters the statistics (the updated code finds turns by their non-zero reward, so a gain of exactly 0 drops out of
its mean and std); the code's 1e-8 under the square root is left out; ``info_gain_weight`` is the code's curriculum
weight of the gains held constant (1: none).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``S`` turns (the longest trajectory's).
"""

from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from mmgrpo.config import ConfigError, Range, from_dict
from mmgrpo.credit import CREDITS, TurnInputs, step_discounted_returns
from mmgrpo.types import DataError

INFO_GAINS = ("prob_diff", "log_prob_diff")
NORMALIZATIONS = ("joint", "separate")


# ----------------------------------------------------------------------------------------------- the math


def information_gains(gt_logprobs: Tensor, turn_mask: Tensor, info_gain: str = "prob_diff") -> Tensor:
    """IG_{b,s} = g(ℓ_{b,s+1}) − g(ℓ_{b,s}) for each turn s followed by a turn s+1 of the same trajectory, else 0;
    g = exp (``prob_diff``: π̄ = exp of the mean token log-prob) or the identity (``log_prob_diff``).

    Shape:
        gt_logprobs: [B, S] ℓ, the mean log-prob of the ground truth given the context before each turn
        turn_mask: [B, S]
        returns: [B, S] (0 on each trajectory's last turn and the padding)
    """
    if info_gain not in INFO_GAINS:
        raise ValueError(f"info_gain must be one of {INFO_GAINS}, got {info_gain!r}")
    value = gt_logprobs.float().exp() if info_gain == "prob_diff" else gt_logprobs.float()  # [B, S]
    valid = turn_mask.bool()  # [B, S]
    has_next = torch.zeros_like(valid)  # [B, S]
    has_next[:, :-1] = valid[:, :-1] & valid[:, 1:]
    gain = torch.zeros_like(value)  # [B, S]
    gain[:, :-1] = value[:, 1:] - value[:, :-1]
    return torch.where(has_next, gain, torch.zeros_like(gain))  # [B, S]


def last_turns(turn_mask: Tensor) -> Tensor:
    """1 on the last valid turn of each trajectory. Shape: [B, S] → [B, S] bool."""
    valid = turn_mask.bool()  # [B, S]
    nxt = torch.zeros_like(valid)  # [B, S]
    nxt[:, :-1] = valid[:, 1:]
    return valid & ~nxt


def group_zscore(values: Tensor, groups: Tensor, *, scale: bool, eps: float) -> Tensor:
    """(x − mean_g x) [/ (std_g x + eps)] over arbitrary groups of items, the population std; a group of one item
    has std 1 (so its item gets 0), as IGPO's ``compute_group_stats``.

    Shape:
        values: [N]; groups: [N] long ids (any values) → [N]
    """
    x = values.float()  # [N]
    groups = torch.unique(groups, return_inverse=True)[1]  # [N] ids 0..g−1
    count = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device).index_add_(0, groups, torch.ones_like(x))
    mean = torch.zeros_like(count).index_add_(0, groups, x) / count.clamp(min=1)  # [N groups]
    var = torch.zeros_like(count).index_add_(0, groups, (x - mean[groups]) ** 2) / count.clamp(min=1)
    std = torch.where(count <= 1, torch.ones_like(var), var.sqrt())  # [N groups]
    centred = x - mean[groups]  # [N]
    return centred / (std[groups] + eps) if scale else centred


def igpo_advantages(
    gt_logprobs: Tensor,
    outcome_rewards: Tensor,
    turn_mask: Tensor,
    group_index: Tensor,
    *,
    gamma: float = 1.0,
    info_gain: str = "prob_diff",
    normalization: str = "joint",
    scale: bool = True,
    eps: float = 1e-6,
    info_gain_weight: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """IGPO's per-turn advantages (module docstring): rewards r = w·IG on the turns before the last, the outcome on
    the last; z-normalised per prompt group over all turns of its trajectories (``joint``) or over the gains and the
    outcomes apart (``separate``); then the discounted sum Ã_{b,s} = Â_{b,s} + γ·Ã_{b,s+1}.

    Args:
        gt_logprobs: ℓ, the mean log-prob of the ground truth given the context before each turn.
        outcome_rewards: the trajectory's outcome reward (the configured rewards, combined).
        turn_mask: 1 for the turns that exist.
        group_index: the group (prompt) of each trajectory.
        gamma: γ of the turn-level discount.
        info_gain: ``prob_diff`` (the paper's) or ``log_prob_diff``.
        normalization: ``joint`` (the paper's) or ``separate``.
        scale: divide by the group's std + eps (false: mean-centred only).
        eps: added to the std.
        info_gain_weight: w, the weight of the gains against the outcome.

    Returns:
        ``(advantages [B, S] (0 where masked), metrics)``: ``credit/info_gain_mean`` (mean IG over the turns that
        have one), ``credit/info_gain_positive_fraction``, ``credit/gt_prob_first`` (mean π̄ before the first turn),
        ``credit/gt_prob_last`` (before the last turn), ``credit/igpo_adv_abs`` (mean |Ã| over turns).

    Shape:
        gt_logprobs, turn_mask: [B, S]; outcome_rewards, group_index: [B]
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    B, S = turn_mask.shape
    if gt_logprobs.shape != (B, S) or outcome_rewards.shape != (B,) or group_index.shape != (B,):
        raise ValueError(
            f"igpo: gt_logprobs must be [B, S] = {[B, S]} and outcome_rewards, group_index [B]; got "
            f"{list(gt_logprobs.shape)}, {list(outcome_rewards.shape)}, {list(group_index.shape)}"
        )
    valid = turn_mask.bool()  # [B, S]
    last = last_turns(turn_mask)  # [B, S]
    gains = information_gains(gt_logprobs, turn_mask, info_gain)  # [B, S]
    rewards = torch.where(last, outcome_rewards.float()[:, None].expand(B, S), info_gain_weight * gains)  # [B, S]
    _, group = torch.unique(group_index.long(), return_inverse=True)  # [B] ids 0..g−1
    kind = last.long() if normalization == "separate" else torch.zeros_like(last, dtype=torch.long)  # [B, S]
    items = (group[:, None] * 2 + kind)[valid]  # [N] the statistics' group of each valid turn
    normed = torch.zeros_like(rewards)  # [B, S]
    normed[valid] = group_zscore(rewards[valid], items, scale=scale, eps=eps)
    adv = step_discounted_returns(normed, turn_mask, gamma)  # [B, S]
    has_gain = valid & ~last  # [B, S]
    p = gt_logprobs.float().exp()  # [B, S]
    first = valid[:, 0]  # [B]
    n_gain = has_gain.sum().clamp(min=1)
    metrics = {
        "credit/info_gain_mean": (gains * has_gain).sum() / n_gain,
        "credit/info_gain_positive_fraction": ((gains > 0) & has_gain).sum() / n_gain,
        "credit/gt_prob_first": (p[:, 0] * first).sum() / first.sum().clamp(min=1),
        "credit/gt_prob_last": (p * last).sum() / last.sum().clamp(min=1),
        "credit/igpo_adv_abs": adv.abs()[valid].mean() if valid.any() else adv.new_zeros(()),
    }
    return adv, {k: v.detach().float() for k, v in metrics.items()}


# ------------------------------------------------------------------------------------------- the credit


@dataclass(frozen=True)
class IGPOOptions:
    """``algorithm.credit_args`` of ``igpo``: :func:`igpo_advantages`'s options (its other parameters come from
    the rollout: ``rollout.ground_truth_probe`` records the log-probs)."""

    gamma: float = 1.0
    """γ, the discount of the turn-level advantages (IGPO's train.sh: 1.0)."""
    info_gain: Literal["prob_diff", "log_prob_diff"] = "prob_diff"
    """prob_diff: exp(ℓ_{t+1}) − exp(ℓ_t), the paper's | log_prob_diff: ℓ_{t+1} − ℓ_t."""
    normalization: Literal["joint", "separate"] = "joint"
    """joint: the gains and outcomes of a prompt's trajectories z-normalised together (the paper's) | separate:
    gains and outcomes apart. With gains small against the outcome, joint gives every extra turn about
    −mean(R)/std(R) (on the zoom task two seeds of three stopped calling the tool: docs/variants.md)."""
    scale: bool = True
    """Divide by the group's std + eps (the code's norm_adv_by_std_in_grpo); false: mean-centred only."""
    eps: float = 1e-6
    """Added to the std."""
    info_gain_weight: Annotated[float, Range(ge=0)] = 1.0
    """w, the weight of the gains against the outcome (the code's curriculum weight, held constant)."""


@CREDITS.register("igpo", options=IGPOOptions)
def igpo_credit(
    advantages: Tensor, outcome: Tensor, turns: TurnInputs, options: IGPOOptions
) -> tuple[Tensor, dict[str, Tensor]]:
    """IGPO (:func:`igpo_advantages`) on the probe's log-probs (``turns.gt_logprobs``) and the outcome reward.

    Shape:
        advantages: [P, G] (unused); outcome: [B] -> [B, S]
    """
    if turns.gt_logprobs is None:
        raise ValueError(
            "algorithm.credit: igpo needs the ground-truth log-probs of each turn (rollout.ground_truth_probe); the "
            "rollout has none"
        )
    return igpo_advantages(turns.gt_logprobs, outcome, turns.turn_mask, turns.group, **dataclasses.asdict(options))


# ---------------------------------------------------------------------------------------------- the probe


@dataclass(frozen=True)
class ProbeOptions:
    """``rollout.ground_truth_probe``: what the multi-turn driver teacher-forces after each turn's context."""

    column: str = "answer"
    """Row column holding the ground truth (every row must have it)."""
    template: str = "<answer>{answer}</answer>"
    """The pseudo response: str.format with ``answer`` = the column's value, e.g. ``<answer>{answer}</answer>``."""
    score: Literal["answer", "text"] = "answer"
    """answer: the mean over the ground truth's own tokens (IGPO's gt_idx span) | text: over the whole response."""
    batch_size: Annotated[int, Range(ge=1)] = 16
    """Contexts per probe forward."""


def probe_options(probe: dict[str, Any] | None) -> ProbeOptions | None:
    """``rollout.ground_truth_probe`` as :class:`ProbeOptions` (None: off); unknown keys raise ``ConfigError``."""
    return None if probe is None else from_dict(ProbeOptions, probe, "rollout.ground_truth_probe")


def render_answer(template: str, value: Any) -> tuple[str, int, int]:
    """``template.format(answer=value)`` and the character span [start, end) of its replacement fields (from the
    first field's start to the last one's end; the whole text when it has none)."""
    f = string.Formatter()
    out, start, end = "", None, None
    for literal, name, spec, conversion in f.parse(template):
        out += literal
        if name is None:
            continue
        obj = f.convert_field(f.get_field(name, (), {"answer": value})[0], conversion)
        start = len(out) if start is None else start
        out += f.format_field(obj, spec or "")
        end = len(out)
    return out, start or 0, len(out) if end is None else end


def probe_target(tokenizer: Any, template: str, value: Any, score: str) -> tuple[list[int], list[int]]:
    """Token ids of the pseudo response for ``value`` and which of them are scored (1): with ``score: answer`` the
    tokens of the answer span (the tokens of the text before it and after it counted off, as IGPO's ``len_st`` /
    ``len_ed``), all of them when the text around it does not tokenize apart; with ``text`` all."""
    text, start, end = render_answer(template, value)
    ids = tokenizer.encode(text, add_special_tokens=False)
    head = tokenizer.encode(text[:start], add_special_tokens=False) if start else []
    tail = tokenizer.encode(text[end:], add_special_tokens=False) if end < len(text) else []
    apart = ids[: len(head)] == head and (not tail or ids[len(ids) - len(tail) :] == tail)
    if score == "text" or not apart or len(head) + len(tail) >= len(ids):
        return ids, [1] * len(ids)
    return ids, [0] * len(head) + [1] * (len(ids) - len(head) - len(tail)) + [0] * len(tail)


def check_row(probe: ProbeOptions, row: dict, where: str) -> None:
    """A row the probe reads: it has the column, and the template renders its value (:class:`DataError`)."""
    if row.get(probe.column) is None:
        raise DataError(
            f"{where}: rollout.ground_truth_probe reads the ground truth from column {probe.column!r}, which the row "
            f"does not have (it has {sorted(row)}); set rollout.ground_truth_probe.column to the column that holds it"
        )
    try:
        render_answer(probe.template, row[probe.column])
    except (IndexError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise DataError(
            f"{where}: rollout.ground_truth_probe.template {probe.template!r} cannot format the row's "
            f"{probe.column!r} = {row[probe.column]!r} ({e}); use {{answer}} for the value"
        ) from None


def check_config(cfg: Any) -> None:
    """``rollout.ground_truth_probe`` and ``algorithm.credit: igpo`` against the rest of the config (one line)."""
    r, a = cfg.rollout, cfg.algorithm
    probe = probe_options(r.ground_truth_probe)
    if probe is None:
        if a.credit == "igpo":
            raise ConfigError(
                "algorithm.credit: igpo rewards each turn by the rise of the ground truth's probability, but "
                "rollout.ground_truth_probe is not set; set rollout.ground_truth_probe: {column: answer, template: "
                "'<answer>{answer}</answer>'} (the column holding the ground truth)"
            )
        return
    if not r.multi_turn:
        raise ConfigError(
            "rollout.ground_truth_probe records a log-prob before each turn of a multi-turn rollout, but rollouts are "
            "single-turn; set rollout.tools or rollout.environment, or remove rollout.ground_truth_probe"
        )
    if r.tree is not None:
        raise ConfigError(
            "rollout.ground_truth_probe is recorded by the chain driver, not by tree rollouts (rollout.tree) yet; "
            "remove one of them"
        )


__all__ = [
    "IGPOOptions",
    "ProbeOptions",
    "check_config",
    "check_row",
    "group_zscore",
    "igpo_advantages",
    "igpo_credit",
    "information_gains",
    "last_turns",
    "probe_options",
    "probe_target",
    "render_answer",
]
