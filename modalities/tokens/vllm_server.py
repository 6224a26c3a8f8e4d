"""vLLM rollout server: the engine side of ``rollout.engine: vllm`` (run by ``mmgrpo rollout-server``).

This file runs under ``.venv-vllm`` (``scripts/setup_vllm.sh``), **not** in the training environment: vLLM pins its
own torch and transformers. It imports only the standard library, torch, safetensors, PIL, vllm and vLLM's own
transformers — never mmgrpo — and is started as a script: ``.venv-vllm/bin/python modalities/tokens/vllm_server.py
--model DIR --port 8100``.
Colocate mode (``rollout.vllm_mode: colocate``, :mod:`.colocate`) imports it as a module in the training process of
``.venv-colocate`` (``scripts/setup_colocate.sh``) and holds its :class:`Engine` directly: the same generate and
weight-reload code, without HTTP or serialisation.

The protocol is plain HTTP + JSON on one address (127.0.0.1 by default), the shape of TRL's ``trl vllm-serve``
(``trl/scripts/vllm_serve.py``: ``/health``, ``/generate``, weight updates) without its NCCL channel, so it works on
CPU and across processes of one machine:

* ``GET /health`` → ``{"ok": true, "version": V, "model": DIR}``; ``V`` is the version of the last weights pushed
  (0 = the weights loaded from ``DIR``); with an ``X-Mmgrpo-Challenge`` header also ``"proof"``, the HMAC of the
  push secret over the challenge (the server proves itself before the trainer sends its secret:
  :func:`.engine_http.server_proof`); with an ``Authorization`` header also ``"authorized"``: whether the server
  takes that secret. 503 and ``{"ok": false, "error": ...}`` once the engine is dead.
* ``POST /generate`` with ``{"requests": [{"prompt": str, "media": {"image": [base64 PNG, ...], "video":
  [{"frames": base64 raw, "shape": [F, H, W, C], "dtype": "uint8", "metadata": {"fps", "frames_indices",
  "total_num_frames", ...}}, ...], "audio": [{"array": base64 raw, "shape": [N], "dtype": "float32"},
  ...]}}, ...], "mm_processor_kwargs": {...}, "n": G, "max_tokens": T, "temperature",
  "top_p", "top_k", "min_tokens", "stop_token_ids", "banned_token_ids"}`` (video frames are the trainer's, already
  sampled and resized, with the transformers ``VideoMetadata`` of their sampling; ``mm_processor_kwargs`` go to
  vLLM's processor with every request that has media, e.g. ``{"videos_kwargs": {"do_sample_frames": false}}``;
  banned: a logit bias of −100, e.g. the media placeholder tokens a sample must never contain;
  ``"early_banned_token_ids"`` and ``"early_banned_steps"``: −inf at the first steps only (:class:`EarlyBans`,
  Whisper's begin-suppressed tokens); each request may carry a ``"seed"``, a ``"prompt_token_ids"`` list that replaces
  ``"prompt"`` (a multi-turn continuation, token-in: one placeholder per media item, which vLLM expands, as verl's
  agent loop sends Qwen2.5-VL prompts), and an encoder-decoder model's (Whisper's)
  its ``"decoder_prompt_token_ids"``: the request is then vLLM's ``{"encoder_prompt": {prompt, media},
  "decoder_prompt": {"prompt_token_ids": ...}}``) → ``{"version": V, "outputs": [[{"token_ids": [...], "logprobs":
  [...]}, ... G], ... P], "prompts": [{"prompt_token_ids": [...]}, ... P]}`` (an encoder-decoder request's: the
  decoder prompt's): G samples per prompt (vLLM's ``n``), each with the log-prob of every sampled token under the
  engine's sampling distribution (``processed_logprobs``: after temperature, and after top-k/top-p when they are
  set). Automatic prefix caching shares each prompt's prefill across its G samples (decoder-only models: vLLM has
  none for cross-attention).
* ``POST /update_weights`` with a safetensors body (header ``X-Weights-Version: V``) → reloads the model's weights
  in place from those tensors (Hugging Face names; ``LLM.collective_rpc`` → the worker's ``reload_weights``, then
  :func:`_repack_embeddings`), resets the prefix cache, and answers ``{"version": V}``. The trainer's first push is
  the whole model (a LoRA run: merged), later ones only what training changes, with ``X-Weights-Base: B`` (the
  version they go on top of); an engine that holds another version answers ``{"refused": "base"}``. A push comes
  in buckets (``X-Weights-Bucket: i/n``, :mod:`.weight_buckets`: whole decoder layers, at most
  ``rollout.push_bucket_mb`` each), each reloaded as it arrives; the engine holds ``V`` after bucket n−1 and refuses
  to generate in between (:class:`~.engine_http.WeightGate`).
* ``POST /init_communicator`` ``{"host", "port"}`` and ``POST /update_weights_nccl`` ``{"version", "base", "bucket":
  [i, n], "entries": [...]}`` (``rollout.weight_sync: nccl``, CUDA only, not run without GPUs): the workers join an
  NCCL group with the trainer (TRL's ``trl/scripts/vllm_serve.py`` ``WeightSyncWorkerExtension``) and receive each
  bucket's flat buffer by broadcast (:func:`_nccl_receive`).

The server answers only its trainer (:mod:`.engine_http`, docs/reliability.md): every POST carries the secret
``mmgrpo rollout-server`` made (``Authorization: Bearer``; the server reads it from ``$MMGRPO_ENGINE_SECRET`` and
refuses to start without one), a push's version must be greater than the one the engine holds (409 otherwise), every
pushed tensor's name, shape and dtype is checked against the served checkpoint before vLLM sees it (400), and bodies
have bounded lengths and deadlines. When vLLM's engine process dies, ``/health`` answers 503 and the server exits
with code 3; on any exit (a signal, a dead engine) it kills its engine processes, which also die with it when it is
SIGKILLed (``PR_SET_PDEATHSIG``).

One request runs at a time (the engine is not re-entrant from this server's threads).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import functools
import io
import os
import signal
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer

from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

try:
    from . import engine_http, vllm_names
    from . import weight_buckets as wb
    from .engine_http import SECRET_ENV, Limits, ModelSpec, Refused, WeightGate, handler
except ImportError:  # run as a script (and in vLLM's spawned worker, which imports this file by path)
    import engine_http
    import vllm_names
    import weight_buckets as wb
    from engine_http import SECRET_ENV, Limits, ModelSpec, Refused, WeightGate, handler


def _reload_weights_file(worker, path: str, architecture: str | None = None) -> int:
    """Run in each engine worker (``LLM.collective_rpc``): reload the model's weights in place from the safetensors
    file at ``path`` (vLLM's ``reload_weights``, which re-applies the kernel-format processing a plain
    ``load_weights`` would find already done), its names as vLLM's loader of ``architecture`` takes them
    (:func:`.vllm_names.to_vllm`). Module-level so that it pickles by reference (a closure does not)."""
    from safetensors.torch import load_file

    return _reload_weights_dict(worker, load_file(path), architecture)


def _repack_embeddings(model) -> None:
    """Re-run the weight processing of every unquantized embedding and LM head after an in-place reload.

    vLLM's CPU backend packs their weights for its GEMM once loaded (``UnquantizedEmbeddingMethod.
    process_weights_after_loading`` → ``dispatch_cpu_unquantized_gemm``, a packed copy beside ``weight``). The reload
    repacks the layers that received tensors, but an LM head tied to the token embedding (Whisper's ``proj_out``; the
    checkpoint's copy is skipped by vLLM's loader) receives none, and kept computing logits from the first weights:
    after a push the engine's greedy completions differed from the trainer's. Repacking from the current ``weight`` is
    idempotent, and a no-op off CPU."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and not module.weight.is_meta:
            method.process_weights_after_loading(module)


