"""Pre-train the tiny SD3 base model of the ``flow_shapes`` task on procedurally generated images.

    OMP_NUM_THREADS=1 python examples/pretrain_tiny_flow.py                      # the shipped checkpoint
    python examples/pretrain_tiny_flow.py --out /tmp/base --vae-steps 50 --flow-steps 50   # a quick smoke run

Writes a ``StableDiffusion3Pipeline`` directory (real diffusers classes, ~1.5 MB in fp32). Without ``--out`` it
replaces ``modalities/flow/assets/tiny-sd3-flow-shapes``, the base that ``model.args.name_or_path:
tiny-sd3-flow-shapes`` loads. Stages and losses: :func:`pretrain` below. Deterministic for a
given seed and torch build (CPU).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mmgrpo.modalities.flow.tiny import SHIPPED, TinyFlowSizes, build_tiny_sd3
from mmgrpo.tasks.flow_shapes import random_render, to_array

BASE_DIR = SHIPPED["tiny-sd3-flow-shapes"]


@dataclass
class PretrainSettings:
    """Budget of :func:`pretrain` (defaults make the shipped base model)."""

    vae_steps: int = 600
    flow_steps: int = 2000
    batch_size: int = 64
    vae_lr: float = 2e-3
    flow_lr: float = 1e-3
    kl_weight: float = 1e-6
    cond_dropout: float = 0.1
    seed: int = 0
    heads: int = 4
    layers: int = 3


def _image_batch(rng: random.Random, n: int) -> tuple[torch.Tensor, list[str]]:
    imgs, prompts = zip(*(random_render(rng) for _ in range(n)))
    x = torch.from_numpy(np.stack([to_array(im) for im in imgs])).permute(0, 3, 1, 2) * 2 - 1  # [n, 3, H, W] in [-1, 1]
    return x, list(prompts)


def pretrain(directory: str | os.PathLike, settings: PretrainSettings | None = None, log=print) -> Path:
    """Train the tiny SD3 base model of this task on procedurally generated images and save the pipeline.

    Stage 1 fits the ``AutoencoderKL`` (L2 reconstruction + ``kl_weight``·KL), then sets the VAE's
    ``shift_factor``/``scaling_factor`` to the latents' mean and 1/std (as SD3 does). Stage 2 fits the
    ``SD3Transformer2DModel`` with the rectified-flow loss ‖v_θ(x_σ, σ) − (ε − x₀)‖², σ ~ logit-normal(0, 1)
    (SD3's sampling, Esser et al. 2024 §3.1), prompts dropped to "" with probability ``cond_dropout``.
    """
    s = settings or PretrainSettings()
    torch.manual_seed(s.seed)
    rng = random.Random(s.seed)
    pipe = build_tiny_sd3(seed=s.seed, sizes=TinyFlowSizes(heads=s.heads, layers=s.layers))
    vae, tr = pipe.vae, pipe.transformer
    for m in (pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3):
        m.requires_grad_(False).eval()
    t0 = time.perf_counter()
    opt = torch.optim.AdamW(vae.parameters(), lr=s.vae_lr)
    for step in range(s.vae_steps):
        x, _ = _image_batch(rng, s.batch_size)
        post = vae.encode(x).latent_dist
        z = post.sample()
        rec = vae.decode(z).sample
        loss = (rec - x).pow(2).mean() + s.kl_weight * post.kl().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == s.vae_steps - 1:
            log(f"vae step {step} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f}s)")
    vae.requires_grad_(False).eval()
    with torch.no_grad():
        x, _ = _image_batch(rng, 512)
        z = vae.encode(x).latent_dist.mean
        vae.register_to_config(shift_factor=float(z.mean()), scaling_factor=float(1.0 / z.std()))
    cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def encode(prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [p for p in set(prompts) if p not in cache]
        if missing:
            with torch.no_grad():
                pe, _, pooled, _ = pipe.encode_prompt(
                    missing,
                    missing,
                    missing,
                    do_classifier_free_guidance=False,
                    max_sequence_length=pipe.tokenizer_3.model_max_length,
                )
            for i, p in enumerate(missing):
                cache[p] = (pe[i], pooled[i])
        return torch.stack([cache[p][0] for p in prompts]), torch.stack([cache[p][1] for p in prompts])

    opt = torch.optim.AdamW(tr.parameters(), lr=s.flow_lr, weight_decay=0.0)
    warm_cosine = lambda k: min(1.0, (k + 1) / 100) * 0.5 * (1 + math.cos(math.pi * k / s.flow_steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warm_cosine)
    t1 = time.perf_counter()
    for step in range(s.flow_steps):
        x, prompts = _image_batch(rng, s.batch_size)
        prompts = ["" if rng.random() < s.cond_dropout else p for p in prompts]
        with torch.no_grad():
            z0 = (vae.encode(x).latent_dist.mean - vae.config.shift_factor) * vae.config.scaling_factor
        pe, pooled = encode(prompts)
        sigma = torch.sigmoid(torch.randn(x.shape[0]))  # [n]
        eps = torch.randn_like(z0)
        zs = (1 - sigma.view(-1, 1, 1, 1)) * z0 + sigma.view(-1, 1, 1, 1) * eps
        v = tr(
            hidden_states=zs,
            timestep=sigma * 1000,
            encoder_hidden_states=pe,
            pooled_projections=pooled,
            return_dict=False,
        )[0]
        loss = (v - (eps - z0)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == s.flow_steps - 1:
            log(f"flow step {step} loss {loss.item():.4f} ({time.perf_counter() - t1:.0f}s)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(str(out), safe_serialization=True)
    return out


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
