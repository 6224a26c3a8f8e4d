"""Issue 54: the rollout server proves itself to the trainer (``engine_http.server_proof``, ``VLLMClient.authenticate``)
before the trainer sends its secret, a push or a request for rollouts; a SIGKILLed server's key file and a port in
TIME_WAIT do not stop a restart. Stand-in servers (no vLLM): seconds.

On the old tree a fake server answering ``"authorized": true`` received the secret, the push and the generate
request; a restart on a port in TIME_WAIT was "in use"."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from mmgrpo.modalities.tokens.engine import EngineError, VLLMClient, address_taken
from mmgrpo.modalities.tokens.engine_http import CHALLENGE_HEADER, SECRET_ENV, handler, secret_file, server_proof
from tests.test_engine_trust import SECRET, StandIn

ROOT = Path(__file__).resolve().parents[1]

REPLAYED = "ab" * 32
"""A challenge the fake answered once for the real secret (an eavesdropped proof)."""


def _fake(answer) -> tuple[ThreadingHTTPServer, list[dict]]:
    """A server on a free port that records every request (method, path, headers) and answers ``GET /health`` with
    ``answer(challenge)``, every POST as a rollout server would."""
    seen: list[dict] = []

    class Fake(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _reply(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            seen.append({"method": "GET", "path": self.path, **dict(self.headers)})
            self._reply(answer(self.headers.get(CHALLENGE_HEADER)))

        def do_POST(self) -> None:
            seen.append({"method": "POST", "path": self.path, **dict(self.headers)})
            self._reply({"version": 1, "outputs": [], "prompts": []})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (lambda c: {"ok": True, "version": 0, "model": "x", "authorized": True}, "gave no proof"),
        (lambda c: {"ok": True, "version": 0, "authorized": True, "proof": server_proof("other" * 8, c)}, "wrong"),
        (lambda c: {"ok": True, "version": 0, "proof": server_proof(SECRET, REPLAYED)}, "wrong"),  # a replay
    ],
    ids=["authorized-true", "another-secret", "replayed-proof"],
)
def test_a_server_that_cannot_prove_the_secret_never_receives_it(answer, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("MMGRPO_CACHE", str(tmp_path))
    server, seen = _fake(answer)
    client = VLLMClient(f"http://127.0.0.1:{server.server_address[1]}", secret=SECRET)
    try:
        for attempt in (
            client.health,
            lambda: client.push({"w": torch.ones(2)}, 1),
            lambda: client._generate({"requests": [], "n": 2}),
        ):
            with pytest.raises(EngineError) as e:
                attempt()
            assert expected in str(e.value) and len(str(e.value).splitlines()) == 1, e.value
    finally:
        server.shutdown()
        server.server_close()
    assert seen and all(r["method"] == "GET" and "Authorization" not in r for r in seen), seen
    assert not any(SECRET in json.dumps(r) for r in seen)  # the secret never left the trainer


def test_the_real_front_proves_itself_and_then_takes_the_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("MMGRPO_CACHE", str(tmp_path))
    engine = StandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(engine, SECRET))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert VLLMClient(url, secret=SECRET).authenticate() == SECRET
        health = VLLMClient(url, secret=SECRET).health()
        assert health["ok"] and health["authorized"] is True
        assert VLLMClient(url, secret=SECRET)._generate({"requests": []})["version"] == 0
        with pytest.raises(EngineError, match="does not take this trainer's push secret"):
            VLLMClient(url, secret="z" * 43).health()
    finally:
        server.shutdown()
        server.server_close()


def _time_wait_port() -> int:
    """A port with no listener whose server side closed a connection first (TIME_WAIT on the server's port), the
    listener bound as the rollout server binds (http.server's ``allow_reuse_address``)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server closes first: its side enters TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    return port


def test_a_restart_on_a_port_in_time_wait_is_not_in_use_and_the_stale_key_goes(tmp_path, monkeypatch):
    """A SIGKILLed `mmgrpo rollout-server` leaves its key file; the restart on that port (in TIME_WAIT) starts, its
    key file replaces the stale one at start, a trainer holding the stale secret is refused, and the file goes at
    the end."""
    monkeypatch.setenv("MMGRPO_CACHE", str(tmp_path))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    port = _time_wait_port()
    url = f"http://127.0.0.1:{port}"
    assert not address_taken(url)  # old tree: True ("port in use")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        assert address_taken(f"http://127.0.0.1:{busy.getsockname()[1]}")  # a live server still is
    key = secret_file(url)
    key.parent.mkdir(parents=True, mode=0o700)
    key.write_text("stale-secret-of-a-sigkilled-server")
    seen = tmp_path / "seen"
    server = (  # serves the real front on the restarted port with the secret run_server hands it
        "import os, sys; from http.server import HTTPServer; "
        "from mmgrpo.modalities.tokens.engine_http import handler; from tests.test_engine_trust import StandIn; "
        f"s = HTTPServer(('127.0.0.1', {port}), handler(StandIn(), os.environ[{SECRET_ENV!r}])); "
        f"open({str(seen)!r}, 'w').write(open({str(key)!r}).read()); s.handle_request(); s.handle_request()"
    )
    runner = (
        "import sys; from pathlib import Path; from mmgrpo.modalities.tokens.engine import run_server; "
        f"sys.exit(run_server([sys.executable, '-c', {server!r}], secret_path=Path({str(key)!r})))"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not (seen.exists() and seen.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        fresh = seen.read_text()
        assert fresh and fresh != "stale-secret-of-a-sigkilled-server"
        with pytest.raises(EngineError, match="does not take this trainer's push secret"):
            VLLMClient(url, secret="stale-secret-of-a-sigkilled-server").health()
        assert VLLMClient(url).health()["authorized"] is True  # the key file read now: the restarted server's
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not key.exists()
