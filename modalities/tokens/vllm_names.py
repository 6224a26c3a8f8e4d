"""Checkpoint tensor names as transformers 5 writes them → the names vLLM 0.32's loaders take.

transformers 5's ``save_pretrained`` writes a CLIP or SigLIP vision tower of a LLaVA-style model without its
``vision_model.`` level (``vision_tower.embeddings.patch_embedding.weight``), while the hub checkpoints and vLLM keep
it (``vision_tower.vision_model.embeddings.patch_embedding.weight``): vLLM's ``CLIPVisionModel`` and
``SiglipVisionModel`` hold the encoder as ``self.vision_model`` (``vllm/model_executor/models/clip.py``,
``siglip.py``), and the models' ``hf_to_vllm_mapper`` only move ``model.vision_tower.`` to ``vision_tower.``
(``llava.py`` ``LlavaForConditionalGeneration``, ``llava_onevision.py`` ``LlavaOnevisionForConditionalGeneration``,
``gemma3_mm.py`` ``Gemma3ForConditionalGeneration``). vLLM stops at load: "There is no module or parameter named
'vision_tower.embeddings' in LlavaForConditionalGeneration". Every checkpoint transformers 5 writes is so — a
user's trained LLaVA export as much as the tests' tiny models — and a weight push sends the names
``save_pretrained`` writes (:func:`.engine.engine_tensors`).

This module is the one place that maps them, used by the rollout server (:mod:`.vllm_server`) both when it loads
the checkpoint (:func:`served_copy`: a copy whose safetensors headers carry vLLM's names, every other file linked)
and for every pushed tensor (:func:`to_vllm`). The trainer keeps transformers' names throughout, and the server
checks pushes against the checkpoint as written (:class:`.engine_http.ModelSpec`).

InternVL (``InternVLForConditionalGeneration``, served by ``interns1.py``'s ``InternS1ForConditionalGeneration``)
needs nothing: its InternViT has no such level in either library (``interns1_vit.py``: ``embeddings``,
``encoder.layer.N``). Standard library only: the server runs under ``.venv-vllm`` and never imports mmgrpo.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable

VISION_MODEL_LEVEL = frozenset(
    {
        "LlavaForConditionalGeneration",
        "LlavaOnevisionForConditionalGeneration",
        "Gemma3ForConditionalGeneration",
    }
)
"""Architectures whose vLLM tower is a ``CLIPVisionModel`` / ``SiglipVisionModel`` under ``vision_tower`` (the
tested ones; LLaVA-NeXT's classes build theirs the same way, ``init_vision_tower_for_llava``, but are not tested)."""

_TOWERS = ("vision_tower.", "model.vision_tower.")


def to_vllm(architecture: str | None, name: str) -> str:
    """``name`` as vLLM's loader of ``architecture`` takes it: a vision-tower tensor written without its
    ``vision_model.`` level gains it; every other name (and a hub checkpoint's, which has it) is unchanged."""
    if architecture not in VISION_MODEL_LEVEL:
        return name
    for tower in _TOWERS:
        if name.startswith(tower) and not name.startswith(tower + "vision_model."):
            return f"{tower}vision_model.{name[len(tower) :]}"
    return name


def architecture(model_dir: str | os.PathLike) -> str | None:
    """The first of ``config.json``'s ``architectures`` (None without one)."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            names = json.load(f).get("architectures") or [None]
    except (OSError, ValueError):
        return None
    return names[0]


def _header(path: str) -> tuple[dict, int]:
    """A safetensors file's JSON header and the offset its data starts at (8-byte length, then the header)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def rename_safetensors(src: str, dst: str, rename: Callable[[str], str]) -> None:
    """Write ``src`` to ``dst`` with every tensor name through ``rename``: only the header changes (its data offsets
    are relative to the data block, which is copied byte for byte); the header is padded with spaces to 8 bytes, as
    the safetensors writer does."""
    header, start = _header(src)
    renamed = {k if k == "__metadata__" else rename(k): v for k, v in header.items()}
    if len(renamed) != len(header):
        raise ValueError(f"{src}: renaming maps two tensors to one name")
    raw = json.dumps(renamed, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(struct.pack("<Q", len(raw)) + raw)
        fin.seek(start)
        shutil.copyfileobj(fin, fout, 16 << 20)


def served_copy(model_dir: str) -> str | None:
    """A temporary folder holding ``model_dir`` under vLLM's names, for vLLM to load; None when the checkpoint needs
    no renaming (the caller serves ``model_dir`` itself). Safetensors files that hold a renamed tensor are rewritten
    (:func:`rename_safetensors`), the index's ``weight_map`` too; every other file is a symbolic link. The caller
    removes the folder when the engine stops."""
    arch = architecture(model_dir)
    if arch not in VISION_MODEL_LEVEL:
        return None
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    changed = [f for f in files if any(to_vllm(arch, k) != k for k in _header(os.path.join(model_dir, f))[0])]
    if not changed:
        return None
    out = tempfile.mkdtemp(prefix="mmgrpo-vllm-names-")
    for f in os.listdir(model_dir):
        src, dst = os.path.join(model_dir, f), os.path.join(out, f)
        if f in changed:
            rename_safetensors(src, dst, lambda k: to_vllm(arch, k))
        elif f == "model.safetensors.index.json":
            with open(src) as fin:
                index = json.load(fin)
            index["weight_map"] = {to_vllm(arch, k): v for k, v in index.get("weight_map", {}).items()}
            with open(dst, "w") as fout:
                json.dump(index, fout)
        else:
            os.symlink(os.path.abspath(src), dst)
    return out
