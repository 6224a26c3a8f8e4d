"""The ground-truth probe of multi-turn rollouts (``rollout.ground_truth_probe``; IGPO, :mod:`mmgrpo.igpo`).

Before each turn of a trajectory the turn driver (:class:`.turns.TurnRunner`) asks: how likely is the row's ground
truth, as the policy's next reply, given everything so far? The context is what the turn is sampled from — the
prompt, the earlier turns and their observations (images included), the next generation prompt — followed by the
pseudo response (:func:`mmgrpo.igpo.probe_target`); the value kept is the mean log-prob of its scored tokens, ℓ.
It is scored through the public sampling protocol only (:meth:`.sampler.TokenSampler.token_logprobs` of a
:class:`.turns.TurnState` whose action tokens are the pseudo response), so ℓ is the log-prob the training forward
gives those tokens there (temperature included), no grad.

Shape glossary: ``n`` probed contexts, ``L`` their longest [context ; response] after the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmgrpo.igpo import ProbeOptions, probe_target

from .sampler import TokenSampler


@dataclass(frozen=True)
class ProbeContext:
    """One context to probe: a prompt, the trajectory tokens after it and their observation images."""

    prompt: int
    """Index of the prompt encoding the context continues."""
    ids: list[int]
    """Trajectory tokens after the prompt (turns and observations so far; empty before turn 0)."""
    media: dict[str, Tensor]
    """Processor tensors of the observation images in ``ids`` (``pixel_values``, ``image_grid_thw``), or empty."""


class GroundTruthProbe:
    """Teacher-forced mean log-probs of each row's ground truth after given contexts (module docstring)."""

    def __init__(self, sampler: TokenSampler, options: ProbeOptions, state: Any):
        self.sampler = sampler
        self.options = options
        self.state = state
        """The class of the rollout state scored (:class:`.turns.TurnState`; the turn driver passes it)."""

    def targets(self, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
        """The pseudo response of each row: (token ids, scored mask), :func:`mmgrpo.igpo.probe_target`."""
        o = self.options
        return [probe_target(self.sampler.tokenizer, o.template, row[o.column], o.score) for row in rows]

    @torch.no_grad()
    def logprobs(
        self, encodings: list[dict[str, Tensor]], contexts: list[ProbeContext], targets: list[tuple[list[int], list]]
    ) -> list[float]:
        """ℓ of ``targets[i]`` after ``contexts[i]`` (prompt ``encodings[contexts[i].prompt]``), ``batch_size``
        contexts per forward. Shape: n contexts → n floats."""
        out: list[float] = []
        step = self.options.batch_size
        for i in range(0, len(contexts), step):
            out += self._chunk(encodings, contexts[i : i + step], targets[i : i + step]).tolist()
        return out

    def _chunk(self, encodings: list[dict], contexts: list[ProbeContext], targets: list) -> Tensor:
        """ℓ of one chunk: the [context ; response] rows as a :class:`.turns.TurnState`, the response's scored
        tokens as its action tokens. Shape: n contexts → [n]."""
        a, n = self.sampler, len(contexts)
        L = max(len(c.ids) + len(t[0]) for c, t in zip(contexts, targets))
        ids = torch.full((n, L), a.pad_id, dtype=torch.long)  # [n, L]
        action = torch.zeros((n, L), dtype=torch.long)  # [n, L]
        valid = torch.zeros((n, L), dtype=torch.long)  # [n, L]
        for j, (c, (target, scored)) in enumerate(zip(contexts, targets)):
            k = len(c.ids)
            ids[j, : k + len(target)] = torch.tensor(c.ids + target, dtype=torch.long)
            action[j, k : k + len(target)] = torch.tensor(scored, dtype=torch.long)
            valid[j, : k + len(target)] = 1
        turn = torch.where(action.bool(), torch.zeros_like(action), torch.full_like(action, -1))  # [n, L]
        prompts = torch.tensor([c.prompt for c in contexts], dtype=torch.long)  # [n]
        state = self.state(ids, action, valid, turn, prompts, encodings, [c.media for c in contexts])
        logp = a.token_logprobs(a.model, state, torch.arange(n)).float().cpu()  # [n, L]
        mask = action.float()  # [n, L]
        return (logp * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # [n]


__all__ = ["GroundTruthProbe", "ProbeContext"]
