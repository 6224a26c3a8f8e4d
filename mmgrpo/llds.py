"""LLDS, the likelihood-preserving regulariser of "On GRPO Collapse in Search-R1: The Lazy Likelihood-Displacement
Death Spiral" (Deng, Li, Gong, Ren, Thrampoulidis, Li 2025, arXiv 2512.04220).

Lazy likelihood displacement (LLD): during tool-integrated GRPO the log-likelihood of the sampled (also the correct)
trajectories stagnates, then falls, and the falling confidence inflates the gradients until training collapses. LLDS
adds a penalty that fires only where a trajectory's (or one of its actions') likelihood fell under π_old, and only on
the tokens whose likelihood fell, within the *preserving set* of tokens with non-negative advantage:

    d_t = log π_old(y_t) − log π_θ(y_t)                    (> 0: the token's likelihood fell)
    P_t = m_t · 1[A_t ≥ 0]                                  (the preserving set)
    g   = 1[Σ_{t ∈ S} P_t · d_t > 0]                        (S: the response, or the action holding t; detached)
    ℓ_t = λ · g · max(0, d_t) · P_t,        loss = J_GRPO-loss + aggregate(ℓ)

Implemented from the authors' code, vengdeng/LLDS-On-Group-Relative-Policy-Optimization-Collapse-in-Search-R1
``verl/workers/actor/dp_actor.py`` (``DataParallelPPOActor.update_policy``: ``diff_log_prob``,
``positive_advantage_mask``, ``chunk_sums_vectorized`` for the action-level gate, ``loss_noreduce`` added to the
policy loss with ``no_reduce_lambda``; defaults from ``train_grpo_nqhot.sh``: λ = 0.2, the action-level gate
``chunk_noreduce=true``, which the README reports best). The paper's section with the numbered equation could not be
retrieved here (its arXiv HTML gave only the abstract and introduction): the formula above is our reading of that
code. An *action* is a contiguous run of the preserving set, as the code's ``chunk_sums_vectorized`` defines it: in a
multi-turn rollout each turn's model tokens (observation tokens have mask 0). **Departures:** the LLDS-MA variant (a
smaller λ on the final-answer tokens, ``answer_mask``/``answer_no_reduce_lambda``) is not implemented; the term is
aggregated like the policy loss (``algorithm.aggregation``; the code's ``masked_mean`` is ``token_mean``).

LLDS is zero while π_θ = π_old, i.e. in the first update of a step; it acts from the second update on
(``algorithm.updates_per_epoch`` or ``epochs`` > 1, the paper's mini-batch updates), which the config check demands.

Metrics (per step, averaged over its minibatches like ``loss/*``): ``llds/displacement`` the mean over valid tokens of
log π_θ − log π_old (negative: likelihood fell), ``llds/displacement_preserved`` the same over the preserving set,
``llds/fell_fraction`` the share of samples whose trajectory log-likelihood fell under π_old, ``llds/active_fraction``
the share of preserving-set tokens the penalty acts on. ``coef: 0`` logs them without changing the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from mmgrpo.config import ConfigError, Range
from mmgrpo.losses import LOSS_TERMS, LossTerm, LossTermInputs


def run_ids(mask: Tensor) -> Tensor:
    """Per-row ids 1..K of the contiguous runs of ``mask`` (0 outside them): the actions of the action-level gate
    (the authors' ``chunk_sums_vectorized``).

    Shape:
        mask: [n, T] -> [n, T] long
    """
    m = mask > 0  # [n, T]
    prev = torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)  # [n, T]
    return (m & ~prev).long().cumsum(dim=1) * m.long()  # [n, T]


def llds_gate(displacement: Tensor, preserve: Tensor, gate: str) -> Tensor:
    """g_t = 1[Σ_{s ∈ S(t)} P_s · d_s > 0] for t in the preserving set (0 elsewhere), S(t) the whole response
    (``gate="response"``) or the action (run of the preserving set) holding t (``gate="action"``); no grad.

    Shape:
        displacement, preserve: [n, T] -> [n, T] float
    """
    d = displacement.detach().float() * preserve  # [n, T]
    if gate == "response":
        return (d.sum(dim=1, keepdim=True) > 0).float() * preserve  # [n, T]
    ids = run_ids(preserve)  # [n, T]
    sums = torch.zeros(d.shape[0], d.shape[1] + 1, dtype=d.dtype, device=d.device)  # [n, K_max + 1] (col 0: outside)
    sums.scatter_add_(1, ids, d)
    fired = (sums > 0).float()  # [n, T + 1]
    fired[:, 0] = 0.0
    return fired.gather(1, ids) * preserve  # [n, T]


def llds_penalty(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, coef: float, gate: str
) -> tuple[Tensor, dict[str, Tensor]]:
    """ℓ_t = λ · g_t · max(0, log π_old − log π_θ) · 1[A_t ≥ 0] · m_t, per token, and the displacement metrics.

    Shape:
        logprobs (with grad), old_logprobs, advantages, mask: [n, T] -> loss [n, T], metrics of []
    """
    m = (mask > 0).float()  # [n, T]
    preserve = m * (advantages >= 0).float()  # [n, T]
    d = old_logprobs.float() - logprobs.float()  # [n, T]
    g = llds_gate(d, preserve, gate)  # [n, T]
    loss = coef * g * d.clamp_min(0.0) * preserve  # [n, T]
    dd = d.detach()
    seq = (dd * m).sum(dim=1)  # [n] log π_old(y) − log π_θ(y)
    has = (m.sum(dim=1) > 0).float()  # [n]
    metrics = {
        "llds/displacement": -(dd * m).sum() / m.sum().clamp_min(1.0),
        "llds/displacement_preserved": -(dd * preserve).sum() / preserve.sum().clamp_min(1.0),
        "llds/fell_fraction": ((seq > 0).float() * has).sum() / has.sum().clamp_min(1.0),
        "llds/active_fraction": (g * (dd > 0).float()).sum() / preserve.sum().clamp_min(1.0),
    }
    return loss, metrics


@dataclass(frozen=True)
class LLDSOptions:
    """``algorithm.loss_terms.llds``."""

    coef: Annotated[float, Range(ge=0)] = 0.2
    """λ, the regulariser's weight (the authors' ``no_reduce_lambda``; 0.2 in their ``train_grpo_nqhot.sh``). 0 logs
    the displacement metrics without changing the loss."""
    gate: Literal["action", "response"] = "action"
    """action: the gate is per action (each contiguous run of non-negative-advantage tokens, e.g. each turn; the
    authors' ``chunk_noreduce``, their best) | response: one gate per trajectory."""


def llds(inputs: LossTermInputs, options: LLDSOptions) -> tuple[Tensor, dict[str, Tensor]]:
    """The ``llds`` loss term (:func:`llds_penalty` on the minibatch). Shape: [n, T] inputs -> [n, T]."""
    return llds_penalty(
        inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask, float(options.coef), options.gate
    )


def check_config(algorithm: Any) -> None:
    """Refuse, in one line at load, the combinations where LLDS cannot act."""
    a = algorithm
    if a.epochs == 1 and a.updates_per_epoch == 1:
        raise ConfigError(
            "algorithm.loss_terms.llds: with one optimizer update per step (epochs: 1, updates_per_epoch: 1) "
            "π_θ = π_old at every token, so LLDS never fires; set algorithm.updates_per_epoch >= 2 or epochs >= 2"
        )
    if a.surrogate == "dgpo":
        raise ConfigError(
            "algorithm.loss_terms.llds regularises token log-likelihoods, but surrogate dgpo's units are DSM losses "
            "(model.args.objective: dgpo); remove llds or use a log-prob surrogate"
        )


LOSS_TERMS.add("llds", LossTerm(llds, check_config), LLDSOptions)
