"""pass@k on the held-out rows: n sampled completions per row, the unbiased estimator of the chance that at least one
of k of them is correct.

What is implemented (``eval.pass_k``, ``eval.pass_samples``, ``eval.pass_metric``; reported as
``eval/<stage>/pass@k`` next to the greedy metrics at every held-out evaluation):

* :func:`pass_at_k` — Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", arXiv 2107.03374 §2.1,
  eq. 1): with c correct among n samples of a problem, pass@k = 1 − C(n−c, k)/C(n, k), averaged over the problems;
  computed as 1 − Π_{i=n−c+1}^{n} (1 − k/i) (their numerically stable form), 1 when n − c < k. "Rewarding the
  Unlikely" (arXiv 2506.02355) reports its effect as pass@N over a range of N, with this estimator.
* :func:`sampled` — the n samples of each held-out row come from ``adapter.rollout`` (the training sampler: its
  temperature, top-k/top-p), with noise keyed by (seed, the row's index), so two runs of the same seed draw the same
  noise for the same policy; a sample is correct when the task's metric ``eval.pass_metric`` scores it 1 (the row's
  n outputs are scored together, and c = round(mean · n): the metric must be 0/1 per output, as ``accuracy`` is).

Cost: n rollouts per held-out row at every evaluation (``eval.max_rows`` bounds the rows).
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, gather_object
from torch import Tensor

from mmgrpo import noise

PASS_NOISE = 0x9A55
"""Mixed into the seed of the held-out samples' noise keys (apart from every training step's)."""


def pass_at_k(n: Tensor, c: Tensor, k: int) -> Tensor:
    """Unbiased pass@k of each problem from n samples, c of them correct (Chen et al. 2021, eq. 1).

    Shape:
        n, c: [R] (integers, 0 ≤ c ≤ n, k ≤ n) → [R]
    """
    n, c = n.double(), c.double()
    i = torch.arange(1, int(n.max()) + 1, dtype=torch.float64)  # [N]
    terms = torch.where(i[None, :] > (n - c)[:, None], 1.0 - k / i[None, :], torch.ones_like(i[None, :]))  # [R, N]
    terms = torch.where(i[None, :] <= n[:, None], terms, torch.ones_like(terms))  # [R, N]
    return torch.where(n - c < k, torch.ones_like(n), 1.0 - terms.prod(1))  # [R]


def sampled(acc: Accelerator, adapter, task, rows: list[dict], eval_cfg: Any, seed: int) -> dict[str, float]:
    """``pass@k`` for each k of ``eval_cfg.pass_k`` over ``rows`` (each process samples a share of the rows);
    empty when ``pass_k`` is empty."""
    if not eval_cfg.pass_k or not rows:
        return {}
    n, metric = eval_cfg.pass_samples, eval_cfg.pass_metric
    counts = []
    sharded = acc.distributed_type == DistributedType.FSDP  # every process must run as many forwards
    with acc.split_between_processes(list(range(len(rows))), apply_padding=sharded) as mine:
        for start in range(0, len(mine), max(1, eval_cfg.batch_size // n)):
            idx = mine[start : start + max(1, eval_cfg.batch_size // n)]
            keys = noise.NoiseKeys(noise.mix(seed, PASS_NOISE), 0, tuple(idx), n)
            outputs = adapter.rollout([rows[i] for i in idx], n, keys).outputs  # [len(idx) · n], group-major
            for j, i in enumerate(idx):
                scores = task.score(outputs[j * n : (j + 1) * n], [rows[i]] * n) or {}
                if metric not in scores:
                    raise ValueError(
                        f"eval.pass_metric: {metric!r} is not a metric of this task (it scores {sorted(scores)}); "
                        "set eval.pass_metric to a 0/1 one of them, or eval.pass_k: [] for no pass@k"
                    )
                counts.append((i, round(float(scores[metric]) * n)))
    c = torch.tensor([v for _, v in sorted(dict(gather_object(counts)).items())])  # [R] (padding kept once)
    total = torch.full_like(c, n)
    return {f"pass@{k}": float(pass_at_k(total, c, k).mean()) for k in eval_cfg.pass_k}
