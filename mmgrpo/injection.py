"""Off-policy ground-truth injection (TempSamp-R1): one slot of every group is the ground-truth answer.

TempSamp-R1 (2025, "TempSamp-R1: Effective Temporal Sampling with Reinforcement Fine-Tuning for Video
LLMs", arXiv 2509.18056, "mixed-policy sampling") trains each group on G − 1 on-policy samples plus one off-policy
solution built from the annotation. What is implemented follows the public re-implementation
(ZhangZikun6666/TempSamp-R1, ``verl/trainer/ray_trainer.py``: ``_inject_gt_rollout_in_gen_output`` and the
``fit`` loop around it):

* the completion of slot ``slot`` of each group (``algorithm.gt_replace_index``, −1 = the last) is replaced by
  the tokens of the ground-truth response (``template`` filled from the row's ``column``) followed by EOS; rows
  whose ground truth is missing keep their sampled completion;
* the GT completion is scored by the rewards and joins its group's mean/std like any sample (``core_algos.py``:
  the GRPO advantage over all G rows);
* its ratio: the re-implementation recomputes ``old_log_probs`` for the whole batch with the actor after the
  injection, so the GT row's "old" log-probs are the current policy's teacher-forced log-probs of the GT tokens.
  Its ratio is therefore exactly 1 at the first update and is clipped like the others: no importance weight for
  the distribution the annotation came from. Here :meth:`TeacherForcing.inject` does the same: old_logprobs of
  an injected row = the adapter's log-prob forward of the GT tokens under the current policy, without gradient.

Departures: a GT response longer than the adapter's T = ``max_new_tokens`` units is an error naming the row and
the option to raise (the re-implementation keeps the last T tokens so that EOS survives, which cuts the answer's
head); the asymmetric reward shaping that accompanies injection in the paper is the separate reward
``tempsamp_soft`` (``mmgrpo.rewards.variants``). Token families only (VLM, video; the :class:`TeacherForcing`
capability): a flow adapter has no ground-truth trajectory to inject.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from mmgrpo.types import Rollout


@runtime_checkable
class TeacherForcing(Protocol):
    """Adapter capability: replace samples of a rollout with given texts, teacher-forced through ``logprobs``."""

    def inject(self, rollout: Rollout, index: Tensor, texts: list[str]) -> None:
        """Replace samples ``index`` [n] of ``rollout`` (in place) by ``texts``: their units, outputs, mask,
        ``truncated`` and ``old_logprobs`` (the current policy's log-probs of the new units, no gradient). Called
        with n = 0 too: a sharded (FSDP) model must then still run its forward, as every process does one."""
        ...


def ground_truth_texts(rows: list[dict], column: str, template: str) -> list[str | None]:
    """The GT response of each prompt row: ``template.format(answer=row[column])``; None where the column is missing.

    ``template`` may index and format the value, e.g. ``"<answer>{answer[0]:g} to {answer[1]:g}</answer>"``.
    """
    out: list[str | None] = []
    for i, row in enumerate(rows):
        value = row.get(column)
        if value is None:
            out.append(None)
            continue
        try:
            out.append(template.format(answer=value))
        except (IndexError, KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"algorithm.gt_injection.template {template!r} cannot format row {i}'s {column!r} = {value!r} ({e}); "
                "use {answer} for the value, e.g. {answer[0]} for the first element of a list"
            ) from None
    return out


def inject_ground_truth(
    adapter: Any, rollout: Rollout, rows: list[dict], *, column: str, template: str, slot: int = -1
) -> Tensor:
    """Put each prompt's GT response into slot ``slot`` of its group (see the module docstring).

    Returns a [B] bool tensor marking the injected samples (at most one per group).
    """
    G = rollout.group_size
    if not -G <= slot < G:
        raise ValueError(f"algorithm.gt_injection.slot: {slot} is outside the group of {G} samples")
    texts = ground_truth_texts(rows, column, template)
    index = [p * G + (slot % G) for p, text in enumerate(texts) if text is not None]
    injected = torch.zeros(rollout.batch_size, dtype=torch.bool)  # [B]
    # called even with no row to inject: under FSDP every process must run the adapter's one forward
    adapter.inject(rollout, torch.tensor(index, dtype=torch.long), [t for t in texts if t is not None])
    injected[index] = True
    return injected
