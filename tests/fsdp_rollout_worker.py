"""Every family of the contract table rolls out and back-propagates under FSDP2: launched by
``tests/test_fsdp.py::test_every_family_rolls_out_and_trains_under_fsdp``.

Run as ``accelerate launch --config_file configs/accelerate/fsdp_cpu_2proc.yaml tests/fsdp_rollout_worker.py OUT
NAME [NAME ...]``. For each family NAME of ``tests/adapter_cases.py`` every process builds the tiny model (full
fine-tuning), shards it as the trainer does (process 0's weights broadcast, then ``Accelerator.prepare``), samples
G completions of its own prompt (process 0's rows are made to end at step 2: their draws are replaced by the end
token, so a sampler that stopped on its own rows would leave process 1 waiting in a collective), then computes the
log-probs and one backward, and scores the rollout with an unsharded copy of the same weights.
Process r writes ``OUT/NAME-rank{r}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mmgrpo import noise, sharding
from mmgrpo.cli import note_deprecations
from mmgrpo.launch import make_accelerator
from mmgrpo.loader import load_config
from mmgrpo.modalities.tokens import decode
from tests.adapter_cases import CASES, build

G = 2
ROOT = Path(__file__).resolve().parents[1]


def main(out: Path, names: list[str]) -> None:
    cfg = load_config(ROOT / "configs/quickstart.yaml", ["logging.trackers=[]", f"output_dir={out}"])
    acc = make_accelerator(cfg, out)
    rank = acc.process_index
    draws = [0]
    draw_token = decode.draw_token

    def counting(scores, spec, u=None, generator=None):  # the decode loop's one draw per step (flow draws none)
        draws[0] += 1
        token, logprob = draw_token(scores, spec, u, generator)
        if rank == 0 and draws[0] >= 2 and spec.eos_ids:  # process 0's rows all end at step 2; process 1's go on
            token = torch.full_like(token, spec.eos_ids[0])
            logprob = torch.log_softmax(scores.float(), -1).gather(1, token[:, None])[:, 0]  # [B], as draw_token's
        return token, logprob

    decode.draw_token = counting
    for name in names:
        case = CASES[name]
        torch.manual_seed(0)
        with acc.main_process_first():  # the tiny model is built into the shared cache once, as the trainer does
            adapter = build(name, lora=False)
            rows = case.rows()[rank : rank + 1]
        sharding.broadcast_from_main(adapter.model)
        acc.state.fsdp_plugin.transformer_cls_names_to_wrap = sharding.block_classes(adapter.model)  # as the trainer
        optimizer = torch.optim.AdamW(adapter.trainable_parameters(), lr=1e-3)
        adapter.model, optimizer = acc.prepare(adapter.model, optimizer)
        draws[0] = 0
        rollout = adapter.rollout(rows, G, noise.NoiseKeys(0, 0, (rank,), G))
        index = torch.arange(rollout.batch_size)
        logp = adapter.logprobs(rollout, index)  # [B, T]
        mask = rollout.mask.to(logp.device)
        advantages = torch.tensor([1.0, -1.0], device=logp.device)[:, None]  # [G, 1]: one better, one worse
        acc.backward(-(advantages * logp * mask).sum() / mask.sum().clamp_min(1.0))
        grads = [sharding.local(p.grad) for p in adapter.trainable_parameters() if p.grad is not None]
        with torch.no_grad():  # the same weights unsharded (every process loads the same cached tiny model)
            unsharded = build(name, lora=False).logprobs(rollout, index).cpu()  # [B, T]
        record = {
            "world": acc.num_processes,
            "sharded": sharding.is_sharded(adapter.model),
            "rows": int(rollout.batch_size),
            "units": int(rollout.mask.sum()),
            "draws": draws[0],
            "own_end": int(rollout.mask.sum(1).max()),  # the decoding steps this process's own rows needed
            "max_diff_unsharded": float((unsharded - rollout.old_logprobs).abs().max()),
            "grad_norm": float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads))) if grads else 0.0,
        }
        (out / f"{name}-rank{rank}.json").write_text(json.dumps(record))
        del adapter, optimizer
        acc.free_memory()


if __name__ == "__main__":
    note_deprecations()  # the suite counts this rank's deprecation notices (tests/deprecations.py)
    main(Path(sys.argv[1]), sys.argv[2:])