def _reload_weights_dict(worker, tensors: dict, architecture: str | None = None) -> int:
    """As :func:`_reload_weights_file`, from tensors already in this process (a colocated engine's worker)."""
    pairs = ((vllm_names.to_vllm(architecture, name), tensor) for name, tensor in tensors.items())
    worker.reload_weights(weights_iterator=pairs)
    _repack_embeddings(worker.get_model())
    return len(tensors)


def _nccl_join(worker, host: str, port: int, world_size: int) -> int:
    """Run in each engine worker: join the trainer's weight-sync group (TRL ``trl/scripts/vllm_serve.py``
    ``WeightSyncWorkerExtension.init_communicator``: vLLM's ``StatelessProcessGroup`` + ``PyNcclCommunicator``, the
    worker at its world rank, the trainer last). CUDA only; untested without GPUs."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.parallel_state import get_world_group
    from vllm.distributed.utils import StatelessProcessGroup

    rank = get_world_group().rank
    group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
    worker.mmgrpo_nccl = PyNcclCommunicator(group, device=worker.device)
    return rank


def _nccl_receive(worker, entries: list, src: int, architecture: str | None = None) -> int:
    """Run in each engine worker: receive one bucket's flat buffer broadcast by the trainer (rank ``src``), view it
    as its tensors (:func:`.weight_buckets.unpack`, the layout the trainer packed) and reload them in place."""
    import torch

    comm = worker.mmgrpo_nccl
    flat = torch.empty(wb.data_bytes(entries), dtype=torch.uint8, device=worker.device)
    comm.broadcast(flat, src=src)
    comm.group.barrier()
    return _reload_weights_dict(worker, dict(wb.unpack(entries, flat)), architecture)


def _video(wire: dict) -> tuple:
    """A video item of a request → vLLM's ``(frames [F, H, W, C], metadata)``: the frames exactly as the trainer's
    processor gets them (already sampled and resized), the metadata of their sampling (fps, frame indices)."""
    import numpy as np

    frames = np.frombuffer(base64.b64decode(wire["frames"]), dtype=wire["dtype"]).reshape(wire["shape"])
    return frames.copy(), dict(wire["metadata"])


def _audio(wire: dict):
    """An audio item of a request → the waveform [N] vLLM takes as is: the trainer's, decoded and resampled to the
    processor's rate (a bare array is not resampled)."""
    import numpy as np

    return np.frombuffer(base64.b64decode(wire["array"]), dtype=wire["dtype"]).reshape(wire["shape"]).copy()


