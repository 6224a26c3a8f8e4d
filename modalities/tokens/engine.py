"""Rollout engines of the token families: ``native`` (the one decode loop, :mod:`.decode`) or ``vllm`` (a vLLM server
in its own environment, :mod:`.vllm_server`, started by ``mmgrpo rollout-server``; or, ``rollout.vllm_mode:
colocate``, the same engine inside the training process, :mod:`.colocate`, behind this client's interface).

With ``rollout.engine: vllm`` the adapter keeps its contract: ``rollout`` returns B = P·G completions group-major,
with ``old_logprobs`` recomputed by the trainer's own model (as TRL does with ``use_vllm``), and the engine's
per-token log-probs in ``Rollout.engine_logprobs`` for the importance-sampling correction of the mismatch
(:mod:`mmgrpo.importance`). Before every rollout the trainer pushes the policy's weights (:func:`engine_weights`:
the whole model, LoRA merged, then only what training changes) with a version number; each generate answer carries
the version it was sampled with, and a mismatch stops the run (a rollout from stale weights would be silently
off-policy).

The token families share this path (:class:`EngineSampling`): each supplies only its requests (:class:`EnginePrompt`:
a prompt text and media for the decoder-only models, an encoder prompt and a decoder prompt by id for Whisper) and
its sampling distribution; the client builds the wire request, checks the engine's prompt token ids against the
trainer's, and pushes weights under the names ``save_pretrained`` writes.

Keyed rollout noise does not carry over: vLLM draws from its own per-request generators (``SamplingParams.seed``,
here the keyed seed of each prompt), so the samples are reproducible for one engine build, world size and batch,
but they are not those of the native sampler and not invariant to how prompts are split over processes
(docs/scale.md).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``T`` completion tokens.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import hmac
import io
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmgrpo import noise
from mmgrpo.types import EngineError

from .. import _hf
from . import weight_buckets as wb
from . import weight_sync
from .decode import SamplingSpec
from .engine_http import CHALLENGE_HEADER, SECRET_ENV, find_secret, secret_file, server_proof, write_secret

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EnginePrompt:
    """One prompt as the engine takes it, built by its family (the one part of a request that differs by family).

    Decoder-only models (VLM, video, audio LLM): ``text`` is the rendered prompt the engine tokenizes itself and
    ``media`` its items by kind, as the adapter's encoders loaded them. Encoder-decoder models (Whisper,
    ``encoder_decoder=True``): ``text`` and ``media`` are the encoder's prompt (Whisper: ``""`` and the waveform) and
    the decoder prompt goes as ``token_ids`` (vLLM's ``{"encoder_prompt", "decoder_prompt"}`` request). Either way
    ``token_ids`` are the trainer's prompt token ids, which the engine's must equal
    (:meth:`EngineSampling._engine_sample`).
    """

    text: str
    media: dict[str, list[Any]]
    token_ids: list[int]
    encoder_decoder: bool = False
    prompt_ids: list[int] | None = None
    """The prompt sent as token ids instead of ``text`` (one placeholder per media item, which the engine expands):
    a multi-turn continuation (``modalities/tokens/turns.py``), whose sampled tokens must not be tokenized again."""


class EngineClient:
    """What every rollout engine does on the trainer's side, whatever the transport: the weights version its
    answers must carry, the generate request built from the families' :class:`EnginePrompt`, and weight pushes
    (:meth:`push_model`). This is the trainer's :class:`mmgrpo.types.EngineRollout` (``name``, ``version``,
    ``health``, ``push_model``, ``close``) plus ``generate`` for the adapters.

    A transport supplies ``health``, ``push`` (a state dict as weights version N), ``_generate`` (a request body to
    the engine's answer) and ``_media_item``: :class:`VLLMClient` over HTTP to ``vllm_server.py``,
    :class:`.colocate.ColocateEngine` in this process. The trainer builds the engine (``mmgrpo.loader.load_engine``)
    and hands it to the adapter (``use_engine``), as TRL's trainer owns its ``VLLMGeneration``."""

    name = "the vLLM rollout engine"  # in error messages
    stale_hint = "a weight push did not reach it"
    version = 0
    """The weights version the engine's answers must carry (the last one pushed; set by every process)."""
    _holds: int | None = None
    """The weights version this client last pushed (the engine holds it), None before the first push."""

    def health(self) -> dict:
        """The engine's state (``ok``, ``version``, ``model``); an :class:`EngineError` when it cannot serve."""
        raise NotImplementedError

    def push(self, tensors: dict[str, Tensor], version: int, base: int | None = None) -> bool:
        """Load ``tensors`` (Hugging Face names) into the engine's model as weights version ``version``; with
        ``base``, a part of the model on top of version ``base``, refused (False) unless the engine holds it."""
        raise NotImplementedError

    def push_model(self, model: torch.nn.Module, version: int) -> None:
        """Send ``model``'s weights to the engine as ``version``: the first push the whole model (LoRA merged),
        later ones only the tensors an optimizer step changes (:func:`engine_tensors` ``trainable_only``, made one
        at a time into bounded buckets), on top of the version pushed before. An engine holding another version
        (restarted; pushed to by someone else) refuses that part, and the whole model goes instead."""
        if self._holds is None or not self.push(engine_tensors(model, trainable_only=True), version, base=self._holds):
            self.push(engine_tensors(model), version)
        self._holds = version

    def close(self) -> None:
        """Release what this client holds of the engine (a server's client: nothing; the server runs on)."""

    bucket_bytes: int = weight_sync.bucket_bytes(weight_sync.DEFAULT_BUCKET_MB)
    """The largest bucket of a push (``rollout.push_bucket_mb``, :mod:`.weight_sync`)."""
    channel: weight_sync.NcclChannel | None = None
    """The NCCL channel (``rollout.weight_sync: nccl``), else None: pushes go over HTTP."""

    def configure_push(self, rollout: Any, sender: bool = True) -> None:
        """Take ``rollout.push_bucket_mb`` and, on the process that pushes (``sender``), open the channel of
        ``rollout.weight_sync`` (``nccl``: :meth:`.weight_sync.NcclChannel.connect`, refused at load without CUDA)."""
        self.bucket_bytes = weight_sync.bucket_bytes(rollout.push_bucket_mb)
        if sender and rollout.weight_sync == "nccl" and rollout.vllm_mode == "server":  # (a server's client: url)
            from urllib.parse import urlparse

            self.channel = weight_sync.NcclChannel.connect(self, urlparse(self.url).hostname, rollout.nccl_port)

    def _generate(self, body: dict) -> dict:
        """The engine's answer to a generate ``body`` (``vllm_server.py``'s ``/generate``)."""
        raise NotImplementedError

    def _media_item(self, kind: str, item: Any) -> Any:
        """A prompt's media item as the engine takes it."""
        raise NotImplementedError

    def generate(
        self,
        prompts: list[EnginePrompt],
        group_size: int,
        spec: SamplingSpec,
        seeds: list[int],
        processor_kwargs: dict[str, Any] | None = None,
        early_bans: tuple[list[int], int] = ([], 0),
    ) -> tuple[Tensor, Tensor, list[list[int]]]:
        """G samples per prompt from the engine.

        ``prompts`` are the families' requests (:class:`EnginePrompt`; media as the adapter's encoders loaded them —
        ``image``: PIL images; ``video``: :class:`~.video.Clip`, frames already sampled and resized; ``audio``: the
        waveform at the processor's rate); ``processor_kwargs`` are the engine processor's options for all prompts
        (vLLM's ``mm_processor_kwargs``, e.g. ``videos_kwargs``); ``early_bans`` the token ids banned at the first
        steps only and for how many (Whisper's ``begin_suppress_tokens``: the first step).

        Shape:
            prompts, seeds: P each
            returns completion_ids [B, T] (pad after the end), engine_logprobs [B, T] fp32 (0 there),
            the engine's prompt token ids (P lists; an encoder-decoder model's: the decoder prompt's)
        """
        item = self._media_item
        requests = []
        for p, s in zip(prompts, seeds):
            req = {
                "prompt": p.text,
                "media": {k: [item(k, x) for x in items] for k, items in p.media.items() if items},
            }
            if p.encoder_decoder:  # the decoder prompt as token ids: the engine does not tokenize it again
                req["decoder_prompt_token_ids"] = list(p.token_ids)
            elif p.prompt_ids is not None:  # token-in (multi-turn): the engine expands the media placeholders only
                req["prompt_token_ids"] = list(p.prompt_ids)
            requests.append({**req, "seed": s})
        early_ids, early_steps = early_bans
        body = {
            "requests": requests,
            "mm_processor_kwargs": processor_kwargs or {},
            "n": group_size,
            "max_tokens": spec.max_new_tokens,
            "min_tokens": spec.min_new_tokens,
            "temperature": 0.0 if spec.greedy else spec.temperature,
            "top_p": spec.top_p,
            "top_k": spec.top_k,
            "stop_token_ids": list(spec.eos_ids),
            "banned_token_ids": list(spec.suppress_ids),  # as the native sampler: never a media placeholder
            "early_banned_token_ids": list(early_ids) if early_steps else [],
            "early_banned_steps": int(early_steps) if early_ids else 0,
        }
        out = self._generate(body)
        if out["version"] != self.version:
            raise EngineError(
                f"{self.name} serves weights version {out['version']}, the trainer's are version "
                f"{self.version}: {self.stale_hint}"
            )
        B, T = len(prompts) * group_size, spec.max_new_tokens
        ids = torch.full((B, T), spec.pad_id, dtype=torch.long)  # [B, T]
        logprobs = torch.zeros((B, T), dtype=torch.float32)  # [B, T]
        for p, samples in enumerate(out["outputs"]):
            if len(samples) != group_size:
                raise EngineError(f"{self.name} returned {len(samples)} samples for a prompt, not G={group_size}")
            for g, sample in enumerate(samples):
                toks, lps = sample["token_ids"][:T], sample["logprobs"][:T]
                if not (isinstance(toks, list) and all(type(t) is int and 0 <= t < 2**63 for t in toks)):
                    raise EngineError(
                        f"{self.name} returned token_ids that are not non-negative integers (prompt {p}, sample "
                        f"{g}); the engine is not serving this trainer's protocol: restart it from this mmgrpo"
                    )
                ids[p * group_size + g, : len(toks)] = torch.tensor(toks, dtype=torch.long)
                logprobs[p * group_size + g, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
        return ids, logprobs, [r.get("prompt_token_ids", []) for r in out.get("prompts", [])]


class VLLMClient(EngineClient):
    """HTTP client of ``modalities/tokens/vllm_server.py`` (``/health``, ``/generate``, ``/update_weights``)."""

    def __init__(self, url: str, timeout_s: float = 600.0, secret: str | None = None):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.name = f"vLLM rollout server {self.url}"  # in error messages
        self.stale_hint = "another trainer pushes to this server, or a weight push was lost; restart it"
        self._secret = secret

    @property
    def secret(self) -> str | None:
        """The push secret the server shares with its trainer: given, else ``$MMGRPO_ENGINE_SECRET``, else the key
        file ``mmgrpo rollout-server`` wrote for this URL (:func:`.engine_http.find_secret`), read at each call."""
        return self._secret if self._secret is not None else find_secret(self.url)

    def _call(self, path: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> dict:
        """``GET path`` (``data`` None: the health check, without the secret) or an authenticated ``POST``: the
        server proves it holds the shared secret first (:meth:`authenticate`), then the request carries it."""
        headers = dict(headers or {})
        if data is not None:
            headers["Authorization"] = f"Bearer {self.authenticate()}"
        return self._request(path, data, headers)

    def _request(self, path: str, data: bytes | None, headers: dict[str, str]) -> dict:
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        hint = "start it with `mmgrpo rollout-server CONFIG` (docs/scale.md) or set rollout.url"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                reason = json.loads(e.read()).get("error", str(e))
            except (ValueError, OSError):
                reason = str(e)
            raise EngineError(f"vLLM rollout server {self.url}{path} failed: {reason}") from None
        except TimeoutError:
            raise EngineError(
                f"vLLM rollout server {self.url} did not answer {path} within rollout.timeout_s={self.timeout_s:g} s"
            ) from None
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise EngineError(f"vLLM rollout server {self.url} is not reachable ({reason}); {hint}") from None
        except ValueError as e:  # not JSON: not a rollout server
            raise EngineError(
                f"vLLM rollout server {self.url}{path} answered something that is not JSON ({e})"
            ) from None

    def authenticate(self) -> str:
        """The server proves it holds this trainer's push secret before the trainer sends it (mutual authentication,
        :mod:`.engine_http`): a fresh challenge on ``/health``, its HMAC checked here; returns the secret. A server
        that gives no proof or a wrong one is an :class:`EngineError` in one line, and nothing more is sent to it."""
        return self._prove()[0]

    def _prove(self) -> tuple[str, dict]:
        challenge = secrets.token_hex(32)
        out = self._request("/health", None, {CHALLENGE_HEADER: challenge})  # a server that is down: one line first
        secret = self.secret
        if secret is None:
            raise EngineError(
                f"{self.name} answers only its own trainer and no push secret for it ({secret_file(self.url)}, "
                f"written by `mmgrpo rollout-server` for this user, or ${SECRET_ENV}): run the server as this user, "
                f"or set {SECRET_ENV} to the same value for both"
            )
        proof = out.get("proof") if isinstance(out, dict) else None
        if isinstance(proof, str) and hmac.compare_digest(proof, server_proof(secret, challenge)):
            return secret, out
        why = (
            "it does not take this trainer's push secret (no or wrong push secret: its proof is not the HMAC of this "
            "trainer's secret over the challenge)"
            if isinstance(proof, str)
            else "it gave no proof that it holds this trainer's push secret (it is not a rollout server of this "
            "mmgrpo, or something else answers on rollout.url)"
        )
        raise EngineError(
            f"{self.name} refused: {why}; the trainer sent it neither its secret nor weights, nor asked it for "
            f"rollouts (check rollout.url, restart `mmgrpo rollout-server` as this user, or set {SECRET_ENV} for both)"
        )

    def health(self) -> dict:
        """The server's state once it has proven it holds this trainer's push secret (:meth:`authenticate`;
        ``authorized``: True); an :class:`EngineError` when it is down, its engine dead, or it cannot prove it (no
        secret, another one, not a rollout server: one line at ``--dry-run``, not at the first push)."""
        _, out = self._prove()
        return {**out, "authorized": True}

    def _media_item(self, kind: str, item: Any) -> Any:
        """A prompt's media item as the engine takes it: here, as the server's request body carries it."""
        return _wire(kind, item)

    def _generate(self, body: dict) -> dict:
        """The engine's answer to a generate ``body`` (``vllm_server.py``'s ``/generate``)."""
        return self._call("/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})

    def post_json(self, path: str, body: dict) -> dict:
        """An authenticated JSON POST to the server (the NCCL channel's requests)."""
        return self._call(path, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def push(self, tensors: dict[str, Tensor] | list[wb.Lazy], version: int, base: int | None = None) -> bool:
        """Load ``tensors`` (Hugging Face names; made tensors, or :class:`.weight_buckets.Lazy` items made one at a
        time) into the engine's model as weights version ``version``, in buckets of at most :attr:`bucket_bytes`
        (:mod:`.weight_sync`): the engine loads each as it arrives and holds ``version`` after the last.

        ``base``: the tensors are a part of the model, to go on top of weights version ``base``; an engine that
        holds another version refuses them (returns False: send the whole model). A whole-model push (``base``
        None) returns True or raises."""
        items = weight_sync.lazy(tensors) if isinstance(tensors, dict) else tensors
        if self.channel is not None:
            out = self.channel.send(items, version, base, self.bucket_bytes)
        else:
            out = {}
            for i, n, payload in weight_sync.http_buckets(items, self.bucket_bytes):
                headers = {"Content-Type": "application/octet-stream", "X-Weights-Version": str(version)}
                headers["X-Weights-Bucket"] = f"{i}/{n}"
                if base is not None:
                    headers["X-Weights-Base"] = str(base)
                out = self._call("/update_weights", payload, headers)
                del payload  # before the next bucket is made: at most one body alive
                if out.get("refused"):
                    break
        if base is not None and out.get("refused") == "base":
            return False
        if out.get("version") != version:
            raise weight_sync.push_error(f"vLLM rollout server {self.url}", version, out)
        self.version = version
        return True


def engine_item(kind: str, item: Any) -> Any:
    """One media item as vLLM takes it (``multi_modal_data``): an image as an RGB PIL image; a video clip as its
    frames [F, H, W, C] uint8 and the metadata of how they were sampled (native fps, frame indices, total frames),
    which the processor turns into ``second_per_grid_ts``; an audio clip as its float32 waveform [N], already at the
    processor's sampling rate (vLLM resamples only a waveform given with another rate)."""
    if kind == "image":
        return item.convert("RGB")
    if kind == "video":
        frames = item.frames.permute(0, 2, 3, 1).contiguous().numpy()  # [F, C, H, W] -> [F, H, W, C]
        return frames, {k: v for k, v in dataclasses.asdict(item.metadata()).items() if v is not None}
    if kind == "audio":
        return np.ascontiguousarray(item, dtype=np.float32)  # [N], decoded and resampled to the processor's rate
    raise EngineError(f"the vLLM rollout engine takes image, video and audio prompts, not {kind!r} (docs/scale.md)")


def _wire(kind: str, item: Any) -> Any:
    """One media item as the server's request body carries it (``vllm_server.py``): :func:`engine_item`, with an
    image as base64 PNG and raw arrays (video frames, waveforms) as base64 with their shape and dtype."""
    local = engine_item(kind, item)
    if kind == "image":
        buf = io.BytesIO()
        local.save(buf, format="PNG")
        return base64.b64encode(buf.getvalue()).decode()
    if kind == "video":
        frames, meta = local
        return {
            "frames": base64.b64encode(frames.tobytes()).decode(),
            "shape": list(frames.shape),
            "dtype": str(frames.dtype),
            "metadata": meta,
        }
    return {"array": base64.b64encode(local.tobytes()).decode(), "shape": list(local.shape), "dtype": "float32"}


@torch.no_grad()
def engine_weights(model: torch.nn.Module, trainable_only: bool = False) -> dict[str, Tensor]:
    """The policy's state under the checkpoint's Hugging Face names, what the engine reloads: every tensor of
    :func:`engine_tensors` made at once (the tests' view; a push makes them one bucket at a time)."""
    return {item.name: item.get() for item in engine_tensors(model, trainable_only)}


def engine_tensors(model: torch.nn.Module, trainable_only: bool = False) -> list[wb.Lazy]:
    """The policy's state under the checkpoint's Hugging Face names, as :class:`.weight_buckets.Lazy` items: known
    by name, dtype and shape now, made when their bucket is packed (:mod:`.weight_sync`), so a push never holds a
    second copy of the model.

    LoRA (peft): every adapted linear layer's base weight plus the adapter's delta (B·A·scale, peft
    ``LoraLayer.get_delta_weight``), in the base weight's dtype — the merged model, without merging in place — and
    every other tensor as is. Full fine-tuning: the model's state dict. The names are those ``save_pretrained`` writes
    (transformers' reverted weight conversion: e.g. Qwen2-Audio's ``model.language_model.*`` is
    ``language_model.model.*`` on disk), the names the engine loaded the checkpoint under.

    ``trainable_only``: only the tensors an optimizer step can change — under LoRA the merged adapted layers, in
    full fine-tuning the parameters that require a gradient (a frozen vision tower, Whisper's fixed positions and
    every buffer stay out). Other trainable tensors of a peft model (``modules_to_save``) are not sent.
    """
    core = _hf.unwrap(model)
    if not hasattr(core, "get_base_model"):
        state = dict(core.state_dict())  # views of the parameters: nothing copied
        if trainable_only:  # remove_duplicate=False: a tied lm_head keeps its own name
            trainable = {n for n, p in core.named_parameters(remove_duplicate=False) if p.requires_grad}
            state = {n: t for n, t in state.items() if n in trainable}
        return _lazy_checkpoint_names(core, {n: _made(t) for n, t in state.items()})
    from peft.tuners.lora import LoraLayer

    base = core.get_base_model()
    merged = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            merged[f"{name}.weight"] = (weight, lambda m=module: _merged_weight(m))
    if trainable_only:
        return _lazy_checkpoint_names(base, merged)
    out = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        clean = name.replace(".base_layer.", ".")
        out[clean] = merged.get(clean, _made(tensor))
    return _lazy_checkpoint_names(base, out)


def _made(t: Tensor) -> tuple[Tensor, Any]:
    return t, lambda: t


@torch.no_grad()
def _merged_weight(module: torch.nn.Module) -> Tensor:
    """A LoRA layer's base weight plus its active adapters' deltas, in the base weight's dtype (one new tensor)."""
    weight = module.get_base_layer().weight
    delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
    return (weight + delta).to(weight.dtype)


def _lazy_checkpoint_names(model: torch.nn.Module, tensors: dict[str, tuple[Tensor, Any]]) -> list[wb.Lazy]:
    """``tensors`` (``{state-dict name: (a tensor of its shape and dtype, maker)}``) as Lazy items under the names
    its checkpoint holds (:func:`_checkpoint_names`, run on meta tensors). Where transformers' reverted conversion is
    more than a renaming (tensors merged or split), the tensors are made and converted at once (one line logged)."""
    meta = {n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, (t, _) in tensors.items()}
    renamed = _checkpoint_names(model, meta)
    source = {id(v): n for n, v in meta.items()}
    if len(renamed) == len(meta) and all(id(v) in source for v in renamed.values()):
        return [
            wb.Lazy(k, wb.dtype_name(v.dtype), tuple(v.shape), tensors[source[id(v)]][1]) for k, v in renamed.items()
        ]
    logger.warning("the engine's checkpoint names convert tensors (not only rename them): this push is made whole")
    made = _checkpoint_names(model, {n: get() for n, (_, get) in tensors.items()})
    return weight_sync.lazy(made)


def _checkpoint_names(model: torch.nn.Module, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` (the model's own state-dict names) under the names its checkpoint holds (what ``save_pretrained``
    writes); unchanged where transformers has no such mapping."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without weight conversions: the names are the checkpoint's
        return tensors
    return revert_weight_conversion(model, tensors)


def prompt_seeds(keys: noise.NoiseKeys | None, prompts: int) -> list[int]:
    """One engine seed per prompt: the keyed group seed of its global position (``keys``), else fresh draws from the
    global RNG (``torch.randint``, so a seeded run gives the same seeds)."""
    if keys is not None:
        return [s % (2**31) for s in keys.prompt_seeds()]
    return torch.randint(0, 2**31 - 1, (prompts,)).tolist()


class EngineSampling:
    """The trainer side of ``rollout.engine: vllm``, shared by the token families (VLM, video, audio LLM, Whisper):
    connect, push the policy's weights, and sample a rollout's completions on the server.

    A family supplies only what differs: its requests (``_engine_prompts`` → :class:`EnginePrompt` per prompt), its
    sampling distribution (``_sampling_spec(greedy)``: all-step bans in ``suppress_ids``; ``_early_bans()``: the ids
    banned at the first steps only), its processor options (``_engine_processor_kwargs``) and ``_completion_mask``.
    """

    model: torch.nn.Module
    pad_id: int
    engine: EngineClient | None = None

    def use_engine(self, engine: EngineClient) -> None:
        """Sample rollouts on ``engine`` (``rollout.engine: vllm``), the one the trainer built and owns
        (``mmgrpo.loader.load_engine``: a :class:`VLLMClient` of a server, or a :class:`.colocate.ColocateEngine`);
        evaluation stays native."""
        self.engine = engine

    def push_engine_weights(self, version: int) -> None:
        """Send the policy's weights to the engine as ``version`` (:meth:`EngineClient.push_model`)."""
        self.engine.push_model(self.model, version)

    def _engine_processor_kwargs(self) -> dict[str, Any]:
        """Processor options the engine must apply as the trainer does (vLLM's ``mm_processor_kwargs``)."""
        return {}

    def _engine_sample(
        self, prompts: list[EnginePrompt], group_size: int, keys: noise.NoiseKeys | None, greedy: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Completion ids [B, T] (pad after the end) and the engine's log-probs [B, T] (0 there) of G samples per
        prompt; the engine's prompt token ids must equal the trainer's (checked: a template, processor or
        checkpoint mismatch is one line)."""
        ids, logprobs, engine_prompts = self.engine.generate(
            prompts,
            group_size,
            self._sampling_spec(greedy=greedy),
            prompt_seeds(keys, len(prompts)),
            self._engine_processor_kwargs(),
            self._early_bans(),
        )
        for i, (prompt, theirs) in enumerate(zip(prompts, engine_prompts)):
            ours = list(prompt.token_ids)
            if theirs and theirs != ours:
                at = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                if prompt.encoder_decoder:
                    raise EngineError(
                        f"prompt {i}: the vLLM engine's decoder prompt is {theirs}, the trainer's {ours}; serve the "
                        "same checkpoint and tokenizer"
                    )
                raise EngineError(
                    f"prompt {i}: the vLLM engine tokenized it into {len(theirs)} tokens, the trainer into {len(ours)} "
                    f"(first difference at token {at}); serve the same checkpoint, processor and chat template"
                )
        check_vocabulary(ids, self.model)
        mask = self._completion_mask(ids)
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, self.pad_id))  # [B, T]
        return ids, logprobs * mask  # [B, T] each


def check_vocabulary(ids: Tensor, model: torch.nn.Module) -> None:
    """Raise :class:`EngineError` (one line) when an engine's token id ``ids`` [B, T] is outside the policy's
    vocabulary V (the rows of its output layer): an engine serving another checkpoint or tokenizer, or a faulty
    one, would otherwise fail as an ``IndexError`` deep inside the embedding lookup of the training forward."""
    core = _hf.unwrap(model, peft=True)
    get = getattr(core, "get_output_embeddings", None)
    head = get() if get is not None else None
    if head is None or not isinstance(getattr(head, "weight", None), Tensor):
        return  # a model without a named output layer: the forward's own checks apply
    V = head.weight.shape[0]
    bad = (ids < 0) | (ids >= V)  # [B, T]
    if bool(bad.any()):
        b, t = (int(i) for i in bad.nonzero()[0])
        raise EngineError(
            f"the rollout engine returned token id {int(ids[b, t])} (sample {b}, position {t}), outside the policy's "
            f"vocabulary of {V}; serve the same checkpoint and tokenizer as the trainer"
        )


def server_command(cfg: Any, python: str | None = None) -> list[str]:
    """The command that serves ``cfg``'s policy model on vLLM at ``cfg.rollout.url`` (``mmgrpo rollout-server``):
    ``vllm_server.py`` with :func:`engine_args`.

    The interpreter is ``python``, else ``$MMGRPO_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in the current
    directory or the repository (``bash scripts/setup_vllm.sh`` makes it).
    """
    from urllib.parse import urlparse

    from mmgrpo.config import ConfigError

    args = engine_args(cfg)
    repo = Path(__file__).resolve().parents[2]
    candidates = [python, os.environ.get("MMGRPO_VLLM_PYTHON"), ".venv-vllm/bin/python", repo / ".venv-vllm/bin/python"]
    found = next((str(c) for c in candidates if c and Path(c).is_file()), None)
    if found is None:
        raise ConfigError(
            "no vLLM environment (.venv-vllm/bin/python): run `bash scripts/setup_vllm.sh` first, or set "
            "MMGRPO_VLLM_PYTHON to the interpreter of an environment with vllm"
        )
    url = urlparse(cfg.rollout.url)
    where = ["--host", url.hostname or "127.0.0.1", "--port", str(url.port or 8100)]
    return [found, str(Path(__file__).with_name("vllm_server.py")), *args, *where]


def engine_args(cfg: Any) -> list[str]:
    """The vLLM engine's options for ``cfg``'s policy (``vllm_server.py``'s arguments, the same for a server and a
    colocated engine): what the adapter's family declares it serves (``AdapterSpec.engine_model``: the model
    directory — a built-in tiny name resolves to its cached directory, as the trainer resolves it, so both load the
    same weights — and the media per prompt), dtype, seed, and ``rollout.vllm_gpu_memory_utilization`` when set."""
    from mmgrpo.config import ConfigError
    from mmgrpo.plugins import ADAPTERS, AdapterSpec

    def served(name: str) -> Any:  # the family's EngineModel declaration, None where it has no engine path
        spec = ADAPTERS.get(name)
        return spec.engine_model if isinstance(spec, AdapterSpec) else None

    engine_model = served(cfg.model.adapter)
    if engine_model is None:
        have = ", ".join(n for n in ADAPTERS.names() if served(n) is not None)
        raise ConfigError(
            f"model.adapter: {cfg.model.adapter!r} has no vLLM rollout engine yet (adapters with one: {have}; an "
            "adapter declares it with AdapterSpec.engine_model)"
        )
    target = engine_model(ADAPTERS.get(cfg.model.adapter).options(cfg.model.args), cfg.seed)
    dtype = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(cfg.model.dtype, "auto")
    args = ["--model", target.path, "--dtype", dtype, "--seed", str(cfg.seed)]
    args += ["--max-videos", str(target.max_videos), "--max-audios", str(target.max_audios)]  # media per prompt
    if cfg.rollout.multi_turn:  # a trajectory's prompt images and its observations' (rollout.max_images)
        args += ["--max-images", str(max(4, 1 + cfg.rollout.max_images))]
    if cfg.rollout.vllm_gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(cfg.rollout.vllm_gpu_memory_utilization)]
    return args


def address_taken(url: str) -> bool:
    """Whether something already listens on ``url``'s host and port (another rollout server: starting a second one
    there would replace the first one's key file, then fail to bind)."""
    from urllib.parse import urlparse

    u = urlparse(url)
    with socket.socket() as s:
        # as the server binds (http.server's allow_reuse_address): a port whose last connections are in TIME_WAIT
        # (a server just stopped or SIGKILLed) is free; one with a listening socket is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((u.hostname or "127.0.0.1", u.port or 8100))
        except OSError:
            return True
    return False


def run_server(cmd: list[str], grace_s: float = 20.0, secret_path: Path | None = None) -> int:
    """Run the server ``cmd`` until it exits or this process is told to stop; return its exit code.

    The server's push secret (``$MMGRPO_ENGINE_SECRET`` if set, else made here) goes to it in its environment, never
    on its command line, and to the trainers of this user in ``secret_path`` (0600; :func:`.engine_http.secret_file`
    of the server's URL), removed when the server stops; a stale one (left by a SIGKILLed server) is removed first.

    vLLM starts engine processes of its own (``VLLM::EngineCore`` / workers, ~2 GB each on CPU) that outlive a
    signal sent to the server alone. So the server runs in its own session (process group), and SIGTERM, SIGINT or
    SIGHUP to ``mmgrpo rollout-server`` is forwarded to that whole group: SIGTERM first, SIGKILL to whatever is
    left after ``grace_s`` seconds. When this process dies of a signal it cannot catch (SIGKILL, the out-of-memory
    killer), Linux's parent-death signal sends SIGTERM to the server, which then kills its group (``vllm_server.py``):
    a crashed command leaves no engine answering on the port.
    """
    secret = os.environ.get(SECRET_ENV) or secrets.token_urlsafe(32)
    if secret_path is not None:
        with contextlib.suppress(FileNotFoundError):  # a SIGKILLed server's (nothing listens here: address_taken)
            secret_path.unlink()
        write_secret(secret_path, secret)
    parent = os.getpid()
    env = dict(os.environ, **{SECRET_ENV: secret})
    child = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=lambda: _die_with_parent(parent))

    def stop(signum: int, frame: Any) -> None:
        raise _Stop(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        return child.wait()
    except _Stop as e:
        _kill_group(child, grace_s)
        return 128 + e.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if child.poll() is None:  # any other way out (an exception): never leave the engine behind
            _kill_group(child, grace_s)
        # the server exited (its engine died; it was SIGKILLed): engine processes left in its group go too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        if secret_path is not None:
            with contextlib.suppress(OSError):
                if secret_path.read_text() == secret:  # not another server's, started on this URL since
                    secret_path.unlink()


def _die_with_parent(parent: int) -> None:
    """In the forked server, before exec: SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``,
    prctl(2)); a no-op where there is no prctl (not Linux). If ``parent`` died before the request was made, exit."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _kill_group(child: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``child``'s process group, SIGKILL to it after ``grace_s`` if the server has not exited, and a
    final SIGKILL to the group for engine processes that outlived their server."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return  # the whole group is gone
        try:
            child.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # orphans of the group (the server exited before its engine)
        os.killpg(child.pid, signal.SIGKILL)
