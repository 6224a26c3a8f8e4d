"""Flow-matching and diffusion text-to-image policies over diffusers: the action units are denoising transitions.

Covers SD3 / SD3.5 (``StableDiffusion3Pipeline`` components), FLUX.1 (``FluxPipeline``, guidance-distilled or not)
and DDIM UNets (``StableDiffusionPipeline`` components, DDPO). One rollout of T steps gives T units per sample:
unit i is the transition x_i → x_{i+1}, with the Gaussian log-density of the stochastic kernel
(:mod:`.flow_kernels`; **averaged over the D latent elements**) and ``mask`` 1 only where the transition was
stochastic *and* selected for training (:mod:`.flow_steps`). Deterministic (ODE) transitions have mask 0.

What this adapter guarantees (the adapter contract in ``docs/architecture.md``; Flow-GRPO, arXiv 2505.05470):
- Prompts are encoded once per prompt (text encoders frozen, no grad); the G samples of a group index them.
- Rollout and training use the same velocity function: with ``cfg: guided`` the log-prob is of the guided
  velocity v_u + w(v_c − v_u), both branches in one batched forward and both differentiable (Flow-GRPO after
  commit a482878); ``cfg: none`` samples and trains the conditional velocity only (CFG-free / "nocfg").
  FLUX.1-dev's distilled guidance is the ``flux_guidance`` embedding, not CFG.
- ``logprobs`` recomputes only the trained transitions (all (sample, step) pairs of a minibatch in one batch,
  split into ``forward_batch_size`` rows), in fp32 kernel math; the ratio is exactly 1 before the first update.
- Rollout steps (``num_steps``, SDE) and evaluation steps (``eval_num_steps``, ODE) are separate (Flow-GRPO's
  "denoising reduction"); evaluation noise is seeded per row (its ``seed`` column, else the prompt text), so
  before/after evaluations compare images from the same noise.
- LoRA (peft, injected with diffusers' ``add_adapter``) on the denoiser; the reference policy is the same
  denoiser with the adapter disabled, or a frozen copy for full fine-tuning with ``need_reference``.
- Rewards receive decoded PIL images. ``unit_sigmas`` holds each transition's σ_i (DDIM: the VP state mapped to
  the flow σ axis); ``unit_values`` holds dense values V(x_i) = reward(decode(x̂₀(x_i))) when
  ``value_rewards`` is set (value-anchored shaping), scored by the callable the builder passes (``value_score``,
  made by the trainer's ``BuildContext.reward_scorer``: the adapter runs no reward machinery of its own).
- Sampling noise: under the trainer's ``rollout_noise: keyed`` (``mmgrpo.noise``) each sample's initial latent
  and per-step SDE noise come from its own generator keyed by (seed, step, global prompt position, sample), and
  the step plan from a generator keyed by (seed, step), so rollouts do not depend on the number of processes
  (except the per-sample random plans ``random_subset``, ``branching`` and chunk sampling, drawn for the process's
  B rows). Otherwise (``per_process``, direct calls) noise and step plans come from torch's global CPU RNG, which
  the trainer seeds per process and checkpoints, so a resumed run draws what an uninterrupted one would
  (``sliding_window``'s iteration counter is the adapter's own and restarts at 0 on resume).
- Optional trainer hooks: ``exact_kl(rollout, index)`` (Gaussian KL to the reference per unit, for
  ``algorithm.kl: gaussian_exact``) and ``ratio_norm_inputs(rollout, index)`` (std and mean_D(μθ − μ_old)² for
  GRPO-Guard RatioNorm); both reuse the means of the preceding ``logprobs`` call on the same rows.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from mmgrpo import compat, noise
from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import ADAPTERS, AdapterSpec, BuildContext, Inputs
from mmgrpo.shaping import gaussian_kl
from mmgrpo.types import Rollout

from .. import _hf, model_names
from . import dgpo
from . import kernels as K
from .steps import STEP_SELECTORS, StepPlan
from .tiny import SHIPPED, TINY_NAMES, resolve_pipeline

FLOW_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]
"""Flow-GRPO's LoRA targets for SD3/FLUX (``scripts/train_sd3.py`` line 430). UNets: to_q, to_k, to_v, to_out.0."""