_MODULE = os.path.splitext(os.path.basename(__file__))[0]
"""This file's module name when imported from its folder (vLLM's engine process loads :class:`EarlyBans` so)."""


class EarlyBans(AdapterLogitsProcessor):
    """Bans a request's ``extra_args["early_banned_ids"]`` (−inf) at its first ``extra_args["early_banned_steps"]``
    completion tokens: Whisper's ``begin_suppress_tokens``, which the trainer masks at the first step only. vLLM
    loads it by name in its engine process (``LLM(logits_processors=["vllm_server:EarlyBans"])``, vLLM's
    ``AdapterLogitsProcessor`` for per-request processors); its ``processed_logprobs`` are after it."""

    def is_argmax_invariant(self) -> bool:
        return False  # a banned token may be the argmax

    def new_req_logits_processor(self, params):
        extra = params.extra_args or {}
        ids, steps = list(extra.get("early_banned_ids") or []), int(extra.get("early_banned_steps") or 0)
        if not ids or not steps:
            return None

        def ban(output_ids: list[int], logits):
            if len(output_ids) < steps:
                logits[ids] = float("-inf")
            return logits

        return ban


class Engine(WeightGate):
    """The vLLM ``LLM`` and the version of its weights: served over HTTP by this script, or held by the training
    process itself (``rollout.vllm_mode: colocate``, :mod:`.colocate`, vLLM's engine core in that process). Pushes go
    through :class:`~.engine_http.WeightGate`'s checks (versions forward, tensors of the served model)."""

    def __init__(self, args: argparse.Namespace):
        import vllm

        problem = engine_http.vllm_version_problem(vllm.__version__)
        if problem is not None and os.environ.get(engine_http.ANY_VLLM_ENV) != "1":
            raise engine_http.UnsupportedVLLM(problem)
        self.model = args.model
        self.version = 0
        self.client_rank: int | None = None  # the trainer's rank in the NCCL weight-sync group, once it exists
        self.lock = threading.Lock()
        import torch

        if args.gpu_memory_utilization is None:
            args.gpu_memory_utilization = 0.9 if torch.cuda.is_available() else 0.1
        # vLLM's CPU runner cannot rewind a seeded request's generator after a discarded token of a chunked prefill
        # ("CPU Generator does not use offset"): on CPU every prompt is prefilled whole (and the batch token budget
        # holds a whole context), so per-request seeds work there too.
        cpu_options = {}
        if not torch.cuda.is_available():
            cpu_options = {"enable_chunked_prefill": False, "max_num_batched_tokens": args.max_model_len or 4096}
        from transformers import AutoConfig

        # vLLM's cross-attention KV manager has no prefix caching ("CrossAttentionManager does not support caching"):
        # an encoder-decoder model (Whisper) runs without it; its encoder outputs are still cached per request
        encoder_decoder = bool(getattr(AutoConfig.from_pretrained(args.model), "is_encoder_decoder", False))
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the engine process imports EarlyBans by name
        # a transformers-5 checkpoint whose names vLLM's loader does not take is served from a renamed copy
        # (vllm_names); pushes keep transformers' names and are renamed in the worker
        local = args.model if os.path.isdir(args.model) else None
        self.architecture = vllm_names.architecture(local) if local else None
        self.served_copy = vllm_names.served_copy(local) if local else None
        try:
            self.llm = self._llm(args, cpu_options, encoder_decoder)
        except BaseException:
            self.remove_served_copy()
            raise
        self.spec = ModelSpec.from_checkpoint(_local_dir(args.model))

    def _llm(self, args: argparse.Namespace, cpu_options: dict, encoder_decoder: bool):
        from vllm import LLM

        return LLM(
            model=self.served_copy or args.model,
            dtype=args.dtype,
            seed=args.seed,
            max_model_len=args.max_model_len,
            enforce_eager=True,
            enable_prefix_caching=not encoder_decoder,
            logprobs_mode="processed_logprobs",
            limit_mm_per_prompt={"image": args.max_images, "video": args.max_videos, "audio": args.max_audios},
            gpu_memory_utilization=args.gpu_memory_utilization,
            logits_processors=[f"{_MODULE}:EarlyBans"],
            enable_sleep_mode=args.enable_sleep_mode,
            **cpu_options,
        )

    def remove_served_copy(self) -> None:
        """Remove the renamed copy of the checkpoint vLLM loaded (:func:`.vllm_names.served_copy`), if any."""
        if self.served_copy is not None:
            import shutil

            shutil.rmtree(self.served_copy, ignore_errors=True)
            self.served_copy = None

    def dead(self) -> str | None:
        """Why vLLM's engine no longer serves (its flag, or an engine process that exited), None while it does; None
        for an engine core in this process (colocated)."""
        resources = getattr(self.llm.llm_engine.engine_core, "resources", None)
        if resources is None:
            return None
        if resources.engine_dead:
            return "vLLM marked its engine core dead"
        for proc in getattr(resources.engine_manager, "processes", None) or []:
            if not proc.is_alive():
                return f"engine process {proc.name} (pid {proc.pid}) exited with code {proc.exitcode}"
        return None

    def generate(self, body: dict) -> dict:
        """A ``/generate`` body (media in their wire form, module docstring) → its answer."""
        requests = [dict(req, media=_loaded(req.get("media", {}))) for req in body["requests"]]
        return self.sample(dict(body, requests=requests))

    def sample(self, body: dict) -> dict:
        """G samples per prompt: ``body`` as ``/generate``'s, each request's media already loaded as vLLM takes them
        (``image``: PIL images; ``video``: ``(frames [F, H, W, C] uint8, metadata)``; ``audio``: waveforms [N])."""
        from vllm import SamplingParams

        inputs = []
        for req in body["requests"]:
            # token-in (multi-turn continuations): the ids as sent, one placeholder per media item for vLLM to expand
            item = (
                {"prompt_token_ids": req["prompt_token_ids"]}
                if "prompt_token_ids" in req
                else {"prompt": req["prompt"]}
            )
            data = {
                kind: items if len(items) > 1 else items[0] for kind, items in req.get("media", {}).items() if items
            }
            if data:
                item["multi_modal_data"] = data
                if body.get("mm_processor_kwargs"):
                    item["mm_processor_kwargs"] = body["mm_processor_kwargs"]
            if "decoder_prompt_token_ids" in req:  # encoder-decoder (Whisper): the decoder prompt as given, by id
                item = {"encoder_prompt": item, "decoder_prompt": {"prompt_token_ids": req["decoder_prompt_token_ids"]}}
            inputs.append(item)
        common = dict(
            n=int(body["n"]),
            max_tokens=int(body["max_tokens"]),
            min_tokens=int(body.get("min_tokens", 0)),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=int(body.get("top_k", 0)),
            stop_token_ids=list(body.get("stop_token_ids", [])),
            logit_bias={int(t): -100.0 for t in body.get("banned_token_ids", [])} or None,
            logprobs=0,
            detokenize=False,
            skip_special_tokens=False,
        )
        early = {
            "early_banned_ids": body.get("early_banned_token_ids"),
            "early_banned_steps": body.get("early_banned_steps"),
        }
        if early["early_banned_ids"] and early["early_banned_steps"]:
            common["extra_args"] = early  # EarlyBans
        # one seed per prompt (its G samples take seed, seed+1, ...: vLLM's parallel sampling)
        params = [SamplingParams(seed=req.get("seed"), **common) for req in body["requests"]]
        with self.lock:
            self.check_whole()  # not while a bucketed push is half loaded
            results = self.llm.generate(inputs, params, use_tqdm=False)
            version = self.version
        outputs = []
        prompts = []
        for res in results:
            prompts.append({"prompt_token_ids": list(res.prompt_token_ids or [])})
            samples = []
            for c in res.outputs:
                ids = list(c.token_ids)
                logprobs = [float(step[tok].logprob) for tok, step in zip(ids, c.logprobs or [])]
                samples.append({"token_ids": ids, "logprobs": logprobs})
            outputs.append(samples)
        return {"version": version, "outputs": outputs, "prompts": prompts}

    def _load_file(self, payload: bytes | bytearray) -> int:
        """Reload the weights from a checked safetensors ``payload`` (:meth:`WeightGate.update_weights`, lock held)."""
        with tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False) as f:
            f.write(payload)
            path = f.name
        try:
            return self._reload(functools.partial(_reload_weights_file, path=path, architecture=self.architecture))
        finally:
            os.unlink(path)

    def _load_tensors(self, tensors: dict) -> int:
        """The trainer's own tensors (Hugging Face names), for an engine whose worker runs in this process
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ``collective_rpc`` calls the function directly, nothing is
        serialised); :meth:`WeightGate.load_weights` checks them first, lock held."""
        return self._reload(functools.partial(_reload_weights_dict, tensors=tensors, architecture=self.architecture))

    def init_communicator(self, body: dict) -> dict:
        """``POST /init_communicator`` (``rollout.weight_sync: nccl``): the engine's workers join a new NCCL group at
        ``body["host"]:body["port"]`` as ranks 0..W-1 (in the background: the trainer joins as rank W after this
        answer, and the group forms then); answers ``{"client_rank": W}``. Refused (400) without CUDA."""
        import torch

        if not torch.cuda.is_available():
            raise Refused(400, "this rollout server has no CUDA, so no NCCL channel: use rollout.weight_sync: http")
        workers = int(self.llm.llm_engine.vllm_config.parallel_config.world_size)
        join = functools.partial(_nccl_join, host=str(body["host"]), port=int(body["port"]), world_size=workers + 1)
        threading.Thread(target=self.llm.collective_rpc, args=(join,), daemon=True).start()
        self.client_rank = workers
        return {"client_rank": workers}

    def update_weights_nccl(self, body: dict) -> dict:
        """``POST /update_weights_nccl``: one bucket's entries (:func:`.weight_buckets.entries_json`), checked as an
        HTTP push's are; the workers then receive its broadcast in the background, lock held, so the next request
        waits for it (the trainer broadcasts after this answer)."""
        if self.client_rank is None:
            raise Refused(409, "no NCCL channel: POST /init_communicator first")
        entries = wb.entries_from_json(body["entries"])
        version, base = int(body["version"]), body.get("base")
        bucket = (int(body["bucket"][0]), int(body["bucket"][1]))
        self.lock.acquire()
        try:
            if not self._admit(version, None if base is None else int(base), bucket):
                self.lock.release()
                return {"refused": "base", "version": self.version}
            if self.spec is not None:
                self.spec.check({e.name: (e.dtype, e.shape) for e in entries})
        except BaseException:
            self.lock.release()
            raise
        receive = functools.partial(
            _nccl_receive, entries=entries, src=self.client_rank, architecture=self.architecture
        )

        def run() -> None:
            try:
                self._reload(receive)
                self._bucket_loaded(version, bucket)
            finally:
                self.lock.release()

        threading.Thread(target=run, daemon=True).start()
        return {"version": version if bucket[0] + 1 == bucket[1] else self.version, "bucket": list(bucket)}

    def _reload(self, fn: functools.partial) -> int:
        loaded = self.llm.collective_rpc(fn)
        # every cache computed with the old weights: prompt K/V, vision-encoder outputs, processed media
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_mm_cache()
        return loaded[0] if loaded else 0

    def sleep(self) -> None:
        """Free the engine's accelerator memory between rollouts (vLLM's ``sleep(level=1)``: weights offloaded to
        host memory, KV cache discarded; CUDA only, and only with ``--enable-sleep-mode``)."""
        with self.lock:
            self.llm.sleep(level=1)

    def shutdown(self) -> None:
        """Stop an engine core that runs in this process (colocated): its worker, KV cache and the
        torch.distributed group vLLM made here (idempotent; vLLM would otherwise do it at interpreter exit)."""
        with self.lock:
            self.llm.llm_engine.engine_core.shutdown()
            self.remove_served_copy()

    def wake_up(self) -> None:
        """Undo :meth:`sleep`: weights back on the device, KV cache allocated again."""
        with self.lock:
            self.llm.wake_up()


