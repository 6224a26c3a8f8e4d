"""benchmarks/cost_model.py: the arithmetic by hand on a config small enough to count every term.

Config: text hidden 4, 1 layer, MLP 8, 2 heads / 1 KV head (head dim 2, kv 2), vocabulary 10; vision hidden 2,
1 block, MLP 3, 1-pixel patches, no merge, no temporal patch, a 1-patch window, no full-attention block.
Workload: P = 1 prompt of L = 3 tokens (I = 1 image token), G = 2 completions of T = 2 tokens.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "cost_model.py"


@pytest.fixture(scope="module")
def cm():
    spec = importlib.util.spec_from_file_location("cost_model", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's string annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def tiny(cm):
    text = cm.TextConfig(hidden=4, layers=1, intermediate=8, heads=2, kv_heads=1, vocab=10)
    vision = cm.VisionConfig(hidden=2, depth=1, intermediate=3, heads=1, patch=1, merge=1, temporal_patch=1,
                             window=1, full_blocks=0)  # fmt: skip
    return cm.ModelConfig("tiny", text, vision)


def test_per_token_flops_and_mix(cm, tiny):
    # decoder layer: q, o 4·4 each; k, v 4·2 each; MLP 3·4·8 → 144 weights → 288 FLOPs; lm_head 2·4·10 = 80;
    # vision: block 4·2² + 3·2·3 = 34, patch embedding 3·1·1·2 = 6, merger 2² + 2·4 = 12 → 2·(40 + 12) = 104
    assert tiny.text.layer_params == 144
    assert cm.per_token_flops(tiny) == {"lm_head": 80.0, "decoder": 288.0, "vision": 104.0}
    mix = cm.flop_mix(tiny)
    assert mix == pytest.approx({"lm_head": 80 / 472, "decoder": 288 / 472, "vision": 104 / 472}, abs=1e-12)


def test_step_flops_by_hand(cm, tiny):
    w = cm.Workload(prompt_tokens=3, image_tokens=1, completion_tokens=2, group_size=2, prompts=1)
    # attention over the 1 layer: 4·q·k·4 = 16·q·k; the image: 2·40 (linear) + 4·2·1·1 (window) + 2·12 = 112;
    # decoding: B·(T−1)·(288 + 80) + 16·B·(L + 1) = 736 + 128 = 864
    mm = cm.step_flops(tiny, w, "mmgrpo")
    assert mm["rollout"] == 112 + 3 * 288 + 16 * 3 * 3 + 80 + 864  # one prefill of the prompt
    body = 112 + (3 + 2) * 288 + 16 * 3 * 3 + 16 * 2 * 4  # prompt once + 2 completions of T−1 tokens
    assert mm["old_logprobs"] == mm["forward"] == body + 4 * 80  # the lm_head on B·T = 4 positions
    # backward: 2× the trained forward (the patch embedding gets no input gradient: −12), 3× the fused head
    assert mm["backward"] == 2 * (body - 112) + (2 * 112 - 12) + 3 * 4 * 80
    assert mm["total"] == 2064 + 2144 + 2144 + 4596 == 10948
    # without attention (as FlopCounterMode counts on CPU): 144 + 128 + 8 (vision window) in each of rollout, old
    # log-probs and forward, twice that (prompt 144, completions 128, vision 8) in the backward
    assert cm.step_flops(tiny, w, "mmgrpo", attention=False)["total"] == 10948 - 3 * 280 - 2 * 280 == 9548
    trl = cm.step_flops(tiny, w, "trl")
    assert trl["rollout"] == 2 * 112 + 2 * 3 * 288 + 16 * 6 * 3 + 2 * 80 + 864 == 3264  # the prompt prefilled G times
    assert trl["old_logprobs"] == 0 and trl["forward"] == 2 * 112 + 2 * 5 * 288 + 16 * 10 * 5 + 4 * 80
    assert trl["total"] == 3264 + 4224 + 8424 == 15912
    cpu = cm.step_flops(tiny, cm.replace(w, trl_head="all"), "trl")  # the CPU rule scores all B·(L+T) positions
    assert cpu["forward"] - trl["forward"] == (10 - 4) * 80
    ckpt = cm.step_flops(tiny, cm.replace(w, checkpointing=True), "mmgrpo")
    assert ckpt["recompute"] == body and ckpt["total"] == mm["total"] + body
    lora = cm.step_flops(tiny, cm.replace(w, lora_params=1), "mmgrpo")  # frozen weights: input gradients only
    assert lora["backward"] == (body - 112) + (112 - 12) + 2 * 4 * 80
    # a tied head's gradient above the size threshold is made last: its logits recomputed once more (4×)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cm, "LATE_GRADIENT_MIN_BYTES", 0)
        late = cm.step_flops(tiny, w, "mmgrpo")
    assert late["backward"] == mm["backward"] + 4 * 80 and late["total"] == 10948 + 320


def test_step_memory_by_hand(cm, tiny):
    w = cm.Workload(prompt_tokens=3, image_tokens=1, completion_tokens=2, group_size=2, prompts=1)
    # weights: text 144 + 10·4 (tied) = 184, vision 34 + 6 + 12 = 52 → 236 values, 944 bytes
    mm = cm.step_memory(tiny, w, "mmgrpo")
    assert mm["weights"] == mm["gradients"] == 944 and mm["optimizer"] == 1888
    assert mm["kv_cache"] == 1 * 2 * 2 * 2 * 5 * 4  # layers · (k, v) · kv · B · (L + T) · bytes
    # kept activations: (U·L + B·(T−1)) = 5 decoder tokens × (8·4 + 3·2 + 4·8 = 70) + 1 patch × (9·2 + 4·3 = 30)
    assert mm["activations"] == (5 * 70 + 30) * 4 and mm["logits"] == 0
    assert mm["peak"] == 944 + 1888 + 944 + 1520
    with pytest.MonkeyPatch.context() as m:  # the tied head's 10·4 gradient made last: not held with the activations
        m.setattr(cm, "LATE_GRADIENT_MIN_BYTES", 0)
        assert cm.step_memory(tiny, w, "mmgrpo")["peak"] == 944 + 1888 + (944 - 160) + 1520
    trl = cm.step_memory(tiny, w, "trl")
    assert trl["activations"] == (10 * 70 + 2 * 30) * 4 and trl["logits"] == 4 * 10 * 4 * 2
    assert trl["peak"] == 944 + 1888 + 944 + 3040 + 320
    ckpt = cm.step_memory(tiny, cm.replace(w, checkpointing=True), "mmgrpo")  # layer inputs + one layer's
    assert ckpt["activations"] == (5 * (4 + 70) + 1 * (2 + 30)) * 4
    r = cm.ratios(tiny, w)
    assert r["flops_ratio"] == pytest.approx(15912 / 10948) and r["memory_saving"] == pytest.approx(1 - 5296 / 7136)
    with pytest.MonkeyPatch.context() as m:  # an untied head's gradient is held as before, whatever its size
        m.setattr(cm, "LATE_GRADIENT_MIN_BYTES", 0)
        untied = cm.ModelConfig("untied", cm.replace(tiny.text, tied=False), tiny.vision)
        assert cm.step_memory(untied, w, "mmgrpo")["peak"] == (184 + 40 + 52) * 4 * 4 + 1520
