"""Host memory of a training process: glibc's malloc gives large freed blocks back to the operating system.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap`` and unmaps it on ``free``;
smaller ones come from its heaps, which keep freed memory for reuse (the process's RSS does not fall). The threshold
starts at 128 KiB but is dynamic: each time a mmapped block is freed it rises to that block's size, up to 32 MiB on
64-bit systems (mallopt(3), ``M_MMAP_THRESHOLD``; glibc ``malloc/malloc.c``, ``mp_.mmap_threshold``). A training
step allocates and frees tensors of 0.1–30 MB by the thousand (KV caches, activations, log-prob blocks, gradient
chunks), so after the first step they are served from the heaps, whose freed-but-kept pages add to every later
peak.

Opt-in (``TrainConfig.host_mmap_threshold_kib``), because of its price. Measured on the real-vocabulary benchmark
model (``benchmarks/vs_trl.py --vocab real``, 8:1, one thread; its mmgrpo worker run with and without, one after
the other), a 128 KiB threshold lowered the step's peak RSS by ~90 MB (1648 → 1557 MB) and made the step 2–4×
slower (10.6–11.5 s → 23–42 s): every large tensor then gets fresh zeroed pages from the kernel. Worth it only
where host memory, not time, runs out.

Setting the threshold explicitly (``mallopt``, as the ``MALLOC_MMAP_THRESHOLD_`` environment variable does at
start-up) fixes it and turns the dynamic rise off. The price is one ``mmap``/``munmap`` and fresh zeroed pages per
large allocation (above). Elsewhere than glibc (musl, macOS, Windows) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter number of the mmap threshold (glibc ``malloc.h``)."""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc, else None (musl, macOS, Windows: another allocator)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def trim_heap() -> None:
    """Give the free pages of glibc's heaps back to the operating system (``malloc_trim(0)``, malloc_trim(3)).

    For a point where a phase has freed most of what it held and a large allocation follows: the freed heap pages
    would otherwise stay resident beside the new block (above the mmap threshold, it is mapped anew), and count in
    the process's peak. The fused head's tied gradient (``TiedGrad`` in mmgrpo/modalities/tokens/logprobs.py) calls it
    at the end of a backward. Measured there (real-vocabulary benchmark model, one thread): a few ms per call; the
    pages are faulted back in as the next step reuses them. Elsewhere than glibc nothing is done.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def fix_mmap_threshold(kib: int | None) -> bool:
    """Fix glibc's mmap threshold at ``kib`` KiB for the rest of this process (``TrainConfig.host_mmap_threshold_kib``).

    Returns whether it was set. Not set when ``kib`` is None, when the user set ``MALLOC_MMAP_THRESHOLD_`` (theirs
    wins), or when the C library is not glibc.
    """
    libc = _glibc()
    if kib is None or "MALLOC_MMAP_THRESHOLD_" in os.environ or libc is None:
        return False  # musl, macOS, Windows: another allocator
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, kib * 1024))
    if not ok:
        logger.warning("glibc refused mallopt(M_MMAP_THRESHOLD, %d KiB); its dynamic threshold stays", kib)
    return ok