def _loaded(media: dict) -> dict:
    """A request's media in their wire form (module docstring) → the items vLLM takes (:meth:`Engine.sample`)."""
    from PIL import Image

    out = {}
    images = [Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB") for b in media.get("image", [])]
    if images:
        out["image"] = images
    if media.get("video"):
        out["video"] = [_video(v) for v in media["video"]]
    if media.get("audio"):
        out["audio"] = [_audio(a) for a in media["audio"]]
    return out


def _local_dir(model: str) -> str:
    """The served checkpoint's folder: ``model`` itself, or a hub id's snapshot (vLLM has downloaded it by now)."""
    if os.path.isdir(model):
        return model
    from huggingface_hub import snapshot_download

    return snapshot_download(model, local_files_only=True)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``, prctl(2); Linux only): vLLM's engine
    processes then never outlive their server, whatever stopped it (SIGKILL included; vLLM's worker ignores
    SIGTERM). Run in every process the server forks (``os.register_at_fork``) and in vLLM's spawned worker, which
    imports this file as ``__mp_main__``."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__mp_main__":  # vLLM's spawned worker process (its parent: the engine core)
    _die_with_parent()


def _engine_processes() -> list[int]:
    """This server's descendants (vLLM's engine core, its workers, multiprocessing's helpers) and, when the server
    leads its process group, the group's other members (orphans whose parent died first), from ``/proc``."""
    me, group_leader = os.getpid(), os.getpgrp() == os.getpid()
    children: dict[int, list[int]] = {}
    in_group = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid, pgid = int(entry), int(fields[1]), int(fields[2])
        children.setdefault(ppid, []).append(pid)
        if group_leader and pgid == me and pid != me:
            in_group.append(pid)
    found, todo = [], [me]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(set(found) | set(in_group))


