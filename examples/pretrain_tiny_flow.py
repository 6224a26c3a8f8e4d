"""Pre-train the tiny SD3 base model of the ``flow_shapes`` task on procedurally generated images.

    OMP_NUM_THREADS=1 python examples/pretrain_tiny_flow.py                      # the shipped checkpoint
    python examples/pretrain_tiny_flow.py --out /tmp/base --vae-steps 50 --flow-steps 50   # a quick smoke run

Writes a ``StableDiffusion3Pipeline`` directory (real diffusers classes, ~1.5 MB in fp32). Without ``--out`` it
replaces ``modalities/flow_assets/tiny-sd3-flow-shapes``, the base that ``model.args.name_or_path:
tiny-sd3-flow-shapes`` loads. Stages and losses: :func:`mmgrpo.modalities.flow_task.pretrain`. Deterministic for a
given seed and torch build (CPU).
"""

from __future__ import annotations

import argparse

import torch

from mmgrpo.modalities.flow_task import BASE_DIR, PretrainSettings, pretrain


def main() -> None:
    d = PretrainSettings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(BASE_DIR), help="output directory (default: the shipped checkpoint)")
    ap.add_argument("--vae-steps", type=int, default=d.vae_steps)
    ap.add_argument("--flow-steps", type=int, default=d.flow_steps)
    ap.add_argument("--batch-size", type=int, default=d.batch_size)
    ap.add_argument("--seed", type=int, default=d.seed)
    a = ap.parse_args()
    torch.set_num_threads(1)
    s = PretrainSettings(vae_steps=a.vae_steps, flow_steps=a.flow_steps, batch_size=a.batch_size, seed=a.seed)
    print(f"wrote {pretrain(a.out, s)}")


if __name__ == "__main__":
    main()
