"""Issue 37: the vLLM rollout server answers only its trainer (docs/reliability.md). Its HTTP front and push checks
(:mod:`mmgrpo.modalities.tokens.engine_http`) in front of a stand-in engine, so these run in seconds without vLLM;
tests/test_engine.py checks the same on the real server."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, save

from mmgrpo.modalities.tokens.engine import EngineError, VLLMClient, run_server
from mmgrpo.modalities.tokens.engine_http import (
    SECRET_ENV,
    Limits,
    ModelSpec,
    Refused,
    WeightGate,
    body_length,
    check_version,
    handler,
    safetensors_spec,
)
from tests.test_engine import _gone, stand_in_server

SECRET = "s3cret-" + "x" * 36


class StandIn(WeightGate):
    """An engine without vLLM: records what reaches its loader."""

    model = "stand-in"

    def __init__(self, spec: ModelSpec | None = None):
        self.lock = threading.Lock()
        self.version = 0
        self.spec = spec
        self.loaded: list[dict] = []
        self.why_dead: str | None = None

    def _load_file(self, payload: bytes | bytearray) -> int:
        self.loaded.append(load(bytes(payload)))
        return len(self.loaded[-1])

    def generate(self, body: dict) -> dict:
        return {"version": self.version, "outputs": [], "prompts": []}

    def dead(self) -> str | None:
        return self.why_dead


@pytest.fixture
def spec(tmp_path) -> ModelSpec:
    """A served checkpoint: two float32 tensors and a token embedding, its output head tied (not stored)."""
    d = tmp_path / "model"
    d.mkdir()
    tensors = {
        "layer.weight": torch.zeros(4, 5),
        "layer.bias": torch.zeros(4),
        "embed_tokens.weight": torch.zeros(7, 4),
    }
    (d / "model.safetensors").write_bytes(save(tensors))
    (d / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    return ModelSpec.from_checkpoint(d)


@pytest.fixture
def served(spec, tmp_path, monkeypatch):
    """(url, engine): the server's handler on a free port, short limits (1 s for headers and a body, 0.5 s stall)."""
    monkeypatch.setenv("MMGRPO_CACHE", str(tmp_path / "cache"))  # no key file of a real server is found
    monkeypatch.delenv(SECRET_ENV, raising=False)
    engine = StandIn(spec)
    limits = Limits(header_s=1.0, idle_s=0.5, body_s=1.0, weights_bytes=spec.max_bytes())
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(engine, SECRET, limits))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", engine
    server.shutdown()
    server.server_close()