@dataclass
class FlowArgs:
    """Options under ``model.args`` for ``model.adapter: flow``."""

    name_or_path: str = "tiny-sd3"
    """Diffusers pipeline directory or hub id (SD3/SD3.5, FLUX.1, SD1.x), or tiny-sd3 | tiny-flux | tiny-unet."""
    kernel: Literal["flow_sde", "dance_sde", "cps", "ddim"] = "flow_sde"
    """Stochastic transition: flow_sde (Flow-GRPO) | dance_sde (DanceGRPO) | cps | ddim (UNets; DDPO)."""
    noise_level: Annotated[float, Range(ge=0)] = 0.7
    """Kernel noise: a of flow_sde (0.7 SD3, 0.9 FLUX) and cps (0.8); η of dance_sde (0.3) and ddim (1.0)."""
    cps_logprob: Literal["gaussian", "flow_grpo"] = "gaussian"
    """CPS log-prob: gaussian (exact density) | flow_grpo (−mean_D (x'−μ)², no constants)."""
    num_steps: Annotated[int, Range(ge=1)] = 10
    """Rollout denoising steps T (= action units per sample)."""
    eval_num_steps: Annotated[int, Range(ge=1)] = 40
    """Evaluation (ODE) steps."""
    resolution: Annotated[int, Range(ge=1)] = 512
    """Image height and width in pixels."""
    cfg: Literal["guided", "none"] = "guided"
    """guided (v_u + w(v_c − v_u) in rollout and training, gradient through both) | none (conditional only)."""
    guidance_scale: float = 4.5
    """CFG weight w for cfg=guided (Flow-GRPO SD3.5: 4.5)."""
    eval_guidance_scale: float | None = None
    """CFG weight at evaluation (None = guidance_scale); with cfg=none evaluation is unguided too."""
    flux_guidance: float = 3.5
    """FLUX.1-dev distilled guidance embedding (ignored by models without guidance_embeds)."""
    negative_prompt: str = ""
    """Unconditional prompt for CFG."""
    max_sequence_length: int | None = None
    """T5 tokens (None = min(256, the T5 tokenizer's model_max_length))."""
    steps: str = "fraction"
    """Step selector (flow_steps.STEP_SELECTORS): fraction | random_subset | sde_window | sliding_window |
    branching | chunks."""
    step_args: dict[str, Any] = field(default_factory=dict)
    """Options of the step selector, e.g. {fraction: 0.99} or {window: 3, high: 5}."""
    same_noise: bool = False
    """The G samples of a prompt share the initial noise (Flow-GRPO same_latent, DanceGRPO init_same_noise)."""
    value_rewards: list[dict[str, Any]] = field(default_factory=list)
    """Rewards that score x̂₀(x_i) at every step for dense values (value_anchored shaping): [{name, weight, kwargs}]."""
    kl_variant: Literal["exact", "flow_grpo"] = "exact"
    """exact_kl(): exact (‖Δμ‖²/(2s²h), mean over D) | flow_grpo (Flow-GRPO's ‖Δμ‖²/(2s²), = exact·h)."""
    forward_batch_size: int = 64
    """Rows per denoiser forward (CFG doubles them)."""
    encode_batch_size: Annotated[int, Range(ge=0)] = 0
    """Prompts per text-encoder call (0: all of a rollout's prompts in one). 1 makes each prompt's embedding
    independent of the batch it came in (a text encoder's output moves by ~1e-7 with its batch size), so that
    with ``rollout_noise: keyed`` 1 process × P prompts and W processes × P/W prompts sample bit-identical
    rollouts (docs/architecture.md, "World-size invariance")."""
    decode_batch_size: Annotated[int, Range(ge=0)] = 0
    """Latents per VAE decode call (0: all of a rollout's in one). 1 makes each decoded image — and so its reward —
    independent of the batch it came in (a VAE decode of 16 vs 8 latents differs by a few 1e-6 in the pixels,
    1.8e-5 in the flow_shapes reward, measured), for world-size invariant rewards with ``rollout_noise: keyed``."""
    eval_seed: int = 1234
    """Seed of the per-prompt evaluation noise."""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda[:i]; the trainer's accelerate device wins once it prepares the model."""
    objective: Literal["logprob", "dgpo"] = "logprob"
    """logprob: SDE rollouts, units = transitions with their log-probs (Flow-GRPO and kin) | dgpo: ODE rollouts,
    units = DSM losses of the final latents (DGPO, arXiv 2510.08425; pair with algorithm.surrogate: dgpo)."""
    dgpo_times: Annotated[int, Range(ge=1)] = 4
    """dgpo: M noise levels per sample (DGPO num_train_timesteps)."""
    dgpo_trunc_steps: Annotated[int, Range(ge=0)] = 4
    """dgpo: the M levels are drawn among rollout steps 0..dgpo_trunc_steps (the high-noise end; DGPO trunc_steps)."""


# ------------------------------------------------------------------------------------------ backends


@dataclass
class Cond:
    """Per-prompt text conditioning (not indexed by sample; ``prompt_of`` maps samples to rows).

    Shape:
        tensors: each [P, ...] (prompt embeddings, pooled embeddings)
        uncond: each [1, ...] or None (no CFG)
    """

    tensors: dict[str, Tensor]
    uncond: dict[str, Tensor] | None = None


