"""The decoding step before/after the reserved KV cache (issue 23 item 6), on the real-FLOP-mix model of vs_trl.py.

    OMP_NUM_THREADS=1 python benchmarks/decode_cache.py --repeats 6 --profile

One process, both variants alternating (the order flips every repeat; the first repeat is a warm-up and is not
counted): the VLM adapter's rollout of P = 4 shapes prompts × G = 8 at prefix:completion 8:1, once with
transformers' ``DynamicLayer`` (the cache grows by ``torch.cat`` at every step) and once with
:class:`mmgrpo.modalities.tokens.decode.ReservedLayer` (keys/values written in place into a buffer reserved for
the completion). Both draw the same tokens (tests/test_prefix_sharing.py). Prints the median rollout seconds of
each and their ratio for T = 16 and T = 64 completion tokens, and with ``--profile`` the top CPU operators of one
T = 64 rollout of each (``torch.profiler``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl

from mmgrpo.modalities.tokens import decode, prefix_sharing
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask


def _concatenating(cache, extra: int) -> None:
    """The 'before' variant: leave transformers' concatenating layers in place."""


def _rollout(adapter, rows, reserve: bool) -> float:
    prefix_sharing.reserve_cache = decode.reserve_cache if reserve else _concatenating
    torch.manual_seed(0)
    start = time.perf_counter()
    adapter.rollout(rows, 8)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    model_dir = vs_trl.build_model(Path(tempfile.mkdtemp()) / "real-mix", 0, vs_trl.REAL_MIX_SIZES)
    for T in (16, 64):
        side, L = vs_trl.image_side_for(model_dir, 8, T)
        adapter = build_vlm_adapter({"name_or_path": str(model_dir), "max_new_tokens": T, "min_new_tokens": T})
        task = ShapesTask(ShapesArgs(questions=vs_trl.QUESTIONS, image_size=side, train_size=4, eval_size=1))
        rows = [task.train_rows()[i] for i in range(4)]
        times: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(a.repeats):
            for reserve in (False, True) if rep % 2 == 0 else (True, False):
                times[reserve].append(_rollout(adapter, rows, reserve))
        before, after = (statistics.median(times[r][1:]) for r in (False, True))
        print(f"T={T}, L={L} (8:1), P=4, G=8: rollout {before:.3f} s concatenating, {after:.3f} s reserved, "
              f"{before / after:.2f}x")  # fmt: skip
        if a.profile and T == 64:
            from torch.profiler import ProfilerActivity, profile

            for reserve in (False, True):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    _rollout(adapter, rows, reserve)
                print("reserved" if reserve else "concatenating")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    prefix_sharing.reserve_cache = decode.reserve_cache


if __name__ == "__main__":
    main()