def _post(url: str, path: str, data: bytes, headers: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_push_without_or_with_a_wrong_secret_is_refused_and_changes_nothing(served):
    url, engine = served
    push = save({"layer.bias": torch.ones(4)})
    code, body = _post(url, "/update_weights", push, {"X-Weights-Version": "999"})
    assert code == 401 and "push secret" in body["error"]
    code, _ = _post(url, "/generate", b"{}", {"Authorization": "Bearer nope"})
    assert code == 401
    with pytest.raises(EngineError, match="no or wrong push secret"):
        VLLMClient(url, secret="y" * 43).push({"layer.bias": torch.ones(4)}, 999)
    assert engine.version == 0 and engine.loaded == []  # nothing reached the engine
    with pytest.raises(EngineError, match="does not take this trainer's push secret"):
        VLLMClient(url, secret="y" * 43).health()  # the trainer learns it at connect (and --dry-run), in one line
    with pytest.raises(EngineError, match="no push secret for it"):
        VLLMClient(url).health()  # no key file, no $MMGRPO_ENGINE_SECRET
    assert VLLMClient(url, secret=SECRET).push({"layer.bias": torch.ones(4)}, 1)
    assert engine.version == 1 and torch.equal(engine.loaded[0]["layer.bias"], torch.ones(4))


def test_the_trainer_finds_the_secret_in_its_key_file_or_the_environment(served, monkeypatch):
    from mmgrpo.modalities.tokens.engine_http import secret_file, write_secret

    url, _ = served
    path = secret_file(url)
    write_secret(path, SECRET)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert VLLMClient(url).health()["authorized"] is True
    path.unlink()
    monkeypatch.setenv(SECRET_ENV, SECRET)
    assert VLLMClient(url).health()["authorized"] is True


def test_versions_only_move_forward(served):
    """Rule: a push's version is strictly greater than the one the engine holds (gaps allowed: the trainer's
    versions are step numbers); a partial push goes only on top of the version it names."""
    url, engine = served
    client = VLLMClient(url, secret=SECRET)
    part = {"layer.bias": torch.ones(4)}
    assert client.push(part, 3)
    for stale in (3, 1, 0):
        with pytest.raises(EngineError, match=f"weights version {stale} is not newer than version 3"):
            client.push(part, stale)
    with pytest.raises(EngineError, match=r"X-Weights-Version -7 is out of range"):
        client.push(part, -7)
    assert client.push(part, 4, base=2) is False  # another base: the trainer sends the whole model instead
    with pytest.raises(EngineError, match="not newer"):
        client.push(part, 3, base=3)  # the right base, but not forward
    assert engine.version == 3 and len(engine.loaded) == 1
    assert client.push(part, 4, base=3) and client.push(part, 10) and engine.version == 10
    assert check_version(10, 11, None) and not check_version(10, 11, 9)
    with pytest.raises(Refused):
        check_version(10, 10, None)


def test_every_pushed_tensor_matches_the_served_model_before_it_reaches_the_engine(served, spec):
    url, engine = served
    client = VLLMClient(url, secret=SECRET)
    bad = {
        "shape": ({"layer.weight": torch.zeros(3, 5)}, r"'layer.weight' has shape \[3, 5\], the served model's is "
                  r"\[4, 5\]"),
        "dtype": ({"layer.bias": torch.zeros(4, dtype=torch.int64)}, r"'layer.bias' has dtype I64, the served model "
                  "takes BF16/F16/F32"),
        "float64": ({"layer.bias": torch.zeros(4, dtype=torch.float64)}, "dtype F64"),
        "name": ({"foo.weight": torch.zeros(4)}, r"'foo.weight' is not a tensor of the served model"),
        "untied head shape": ({"lm_head.weight": torch.zeros(4, 7)}, r"'lm_head.weight' has shape \[4, 7\]"),
    }  # fmt: skip
    for tensors, message in bad.values():
        with pytest.raises(EngineError, match=message):
            client.push({"layer.bias": torch.ones(4), **tensors}, 1)
    assert engine.version == 0 and engine.loaded == []  # the engine keeps serving its weights
    code, body = _post(url, "/update_weights", b"\xff" * 8 + b"{}", {"X-Weights-Version": "1", "Authorization":
                                                                       f"Bearer {SECRET}"})  # fmt: skip
    assert code == 400 and "not a safetensors file" in body["error"]
    ok = {"layer.weight": torch.ones(4, 5, dtype=torch.bfloat16), "lm_head.weight": torch.ones(7, 4)}  # tied head
    assert client.push(ok, 1) and set(engine.loaded[0]) == set(ok)
    assert spec.max_bytes() >= (20 + 4 + 28) * 4


def test_a_malformed_push_header_is_refused_not_unpacked():
    good = save({"a": torch.zeros(2, 3)})
    assert safetensors_spec(good) == {"a": ("F32", (2, 3))}
    n = int.from_bytes(good[:8], "little")
    header = json.loads(good[8 : 8 + n])
    for broken in (
        {"a": {**header["a"], "data_offsets": [0, 1 << 40]}},  # past the data
        {"a": {**header["a"], "shape": [3, 3]}},  # more elements than bytes
        {"a": {**header["a"], "dtype": "X9"}},
    ):
        raw = json.dumps(broken).encode()
        with pytest.raises(Refused, match="not a safetensors file"):
            safetensors_spec(len(raw).to_bytes(8, "little") + raw + good[8 + n :])
    with pytest.raises(Refused, match="header of"):
        safetensors_spec((1 << 62).to_bytes(8, "little") + b"{}")


def _raw(url: str, request: bytes, trickle: bytes = b"", every_s: float = 0.0) -> tuple[bytes, float]:
    """Send ``request`` on a fresh connection (then ``trickle`` one byte every ``every_s``), return what the server
    answered and when (s) it answered or closed."""
    host, port = url.removeprefix("http://").split(":")
    t = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        for b in trickle:
            time.sleep(every_s)
            try:
                s.sendall(bytes([b]))
            except OSError:
                break
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer, time.monotonic() - t


def test_malformed_lengths_and_slow_requests_are_refused_within_bounds(served):
    url, engine = served
    head = f"POST /update_weights HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\r\nX-Weights-Version: 1\r\n"
    for length, status in (("-1", b"400"), ("abc", b"400"), (str(10**12), b"413")):
        answer, took = _raw(url, f"{head}Content-Length: {length}\r\n\r\n".encode())
        assert answer.split(b" ")[1] == status and took < 2, (length, answer, took)  # at once: no body awaited
    answer, _ = _raw(url, f"{head}\r\n".encode())
    assert answer.split(b" ")[1] == b"411"
    # a body that stalls (0.5 s allowed between reads) or trickles (1 s allowed for the whole)
    answer, took = _raw(url, f"{head}Content-Length: 100\r\n\r\n0123456789".encode())
    assert answer.split(b" ")[1] == b"408" and took < 3, (answer, took)
    answer, took = _raw(url, f"{head}Content-Length: 100\r\n\r\n".encode(), b"x" * 20, every_s=0.2)
    assert answer.split(b" ")[1] == b"408" and took < 5, (answer, took)
    # headers that trickle: the connection is cut after 1 s
    answer, took = _raw(url, b"POST /generate HTTP/1.1\r\n", b"X-Slow: " + b"a" * 40, every_s=0.2)
    assert answer == b"" and took < 4, (answer, took)
    assert engine.loaded == [] and engine.version == 0
    assert VLLMClient(url, secret=SECRET).health()["ok"]  # every handler thread came back
    with pytest.raises(Refused):
        body_length("+5", 10)
    assert body_length("10", 10) == 10


def test_a_dead_engine_fails_health(served):
    url, engine = served
    engine.why_dead = "engine process EngineCore_DP0 (pid 1) exited with code -9"
    with pytest.raises(EngineError, match="the vLLM engine is dead: engine process EngineCore_DP0"):
        VLLMClient(url, secret=SECRET).health()
    code, body = _post(url, "/generate", b"{}", {"Authorization": f"Bearer {SECRET}"})
    assert code == 503 and "dead" in body["error"]


def test_rollout_server_hands_the_secret_over_in_the_environment_only(tmp_path, monkeypatch):
    """``mmgrpo rollout-server`` makes the secret, gives it to the server in its environment (not its command line)
    and to this user's trainers in a 0600 key file, removed when the server stops."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    key, seen = tmp_path / "keys" / "127.0.0.1_8100.key", tmp_path / "seen.json"
    server = (
        "import json, os, stat, sys; k = sys.argv[1]; "
        "json.dump({'env': os.environ.get('MMGRPO_ENGINE_SECRET'), 'cmdline': open('/proc/self/cmdline').read(), "
        "'file': open(k).read(), 'mode': stat.S_IMODE(os.stat(k).st_mode)}, open(sys.argv[2], 'w'))"
    )
    assert run_server([sys.executable, "-c", server, str(key), str(seen)], secret_path=key) == 0
    got = json.loads(seen.read_text())
    assert got["env"] and len(got["env"]) >= 32 and got["file"] == got["env"] and got["mode"] == 0o600
    assert got["env"] not in got["cmdline"]
    assert not key.exists()  # the server stopped: its key goes


def test_a_second_rollout_server_on_a_taken_address_is_refused():
    """Before it writes its key file over the first server's: one line, exit 2."""
    from mmgrpo.modalities.tokens.engine import address_taken

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        assert address_taken(url)
        out = subprocess.run(
            [sys.executable, "-m", "mmgrpo", "rollout-server", "configs/quickstart.yaml", f"rollout.url={url}",
             "--python", sys.executable],
            cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 2 and "is in use" in out.stderr, out.stderr
    assert not address_taken(url)


def test_a_sigkilled_server_takes_its_engine_processes_along(tmp_path):
    """The server itself SIGKILLed (not ``mmgrpo rollout-server``): the engine processes it started (a stand-in
    grandchild here, as vLLM's ``VLLM::EngineCore``) are killed with it, and the command exits non-zero."""
    proc, server_pid, engine_pid = stand_in_server(tmp_path)
    os.kill(server_pid, signal.SIGKILL)
    assert proc.wait(timeout=30) != 0
    if not _gone(engine_pid, 10):
        os.kill(engine_pid, signal.SIGKILL)
        raise AssertionError("an engine process outlived its SIGKILLed server")


VLLM_PYTHON = Path(os.environ.get("MMGRPO_VLLM_PYTHON", Path(__file__).resolve().parents[1] / ".venv-vllm/bin/python"))


@pytest.mark.slow  # imports vLLM (seconds each)
@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="no .venv-vllm: run `bash scripts/setup_vllm.sh`")
def test_the_server_started_by_hand_without_a_secret_refuses_to_start(tmp_path):
    """``vllm_server.py`` without ``$MMGRPO_ENGINE_SECRET`` (or a short one): one line, exit 2, before vLLM loads."""
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    script = Path(__file__).resolve().parents[1] / "modalities/tokens/vllm_server.py"
    for extra in ({}, {SECRET_ENV: "short"}):
        out = subprocess.run(
            [str(VLLM_PYTHON), str(script), "--model", str(tmp_path)],
            env={**env, **extra}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 2 and "no push secret" in out.stderr, out.stderr[-2000:]
