"""Rollout throughput of the two engines on one machine: mmgrpo's native decode loop vs the vLLM server.

Both sample the same P image prompts × G samples × T tokens (``min_new_tokens = T``, so every sample is T tokens
long in both) from the same weights, alternating engine by engine for ``--repeats`` rounds in one run; the
figure is generated tokens per second (P·G·T / wall seconds of one rollout call, prompt encoding included, the
vLLM server already started and warmed up by one call). The server runs under ``.venv-vllm``
(``bash scripts/setup_vllm.sh``).

Models: ``tiny`` — the built-in ``tiny-qwen2.5-vl-engine``; ``real-mix`` — ``benchmarks/vs_trl.py``'s real-FLOP-mix
Qwen2.5-VL (Qwen2.5-VL-3B's lm_head / decoder / vision shares of per-token FLOPs).

    python benchmarks/engine_throughput.py --model tiny --prompts 8 --group 8 --tokens 32 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_dir(name: str, out: Path) -> str:
    if name == "tiny":
        from mmgrpo.modalities.vlm.tiny import resolve_model_path

        return resolve_model_path("tiny-qwen2.5-vl-engine")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import vs_trl

    directory = vs_trl.build_model(out / "model_real-mix", seed=0, sizes=vs_trl.REAL_MIX_SIZES)
    return str(vs_trl.resize_vocab(directory, vs_trl.REAL_MIX_VOCAB))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny", "real-mix"], default="tiny")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="runs/engine_throughput")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = _model_dir(a.model, out)

    from mmgrpo.modalities.tokens.engine import VLLMClient
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask
    from mmgrpo.types import EngineError

    port = _free_port()
    python = os.environ.get("MMGRPO_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))
    secret = secrets.token_urlsafe(32)  # the server takes pushes from this process only (docs/reliability.md)
    server = subprocess.Popen(
        [python, str(ROOT / "modalities/tokens/vllm_server.py"), "--model", model_dir, "--port", str(port)],
        stdout=(out / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(os.environ, MMGRPO_ENGINE_SECRET=secret),
    )
    try:
        client = VLLMClient(f"http://127.0.0.1:{port}", timeout_s=600, secret=secret)
        for _ in range(600):
            try:
                client.health()
                break
            except EngineError:
                if server.poll() is not None:
                    raise SystemExit((out / "server.log").read_text()[-3000:]) from None
                time.sleep(1)
        args = {"name_or_path": model_dir, "max_new_tokens": a.tokens, "min_new_tokens": a.tokens, "temperature": 1.0}
        adapter = build_vlm_adapter(args, seed=0)
        adapter.engine = client
        rows = ShapesTask(ShapesArgs(train_size=a.prompts, eval_size=1)).train_rows()[: a.prompts]
        with adapter._media_scope():
            encodings = [adapter._encode_prompt(r) for r in rows]
        tokens = a.prompts * a.group * a.tokens

        def native() -> float:
            t = time.perf_counter()
            adapter._sample(encodings, a.group, greedy=False)
            return time.perf_counter() - t

        def vllm() -> float:
            t = time.perf_counter()
            adapter._engine_sample(adapter._engine_prompts(rows, encodings), a.group, None)
            return time.perf_counter() - t

        vllm()  # warm-up: the server's first request compiles and allocates
        results = {"native": [], "vllm": []}
        for _ in range(a.repeats):
            results["native"].append(tokens / native())
            results["vllm"].append(tokens / vllm())
        summary = {
            "model": a.model,
            "threads": torch.get_num_threads(),
            "prompts": a.prompts,
            "group": a.group,
            "tokens": a.tokens,
            "tokens_per_s": results,
            "vllm_over_native": [v / n for v, n in zip(results["vllm"], results["native"])],
        }
        (out / f"{a.model}.json").write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
