"""DGPO rollouts and units for the flow adapter (``model.args.objective: dgpo``): no transition log-probs.

DGPO (Luo, Hu & Tang 2025, "Reinforcing Diffusion Models by Direct Group Preference Optimization",
arXiv 2510.08425; code Luo-Yihong/DGPO ``scripts/train_sd3_dgpo.py`` lines 52–193 and 1040–1160 and
``config/dgpo.py``, commit 01ceb4b) samples each group with the deterministic ODE sampler and learns from the group
preference through the denoising (DSM) loss of the final latents:

* rollout: ODE steps (``noise_level = 0``) with the rollout CFG; x₀ = the final latent of every sample;
* training units: M = ``dgpo_times`` noise levels σ_j picked among the first ``dgpo_trunc_steps + 1`` steps of the
  rollout schedule (the high-noise end; ``random.sample`` on the main process in the code), the same for every
  sample; for each, noise ε shared by the G samples of a group (``use_shared_noise``);
  x_t = (1 − σ)·x₀ + σ·ε, target u = ε − x₀ and ℓ_{i,j} = mean_D ‖v_θ(x_t, σ_j) − u‖², the conditional velocity
  (training without CFG, the code's default);
* the reference ℓ^ref_{i,j} is the same loss under the reference denoiser (LoRA disabled / the frozen copy).

The adapter returns u_{i,j} = −ℓ_{i,j} as the units' "log-probs" and −ℓ^ref as ``old_logprobs``, so the trainer's
log-ratio is −(ℓ − ℓ^ref), the quantity DGPO's group score is built from; the ``dgpo`` surrogate
(``mmgrpo.losses``) turns it into the group-preference loss. ``exact_kl`` gives DGPO's KL term
mean_D ‖v_θ − v_ref‖² (``algorithm.kl: gaussian_exact``).

Departures: the M times and the shared noise are drawn once per rollout (keyed by (seed, step) under
``rollout_noise: keyed``) and kept for all epochs, where the code draws the times once per epoch and fresh noise
per minibatch; the code's optional PPO-style stop-gradient against an EMA copy of the policy (``clip_dsm``) and
its EMA reference (TDM-R1) are not implemented; flow-matching backends only (SD3, FLUX).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from mmgrpo import noise
from mmgrpo.types import Rollout

DGPO_NOISE = 0xD6F0
"""Mixed into the rollout seed for the DSM noise and the times (apart from the sampling noise)."""


class FlowPolicy(Protocol):
    """The flow adapter's public surface DGPO uses (:class:`.adapter.FlowAdapter`): options, devices, the denoiser,
    prompt encoding, the (guided) velocity, the sampler's kernel and the reference policy."""

    args: Any
    backend: Any
    generator: torch.Generator

    @property
    def device(self) -> torch.device: ...

    def sync_devices(self) -> None: ...

    def denoiser(self) -> torch.nn.Module: ...

    def encode_prompts(self, texts: list[str], guided: bool) -> Any: ...

    def velocity(
        self, model: Any, x: Tensor, t_model: Tensor, cond: Any, prompt_of: Tensor, guidance: float | None
    ) -> Tensor: ...

    def kernel(
        self, out: Tensor, x: Tensor, coef: Tensor, coef_next: Tensor, sigma_max: float | None, *, stochastic=True
    ) -> Any: ...

    def reference_policy(self) -> AbstractContextManager[torch.nn.Module]: ...


@dataclass
class DGPOState:
    """Adapter-private rollout state of ``objective: dgpo``.

    Shape:
        x0: [B, C, H, W] final latents of the ODE rollouts (fp32, CPU)
        eps: [B, M, C, H, W] DSM noise, equal within each group
        sigma, t_model: [B, M] noise level σ_j and the model timestep of each training unit
        prompt_of: [B] row of ``cond`` for each sample
    """

    x0: Tensor
    eps: Tensor
    sigma: Tensor
    t_model: Tensor
    prompt_of: Tensor
    cond: Any


