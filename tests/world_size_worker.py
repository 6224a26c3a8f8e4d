"""One GRPO step, saving its rollout and the updated weights: launched by ``tests/test_world_size.py``.

Run as ``python tests/world_size_worker.py CONFIG OUT [key=value ...]`` (one process) or under
``accelerate launch`` (several); ``WS_LATE_GRADIENT_MIN_BYTES`` in the environment sets
``modalities/tokens/logprobs.py``'s threshold for a tied head's late gradient. Each process writes
``OUT/rank{r}.pt`` (its rollout: outputs, token ids or latents, old log-probs, rewards, world size) and process 0
writes ``OUT/params.pt`` (trainable parameters after the step, by name) and ``OUT/metrics.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from mmgrpo.cli import note_deprecations
from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer


class _RecordingRewards:
    """The trainer's reward runner, keeping the scores [B, K] of its last call."""

    def __init__(self, runner, record: dict):
        self._runner, self._record = runner, record

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def __call__(self, *args, **kwargs):
        scores, metrics = self._runner(*args, **kwargs)
        self._record["scores"] = scores.clone()  # [B, K]
        return scores, metrics


def main(config: str, out: str, overrides: list[str]) -> None:
    late_heads = [0]  # head gradients deferred to the end of the backward (TiedGrad.add_head calls)
    if "WS_LATE_GRADIENT_MIN_BYTES" in os.environ:  # the tied head's late gradient at any size (its tests)
        from mmgrpo.modalities.tokens import logprobs

        logprobs.LATE_GRADIENT_MIN_BYTES = int(os.environ["WS_LATE_GRADIENT_MIN_BYTES"])
        add_head = logprobs.TiedGrad.add_head

        def counted(self, add):
            late_heads[0] += 1
            add_head(self, add)

        logprobs.TiedGrad.add_head = counted
    cfg = load_config(config, [f"output_dir={out}/run", *overrides])
    trainer = Trainer(cfg)
    record: dict = {}
    sample = trainer.adapter.rollout

    def rollout(rows, group_size, keys=None):
        r = sample(rows, group_size, keys)
        record["rollout"] = r
        return r

    trainer.adapter.rollout = rollout
    trainer.rewards = _RecordingRewards(trainer.rewards, record)
    metrics = trainer.train_step(0)
    acc, r = trainer.acc, record["rollout"]
    state = r.state
    # The launch is what the caller asked for, and this process sampled exactly the prompts its keys name: the
    # comparison in tests/test_world_size.py is only meaningful when both hold.
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if acc.num_processes != launched:
        raise SystemExit(f"world_size_worker: {launched} processes launched but accelerate sees {acc.num_processes}")
    expected = len(trainer.sampler.positions(0)) * cfg.algorithm.group_size
    if r.mask.shape[0] != expected:
        raise SystemExit(f"world_size_worker: rank {acc.process_index} sampled {r.mask.shape[0]} rows, not {expected}")
    saved = {
        "world": acc.num_processes,
        "rank": acc.process_index,
        "positions": trainer.sampler.positions(0),
        "outputs": [o if isinstance(o, str) else None for o in r.outputs],
        "completion_ids": getattr(state, "completion_ids", None),  # [B, T] token policies
        "latents": getattr(state, "latents", None),  # [B, T+1, C, H, W] flow
        "old_logprobs": r.old_logprobs,  # [B, T]
        "mask": r.mask,  # [B, T]
        "scores": record["scores"],  # [B, K]
        "late_heads": late_heads[0],
    }
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(saved, directory / f"rank{acc.process_index}.pt")
    model = acc.unwrap_model(trainer.adapter.model)
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
    if acc.is_main_process:
        torch.save(params, directory / "params.pt")
        (directory / "metrics.json").write_text(json.dumps(metrics))
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    note_deprecations()  # the suite counts this rank's deprecation notices (tests/deprecations.py)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
