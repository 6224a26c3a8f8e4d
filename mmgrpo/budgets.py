"""Knapsack RL: a rollout budget per prompt, chosen by a knapsack over each prompt's value and cost.

Li et al. 2025, "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation" (arXiv 2509.25849;
seed 002:197). GRPO learns nothing from a group whose samples all succeed or all fail, and a uniform G wastes
samples on easy prompts while hard ones never see a success. The paper treats prompt i's exploration as a knapsack
item: a budget of N_i samples costs N_i and is worth (its §3, "task value"; our reading of the equations, checked
against the authors' public knapsack solver, ``sampling_budget_by_knapsack`` / ``solve_by_dp``, whose repository the
code index does not name)::

    Value(N_i, p_i) = ProbNonZeroGradient(N_i, p_i) · InfoGain(p_i)
    ProbNonZeroGradient(N, p) = 1 − p^N − (1 − p)^N          the group holds a success and a failure
    InfoGain(p) = p (1 − p)^2                                  the expected rise of the success rate after a step

with p_i the prompt's success rate estimated from its last visit (the fraction of its samples whose combined reward
exceeds ``success_threshold``), and solves::

    max Σ_i Value(N_i, p_i)   s.t.  Σ_i N_i = P·G,   N_low ≤ N_i ≤ N_up

Value is concave in N (its increments p^N(1 − p) + (1 − p)^N p shrink with N), so greedy marginal allocation — give
the next ``unit`` samples to the prompt whose Value rises most — is an exact solution of this separable concave
knapsack (Fox 1966, "Discrete optimization via marginal analysis", Management Science 13(3)); the authors solve the
same problem by dynamic programming. Prompts with p ∈ {0, 1} are worth 0 and keep N_low; prompts never seen keep G.
The authors' fallback (their solver's ``allow_fallback``): the samples each 0 < p < 1 prompt needs to hold both
outcomes with probability ``confidence`` α, c_i = ln(1 − α) / ln max(p_i, 1 − p_i) (capped at N_up), are estimated;
if the budget exceeds them, the surplus goes to the prompts that never succeeded (p = 0), the hardest ones.

Departures: budgets are multiples of ``unit`` (a prompt's samples are rolled out as rows of ``unit`` samples,
:mod:`mmgrpo.groups`); the fallback's need is Σ_i (round-up of min(c_i, N_up) to a unit − N_low) over the effective
prompts (the authors' code compares Σ_i min(c_i, N_up) with the budget left after N_low); what no prompt can take
below N_up is spread one unit at a time over the p = 0 prompts, then all prompts, in batch order.

The allocation is a rollout step with a plan (``algorithm.rollout_steps: {knapsack_budget: {...}}``,
:mod:`mmgrpo.rollout_steps`): before the step's rollout it sets each prompt's budget from its memory of success
rates; after scoring it records the step's rates (every process's, gathered) into that memory, which the checkpoint
keeps (resumed exactly). The groups are then ragged (:class:`mmgrpo.groups.Groups`).

Shape glossary (DESIGN.md): ``P`` prompts, ``G`` the configured group size (the mean budget), ``B = P·G``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import torch

from mmgrpo import advantages as adv_lib
from mmgrpo import groups as groups_lib
from mmgrpo import losses, sampling
from mmgrpo.errors import ConfigError


@dataclass(frozen=True)
class KnapsackOptions:
    """``algorithm.rollout_steps.knapsack_budget``: the per-prompt budget's bounds and the success estimate."""

    min_budget: int = 2
    """N_low: the fewest samples a prompt gets (a multiple of ``unit``, ≥ 2 for a group statistic)."""
    max_budget: int = 32
    """N_up: the most samples a prompt gets (a multiple of ``unit``, ≥ ``algorithm.group_size``)."""
    unit: int = 2
    """Samples per rollout row: budgets are multiples of it (``algorithm.group_size`` must be one too)."""
    success_threshold: float = 0.5
    """A sample succeeds when its combined reward exceeds it (p_i: the successes' share of the prompt's samples)."""
    confidence: float = 0.9
    """α of the fallback's need c = ln(1 − α) / ln max(p, 1 − p)."""
    fallback: bool = True
    """Give the budget the effective prompts do not need (by c) to the prompts that never succeeded (p = 0)."""

    def __post_init__(self) -> None:
        where = "algorithm.rollout_steps.knapsack_budget"
        if self.unit < 1 or self.min_budget % self.unit or self.max_budget % self.unit:
            raise ConfigError(f"{where}: min_budget and max_budget must be multiples of unit={self.unit}")
        if not 2 <= self.min_budget <= self.max_budget:
            raise ConfigError(f"{where}: need 2 <= min_budget <= max_budget (got {self.min_budget}, {self.max_budget})")
        if not 0.0 < self.confidence < 1.0:
            raise ConfigError(f"{where}.confidence must lie in (0, 1), got {self.confidence}")


