"""Peak host memory of a checkpoint under FSDP2: gathered on process 0 against sharded (torch.distributed.checkpoint).

Run on 2 CPU processes (gloo)::

    OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=65536 .venv/bin/torchrun --nproc-per-node 2 \
        benchmarks/checkpoint_memory.py --mib 64 --out /tmp/ckpt-mem

A stack of ``Linear`` layers holding ``--mib`` MiB of float32 weights is sharded with ``fully_shard`` (each layer
its own FSDP unit, as the transformer blocks of a policy) and takes one AdamW step (two moments per weight: the
optimizer state is twice the model). Then each process saves a step checkpoint with :func:`mmgrpo.checkpoint.save`,
once with ``sharded=False`` (the layout before: weights and optimizer state gathered whole on process 0, plus the
Hugging Face export) and once with ``sharded=True`` (every process writes its own shards), while a thread samples
its RSS every millisecond. ``MALLOC_MMAP_THRESHOLD_`` makes glibc return every allocation of 64 kB or more to the OS
when freed, so RSS follows the live bytes. Prints, per process and layout, the peak RSS above the RSS before the save,
in MiB and as a multiple of the model's size.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class _Peak:
    """The highest RSS seen by a sampling thread between ``start`` and ``stop``."""

    def __enter__(self):
        self.base, self.peak, self._run = _rss(), _rss(), True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while self._run:
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._run = False
        self._thread.join()
        self.peak = max(self.peak, _rss())


class _Adapter:
    """What :func:`mmgrpo.checkpoint.save` needs of a policy adapter: the model and a Hugging Face-style export."""

    def __init__(self, model):
        self.model = model

    def save_pretrained(self, directory: str) -> None:
        from safetensors.torch import save_file

        Path(directory).mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, f"{directory}/model.safetensors")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=64, help="model size in MiB of float32 weights")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--out", default="/tmp/mmgrpo-ckpt-mem")
    args = p.parse_args()
    from accelerate import Accelerator
    from torch.distributed.fsdp import fully_shard

    from mmgrpo import checkpoint

    acc = Accelerator(cpu=True)
    width = int((args.mib * (1 << 20) / 4 / args.layers) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(args.layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    size = sum(p.numel() * 4 for p in model.parameters())
    out = {}
    for layout in (False, True, False, True):  # twice each: the second of each is reported (warm allocator)
        run = Path(args.out) / f"{'sharded' if layout else 'gathered'}"
        acc.wait_for_everyone()
        with _Peak() as peak:
            checkpoint.save(acc, _Adapter(model), run, 1, keep_last=1, optimizer=opt, sharded=layout)
        out["sharded" if layout else "gathered"] = (peak.peak - peak.base) / (1 << 20)
    rec = {"rank": acc.process_index, "model_mib": size / (1 << 20), **{f"{k}_mib": v for k, v in out.items()}}
    rec |= {f"{k}_x_model": v * (1 << 20) / size for k, v in out.items()}
    print(json.dumps(rec), flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