class _Backend:
    """The model-family plumbing: text encoding, schedule, one denoiser forward, decoding."""

    is_flow = True

    def __init__(self, pipe, args: FlowArgs):
        self.pipe, self.args = pipe, args
        vae = pipe.vae
        self.vae_scale = 2 ** (len(vae.config.block_out_channels) - 1)
        self.height = self.width = args.resolution

    @property
    def device(self) -> torch.device:
        return self.pipe.vae.device

    def latent_shape(self) -> tuple[int, int, int]:
        raise NotImplementedError

    def encode(self, texts: list[str]) -> dict[str, Tensor]:
        raise NotImplementedError

    def forward(self, model, x: Tensor, t_model: Tensor, cond: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def schedule(self, num_steps: int) -> dict[str, Tensor]:
        """Per-step tensors [T]: t_model (model timestep), coef/coef_next (kernel inputs), sigma (flow σ axis)."""
        raise NotImplementedError

    def x0(self, out: Tensor, x: Tensor, sched: dict[str, Tensor], i: int) -> Tensor:
        return K.x0_from_velocity(out, x, sched["coef"][i])

    def max_sequence_length(self) -> int | None:
        """The T5 length prompts are encoded with (None: no T5 encoder, the UNets)."""
        return None

    @torch.no_grad()
    def decode(self, latents: Tensor) -> list:
        vae = self.pipe.vae
        z = latents.to(vae.dtype) / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        step = self.args.decode_batch_size or max(1, z.shape[0])
        images = torch.cat([vae.decode(z[i : i + step], return_dict=False)[0] for i in range(0, z.shape[0], step)])
        return self.pipe.image_processor.postprocess(images.float(), output_type="pil")


class _SD3Backend(_Backend):
    def latent_shape(self):
        c = self.pipe.transformer.config.in_channels
        return c, self.height // self.vae_scale, self.width // self.vae_scale

    def max_sequence_length(self) -> int:
        tok = self.pipe.tokenizer_3
        return self.args.max_sequence_length or min(256, tok.model_max_length if tok is not None else 256)

    @torch.no_grad()
    def encode(self, texts):
        pe, _, pooled, _ = self.pipe.encode_prompt(
            prompt=texts,
            prompt_2=texts,
            prompt_3=texts,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length(),
        )
        return {"prompt_embeds": pe, "pooled": pooled}

    def forward(self, model, x, t_model, cond):
        dtype = self.pipe.vae.dtype
        return model(
            hidden_states=x.to(dtype),
            timestep=t_model.to(dtype),
            encoder_hidden_states=cond["prompt_embeds"],
            pooled_projections=cond["pooled"],
            return_dict=False,
        )[0].float()

    def schedule(self, num_steps):
        sch = copy.deepcopy(self.pipe.scheduler)
        if sch.config.get("use_dynamic_shifting", False):
            from diffusers.pipelines.flux.pipeline_flux import calculate_shift

            _c, h, w = self.latent_shape()
            seq = (h // 2) * (w // 2)
            cfg = sch.config
            mu = calculate_shift(
                seq,
                cfg.get("base_image_seq_len", 256),
                cfg.get("max_image_seq_len", 4096),
                cfg.get("base_shift", 0.5),
                cfg.get("max_shift", 1.15),
            )
            sch.set_timesteps(sigmas=list(torch.linspace(1.0, 1.0 / num_steps, num_steps).numpy()), mu=mu)
        else:
            sch.set_timesteps(num_steps)
        sig = sch.sigmas.float().cpu()  # [T+1]
        return {"t_model": sch.timesteps.float().cpu(), "coef": sig[:-1], "coef_next": sig[1:], "sigma": sig[:-1]}


class _FluxBackend(_SD3Backend):
    def latent_shape(self):
        c = self.pipe.transformer.config.in_channels // 4
        h = 2 * (self.height // (self.vae_scale * 2))
        w = 2 * (self.width // (self.vae_scale * 2))
        return c, h, w

    def max_sequence_length(self) -> int:
        return self.args.max_sequence_length or min(256, self.pipe.tokenizer_2.model_max_length)

    @torch.no_grad()
    def encode(self, texts):
        pe, pooled, text_ids = self.pipe.encode_prompt(
            prompt=texts, prompt_2=texts, device=self.device, max_sequence_length=self.max_sequence_length()
        )
        return {"prompt_embeds": pe, "pooled": pooled, "text_ids": text_ids.unsqueeze(0).expand(len(texts), -1, -1)}

    def forward(self, model, x, t_model, cond):
        n, c, h, w = x.shape
        dtype = self.pipe.vae.dtype
        packed = compat.flux_pack_latents(self.pipe, x.to(dtype), n, c, h, w)  # [n, hw/4, 4c]
        img_ids = compat.flux_latent_image_ids(self.pipe, n, h // 2, w // 2, x.device, dtype)
        guidance = None
        if self.pipe.transformer.config.guidance_embeds:
            guidance = torch.full((n,), self.args.flux_guidance, device=x.device, dtype=torch.float32)
        out = model(
            hidden_states=packed,
            timestep=t_model.to(dtype),
            guidance=guidance,
            pooled_projections=cond["pooled"],
            encoder_hidden_states=cond["prompt_embeds"],
            txt_ids=cond["text_ids"][0],
            img_ids=img_ids,
            return_dict=False,
        )[0]
        out = out.view(n, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(n, c, h, w)
        return out.float()

    def schedule(self, num_steps):
        s = super().schedule(num_steps)
        s["t_model"] = s["t_model"] / 1000.0  # FluxPipeline calls the transformer with timestep / 1000
        return s


class _UNetBackend(_Backend):
    is_flow = False

    def latent_shape(self):
        c = self.pipe.unet.config.in_channels
        return c, self.height // self.vae_scale, self.width // self.vae_scale

    @torch.no_grad()
    def encode(self, texts):
        pe, _ = self.pipe.encode_prompt(texts, self.device, 1, False)
        return {"prompt_embeds": pe}

    def forward(self, model, x, t_model, cond):
        dtype = self.pipe.vae.dtype
        out = model(x.to(dtype), t_model.long(), encoder_hidden_states=cond["prompt_embeds"], return_dict=False)[0]
        return out.float()

    def schedule(self, num_steps):
        sch = copy.deepcopy(self.pipe.scheduler)
        sch.set_timesteps(num_steps)
        t = sch.timesteps.long().cpu()  # [T]
        prev = t - sch.config.num_train_timesteps // num_steps
        ac = sch.alphas_cumprod.float().cpu()
        a = ac[t]
        a_prev = torch.where(prev >= 0, ac[prev.clamp_min(0)], torch.as_tensor(float(sch.final_alpha_cumprod)))
        return {"t_model": t.float(), "coef": a, "coef_next": a_prev, "sigma": K.vp_to_flow_sigma(a)}

    def x0(self, out, x, sched, i):
        a = sched["coef"][i]
        pt = self.pipe.scheduler.config.prediction_type
        if pt == "epsilon":
            return (x - (1 - a).sqrt() * out) / a.sqrt()
        if pt == "v_prediction":
            return a.sqrt() * x - (1 - a).sqrt() * out
        return out


def _backend_for(pipe, args: FlowArgs) -> _Backend:
    name = type(pipe).__name__
    if hasattr(pipe, "unet"):
        return _UNetBackend(pipe, args)
    if "Flux" in name:
        return _FluxBackend(pipe, args)
    if "StableDiffusion3" in name:
        return _SD3Backend(pipe, args)
    raise ConfigError(
        f"model.args.name_or_path: pipeline {name} is not supported; use an SD3/SD3.5, FLUX.1 or "
        "Stable Diffusion (UNet + DDIM) pipeline"
    )


# -------------------------------------------------------------------------------------------- rollout


@dataclass
class FlowState:
    """Adapter-private rollout state.

    Shape:
        latents: [B, T+1, C, H, W] x_0 … x_T (fp32)
        old_means: [B, T, C, H, W] μ_old of each transition (RatioNorm)
        std: [B, T] transition std (0 = deterministic)
        t_model, coef, coef_next: [B, T] model timestep and kernel coefficients (σ_i, σ_{i+1} or ᾱ_t, ᾱ_prev)
        prompt_of: [B] row of ``cond`` for each sample
    """

    latents: Tensor
    old_means: Tensor
    std: Tensor
    t_model: Tensor
    coef: Tensor
    coef_next: Tensor
    prompt_of: Tensor
    cond: Cond


@dataclass
class FlowForward:
    """What one training forward of rows ``index`` computed besides their log-probs
    (:meth:`FlowAdapter.logprobs_with_forward`), handed back by the trainer to ``exact_kl`` / ``ratio_norm_inputs``
    of the same minibatch, so neither runs the denoiser again: the trained units' rows within the minibatch, their
    steps, transition means (with grad) and stds; with ``objective: dgpo``, the velocities of the DSM terms."""

    rows: Tensor | None = None  # [N] row within the minibatch
    steps: Tensor | None = None  # [N]
    mean: Tensor | None = None  # [N, C, H, W] with grad
    std: Tensor | None = None  # [N]
    velocities: Tensor | None = None  # DGPO: [n·M, C, H, W] with grad


class FlowAdapter:
    """``PolicyAdapter`` for flow-matching / diffusion text-to-image models. See the module docstring."""

    def __init__(
        self,
        pipe,
        args: FlowArgs,
        *,
        seed: int = 0,
        lora: bool = False,
        reference=None,
        value_score: Callable[[list, list[dict], int], Tensor] | None = None,
    ):
        self.pipe, self.args = pipe, args
        self.backend = _backend_for(pipe, args)
        self.model = pipe.unet if hasattr(pipe, "unet") else pipe.transformer
        self.lora, self.reference = lora, reference
        if args.kernel == "ddim" and self.backend.is_flow:
            raise ConfigError(
                "model.args.kernel: ddim is for UNet (DDIM-scheduler) pipelines; use flow_sde | dance_sde | cps"
            )
        if args.kernel != "ddim" and not self.backend.is_flow:
            raise ConfigError(f"model.args.kernel: {args.kernel} needs a flow-matching pipeline; UNets use ddim")
        self.selector = STEP_SELECTORS.get(args.steps)
        self.generator = None  # sampling noise and step plans use torch's global CPU RNG: checkpoints save it
        self.iteration = 0
        self.value_score = value_score  # Σ_k w_k·reward_k of decoded x̂₀ (model.args.value_rewards), from the builder
        if args.objective == "dgpo" and not self.backend.is_flow:
            raise ConfigError("model.args.objective: dgpo needs a flow-matching pipeline (SD3, FLUX), not a UNet")

    # ---- plumbing

    def _unwrapped(self):
        return _hf.unwrap(self.model)

    def denoiser(self) -> torch.nn.Module:
        """The trained denoiser (transformer or UNet, with its LoRA), unwrapped from DDP / FSDP: what DGPO's
        rollout (:mod:`.dgpo`) samples with."""
        return self._unwrapped()

    @property
    def device(self) -> torch.device:
        return next(self._unwrapped().parameters()).device

    def sync_devices(self) -> None:
        """Move the frozen components to the denoiser's device (the trainer may have moved it)."""
        dev = self.device
        if self.pipe.vae.device != dev:
            for _name, comp in self.pipe.components.items():
                if isinstance(comp, torch.nn.Module) and comp is not self._unwrapped():
                    comp.to(dev)
            if self.reference is not None:
                self.reference.to(dev)

    def kernel(
        self,
        out: Tensor,
        x: Tensor,
        coef: Tensor,
        coef_next: Tensor,
        sigma_max: float | None,
        *,
        stochastic=True,
        draw: K.Draw = K.SAMPLE,
    ) -> K.KernelOutput:
        """The configured kernel (the ODE / η = 0 step unless ``stochastic``) on a batch of transitions.

        Shape:
            out, x: [N, C, H, W]; coef, coef_next: [N] -> KernelOutput
        """
        a = self.args
        if not self.backend.is_flow:
            return K.ddim(
                out,
                x,
                coef,
                coef_next,
                draw=draw,
                eta=a.noise_level if stochastic else 0.0,
                prediction_type=self.pipe.scheduler.config.prediction_type,
            )
        if not stochastic:
            return K.ode(out, x, coef, coef_next, draw=draw)
        fn = K.FLOW_KERNELS[a.kernel]
        return fn(
            out,
            x,
            coef,
            coef_next,
            draw=draw,
            noise_level=a.noise_level,
            sigma_max=sigma_max,
            cps_logprob=a.cps_logprob,
        )

    def velocity(
        self, model, x: Tensor, t_model: Tensor, cond: Cond, prompt_of: Tensor, guidance: float | None
    ) -> Tensor:
        """The (guided) model output for rows x, in chunks of ``forward_batch_size``; grad if enabled.

        Shape:
            x: [N, C, H, W], t_model: [N], prompt_of: [N] -> [N, C, H, W]
        """
        outs = []
        step = max(1, self.args.forward_batch_size)
        for s in range(0, x.shape[0], step):
            xs, ts, ps = x[s : s + step], t_model[s : s + step], prompt_of[s : s + step]
            rows = {k: v[ps] for k, v in cond.tensors.items()}
            if guidance is None or cond.uncond is None:
                outs.append(self.backend.forward(model, xs, ts, rows))
                continue
            n = xs.shape[0]
            both = {k: torch.cat([cond.uncond[k].expand(n, *v.shape[1:]), v]) for k, v in rows.items()}
            o = self.backend.forward(model, torch.cat([xs, xs]), torch.cat([ts, ts]), both)
            o_u, o_c = o.chunk(2)
            outs.append(o_u + guidance * (o_c - o_u))
        return torch.cat(outs)

    def encode_prompts(self, texts: list[str], guided: bool) -> Cond:
        step = self.args.encode_batch_size or max(1, len(texts))
        parts = [self.backend.encode(texts[s : s + step]) for s in range(0, len(texts), step)]
        tensors = {k: torch.cat([part[k] for part in parts]) for k in parts[0]}  # [P, ...] each
        uncond = self.backend.encode([self.args.negative_prompt]) if guided else None
        return Cond(tensors, uncond)

    # ---- PolicyAdapter

    @torch.no_grad()
    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        """Sample G images per prompt with the selected SDE steps; B = P·G samples, T = ``num_steps`` units."""
        if self.args.objective == "dgpo":  # ODE samples, DSM units (modalities/flow/dgpo.py)
            return dgpo.rollout(self, prompts, group_size, keys)
        a, dev = self.args, self.device
        self.sync_devices()
        model = self._unwrapped()
        P, G, T = len(prompts), group_size, a.num_steps
        B = P * G
        guided = a.cfg == "guided"
        cond = self.encode_prompts([str(r["prompt"]) for r in prompts], guided)
        prompt_of = torch.arange(P).repeat_interleave(G)  # [B]
        # keys: the trainer's keyed rollout noise (rollout_noise: keyed, mmgrpo/noise.py), else the global RNG
        plan_gen = self.generator
        if keys is not None:
            keys.check(B, "flow rollout")
            plan_gen = torch.Generator().manual_seed(noise.mix(keys.seed, keys.step))  # same on every process
        plan: StepPlan = self.selector(T, B, G, generator=plan_gen, iteration=self.iteration, **a.step_args)
        self.iteration += 1
        sched = self.backend.schedule(T)
        sigma_max = float(sched["coef"][1]) if T > 1 else None
        shape = self.backend.latent_shape()
        shared = plan.shared_noise or a.same_noise
        if keys is not None:  # per sample: initial latent, then the noise of every step, from its own generator
            gens = keys.generators()
            x = noise.normals(keys.generators(shared=True), shape).repeat_interleave(G, 0) if shared else None
            x = noise.normals(gens, shape) if x is None else x  # [B, C, H, W]
            step_noise = noise.normals(gens, (T, *shape))  # [B, T, C, H, W]
        elif shared:
            x = torch.randn(P, *shape, generator=self.generator).repeat_interleave(G, 0)
        else:
            x = torch.randn(B, *shape, generator=self.generator)
        x = x.to(dev)  # [B, C, H, W]
        latents, means = [x], []
        logp = torch.zeros(B, T)
        std = torch.zeros(B, T)
        values = torch.zeros(B, T) if self._values_on() else None
        for i in range(T):
            t_i = sched["t_model"][i].expand(B).to(dev)
            out = self.velocity(model, x, t_i, cond, prompt_of.to(dev), a.guidance_scale if guided else None)
            c, cn = sched["coef"][i].expand(B).to(dev), sched["coef_next"][i].expand(B).to(dev)
            eps = step_noise[:, i] if keys is not None else torch.randn(x.shape, generator=self.generator)
            sde = self.kernel(out, x, c, cn, sigma_max, draw=K.Draw(noise=eps.to(dev)))
            det = self.kernel(out, x, c, cn, sigma_max, stochastic=False, draw=K.Draw(noise=torch.zeros_like(x)))
            on = plan.sde[:, i].to(dev)  # [B]
            on_d = on.view(-1, *([1] * (x.dim() - 1)))
            x_next = torch.where(on_d, sde.prev_sample, det.prev_sample)
            means.append(torch.where(on_d, sde.mean, det.mean).cpu())
            logp[:, i] = torch.where(on, sde.logprob, torch.zeros_like(sde.logprob)).cpu()
            std[:, i] = torch.where(on, sde.std, torch.zeros_like(sde.std)).cpu()
            if values is not None:
                values[:, i] = self._value(self.backend.x0(out, x, sched, i), prompts, G)
            x = x_next
            latents.append(x)
        lat = torch.stack(latents, 1).cpu()  # [B, T+1, C, H, W]
        train = plan.train if plan.post is None else plan.post(lat, plan_gen)
        mask = (train & plan.sde & (std > 0)).float()  # [B, T]
        outputs = self.backend.decode(x)
        state = FlowState(
            latents=lat,
            old_means=torch.stack(means, 1),
            std=std,
            t_model=sched["t_model"].expand(B, T).clone(),
            coef=sched["coef"].expand(B, T).clone(),
            coef_next=sched["coef_next"].expand(B, T).clone(),
            prompt_of=prompt_of,
            cond=cond,
        )
        return Rollout(
            outputs=outputs,
            old_logprobs=logp * mask,
            mask=mask,
            group_size=G,
            prompt_index=prompt_of,
            truncated=torch.zeros(B, dtype=torch.bool),
            state=state,
            unit_sigmas=sched["sigma"].expand(B, T).clone(),
            unit_values=values,
        )

    def _values_on(self) -> bool:
        """Dense values are recorded: ``model.args.value_rewards`` is set and the builder passed its scorer."""
        if self.args.value_rewards and self.value_score is None:
            raise ConfigError(
                "model.args.value_rewards: this flow adapter was built without a reward scorer; build it through the "
                "trainer, or pass reward_scorer=mmgrpo.rewards.weighted_scorer to the adapter's builder"
            )
        return self.value_score is not None

    def _value(self, x0: Tensor, prompts: list[dict], G: int) -> Tensor:
        """Σ_k w_k·reward_k(decode(x̂₀)) for every sample (dense value of the state), by the builder's
        ``value_score`` (:class:`mmgrpo.rewards.WeightedScore`; NaN where a reward returned None).

        Shape: [B, C, H, W] -> [B]."""
        images = self.backend.decode(x0)
        rows = [{**r, "prompt": str(r["prompt"])} for r in prompts]
        return self.value_score(images, rows, G)  # [B]

    def _forward_units(self, model, rollout: Rollout, index: Tensor) -> tuple[Tensor, K.KernelOutput, Tensor, Tensor]:
        """Kernel outputs of the trained units of rows ``index`` under ``model`` (grad if enabled)."""
        st: FlowState = rollout.state
        idx = index.cpu()
        m = rollout.mask[idx]  # [n, T]
        rows, steps = m.nonzero(as_tuple=True)  # [N], [N]
        b = idx[rows]
        dev = self.device
        x = st.latents[b, steps].to(dev)  # [N, C, H, W]
        x_next = st.latents[b, steps + 1].to(dev)
        guided = self.args.cfg == "guided"
        out = self.velocity(
            model,
            x,
            st.t_model[b, steps].to(dev),
            st.cond,
            st.prompt_of[b].to(dev),
            self.args.guidance_scale if guided else None,
        )
        sigma_max = float(st.coef[0, 1]) if st.coef.shape[1] > 1 else None
        coef, coef_next = st.coef[b, steps].to(dev), st.coef_next[b, steps].to(dev)
        k = self.kernel(out, x, coef, coef_next, sigma_max, draw=K.Draw(prev_sample=x_next))
        return m, k, rows, steps

    def logprobs(self, rollout: Rollout, index: Tensor) -> Tensor:
        """log π_θ of the trained transitions of rows ``index``, 0 elsewhere; differentiable, fp32. Shape: [n, T]."""
        return self.logprobs_with_forward(rollout, index)[0]

    def logprobs_with_forward(self, rollout: Rollout, index: Tensor) -> tuple[Tensor, FlowForward]:
        """:meth:`logprobs` [n, T] and the forward's by-products (:class:`FlowForward`), which the trainer passes to
        :meth:`exact_kl` / :meth:`ratio_norm_inputs` for the same rows."""
        if self.args.objective == "dgpo":  # −ℓ_DSM [n, M] (modalities/flow/dgpo.py)
            loss, v = dgpo.dsm_losses(self, self.model, rollout, index)
            return -loss, FlowForward(velocities=v)
        m, k, rows, steps = self._forward_units(self.model, rollout, index)
        dev = k.logprob.device
        out = torch.zeros(m.shape, device=dev).index_put((rows.to(dev), steps.to(dev)), k.logprob)
        return out, FlowForward(rows, steps, k.mean, k.std)

    @contextmanager
    def reference_policy(self) -> Iterator[torch.nn.Module]:
        if self.reference is not None:
            yield self.reference
            return
        if not self.lora:
            raise RuntimeError("no reference policy: enable model.lora or build the adapter with need_reference=True")
        model = self._unwrapped()
        model.disable_adapters()
        try:
            yield model
        finally:
            model.enable_adapters()

    @torch.no_grad()
    def ref_logprobs(self, rollout: Rollout, index: Tensor) -> Tensor:
        """log π_ref (LoRA disabled or the frozen copy) of the trained transitions. Shape: [n, T]."""
        if self.args.objective == "dgpo":
            with self.reference_policy() as ref:
                return -dgpo.dsm_losses(self, ref, rollout, index)[0]
        with self.reference_policy() as ref:
            m, k, rows, steps = self._forward_units(ref, rollout, index)
        return torch.zeros(m.shape).index_put((rows, steps), k.logprob.cpu()).to(self.device)

    def exact_kl(self, rollout: Rollout, index: Tensor, forward: FlowForward | None = None) -> Tensor:
        """Per-unit Gaussian KL(π_θ ‖ π_ref) of the trained transitions (``shaping.gaussian_kl``). Shape: [n, T].

        Differentiable through μ_θ: ``forward`` is what :meth:`logprobs_with_forward` returned for these rows
        (its means are reused); ``None`` runs that forward here. ``kl_variant`` picks the exact KL or Flow-GRPO's
        (× h).
        """
        if forward is None:
            forward = self.logprobs_with_forward(rollout, index)[1]
        if self.args.objective == "dgpo":  # DGPO's KL term mean_D ‖v_θ − v_ref‖² per (sample, time)
            v = forward.velocities
            with torch.no_grad(), self.reference_policy() as ref:
                v_ref = dgpo.dsm_losses(self, ref, rollout, index)[1]
            return (v.float() - v_ref.float()).square().flatten(1).mean(1).view(len(index), -1)
        cur = forward
        with torch.no_grad(), self.reference_policy() as ref:
            _, k_ref, _, _ = self._forward_units(ref, rollout, index)
        st: FlowState = rollout.state
        b = index.cpu()[cur.rows]
        dt = (st.coef[b, cur.steps] - st.coef_next[b, cur.steps]).to(cur.std.device)
        kl = gaussian_kl(cur.mean, k_ref.mean.detach(), cur.std, variant=self.args.kl_variant, dt=dt)  # [N]
        n, T = len(index), st.std.shape[1]
        dev = kl.device
        return torch.zeros(n, T, device=dev).index_put((cur.rows.to(dev), cur.steps.to(dev)), kl)

    def ratio_norm_inputs(
        self, rollout: Rollout, index: Tensor, forward: FlowForward | None = None
    ) -> dict[str, Tensor]:
        """``std`` [n, T] and ``mean_sq_dist`` [n, T] = mean_D (μ_θ − μ_old)² (with grad) for ``shaping.ratio_norm``;
        ``forward`` as in :meth:`exact_kl`."""
        cur = forward if forward is not None else self.logprobs_with_forward(rollout, index)[1]
        st: FlowState = rollout.state
        b = index.cpu()[cur.rows]
        dev = cur.mean.device
        old = st.old_means[b, cur.steps].to(dev)
        msd = ((cur.mean - old) ** 2).flatten(1).mean(1)  # [N]
        n, T = len(index), st.std.shape[1]
        r, s = cur.rows.to(dev), cur.steps.to(dev)
        std = torch.zeros(n, T, device=dev).index_put((r, s), st.std[b, cur.steps].to(dev))
        return {"std": std, "mean_sq_dist": torch.zeros(n, T, device=dev).index_put((r, s), msd)}

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self._unwrapped().parameters() if p.requires_grad]

    def save_pretrained(self, directory: str) -> None:
        """LoRA: diffusers-format ``pytorch_lora_weights.safetensors`` (``pipe.load_lora_weights(directory)``);
        full fine-tuning: the whole pipeline (``DiffusionPipeline.from_pretrained(directory)``)."""
        model = self._unwrapped()
        if self.lora:
            from peft.utils import get_peft_model_state_dict

            layers = get_peft_model_state_dict(model)
            meta = model.peft_config["default"].to_dict()  # keeps lora_alpha: the scale survives loading
            key = "unet" if hasattr(self.pipe, "unet") else "transformer"
            kwargs = {f"{key}_lora_layers": layers, f"{key}_lora_adapter_metadata": meta}
            type(self.pipe).save_lora_weights(directory, **kwargs, safe_serialization=True)
        else:
            self.pipe.save_pretrained(directory, safe_serialization=True)

    def export_info(self) -> dict:
        """What the model card says about the saved pipeline (or LoRA weights) and how it loads in diffusers."""
        name = self.args.name_or_path
        built_in = name in TINY_NAMES or name in SHIPPED
        return {
            "base_model": name,
            "library": "diffusers",
            "model_class": type(self.pipe).__name__,
            "lora": bool(self.lora),
            "pipeline_tag": "text-to-image",
            "built_in": {"module": "mmgrpo.modalities.flow.tiny", "function": "resolve_pipeline"} if built_in else None,
        }

    @torch.no_grad()
    def sampling_settings(self) -> dict:
        """Pipeline-call arguments that reproduce :meth:`evaluate` in plain diffusers (written next to saved weights).

        ``max_sequence_length`` is the effective T5 length used to encode prompts (diffusers' default is 256; a
        model trained with another length gives different images with the default).
        """
        a = self.args
        scale = a.guidance_scale if a.eval_guidance_scale is None else a.eval_guidance_scale
        out = {
            "num_inference_steps": a.eval_num_steps,
            "guidance_scale": scale if a.cfg == "guided" else 1.0,
            "height": a.resolution,
            "width": a.resolution,
        }
        if a.negative_prompt:
            out["negative_prompt"] = a.negative_prompt
        max_len = self.backend.max_sequence_length()  # T5-encoding backends (SD3, FLUX); None for UNets
        if max_len is not None:
            out["max_sequence_length"] = int(max_len)
        return out

    def evaluate(self, prompts: list[dict]) -> list:
        """Deterministic images: ODE (DDIM η=0) with ``eval_num_steps``; the initial noise is seeded by the row's
        ``seed`` column if present, else by the prompt text (plus ``eval_seed``)."""
        a, dev = self.args, self.device
        self.sync_devices()
        model = self._unwrapped()
        texts = [str(r["prompt"]) for r in prompts]
        guided = a.cfg == "guided"
        scale = a.guidance_scale if a.eval_guidance_scale is None else a.eval_guidance_scale
        cond = self.encode_prompts(texts, guided and scale != 1.0)
        sched = self.backend.schedule(a.eval_num_steps)
        shape = self.backend.latent_shape()
        seeds = [
            int(r["seed"]) + a.eval_seed if r.get("seed") is not None else _text_seed(t, a.eval_seed)
            for r, t in zip(prompts, texts)
        ]
        x = torch.stack([torch.randn(*shape, generator=torch.Generator().manual_seed(s)) for s in seeds]).to(dev)
        rows = torch.arange(len(texts), device=dev)
        for i in range(a.eval_num_steps):
            n = len(texts)
            out = self.velocity(
                model, x, sched["t_model"][i].expand(n).to(dev), cond, rows, scale if cond.uncond is not None else None
            )
            c, cn = sched["coef"][i].expand(n).to(dev), sched["coef_next"][i].expand(n).to(dev)
            x = self.kernel(out, x, c, cn, None, stochastic=False).prev_sample
        return self.backend.decode(x)


def _text_seed(text: str, seed: int) -> int:
    return (int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) + seed * 1_000_003) % (2**63)


def _value_reward_entry(spec: dict[str, Any], i: int) -> tuple[Any, float, dict]:
    """``(name, weight, kwargs)`` of a ``value_rewards`` entry {name, weight, kwargs}, its shape checked (the builder's
    reward scorer loads it)."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(
            f"model.args.value_rewards[{i}]: expected {{name: ..., weight: 1.0, kwargs: {{}}}}, got {spec!r}"
        )
    unknown = set(spec) - {"name", "weight", "kwargs"}
    if unknown:
        raise ConfigError(
            f"model.args.value_rewards[{i}]: unknown keys {sorted(unknown)}; allowed: name, weight, kwargs"
        )
    return spec["name"], float(spec.get("weight", 1.0)), spec.get("kwargs", {})


def _load_flow(a: FlowArgs, ctx: BuildContext) -> FlowAdapter:
    """The ``flow`` family's loader (:class:`~mmgrpo.plugins.AdapterSpec`): the diffusers pipeline, frozen but for
    the denoiser, then LoRA (diffusers' ``add_adapter``) or the frozen reference copy; ``value_rewards`` scored by
    the context's reward scorer."""
    entries = [_value_reward_entry(spec, i) for i, spec in enumerate(a.value_rewards)]
    if a.steps not in STEP_SELECTORS:
        allowed = ", ".join(STEP_SELECTORS.names())
        raise ConfigError(f"model.args.steps: {a.steps!r} is not allowed; choose one of: {allowed}")
    if a.num_steps < 1 or a.eval_num_steps < 1:
        raise ConfigError("model.args.num_steps and eval_num_steps must be >= 1")
    if a.objective == "dgpo" and not a.dgpo_times <= a.dgpo_trunc_steps + 1 <= a.num_steps:
        raise ConfigError(
            f"model.args: dgpo_times={a.dgpo_times} levels are drawn among steps 0..dgpo_trunc_steps="
            f"{a.dgpo_trunc_steps} of num_steps={a.num_steps}; need dgpo_times <= dgpo_trunc_steps + 1 <= num_steps"
        )
    try:
        STEP_SELECTORS.get(a.steps)(a.num_steps, 2, 2, generator=torch.Generator().manual_seed(0), **a.step_args)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model.args.step_args for steps={a.steps}: {e}") from None
    pipe = resolve_pipeline(a.name_or_path, seed=ctx.seed, torch_dtype=_hf.DTYPES[ctx.dtype])
    pipe.set_progress_bar_config(disable=True)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    pipe.to(device)
    for _name, comp in pipe.components.items():
        if isinstance(comp, torch.nn.Module):
            comp.requires_grad_(False).eval()
    model = pipe.unet if hasattr(pipe, "unet") else pipe.transformer
    reference = None
    use_lora = ctx.lora is not None and ctx.lora.enabled
    if use_lora:
        hint = f". For SD3/FLUX use {FLOW_LORA_TARGETS}; for UNets [to_q, to_k, to_v, to_out.0]"
        _hf.diffusers_lora(model, ctx.lora, hint)
    else:
        model.requires_grad_(True)
        if ctx.need_reference or a.objective == "dgpo":  # DGPO's units need the reference loss
            reference = copy.deepcopy(model).requires_grad_(False).eval()
    model.train()
    value_score = None
    if entries and ctx.reward_scorer is not None:
        value_score = ctx.reward_scorer(entries, "model.args.value_rewards")
    return FlowAdapter(pipe, a, seed=ctx.seed, lora=use_lora, reference=reference, value_score=value_score)


build_flow_adapter = ADAPTERS.register("flow")(
    AdapterSpec(
        args=FlowArgs,
        cls=FlowAdapter,
        load=_load_flow,
        units_per_sample=lambda a: a.num_steps,
        inputs=Inputs(outputs="image"),  # text prompts: rows with media are refused at load
        load_check=lambda a: model_names.name_problem(
            a.name_or_path, "flow", (*TINY_NAMES, *SHIPPED), filenames=("model_index.json",)
        ),
    )
)


__all__ = ["FLOW_LORA_TARGETS", "FlowAdapter", "FlowArgs", "FlowState", "build_flow_adapter"]
