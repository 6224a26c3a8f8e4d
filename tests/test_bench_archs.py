"""benchmarks/bench_archs.py: the FLOP mixes by hand, and the benchmark models' prompts as both toolkits see them.

By hand, SmolLM2-135M (hidden 576, 30 layers, MLP 1536, 9 / 3 heads: KV width 192, vocabulary 49,152): a decoder
layer has q, o 576² + k, v 576·192 + gate, up, down 576·1536 each = 663,552 + 221,184 + 2,654,208 = 3,538,944 weights,
so a text position costs 2 · 30 · 3,538,944 = 212,336,640 FLOPs and a scored one 2 · 576 · 49,152 = 56,623,104 in the
lm_head. SmolVLM-256M's SigLIP-B/16 block: 4 · 768² + 2 · 768 · 3072 = 7,077,888 weights, 12 blocks + the patch
embedding (3 · 16² · 768 = 589,824) = 85,524,480 per patch; an image token is 4² = 16 patches plus the connector's
16 · 768 · 576 = 7,077,888: 2 · (16 · 85,524,480 + 7,077,888) = 2,750,939,136 FLOPs.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_archs.py"


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def ba(monkeypatch_module):
    monkeypatch_module.syspath_prepend(str(PATH.parent))  # it imports cost_model beside it, as vs_trl.py runs it
    spec = importlib.util.spec_from_file_location("bench_archs", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's string annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_per_token_flops_of_the_real_checkpoints_by_hand(ba):
    f = ba.per_token_flops(ba.SMOLLM2_135M, ba.SMOLVLM_256M_VISION)
    assert f == {"lm_head": 56_623_104.0, "decoder": 212_336_640.0, "vision": 2_750_939_136.0}


def test_benchmark_models_keep_the_real_mix_within_one_point(ba):
    for arch, real in (("llama", "SmolLM2-135M"), ("idefics3", "SmolVLM-256M")):
        mixes = ba.flop_mixes(arch)
        ours, theirs = mixes["benchmark model"], mixes[real]
        assert ours.keys() == theirs.keys()
        assert all(abs(ours[k] - theirs[k]) < 0.01 for k in ours), (arch, ours, theirs)


@pytest.mark.parametrize("arch", ["llama", "idefics3"])
def test_rows_are_what_both_toolkits_tokenize_at_eight_to_one(ba, arch, tmp_path):
    """The filler puts the longest prompt within a few tokens of 8 · 16; the JSONL rows carry that prompt (with the
    image file for SmolVLM) and mmgrpo's dataset task reads them into the same chat."""
    import json

    from mmgrpo.tasks.dataset import DatasetArgs, DatasetTask

    model = ba.build_model(tmp_path / arch, arch, seed=0)
    words, L = ba.filler_for(model, arch, 8.0, 16)
    assert abs(L - 128) <= 4 and ba.prompt_length(model, arch, words) == L
    path = ba.write_rows(tmp_path / "data", arch, 16, words, seed=1234)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 16 and all(r["prompt"][0]["role"] == "user" for r in rows)
    task = DatasetTask(DatasetArgs(train=str(path), eval=str(path)), seed=0)
    first = task.train_rows()[0]
    assert first["prompt"] == rows[0]["prompt"]
    if arch == "idefics3":
        assert first["image"].size == (ba.IMAGE_SIDE, ba.IMAGE_SIDE)