def value(n: int, p: float) -> float:
    """Value(N, p) = (1 − p^N − (1 − p)^N) · p (1 − p)^2 (Knapsack RL §3: ProbNonZeroGradient × InfoGain)."""
    return (1.0 - p**n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def need(p: float, confidence: float) -> float:
    """c = ln(1 − α) / ln max(p, 1 − p): samples after which both outcomes appear with probability ≥ α (0 < p < 1)."""
    return math.log(1.0 - confidence) / math.log(max(p, 1.0 - p))


def _spread(budgets: list[int], amount: int, order: list[int], hi: int, unit: int) -> int:
    """Add ``amount`` one ``unit`` at a time round-robin over ``order`` while below ``hi``; returns what is left."""
    while amount > 0:
        open_ = [i for i in order if budgets[i] + unit <= hi]
        if not open_:
            return amount
        for i in open_:
            if amount <= 0:
                break
            budgets[i] += unit
            amount -= unit
    return amount


def allocate(rates: list[float | None], total: int, default: int, o: KnapsackOptions) -> list[int]:
    """Each prompt's budget N_i: Σ N_i = ``total``, N_low ≤ N_i ≤ N_up, multiples of ``o.unit`` (module docstring).

    ``rates[i]``: prompt i's success rate p_i, None when it was never seen (it gets ``default``, G).
    """
    lo, hi, u = o.min_budget, o.max_budget, o.unit
    budgets = [default if p is None else lo for p in rates]  # [P]
    effective = [i for i, p in enumerate(rates) if p is not None and 0.0 < p < 1.0]
    hardest = [i for i, p in enumerate(rates) if p == 0.0]
    left = total - sum(budgets)
    if o.fallback and effective:
        needed = sum(max(0, math.ceil(min(need(rates[i], o.confidence), hi) / u) * u - lo) for i in effective)
        if needed < left:
            left = needed + _spread(budgets, left - needed, hardest, hi, u)
    gains = [(-(value(lo + u, rates[i]) - value(lo, rates[i])), i) for i in effective if lo + u <= hi]
    heapq.heapify(gains)
    while left >= u and gains:  # greedy marginal allocation: exact for a concave separable objective
        _, i = heapq.heappop(gains)
        budgets[i] += u
        left -= u
        n, p = budgets[i], rates[i]
        if n + u <= hi:
            heapq.heappush(gains, (-(value(n + u, p) - value(n, p)), i))
    left = _spread(budgets, left, hardest + [i for i in range(len(rates)) if i not in hardest], hi, u)
    if left != 0:
        raise ValueError(f"knapsack budget: {left} samples of {total} could not be placed under max_budget={hi}")
    return budgets


# ------------------------------------------------------------------------------------------- the rollout step


def check(a: Any, o: KnapsackOptions) -> None:
    """Refuse at load, in one line, what ragged groups do not support (``a``: the ``AlgorithmConfig``)."""
    where = "algorithm.rollout_steps.knapsack_budget"
    if a.group_size % o.unit or not o.min_budget <= a.group_size <= o.max_budget:
        raise ConfigError(
            f"{where}: algorithm.group_size={a.group_size} (the mean budget) must be a multiple of unit={o.unit} "
            f"within [min_budget, max_budget] = [{o.min_budget}, {o.max_budget}]"
        )
    refusals = {
        "algorithm.shaping": (a.shaping != "none", "per-sample shaping only"),
        "algorithm.token_weighting": (a.token_weighting != "none", "it reads a fixed group size"),
        "algorithm.surrogate": (a.surrogate in losses.GROUP_SURROGATES, "its loss couples a fixed group size"),
        "algorithm.sampler": (sampling.SAMPLERS.get(a.sampler).observes, "its observation reads a fixed group size"),
    }
    for key, (bad, why) in refusals.items():
        if bad:
            raise ConfigError(f"{where}: not combined with {key} other than its default ({why}); turn one of them off")


def plan(ctx: Any, rows: list[dict], indices: list[int], keys: Any, o: KnapsackOptions, memory: dict):
    """The step's budgets from the remembered success rates: its rows split into rollout units
    (:func:`mmgrpo.groups.split`); the groups' grid is as wide as the largest budget, so a step whose budgets are
    all G is the fixed [P, G] grid, numbers and metrics as GRPO's."""
    known = memory.get("rates", {})
    rates = [known.get(str(i)) for i in indices]  # [P] p_i or None
    sizes = allocate(rates, len(rows) * ctx.group_size, ctx.group_size, o)
    width = torch.tensor([max(sizes)])  # the grid's width: the largest budget of any process (one gathered shape)
    if ctx.acc.num_processes > 1:
        width = ctx.acc.gather(width.to(ctx.acc.device)).cpu()
    return groups_lib.split(rows, keys, sizes, o.unit, int(width.max()))


def observe(ctx: Any, batch: Any, o: KnapsackOptions, memory: dict) -> Any:
    """Record each group's success rate p̂ (every process's groups, gathered) and log the budgets: ``budget/min``,
    ``budget/max``, ``budget/uneven_fraction`` (prompts whose budget is not G), ``budget/signal_sample_fraction``
    (the share of the samples in groups with reward variance: the paper's effective-gradient ratio; GRPO's is
    1 − ``advantage/zero_std_fraction``). This process's groups."""
    g = batch.groups
    combined = adv_lib.combine_rewards(g.grid(batch.scores), ctx.weights)  # [P, W] NaN: n/a or padding
    valid = ~torch.isnan(combined)  # [P, W]
    wins = (valid & (combined > o.success_threshold)).float().sum(1)  # [P]
    rate = wins / valid.float().sum(1).clamp_min(1.0)  # [P] p̂ (0 for a group without a valid reward)
    seen = (torch.tensor(batch.indices, dtype=torch.float64), rate.double())  # [P] × 2
    if ctx.acc.num_processes > 1:
        seen = tuple(ctx.acc.gather(t.to(ctx.acc.device)).cpu() for t in seen)
    rates = memory.setdefault("rates", {})
    for i, p in zip(seen[0].long().tolist(), seen[1].tolist(), strict=True):
        rates[str(i)] = p
    sizes = torch.tensor(g.sizes, dtype=torch.float32)  # [P]
    batch.metrics |= {"budget/max": float(sizes.max()), "budget/min": float(sizes.min())}
    batch.metrics["budget/uneven_fraction"] = float((sizes != ctx.group_size).float().mean())
    signal = ~adv_lib.zero_variance_groups(combined)  # [P] groups with a learning signal
    batch.metrics["budget/signal_sample_fraction"] = float(sizes[signal].sum() / sizes.sum())  # the paper's ratio
    return batch


__all__ = ["KnapsackOptions", "allocate", "check", "need", "observe", "plan", "value"]