def _kill_engine_processes() -> None:
    """SIGKILL every engine process (:func:`_engine_processes`): the server is going, and nothing of vLLM's may stay
    (an engine core left behind holds GBs of memory; its worker ignores SIGTERM)."""
    for pid in _engine_processes():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    """SIGTERM, SIGINT, SIGHUP: leave ``serve_forever``; :func:`main` kills the engine processes on its way out."""
    raise _Stop(signum)


ENGINE_DIED = 3
"""The server's exit code when vLLM's engine died under it."""


def _watch(engine: Engine, server: ThreadingHTTPServer, state: dict, every_s: float = 1.0) -> None:
    """Stop the server once the engine is dead (``/health`` answers 503 meanwhile): exit code :data:`ENGINE_DIED`."""
    while (why := engine.dead()) is None:
        time.sleep(every_s)
    print(f"mmgrpo rollout-server: the vLLM engine died ({why}); stopping", file=sys.stderr, flush=True)
    state["code"] = ENGINE_DIED
    server.shutdown()


def parser() -> argparse.ArgumentParser:
    """The engine's options, for this server and for a colocated engine (:mod:`.colocate` parses the same list)."""
    p = argparse.ArgumentParser(description="mmgrpo's vLLM rollout server (run under .venv-vllm)")
    p.add_argument("--model", required=True, help="Hugging Face model directory (or hub id)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's context length")
    p.add_argument("--max-images", type=int, default=4, help="images per prompt")
    p.add_argument("--max-videos", type=int, default=0, help="videos per prompt (0: a server for text and images)")
    p.add_argument("--max-audios", type=int, default=0, help="audio clips per prompt (audio LLMs)")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="fraction of GPU memory for weights and KV cache (default 0.9); on the CPU backend the fraction of the "
        "machine's memory (default 0.1: the training process needs the rest)",
    )
    p.add_argument(
        "--enable-sleep-mode",
        action="store_true",
        help="allow Engine.sleep / wake_up (CUDA only; a colocated engine sleeps while the trainer updates)",
    )
    return p


