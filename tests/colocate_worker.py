"""The colocated vLLM engine against the native decode loop, in one process: run by
``tests/test_colocate.py::test_colocated_engine_greedy_equals_native_after_a_weight_push`` under
``.venv-colocate/bin/python`` (pytest's own environment has no vllm).

Run as ``python tests/colocate_worker.py OUT.json``. On the tiny engine-sized Qwen2.5-VL (shapes images), with the
engine built from the quickstart config's options (:func:`mmgrpo.modalities.tokens.colocate.colocate_args`) and
held by the adapter (``use_engine(..., engine=ColocateEngine(...))``), it records: greedy completions of the engine
before a weight push, of the native loop and the engine after pushing perturbed weights, the largest |engine − trainer|
log-prob over a sampled rollout, and the error a stale version raises. The test asserts on ``OUT.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mmgrpo import noise
from mmgrpo.cli import note_deprecations
from mmgrpo.loader import load_config
from mmgrpo.modalities.tokens.colocate import ColocateEngine, colocate_args
from mmgrpo.modalities.tokens.engine import EngineError
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask
from tests.numerics import adapter_reductions, logprob_scale

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-qwen2.5-vl-engine"


def greedy(adapter, rows: list[dict], engine: bool) -> list[list[int]]:
    """Greedy completions [P, T] of the native decode loop or of the engine (pad after the end)."""
    with adapter._media_scope():
        encodings = [adapter._encode_prompt(r) for r in rows]
    if not engine:
        return adapter._sample(encodings, 1, greedy=True)[0].tolist()
    requests = adapter._engine_prompts(rows, encodings)
    spec = adapter._sampling_spec(greedy=True)
    ids, _, prompt_ids = adapter.engine.generate(requests, 1, spec, [0] * len(rows), adapter._engine_processor_kwargs())
    assert prompt_ids == [e["input_ids"][0].tolist() for e in encodings], "the engine tokenized a prompt differently"
    mask = adapter._completion_mask(ids)
    return torch.where(mask.bool(), ids, torch.full_like(ids, adapter.pad_id)).tolist()


def main(out: str) -> None:
    cfg = load_config(
        ROOT / "configs/quickstart.yaml",
        [f"model.args.name_or_path={MODEL}", "rollout.engine=vllm", "rollout.vllm_mode=colocate"],
    )
    adapter = build_vlm_adapter({"name_or_path": MODEL, "max_new_tokens": 8, "temperature": 1.0}, seed=cfg.seed)
    adapter.use_engine(ColocateEngine(colocate_args(cfg)))
    rows = ShapesTask(ShapesArgs(train_size=4, eval_size=1)).train_rows()[:4]
    result: dict = {"engine_before": greedy(adapter, rows, engine=True)}
    with torch.no_grad():  # move the policy away from the checkpoint the engine loaded, then push it
        g = torch.Generator().manual_seed(1)
        for p in adapter.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    adapter.push_engine_weights(version=1)
    result["native"] = greedy(adapter, rows, engine=False)
    result["engine"] = greedy(adapter, rows, engine=True)
    rollout = adapter.rollout(rows[:2], 4, noise.NoiseKeys(0, 0, (0, 1), 4))  # the adapter's own engine path
    m = rollout.mask.bool()
    result["sampled_tokens"] = int(m.sum())
    result["logprob_max_abs_diff"] = float((rollout.old_logprobs - rollout.engine_logprobs)[m].abs().max())
    result["logprob_tol"] = adapter_reductions(adapter).tol(logprob_scale(rollout.old_logprobs[m]))  # tests/numerics
    adapter.engine.version = 2  # the trainer believes it pushed version 2; the engine holds version 1
    try:
        adapter.rollout(rows[:1], 2)
        result["stale_version_error"] = None
    except EngineError as e:
        result["stale_version_error"] = str(e)
    adapter.engine.close()
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    note_deprecations()  # the suite counts this rank's deprecation notices (tests/deprecations.py)
    main(sys.argv[1])
