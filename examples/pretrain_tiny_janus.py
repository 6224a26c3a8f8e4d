"""Pre-train the tiny Janus base model of the ``ar_image`` adapter on the procedurally generated ``flow_shapes`` images.

    OMP_NUM_THREADS=1 python examples/pretrain_tiny_janus.py                        # the shipped checkpoint
    python examples/pretrain_tiny_janus.py --out /tmp/janus --vq-steps 50 --lm-steps 50   # a quick smoke run

Writes a ``JanusForConditionalGeneration`` directory + ``JanusProcessor`` (real transformers classes). Without ``--out``
it replaces ``modalities/ar_image/assets/tiny-janus-shapes``, the base that ``model.args.name_or_path:
tiny-janus-shapes`` loads.

Stages:
1. **VQ auto-encoder** (``model.model.vqmodel``): encoder → ``quant_conv`` → nearest entry of the L2-normalised
   codebook (cosine; the decoder side, ``get_codebook_entry``, normalises the same way, as LlamaGen's VQ does) →
   ``post_quant_conv`` → decoder. Loss: MSE reconstruction + ‖sg(e) − z‖² + 0.25·‖e − sg(z)‖² with a
   straight-through estimator (van den Oord et al. 2017, §3.2); unused entries are re-seeded from encoder outputs.
2. **Language model**: the images are tokenised once; the Llama backbone, the generation embeddings / aligner
   and the generation head learn next-image-token cross-entropy after the prompt ``<bos> words <begin_of_image>``,
   the prompt replaced by the unconditional one (pad except BOS and BOI) 10% of the time so that
   classifier-free guidance has an unconditional model (Janus-Pro §3 trains with the same 10% dropout).
Deliberately short, so the base is sensible but imperfect.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from mmgrpo.modalities.ar_image.adapter import JanusFamily
from mmgrpo.modalities.ar_image.tiny import RESOLUTION, SHIPPED, build_processor, build_tiny_janus
from mmgrpo.tasks.flow_shapes import random_render


def _images(rng: random.Random, n: int) -> tuple[torch.Tensor, list[str]]:
    imgs, prompts = zip(*(random_render(rng) for _ in range(n)))  # 32×32, box-downsampled to the VQ resolution
    arr = np.stack([np.asarray(im.resize((RESOLUTION, RESOLUTION), Image.BOX)) for im in imgs])
    x = torch.from_numpy(arr).float().permute(0, 3, 1, 2) / 127.5 - 1  # [n, 3, H, W] in [-1, 1]
    return x, list(prompts)


def _quantise(vq, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(normalised encoder output z [n, e, h, w], its codes [n, h·w], the codebook loss)."""
    z = F.normalize(vq.quant_conv(vq.encoder(x)), dim=1)  # [n, e, h, w]
    codebook = F.normalize(vq.quantize.embedding.weight, dim=-1)  # [V, e]
    flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])  # [n·h·w, e]
    codes = (flat @ codebook.T).argmax(-1)  # [n·h·w]
    q = codebook[codes].view(z.shape[0], z.shape[2], z.shape[3], -1).permute(0, 3, 1, 2)  # [n, e, h, w]
    loss = F.mse_loss(q, z.detach()) + 0.25 * F.mse_loss(z, q.detach())
    zq = z + (q - z).detach()
    return zq, codes.view(z.shape[0], -1), loss


def train_vq(model, steps: int, batch: int, lr: float, rng: random.Random) -> None:
    vq = model.model.vqmodel
    vq.train()
    opt = torch.optim.Adam(vq.parameters(), lr=lr)
    V = vq.quantize.embedding.weight.shape[0]
    for step in range(steps):
        x, _ = _images(rng, batch)
        zq, codes, cb_loss = _quantise(vq, x)
        recon = vq.decoder(vq.post_quant_conv(zq))  # [n, 3, H, W]
        loss = F.mse_loss(recon, x) + cb_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            used = torch.bincount(codes.flatten(), minlength=V)
            dead = (used == 0).nonzero().flatten()
            if len(dead) and step < steps * 0.8:  # re-seed unused entries from encoder outputs
                with torch.no_grad():
                    z = F.normalize(vq.quant_conv(vq.encoder(x)), dim=1).permute(0, 2, 3, 1).reshape(-1, zq.shape[1])
                    vq.quantize.embedding.weight[dead] = z[torch.randint(len(z), (len(dead),))]
            print(f"vq {step:5d} loss {loss.item():.4f} used codes {(used > 0).sum().item()}/{V}", flush=True)
    vq.eval()


def _lm_loss(model, family: JanusFamily, prompt_ids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    embeds = torch.cat(
        [model.get_input_embeddings()(prompt_ids), model.prepare_embeddings_for_image_generation(codes[:, :-1])], 1
    )
    hidden = family.backbone(model)(inputs_embeds=embeds, use_cache=False).last_hidden_state  # [n, L+T-1, D]
    logits = model.model.generation_head(hidden[:, prompt_ids.shape[1] - 1 :])  # [n, T, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), codes.flatten())


def train_lm(model, tok, steps: int, batch: int, lr: float, dropout: float, rng: random.Random, pool: int) -> None:
    family = JanusFamily(model, tok)
    with torch.no_grad():
        x, prompts = _images(rng, pool)
        codes = torch.cat([_quantise(model.model.vqmodel, x[i : i + 256])[1] for i in range(0, pool, 256)])  # [pool, T]
    ids = [family.prompt_ids(p) for p in prompts]
    L = max(len(i) for i in ids)
    assert all(len(i) == L for i in ids), "task prompts tokenise to one length"
    ids = torch.tensor(ids)  # [pool, L]
    params = [p for n, p in model.named_parameters() if "vqmodel" not in n and "vision_model" not in n]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    model.train()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    for step in range(steps):
        b = torch.randint(pool, (batch,), generator=gen)
        p = ids[b]
        drop = torch.rand(batch, generator=gen) < dropout
        p = torch.where(drop[:, None], family.uncond_ids(p), p)
        loss = _lm_loss(model, family, p, codes[b])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            print(f"lm {step:5d} loss {loss.item():.4f}", flush=True)
    model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(SHIPPED["tiny-janus-shapes"]))
    ap.add_argument("--vq-steps", type=int, default=200)
    ap.add_argument("--vq-batch-size", type=int, default=32)
    ap.add_argument("--lm-steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--pool", type=int, default=8192, help="training images tokenised for the LM stage")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    model, tok = build_tiny_janus(a.seed)
    t0 = time.time()
    train_vq(model, a.vq_steps, a.vq_batch_size, 2e-3, rng)
    print(f"vq done {time.time() - t0:.0f}s", flush=True)
    train_lm(model, tok, a.lm_steps, a.batch_size, 2e-3, 0.1, rng, a.pool)
    print(f"lm done {time.time() - t0:.0f}s", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    build_processor(tok, model.config).save_pretrained(str(out))  # JanusProcessor: tokenizer + image processor
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