def main() -> int:
    args = parser().parse_args()
    secret = os.environ.pop(SECRET_ENV, "")  # not inherited by vLLM's engine processes
    if len(secret) < 16:
        print(
            f"mmgrpo rollout-server: no push secret (${SECRET_ENV}, at least 16 characters): start the server with "
            "`mmgrpo rollout-server CONFIG`, which makes one, or set it for the server and the trainer",
            file=sys.stderr,
        )
        return 2
    # LLM.collective_rpc sends a function to the engine's worker process: vLLM serialises it only when allowed.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _stop)
    os.register_at_fork(after_in_child=_die_with_parent)  # vLLM forks its engine core from this process
    state = {"code": 0}
    engine = None
    try:
        engine = Engine(args)
        limits = Limits(weights_bytes=engine.spec.max_bytes())
        server = ThreadingHTTPServer((args.host, args.port), handler(engine, secret, limits))
        server.daemon_threads = True
        threading.Thread(target=_watch, args=(engine, server, state), daemon=True).start()
        print(f"mmgrpo rollout-server: vLLM on {args.model} at http://{args.host}:{args.port}", flush=True)
        server.serve_forever()
    except _Stop as e:
        state["code"] = 128 + e.signum
    except engine_http.UnsupportedVLLM as e:
        print(f"mmgrpo rollout-server: {e}", file=sys.stderr)
        state["code"] = 2
    finally:
        _kill_engine_processes()
        if engine is not None:
            engine.remove_served_copy()
    return state["code"]


if __name__ == "__main__":  # vLLM spawns its engine process, which re-imports this module
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not vLLM's exit handlers: they wait on the engine processes just killed
