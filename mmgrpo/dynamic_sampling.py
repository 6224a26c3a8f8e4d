"""DAPO dynamic sampling: refill the groups whose rewards have zero variance with fresh prompts.

DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476 §3.2,
"Dynamic Sampling"): over-sample and filter out the prompts whose G outputs are all correct or all wrong (their
advantages are 0), and keep sampling until the batch is full of groups with non-zero reward variance. The verl
implementation (``algorithm.filter_groups``: ``enable``, ``metric``, ``max_num_gen_batches``; ``recipe/dapo``'s
``RayDAPOTrainer.fit``) generates one more prompt batch at a time, keeps the groups whose metric has std > 0, stops
when it holds the train batch size of groups (truncating the surplus) and raises after ``max_num_gen_batches``
generation batches (0 = no limit).

Here (``algorithm.dynamic_sampling``): generation batch k = 0 is the step's usual P prompts; each further batch is
P rows drawn uniformly from the data with a generator keyed by (seed, step, k, process) and rolled out with noise
keyed by (seed mixed with k, step, the step's positions), so a step — and a resumed run — is reproducible. The
first P groups with non-zero variance of the combined reward (``advantages.zero_variance_groups``), in generation
order, form the batch. Departures: (1) the refill prompts are drawn at random rather than taken from the data
stream (the step's own rows stay those of the sampler, so later steps do not shift); (2) after
``max_num_gen_batches`` batches the remaining slots are filled with the earliest zero-variance groups (they add
no gradient) and counted in ``data/dynamic_short_groups``, instead of raising; (3) with several processes each one
refills its own P groups (all run the same number of generation batches, so FSDP's collective forwards stay in
step), so with refill on the batch depends on the number of processes, unlike the rest of the step.

Merging the kept groups of several rollouts needs the adapter's ``merge_states`` (token adapters: VLM, video).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mmgrpo import advantages as adv_lib
from mmgrpo.groups import Groups
from mmgrpo.types import Rollout


def refill_indices(n_rows: int, count: int, *, seed: int, step: int, batch: int, rank: int) -> list[int]:
    """[count] dataset rows of refill batch ``batch`` (≥ 1) of ``step`` on process ``rank``, uniform, keyed."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + step * 7919 + batch * 104_729 + rank * 15_485_863) % 2**63)
    return torch.randint(n_rows, (count,), generator=g).tolist()


def merge_groups(adapter: Any, parts: list[tuple[Rollout, list[int]]]) -> Rollout:
    """One rollout of the groups ``prompts`` of each ``(rollout, prompts)`` part, in that order.

    Generic fields are concatenated here; the adapter-private state by ``adapter.merge_states`` with the same
    ``(state, samples [n], prompts [p])`` parts.
    """
    G = parts[0][0].group_size
    pieces = []
    for rollout, prompts in parts:
        p = torch.tensor(prompts, dtype=torch.long)  # [p]
        samples = (p[:, None] * G + torch.arange(G)).flatten()  # [p·G] group-major
        pieces.append((rollout, samples, p))
    cat = lambda name: torch.cat([getattr(r, name)[s] for r, s, _ in pieces])
    optional = {
        name: cat(name) if getattr(parts[0][0], name) is not None else None for name in ("unit_sigmas", "unit_values")
    }
    extras = {key: [r.extras[key][i] for r, s, _ in pieces for i in s.tolist()] for key in parts[0][0].extras}
    n_prompts = sum(len(p) for _, _, p in pieces)
    merged = Rollout(
        outputs=[r.outputs[i] for r, s, _ in pieces for i in s.tolist()],
        old_logprobs=cat("old_logprobs"),
        mask=cat("mask"),
        group_size=G,
        prompt_index=torch.arange(n_prompts).repeat_interleave(G),
        truncated=cat("truncated"),
        state=adapter.merge_states([(r.state, s, p) for r, s, p in pieces]),
        extras=extras,
        **optional,
    )
    return merged


def select_groups(kept: list[list[int]], P: int) -> tuple[list[tuple[int, int]], int]:
    """Which P groups form the batch, from the groups ``kept[j]`` with non-zero variance of generation batch j.

    The first P kept groups in generation order; when there are fewer, the earliest other groups fill the rest.
    Returns ``(order, short)``: ``order`` the (batch j, group g) pairs sorted by batch then group (the order of
    :func:`merge_groups`'s output), ``short`` the number of zero-variance groups used to fill.
    """
    chosen = [(j, g) for j, groups in enumerate(kept) for g in groups][:P]
    short = P - len(chosen)
    taken = set(chosen)
    chosen += [(j, g) for j in range(len(kept)) for g in range(P) if (j, g) not in taken][:short]
    return sorted(chosen), short


def kept_groups(zero_variance: Tensor) -> list[int]:
    """Indices of the groups with non-zero variance. Shape: [P] bool → list."""
    return torch.nonzero(~zero_variance).flatten().tolist()


def signal_groups(scores: Tensor, weights: Tensor, groups: Groups) -> list[int]:
    """Indices of the groups whose combined reward varies (the ones DAPO keeps), over the groups of ``groups``
    (ragged groups: each over its own samples, :mod:`mmgrpo.groups`). Shape: scores [B, K], weights [K]."""
    return kept_groups(adv_lib.zero_variance_groups(adv_lib.combine_rewards(groups.grid(scores), weights)))


__all__ = ["kept_groups", "merge_groups", "refill_indices", "select_groups", "signal_groups"]


def refill(acc, adapter, first: tuple, weights: Tensor, max_batches: int, generate: Callable[[int], tuple]) -> tuple:
    """The first P groups with non-zero reward variance over up to ``max_batches`` generation batches.

    ``first`` is generation batch 0, ``(rows, rollout, scores [B, K], dataset indices)`` of the step's P prompts;
    ``generate(k)`` returns the same for batch k. Every process runs as many batches (until all hold P groups with
    signal). Returns ``(rows, indices, merged rollout, scores [B, K], number of batches, short groups)``.
    """
    rows, rollout, scores, _ = first
    G, P = rollout.group_size, len(rows)
    batches = [first]
    kept = lambda sc: signal_groups(sc, weights, Groups.uniform(len(sc) // G, G))
    have = len(kept(scores))
    for k in range(1, max_batches):
        need = torch.tensor([float(have < P)], device=acc.device)
        if float(acc.reduce(need, reduction="sum") if acc.num_processes > 1 else need) == 0:
            break  # every process holds P groups with signal (all run the same number of batches)
        batches.append(generate(k))
        have += len(kept(batches[-1][2]))
    order, short = select_groups([kept(sc) for _, _, sc, _ in batches], P)
    parts = [(batches[j][1], [g for jj, g in order if jj == j]) for j in range(len(batches))]
    merged = merge_groups(adapter, [(r, groups) for r, groups in parts if groups])
    new_rows = [batches[j][0][g] for j, g in order]
    indices = [batches[j][3][g] for j, g in order]
    new_scores = torch.cat([batches[j][2][g * G : (g + 1) * G] for j, g in order])  # [B, K]
    return new_rows, indices, merged, new_scores, len(batches), short
