"""Issue 35 item 4: weight pushes stream in bounded buckets (modalities/tokens/weight_buckets.py, weight_sync.py).

Without vLLM: a push larger than one bucket reaches a pure-Python receiver (the server's own HTTP front and checks,
:mod:`engine_http`, in front of a stand-in loader) bit-exact; the trainer's peak extra host memory during a push is
measured (RSS of a child process, every large allocation returned to the OS) and must stay within two buckets — and
the same measure on a one-bucket push must see the whole model, so the measure can fail; the NCCL channel's
send/receive runs over a gloo group on CPU (the broadcast is the only part NCCL replaces); the engine's bucket
bookkeeping refuses out-of-order buckets and generating from torn weights. tests/test_engine.py pushes in many
buckets to the real vLLM server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from http.server import ThreadingHTTPServer

import pytest
import torch
from safetensors.torch import load

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.modalities.tokens import weight_buckets as wb
from mmgrpo.modalities.tokens import weight_sync
from mmgrpo.modalities.tokens.engine import EngineError, VLLMClient
from mmgrpo.modalities.tokens.engine_http import SECRET_ENV, Limits, Refused, handler
from tests.test_engine_trust import SECRET, StandIn
from tests.test_trainer import QUICK


def _model(seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensors of every width a push carries, some larger than the tests' bucket, one 0-d and one empty."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(300, 64, generator=g),  # 76.8 kB: larger than a 16 kB bucket, alone in its own
        "layer.0.weight": torch.randn(40, 64, generator=g).to(torch.bfloat16),
        "layer.0.bias": torch.randn(40, generator=g).to(torch.float16),
        "layer.1.weight": torch.randn(64, 64, generator=g),
        "layer.1.bias": torch.randn(64, generator=g).double(),
        "positions": torch.arange(77, dtype=torch.int64),
        "mask": torch.rand(33, generator=g) > 0.5,
        "scale": torch.tensor(1.5),
        "empty": torch.zeros(0, 3),
        "head.weight": torch.randn(50, 64, generator=g).to(torch.bfloat16),
    }


def test_plan_keeps_buckets_bounded_and_every_tensor_aligned_in_model_order():
    model = _model()
    items = weight_sync.lazy(model)
    size = 16 << 10
    buckets = wb.plan(items, size)
    assert len(buckets) > 2
    names = [[e.name for _, e in b] for b in buckets]
    assert sorted(n for b in names for n in b) == sorted(model)  # every tensor once
    for bucket in buckets:
        entries = [e for _, e in bucket]
        total = wb.data_bytes(entries)
        groups = {wb.group_of(e.name) for e in entries}
        assert total <= size or len(groups) == 1, (names, total)  # only a layer larger than a bucket goes over
        assert [e.start for e in entries] == [0] + [e.end for e in entries[:-1]]  # back to back, no gap
        for e in entries:
            assert e.start % wb.ITEMSIZE[e.dtype] == 0, e  # viewable in place as its dtype
    # buckets follow model order: each bucket holds a run of consecutive tensors
    order = list(model)
    runs = [sorted(order.index(n) for n in b) for b in names]
    assert [i for r in runs for i in r] == list(range(len(order)))
    assert wb.plan(items, size) == buckets  # deterministic
    assert [n for n in names if "layer.1.weight" in n] == [["layer.1.bias", "layer.1.weight"]]  # one layer, F64 first


def test_a_bucket_never_splits_a_layer_that_vllm_reloads_as_one():
    """vLLM fuses q/k/v (and gate/up, a MoE layer's experts) and reloads a fused layer only from one call: the
    tensors of one block go in one bucket, even where the block is larger than a bucket."""
    assert wb.group_of("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert wb.group_of("model.layers.3.mlp.experts.7.up_proj.weight") == "model.layers.3"
    assert wb.group_of("visual.blocks.0.attn.qkv.bias") == "visual.blocks.0"
    assert wb.group_of("model.norm.weight") == "model.norm" and wb.group_of("lm_head.weight") == "lm_head"
    names = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(3) for p in "qkvo"]
    items = weight_sync.lazy({n: torch.zeros(16, 16) for n in names})  # 1 kB each, 4 kB a layer
    buckets = wb.plan(items, 2 << 10)  # smaller than a layer
    assert [[e.name for _, e in b] for b in buckets] == [names[0:4], names[4:8], names[8:12]]


def test_a_bucket_is_a_safetensors_file_and_unpacks_in_place_bit_exact():
    model = _model()
    (bucket,) = wb.plan(weight_sync.lazy(model), 1 << 30)
    body = wb.pack(bucket)
    got = load(bytes(body))  # the reference reader takes it
    assert sorted(got) == sorted(model)
    for k, v in model.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    entries = wb.entries_from_json(json.loads(json.dumps(wb.entries_json([e for _, e in bucket]))))
    flat = torch.frombuffer(bytearray(body), dtype=torch.uint8)[len(wb.safetensors_header(entries)) :]
    for name, t in wb.unpack(entries, flat):
        assert torch.equal(t, model[name]), name
    with pytest.raises(ValueError, match="span"):
        wb.entries_from_json([{**wb.entries_json(entries)[0], "end": 3}])


@pytest.fixture
def receiver(tmp_path, monkeypatch):
    """(client, engine): the server's HTTP front (:func:`engine_http.handler`) on a stand-in engine that records
    each bucket it loads; no model spec (any name and dtype)."""
    monkeypatch.setenv("MMGRPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    engine = StandIn(None)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(engine, SECRET, Limits(weights_bytes=1 << 26)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = VLLMClient(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=30, secret=SECRET)
    yield client, engine
    server.shutdown()
    server.server_close()


def test_a_push_larger_than_one_bucket_arrives_bit_exact_bucket_by_bucket(receiver):
    client, engine = receiver
    model = _model()
    client.bucket_bytes = 16 << 10
    seen = []
    gate = engine._bucket_loaded
    engine._bucket_loaded = lambda v, b: (seen.append((engine.version, b)), gate(v, b))  # version before each load
    assert client.push(model, version=3)
    n = len(engine.loaded)
    assert n == len(wb.plan(weight_sync.lazy(model), 16 << 10)) > 2
    assert seen == [(0, (i, n)) for i in range(n)] and engine.version == 3  # version 3 only after the last bucket
    got = {k: v for bucket in engine.loaded for k, v in bucket.items()}
    assert sorted(got) == sorted(model)
    for k, v in model.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k  # bit-exact, every dtype
    for bucket in engine.loaded:
        size = sum(t.numel() * t.element_size() for t in bucket.values())
        assert size <= client.bucket_bytes or len({wb.group_of(k) for k in bucket}) == 1


def test_a_partial_push_on_torn_weights_is_refused_and_the_whole_model_mends_them(receiver):
    client, engine = receiver
    model = _model()
    client.bucket_bytes = 16 << 10
    client.push(model, version=1)
    lost = weight_sync.http_buckets(weight_sync.lazy(model), client.bucket_bytes)
    i, n, body = next(lost)  # a push that stops after its first bucket
    client._call("/update_weights", body, {"X-Weights-Version": "2", "X-Weights-Bucket": f"{i}/{n}"})
    assert engine.pending == (2, 1, n) and engine.version == 1
    with pytest.raises(Refused, match="mix of two versions"):
        engine.check_whole()  # vllm_server.Engine.sample calls it before generating
    with pytest.raises(EngineError, match="out of order"):
        client._call("/update_weights", body, {"X-Weights-Version": "2", "X-Weights-Bucket": f"2/{n}"})
    assert not client.push({"layer.1.bias": model["layer.1.bias"]}, version=3, base=1)  # a part: send it whole
    assert client.push(model, version=3) and engine.pending is None and engine.version == 3
    engine.check_whole()


PEAK = textwrap.dedent(
    """
    import json, sys, torch
    from mmgrpo.modalities.tokens import weight_buckets as wb
    from mmgrpo.modalities.tokens.engine import VLLMClient

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    n, mb, bucket_mb = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    weights = [torch.randn(mb << 18) for _ in range(n)]  # n tensors of mb MiB (float32)
    for w in weights:
        w.add_(1)  # every page touched: in the baseline
    peak = [0]

    def made(w):  # a tensor made when its bucket is packed (a LoRA layer's merged weight)
        t = w * 1.0
        peak[0] = max(peak[0], rss())
        return t

    items = [wb.Lazy(f"layers.{i}.weight", "F32", tuple(w.shape), lambda w=w: made(w)) for i, w in enumerate(weights)]
    client = VLLMClient("http://unused", secret="x" * 20)
    client.bucket_bytes = int(bucket_mb * (1 << 20))
    sent = []

    def call(path, data=None, headers=None):
        peak[0] = max(peak[0], rss())
        sent.append(len(data))
        return {"version": 1}

    client._call = call
    base = rss()
    client.push(items, version=1)
    print(json.dumps({"base": base, "peak": peak[0], "sent": sent}))
    """
)


def _push_peak(tmp_path, bucket_mb: float) -> dict:
    """Peak RSS above the baseline while pushing a 64 MiB model (16 tensors of 4 MiB) in buckets of ``bucket_mb``,
    in a child process where glibc returns every allocation of 64 kB or more to the OS when it is freed
    (``MALLOC_MMAP_THRESHOLD_``), so RSS follows the live bytes."""
    script = tmp_path / "peak.py"
    script.write_text(PEAK)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(script), "16", "4", str(bucket_mb)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    return {**rec, "extra": rec["peak"] - rec["base"]}


def test_the_peak_extra_host_memory_of_a_push_is_at_most_two_buckets(tmp_path):
    model = 64 << 20
    bucketed = _push_peak(tmp_path, bucket_mb=8)  # 8 buckets of two 4 MiB tensors
    assert len(bucketed["sent"]) == 8 and max(bucketed["sent"]) <= (8 << 20) + 4096
    assert bucketed["extra"] <= 2 * (8 << 20), bucketed  # one body + the tensor being copied in, not the model
    whole = _push_peak(tmp_path, bucket_mb=64)  # the old way: the whole model as one body
    assert len(whole["sent"]) == 1
    assert whole["extra"] >= model, whole  # the measure sees a push's memory: it would catch an unbounded one


def test_the_nccl_channel_sends_each_bucket_after_its_entries_and_stops_at_a_refusal():
    model = _model()
    calls = []

    class Communicator:
        def __init__(self):
            self.group = self

        def broadcast(self, tensor, src):
            calls.append(("broadcast", tensor.numel(), src))

        def barrier(self):
            calls.append(("barrier",))

    def post(path, body):
        calls.append((path, tuple(body["bucket"]), body["base"], [e["name"] for e in body["entries"]]))
        return {"refused": "base"} if body["base"] == 7 else {"version": body["version"]}

    channel = weight_sync.NcclChannel(Communicator(), 1, "cpu", post)
    buckets = wb.plan(weight_sync.lazy(model), 16 << 10)
    assert channel.send(weight_sync.lazy(model), 5, None, 16 << 10) == {"version": 5}
    expected = []
    for i, bucket in enumerate(buckets):
        entries = [e for _, e in bucket]
        expected += [("/update_weights_nccl", (i, len(buckets)), None, [e.name for e in entries])]
        expected += [("broadcast", wb.data_bytes(entries), 1), ("barrier",)]
    assert calls == expected
    calls.clear()
    assert channel.send(weight_sync.lazy(model), 6, 7, 16 << 10) == {"refused": "base"}
    assert len(calls) == 1  # refused: nothing broadcast, the engine is not left waiting


GLOO = textwrap.dedent(
    """
    import json, sys, torch, torch.distributed as dist
    from mmgrpo.modalities.tokens import weight_buckets as wb, weight_sync
    from tests.test_weight_sync import _model

    rank, init = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    broadcast = lambda flat: dist.broadcast(flat, src=0)  # NCCL's PyNcclCommunicator.broadcast, here over gloo
    model = _model(seed=4)
    buckets = wb.plan(weight_sync.lazy(model), 16 << 10)
    got = {}
    for bucket in buckets:
        if rank == 0:  # the trainer
            weight_sync.send_bucket(bucket, broadcast, "cpu")
        else:  # the engine: only the entries' JSON (the metadata request) and the broadcast
            entries = wb.entries_from_json(json.loads(json.dumps(wb.entries_json([e for _, e in bucket]))))
            got.update({k: v.clone() for k, v in weight_sync.receive_bucket(entries, broadcast, "cpu")})
    if rank == 1:
        assert sorted(got) == sorted(model), sorted(got)
        bad = [k for k in model if got[k].dtype != model[k].dtype or not torch.equal(got[k], model[k])]
        assert not bad, bad
        print("received", len(buckets), "buckets bit-exact")
    dist.destroy_process_group()
    """
)


def test_the_nccl_channels_buckets_arrive_bit_exact_over_a_gloo_group(tmp_path):
    """The NCCL channel's send and receive (:func:`weight_sync.send_bucket` / ``receive_bucket``, what the server's
    workers run) between two processes, with gloo's broadcast in place of NCCL's."""
    from tests.test_trainer import ROOT

    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    init = f"file://{tmp_path / 'rendezvous'}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), init], **pipes) for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert "bit-exact" in outs[1][0]


def test_nccl_weight_sync_without_cuda_is_refused_at_load_in_one_line(tmp_path):
    overrides = ["rollout.engine=vllm", "rollout.weight_sync=nccl", f"output_dir={tmp_path}"]
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match=r"rollout.weight_sync: nccl: .*no CUDA; use http") as e:
        load_config(QUICK, overrides)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="colocated engine takes the trainer's tensors in-process"):
        load_config(QUICK, [*overrides, "rollout.vllm_mode=colocate"])
    cfg = load_config(QUICK, ["rollout.engine=vllm", "rollout.push_bucket_mb=0.5", f"output_dir={tmp_path}"])
    client = VLLMClient("http://unused", secret="x" * 20)
    client.configure_push(cfg.rollout)
    assert client.bucket_bytes == 1 << 19 and client.channel is None  # http: no channel
    with pytest.raises(ConfigError, match="push_bucket_mb"):
        load_config(QUICK, ["rollout.push_bucket_mb=0"])
