"""A checkpoint's manifest: the size and SHA-256 of every file it holds, written last, checked on resume.

A checkpoint directory is published by renaming it into place once its ``COMPLETE`` marker is written
(:mod:`mmgrpo.checkpoint`), so a crash never publishes half a checkpoint. What that cannot see is damage after the
fact: a bit flipped in a finite weight, a step's model file replaced by another step's, a corrupted
``.distcp`` shard of the sharded layout (:mod:`mmgrpo.sharded_checkpoint`). The manifest records, for every file
under the checkpoint directory (``COMPLETE`` and the DCP shards included, every process's), its size in bytes and
its SHA-256, hashed in 1 MiB blocks (one block in memory at a time)::

    MANIFEST.json   {"format": "mmgrpo-manifest/1", "files": {"state/model.safetensors": {"size": ..., "sha256": ...}}}

It is written last, atomically (a temporary file and ``os.replace``), before the directory is renamed into place,
and ``COMPLETE`` then holds a second line ``manifest`` so that a deleted ``MANIFEST.json`` is damage, not an older
checkpoint. Resume (:func:`mmgrpo.resume_checks.problem`) checks every listed file's size and hash and passes over
a checkpoint that fails for the previous complete one with one line; a file the manifest does not list (an
``*.pkl`` dropped in later) is never read by resume and is not checked. A checkpoint written before manifests
(its ``COMPLETE`` holds only the step) still resumes: :func:`note` gives the one line saying its files were not
hash-checked. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

NAME = "MANIFEST.json"
FORMAT = "mmgrpo-manifest/1"
MARK = "manifest"  # the word on COMPLETE's second line: this checkpoint has a manifest
_BLOCK = 1 << 20  # bytes hashed at a time


def sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    """Every regular file under ``directory`` but the manifest itself, in sorted relative-path order."""
    found = [p for p in Path(directory).rglob("*") if p.is_file() and not p.is_symlink()]
    return sorted((p for p in found if p.relative_to(directory).as_posix() != NAME), key=lambda p: p.as_posix())


def write(directory: Path) -> dict:
    """Hash every file under ``directory`` and write ``MANIFEST.json`` atomically; returns the manifest."""
    directory = Path(directory)
    files = {
        p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": sha256(p)} for p in _files(directory)
    }
    manifest = {"format": FORMAT, "files": files}
    fd, tmp = tempfile.mkstemp(prefix=f".{NAME}.", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=0, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / NAME)
    return manifest


def promised(directory: Path) -> bool:
    """Whether the checkpoint's ``COMPLETE`` marker says it was written with a manifest (its second word)."""
    try:
        words = (Path(directory) / "COMPLETE").read_text().split()
    except OSError:
        return False
    return MARK in words[1:]


def present(directory: Path) -> bool:
    """Whether the checkpoint holds a manifest or its marker promises one (a missing one is then damage)."""
    return (Path(directory) / NAME).is_file() or promised(directory)


def _read(directory: Path) -> tuple[dict | None, str | None]:
    """(the manifest's ``files`` table, None), or (None, why it cannot be read)."""
    path = Path(directory) / NAME
    if not path.is_file():
        return None, f"{NAME} is missing (COMPLETE says the checkpoint was written with one)"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{NAME} is unreadable ({(str(e).splitlines() or [type(e).__name__])[0][:120]})"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(files, dict):
        return None, f"{NAME} is not a manifest of this version (format {FORMAT})"
    if not all(isinstance(v, dict) and {"size", "sha256"} <= set(v) for v in files.values()):
        return None, f"{NAME} lists a file without its size and sha256"
    return files, None


def problem(directory: Path, *, hashes: bool = True) -> str | None:
    """Why the checkpoint's files differ from its manifest (one line: the first file missing, of another size or,
    with ``hashes``, another SHA-256), else ``None``; ``None`` too for a checkpoint without a manifest (written
    before manifests: :func:`note`). Without ``hashes`` only sizes are compared (no file is read)."""
    directory = Path(directory)
    if not present(directory):
        return None
    files, why = _read(directory)
    if why is not None:
        return why
    for name, entry in sorted(files.items()):
        path = directory / name
        if not path.is_file() or ".." in Path(name).parts:
            return f"{name} is missing (listed in {NAME})"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} has {size} bytes, {NAME} says {entry['size']}"
        if hashes and sha256(path) != entry["sha256"]:
            return f"{name} does not match its sha256 in {NAME} (the file changed after it was saved)"
    return None


def note(directory: Path) -> str | None:
    """The one line for a checkpoint written before manifests (its files are checked, not their hashes), else
    ``None``."""
    if present(directory):
        return None
    return (
        f"{directory} has no {NAME} (written by an mmgrpo before checkpoint manifests): its files are checked but "
        "their hashes are not; the next checkpoint this run saves has one"
    )