@torch.no_grad()
def rollout(adapter: FlowPolicy, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
    """G ODE samples per prompt; units = the M DSM terms of each sample, ``old_logprobs`` = −ℓ^ref. See the module."""
    a, dev = adapter.args, adapter.device
    adapter.sync_devices()
    model = adapter.denoiser()
    P, G, T, M = len(prompts), group_size, a.num_steps, a.dgpo_times
    B = P * G
    guided = a.cfg == "guided"
    cond = adapter.encode_prompts([str(r["prompt"]) for r in prompts], guided)
    prompt_of = torch.arange(P).repeat_interleave(G)  # [B]
    shape = adapter.backend.latent_shape()
    if keys is not None:
        keys.check(B, "flow DGPO rollout")
        x = noise.normals(keys.generators(shared=a.same_noise), shape)  # [B or P, C, H, W]
        dsm_keys = noise.NoiseKeys(noise.mix(keys.seed, DGPO_NOISE), keys.step, keys.positions, G)
        eps = noise.normals(dsm_keys.generators(shared=True), (M, *shape))  # [P, M, C, H, W]
        times_gen = torch.Generator().manual_seed(noise.mix(keys.seed, keys.step, DGPO_NOISE))  # every process
    else:
        x = torch.randn(P if a.same_noise else B, *shape, generator=adapter.generator)
        eps = torch.randn(P, M, *shape, generator=adapter.generator)
        times_gen = adapter.generator
    x = (x.repeat_interleave(G, 0) if a.same_noise else x).to(dev)  # [B, C, H, W]
    sched = adapter.backend.schedule(T)
    for i in range(T):  # the deterministic sampler (DGPO: noise_level = 0)
        out = adapter.velocity(
            model,
            x,
            sched["t_model"][i].expand(B).to(dev),
            cond,
            prompt_of.to(dev),
            a.guidance_scale if guided else None,
        )
        c, cn = sched["coef"][i].expand(B).to(dev), sched["coef_next"][i].expand(B).to(dev)
        x = adapter.kernel(out, x, c, cn, None, stochastic=False).prev_sample
    steps = torch.randperm(a.dgpo_trunc_steps + 1, generator=times_gen)[:M]  # [M] among the high-noise steps
    state = DGPOState(
        x0=x.float().cpu(),
        eps=eps.repeat_interleave(G, 0),
        sigma=sched["sigma"][steps].expand(B, M).clone().float(),
        t_model=sched["t_model"][steps].expand(B, M).clone(),
        prompt_of=prompt_of,
        cond=cond,
    )
    out = Rollout(
        outputs=adapter.backend.decode(x),
        old_logprobs=torch.zeros(B, M),
        mask=torch.ones(B, M),
        group_size=G,
        prompt_index=prompt_of.clone(),
        truncated=torch.zeros(B, dtype=torch.bool),
        state=state,
        unit_sigmas=state.sigma.clone(),
    )
    with adapter.reference_policy() as ref:
        out.old_logprobs = -torch.cat(
            [dsm_losses(adapter, ref, out, idx)[0].cpu() for idx in torch.arange(B).split(a.forward_batch_size)]
        )  # [B, M] −ℓ^ref
    return out


def dsm_losses(adapter: FlowPolicy, model: Any, rollout: Rollout, index: Tensor) -> tuple[Tensor, Tensor]:
    """ℓ_{i,j} = mean_D ‖v(x_t) − (ε − x₀)‖² [n, M] of samples ``index`` under ``model`` (grad if enabled), and the
    velocities v [n·M, C, H, W] (row-major over (sample, time))."""
    st: DGPOState = rollout.state
    idx = index.cpu()
    dev = adapter.device
    n, M = len(idx), st.sigma.shape[1]
    x0 = st.x0[idx].to(dev)[:, None]  # [n, 1, C, H, W]
    eps = st.eps[idx].to(dev)  # [n, M, C, H, W]
    sig = st.sigma[idx].to(dev).view(n, M, *([1] * (eps.dim() - 2)))  # [n, M, 1, 1, 1]
    xt = ((1 - sig) * x0 + sig * eps).flatten(0, 1)  # [n·M, C, H, W]
    target = (eps - x0).flatten(0, 1)  # [n·M, C, H, W]
    rows = st.prompt_of[idx].repeat_interleave(M).to(dev)  # [n·M]
    v = adapter.velocity(model, xt, st.t_model[idx].flatten().to(dev), st.cond, rows, None)  # conditional only
    loss = (v.float() - target.float()).square().flatten(1).mean(1)  # [n·M]
    return loss.view(n, M), v


__all__ = ["DGPOState", "FlowPolicy", "dsm_losses", "rollout"]
