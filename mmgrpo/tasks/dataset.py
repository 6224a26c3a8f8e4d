"""Train on your own data: ``task.name: dataset`` reads a file, a saved dataset or a hub id, row by row.

Formats (``train`` / ``eval``): ``.jsonl`` (one JSON object per line), ``.json`` (a list of objects), ``.csv``,
``.parquet``, ``.txt`` (one prompt per line, as Flow-GRPO ships its prompt sets), a directory written by
``datasets.Dataset.save_to_disk``, or a Hugging Face hub id loaded with ``datasets.load_dataset(id, split=...)``.

Rows are read lazily: the task holds an index (JSONL line offsets, an Arrow table, a ``datasets.Dataset``) and
builds row ``i`` when the trainer samples it, opening its images then — a million-row JSONL does not sit in
memory as PIL images. A row is the file's columns with these additions:

- ``columns`` maps adapter keys to the file's column names (``{prompt: problem, image: image_path, answer:
  solution}``; a row without ``answer`` takes TRL's ``solution`` as it, as TRL's rewards read it); the file's own
  columns stay too, so every other column (boxes, ``problem_type``...) reaches the
  rewards unchanged. Without a ``prompt`` column, a LLaVA/ShareGPT ``conversations`` list (``[{"from": "human",
  "value": "<image>question"}, {"from": "gpt", "value": "answer"}]``, VLM-R1's JSONL) gives ``prompt`` (the
  first human turn without its ``<image>``/``<video>`` tags) and ``answer`` (the first gpt turn).
- Media keys: ``image`` (one or a list; multi-image rows), ``images``, ``video``, ``audio``. Relative paths
  resolve against ``media_root`` (default: the data file's folder); a path that resolves outside it (``../``,
  an absolute path elsewhere, a symlink leading out) is a data error unless ``allow_outside_media_root: true``.
  In a JSON/JSONL/CSV file, a row with none of the media columns its first rows carry is a data error (write
  ``"image": null`` for a text-only row). A conversational prompt whose first user message holds string
  content gets one ``{"type": kind}`` part per image/video/audio, as TRL adds them. ``media`` holds a path whose
  kind comes from ``media_type_column`` (Video-R1's ``data_type``: image | video) or else the file extension.
  Images are opened (and fully read, to catch truncation) when the row is built; videos are checked to exist and
  their last frame decoded in decord (``probe_videos``); audio is decoded with soundfile (a speech adapter decodes
  it again, at its rate). ``<image>`` / ``<video>`` placeholders in the prompt text (EasyR1, LLaVA) become those
  parts at their place (:func:`mmgrpo.media.media_content`). A row with audio and no prompt gets ``""`` (Whisper
  ASR data, a CSV ``file,text``).
- ``prompt_template`` wraps a text prompt: ``{prompt}`` is the prompt, ``{column}`` any other column (lists are
  joined with newlines), e.g. R1-V's ``"{prompt} Output the thinking process in <think> </think> and final
  answer in <answer> </answer> tags."``. A mapping ``{value: template}`` picks the template by
  ``template_column`` (Video-R1's per ``problem_type`` instructions; key ``default`` as the fallback).
- ``system_prompt`` makes the prompt a chat: a system message, then a user message with one ``{"type": kind}``
  part per image/video/audio before the text (conversational prompts get the system message prepended).

Bad data raises :class:`~mmgrpo.types.DataError` with one line naming the file, the row (JSONL/TXT/CSV: the
line) and the column. The first ``check_rows`` rows of each split are built at start-up (and by ``mmgrpo train
--dry-run``, through the same :func:`mmgrpo.preflight.preflight`), so a wrong column name or media root fails
before any model loads; at train time the trainer skips
an unreadable row and counts it (``data/skipped_rows``).

Held-out rows: ``eval`` (a file or dataset, its split ``eval_split``), else ``eval_split`` alone (that split of
``train``: a hub id or a saved DatasetDict; an error for a single file), else ``eval_fraction`` of train.

Evaluation: with no ``eval_rewards`` the held-out outputs are scored by the run's configured rewards (each
reward's mean and the combined reward, ``eval/<stage>/reward/<name>`` and ``eval/<stage>/reward``).
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmgrpo.config import ConfigError
from mmgrpo.media import (
    add_media_parts,
    as_list,
    check_media_content,
    decode_audio,
    decode_video,
    media_content,
    media_counts,
    open_image,
)
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards
from mmgrpo.types import DataError

MEDIA_KEYS = ("image", "images", "video", "audio")
VIDEO_EXTENSIONS = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".flv", ".mpeg", ".mpg"}
AUDIO_EXTENSIONS = {".wav", ".flac", ".mp3", ".ogg", ".m4a", ".opus"}
FILE_FORMATS = (".jsonl", ".json", ".csv", ".parquet", ".txt")


@dataclass
class DatasetArgs:
    """Options under ``task.args`` for ``task.name: dataset`` (see the module docstring)."""

    train: str = ""
    """Training rows: a .jsonl/.json/.csv/.parquet/.txt file, a save_to_disk directory, or a hub id."""
    eval: str | None = None
    """Held-out rows (same forms); None holds out ``eval_fraction`` of train instead."""
    eval_fraction: float = 0.0
    """Fraction of train rows held out (seeded) when ``eval`` is not given; 0 = no held-out evaluation."""
    split: str = "train"
    """Split of a hub id or a saved DatasetDict used for ``train``."""
    eval_split: str | None = None
    """Split used for ``eval`` (default: ``split``). Without ``eval``, the held-out rows are this split of
    ``train`` (a hub id or a save_to_disk DatasetDict), e.g. train: my/dataset, eval_split: test."""
    seed: int | None = None
    """Seed of the eval_fraction split (default: the run seed)."""
    columns: dict[str, str] = field(default_factory=dict)
    """Adapter key → column name, e.g. {prompt: problem, image: image_path, answer: solution}."""
    media_root: str | None = None
    """Folder relative media paths resolve against (default: the data file's folder; cwd for hub ids)."""
    allow_outside_media_root: bool = False
    """Accept media paths that resolve outside media_root (``../``, absolute paths, symlinks leading out);
    false: such a row is a data error naming the path."""
    media_type_column: str | None = None
    """Column saying whether the ``media`` path is an image or a video (Video-R1: data_type)."""
    prompt_template: str | dict[str, str] | None = None
    """Wraps a text prompt: "{prompt} ..." with {column} placeholders; or {value: template} by template_column."""
    template_column: str | None = None
    """Column whose value picks the prompt_template entry (Video-R1: problem_type)."""
    system_prompt: str | None = None
    """System message: turns each prompt into a chat with media parts (see the module docstring)."""
    max_rows: int | None = None
    """Use at most this many rows of each file (the first ones)."""
    check_rows: int = 8
    """Rows of each split built and checked at start-up (and by --dry-run); 0 = none."""
    probe_videos: bool = True
    """Open each sampled video file in decord when its row is built, so an undecodable file is a skipped row."""
    eval_rewards: list[dict[str, Any]] = field(default_factory=list)
    """Own evaluation metrics [{name, kwargs}] (eval/<stage>/<name>); empty = the run's rewards."""


# ------------------------------------------------------------------------------------------ raw sources


class _Source:
    """Raw rows of one file or dataset: ``len`` and ``raw(i)``; ``where(i)`` names the row in messages."""

    name: str
    base: Path

    def __len__(self) -> int:
        raise NotImplementedError

    def raw(self, i: int) -> dict:
        raise NotImplementedError

    def where(self, i: int) -> str:
        return f"{self.name}: row {i}"


class _JsonlSource(_Source):
    """A JSONL file indexed by line offsets (one pass over the bytes); line ``i`` is parsed when read."""

    def __init__(self, path: Path):
        self.name, self.base, self.path = str(path), path.parent, path
        self.offsets: list[int] = []
        self.lines: list[int] = []
        pos = 0
        with open(path, "rb") as f:
            for n, line in enumerate(f, start=1):
                if line.strip():
                    self.offsets.append(pos)
                    self.lines.append(n)
                pos += len(line)
        self._file = None

    def __len__(self) -> int:
        return len(self.offsets)

    def raw(self, i: int) -> dict:
        if self._file is None:
            self._file = open(self.path, "rb")  # noqa: SIM115 - kept open for random row access for the life of the task
        self._file.seek(self.offsets[i])
        line = self._file.readline()
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(
                f"{self.where(i)}: not valid JSON ({getattr(e, 'msg', e)}); fix or delete that line"
            ) from None
        if not isinstance(row, dict):
            raise DataError(f"{self.where(i)}: expected a JSON object, got {type(row).__name__}")
        return row

    def where(self, i: int) -> str:
        return f"{self.name}: line {self.lines[i]}"

    def __getstate__(self) -> dict:  # the open handle is per process
        return {**self.__dict__, "_file": None}


class _ListSource(_Source):
    """Rows already in memory (JSON list, CSV, TXT): dicts of strings and paths, not decoded media."""

    def __init__(self, path: Path, rows: list[dict], where_fmt: str = "row {i}", lines: list[int] | None = None):
        self.name, self.base, self.rows, self.where_fmt, self.lines = str(path), path.parent, rows, where_fmt, lines

    def __len__(self) -> int:
        return len(self.rows)

    def raw(self, i: int) -> dict:
        row = self.rows[i]
        if not isinstance(row, dict):
            raise DataError(f"{self.where(i)}: expected an object with named columns, got {type(row).__name__}")
        return dict(row)

    def where(self, i: int) -> str:
        line = self.lines[i] if self.lines is not None else i + 2
        return f"{self.name}: " + self.where_fmt.format(i=i, line=line, n=i + 1)


class _ArrowSource(_Source):
    """A ``datasets.Dataset`` (save_to_disk, hub) or a parquet table; row ``i`` is materialised when read."""

    def __init__(self, name: str, base: Path, data: Any):
        self.name, self.base, self.data = name, base, data

    def __len__(self) -> int:
        return int(self.data.num_rows)

    def raw(self, i: int) -> dict:
        import pyarrow as pa

        if isinstance(self.data, pa.Table):
            return self.data.slice(i, 1).to_pylist()[0]
        return dict(self.data[i])


_EXAMPLE_HINT = "; the example datasets are made by `python examples/make_example_datasets.py examples/data`"


def _open_source(spec: str, split: str, field_name: str) -> _Source:
    path = Path(spec).expanduser()
    if path.is_dir():
        try:
            import datasets
        except ImportError:
            raise ConfigError(
                f"task.args.{field_name}: {spec} is a directory; reading it needs `pip install datasets`"
            ) from None
        if not ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
            raise ConfigError(f"task.args.{field_name}: {spec} is a directory but not one written by save_to_disk")
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ConfigError(f"task.args.split: {spec} has splits {sorted(data)}, not {split!r}")
            data = data[split]
        return _ArrowSource(str(path), path, data)
    hint = _EXAMPLE_HINT if spec.startswith("examples/data/") else ""
    if path.suffix.lower() in FILE_FORMATS:
        if not path.is_file():
            raise ConfigError(f"task.args.{field_name}: data file {spec!r} does not exist{hint}")
        return _read_file(path)
    if hint and not path.exists():
        raise ConfigError(f"task.args.{field_name}: {spec!r} does not exist{hint}")
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ConfigError(
            f"task.args.{field_name}: {spec!r} is not a .jsonl/.json/.csv/.parquet/.txt file, a save_to_disk "
            "directory, or a hub id"
        )
    try:
        import datasets

        data = datasets.load_dataset(spec, split=split)
    except ImportError:
        raise ConfigError(
            f"task.args.{field_name}: loading hub dataset {spec!r} needs `pip install datasets`"
        ) from None
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"task.args.{field_name}: {spec!r} is neither a local file/directory nor loadable from the hub ({first})"
        ) from None
    return _ArrowSource(spec, Path.cwd(), data)


def _read_file(path: Path) -> _Source:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _JsonlSource(path)
    if suffix == ".txt":
        numbered = [(n, line.strip()) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]
        numbered = [(n, text) for n, text in numbered if text]
        return _ListSource(path, [{"prompt": t} for _, t in numbered], "line {line}", [n for n, _ in numbered])
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        return _ListSource(path, rows, "row {n} (line {line})")
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON at line {e.lineno} column {e.colno} ({e.msg})") from None
        if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
            data = next(iter(data.values()))  # {"data": [...]}
        if not isinstance(data, list):
            raise ConfigError(f"{path}: a .json dataset must be a list of objects (use .jsonl for one object per line)")
        return _ListSource(path, data)
    import pyarrow.parquet as pq

    return _ArrowSource(str(path), path.parent, pq.read_table(path))


# ---------------------------------------------------------------------------------------------- rows


def _template_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "\n".join(str(v) for v in value)
    return str(value)


def _strip_none(messages: list) -> list:
    """Chat messages without the ``None`` keys Arrow adds when it unifies content-part structs."""
    out = []
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            parts = [{k: v for k, v in p.items() if v is not None} if isinstance(p, dict) else p for p in m["content"]]
            m = {**m, "content": parts}
        out.append(m)
    return out


MEDIA_SCAN_ROWS = 16  # rows read (not built) to learn which media columns a file's rows carry


def _media_columns(source: _Source, columns: dict[str, str]) -> tuple[str, ...]:
    """Media columns (``image``, ``images``, ``video``, ``audio``, ``media``) that the first rows of a JSON /
    JSONL / CSV source carry: a row with none of them is a data error, not silently a text-only prompt (a row of
    an image + video mix may carry either; an explicit ``null`` marks a text-only row). Arrow
    sources (parquet, save_to_disk, hub) have one schema, so a row cannot lack a column there."""
    if isinstance(source, _ArrowSource):
        return ()
    keys = [*MEDIA_KEYS, "media"]
    keys += [columns[k] for k in keys if k in columns]  # the file's own names of mapped media columns
    seen: dict[str, None] = {}
    for i in range(min(MEDIA_SCAN_ROWS, len(source))):
        try:
            raw = source.raw(i)
        except DataError:  # reported when that row is built
            continue
        seen.update((k, None) for k in keys if k in raw)
    return tuple(seen)


class RowBuilder:
    """Turns raw row ``i`` of a source into an adapter row (columns mapped, media opened, prompt wrapped)."""

    def __init__(self, args: DatasetArgs, source: _Source):
        self.args, self.source = args, source
        self.root = Path(args.media_root).expanduser() if args.media_root else source.base
        self.media_columns = _media_columns(source, args.columns)

    def _resolve(self, value: Any, key: str, where: str) -> Any:
        """A media path resolved against ``media_root``; one outside it is refused unless
        ``allow_outside_media_root`` (``../``, absolute paths and symlinks are followed to their target)."""
        if isinstance(value, dict) and value.get("bytes") is None and isinstance(value.get("path"), str):
            return {**value, "path": self._resolve(value["path"], key, where)}
        if not (isinstance(value, str) and value and not value.startswith(("http://", "https://", "data:"))):
            return value
        path = Path(value).expanduser()
        full = path if path.is_absolute() else self.root / path
        if not self.args.allow_outside_media_root:
            real, root = full.resolve(), self.root.resolve()
            if not real.is_relative_to(root):
                raise DataError(
                    f"{where}: column {key!r}: {value!r} resolves to {str(real)!r}, outside the media root "
                    f"{str(root)!r}; move the file under it, set task.args.media_root, or set "
                    "task.args.allow_outside_media_root: true"
                )
        return str(full)

    def __call__(self, i: int) -> dict:
        raw = self.source.raw(i)
        where = self.source.where(i)
        row = dict(raw)
        for key, column in self.args.columns.items():
            if column not in raw:
                raise DataError(
                    f"{where}: column {column!r} (task.args.columns.{key}) is missing; the row has {sorted(raw)}"
                )
            row[key] = raw[column]
        if "prompt" not in row and isinstance(row.get("conversations"), list):
            self._from_conversations(row, where)
        if "media" in row and row["media"] is not None:
            self._route_media(row, where)
        if "answer" not in row and "solution" in row:
            row["answer"] = row["solution"]  # TRL's name for the ground truth (its accuracy_reward reads solution)
        if "prompt" not in row and row.get("audio") is not None:
            row["prompt"] = ""  # ASR data (file,text): Whisper reads no prompt; audio_llm refuses this at load
        if "prompt" not in row:
            raise DataError(f"{where}: column 'prompt' is missing; {_prompt_hint(raw)}")
        if self.media_columns and not any(k in raw for k in self.media_columns):
            key = self.media_columns[0]
            raise DataError(
                f"{where}: column {key!r} is missing, but other rows of this file have it; give the row its "
                f'{key}, or write "{key}": null for a row without media (it is then a text-only prompt)'
            )
        self._media(row, where)
        row["prompt"] = self._prompt(row, where)
        return row

    def _from_conversations(self, row: dict, where: str) -> None:
        turns = row["conversations"]
        human = [t for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user")]
        answer = [t for t in turns if isinstance(t, dict) and t.get("from") in ("gpt", "assistant")]
        if not human:
            raise DataError(f"{where}: column 'conversations' has no human turn ({{'from': 'human', 'value': ...}})")
        row["prompt"] = re.sub(r"<(image|video)>\s*", "", str(human[0].get("value", ""))).strip()
        if answer and "answer" not in row:
            row["answer"] = answer[0].get("value")

    def _route_media(self, row: dict, where: str) -> None:
        value = row["media"]
        kind = None
        if self.args.media_type_column:
            kind = row.get(self.args.media_type_column)
            if kind not in ("image", "video", "audio"):
                raise DataError(
                    f"{where}: column {self.args.media_type_column!r} is {kind!r}; expected image, video or audio"
                )
        else:
            suffix = Path(str(value if not isinstance(value, list) else value[0])).suffix.lower()
            kind = "video" if suffix in VIDEO_EXTENSIONS else "audio" if suffix in AUDIO_EXTENSIONS else "image"
        row[kind] = value

    def _media(self, row: dict, where: str) -> None:
        for key in ("image", "images"):
            if row.get(key) is not None:
                items = [self._resolve(v, key, where) for v in as_list(row[key])]
                opened = []
                for v in items:
                    try:
                        opened.append(open_image(v, "image"))
                    except DataError as e:
                        raise DataError(f"{where}: column {key!r}: {e}") from None
                row[key] = opened if isinstance(row[key], (list, tuple)) else opened[0]
        for key in ("video", "audio"):
            if isinstance(row.get(key), str):
                row[key] = self._resolve(row[key], key, where)
                try:  # decoded as the adapter will, so a bad file is a skipped row (file and line), not a stop
                    if key == "audio":
                        decode_audio(row[key])
                    else:  # probe_videos: the last frame decodes (a cut-short file fails); else the file exists
                        decode_video(row[key], frames=1 if self.args.probe_videos else 0)
                except DataError as e:
                    raise DataError(f"{where}: column {key!r}: {e}") from None

    def _prompt(self, row: dict, where: str) -> Any:
        prompt = row["prompt"]
        a = self.args
        if isinstance(prompt, list):
            prompt = _strip_none(prompt)
            if a.system_prompt and not (prompt and isinstance(prompt[0], dict) and prompt[0].get("role") == "system"):
                prompt = [{"role": "system", "content": a.system_prompt}, *prompt]
            try:  # TRL's vision format: string content + an images column gets its {"type": "image"} parts here
                return add_media_parts(prompt, media_counts(row))
            except DataError as e:
                raise DataError(f"{where}: column 'prompt': {e}") from None
        if not isinstance(prompt, str):
            raise DataError(
                f"{where}: column 'prompt' must be text or a list of chat messages, got {type(prompt).__name__}"
            )
        template = a.prompt_template
        if isinstance(template, dict):
            key = row.get(a.template_column) if a.template_column else None
            template = template.get(str(key), template.get("default"))
        if template:
            values = {k: _template_value(v) for k, v in row.items() if k not in MEDIA_KEYS}
            values["prompt"] = prompt
            try:
                prompt = template.format_map(values)
            except KeyError as e:
                raise DataError(
                    f"{where}: task.args.prompt_template uses {{{e.args[0]}}}, which the row has no column for"
                ) from None
        counts = media_counts(row)
        try:  # <image> / <video> placeholders in the text: as many as the row's items (they become parts there)
            check_media_content(prompt, counts)
        except DataError as e:
            raise DataError(f"{where}: column 'prompt': {e}") from None
        if not a.system_prompt:
            return prompt
        content: Any = media_content(prompt, counts) if any(counts.values()) else prompt
        return [{"role": "system", "content": a.system_prompt}, {"role": "user", "content": content}]


def _prompt_hint(raw: dict) -> str:
    """How to give a row without a ``prompt`` one: a column holding audio files (Whisper ASR data, a CSV
    ``file,text``) is mapped as ``audio`` (Whisper needs no prompt); else the prompt column is mapped."""
    audio = next((c for c, v in raw.items() if isinstance(v, str) and Path(v).suffix.lower() in AUDIO_EXTENSIONS), None)
    if audio is not None:
        return (
            f"column {audio!r} holds audio ({raw[audio]!r}): map it with task.args.columns: {{audio: {audio}}} "
            f"(speech data needs no prompt: Whisper reads none), or map a prompt column (the row has {sorted(raw)})"
        )
    return (
        f"map one with task.args.columns.prompt, or for speech data without prompts the audio file column with "
        f"task.args.columns.audio (the row has {sorted(raw)})"
    )


class Rows(Sequence):
    """A lazy split: ``len`` and row ``i`` (built on access); ``indices`` select rows of the source."""

    def __init__(self, builder: RowBuilder, indices: Sequence[int]):
        self.builder, self.indices = builder, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return Rows(self.builder, self.indices[i])
        return self.builder(self.indices[i])

    def where(self, i: int) -> str:
        """Row ``i`` named as messages name it (``file: line N``)."""
        return self.builder.source.where(self.indices[i])


# ---------------------------------------------------------------------------------------------- task


class DatasetTask:
    """``Task`` over user data (see the module docstring)."""

    def __init__(self, args: DatasetArgs, seed: int = 0):
        train_source = _open_source(args.train, args.split, "train")
        n = len(train_source) if args.max_rows is None else min(args.max_rows, len(train_source))
        train_idx: Sequence[int] = range(n)
        if args.eval or args.eval_split:  # eval_split alone: that split of the train dataset
            eval_source = _open_source(args.eval or args.train, args.eval_split or args.split, "eval")
            m = len(eval_source) if args.max_rows is None else min(args.max_rows, len(eval_source))
            self._eval = Rows(RowBuilder(args, eval_source), range(m))
        else:
            order = list(range(n))
            random.Random(args.seed if args.seed is not None else seed).shuffle(order)
            k = round(args.eval_fraction * n)
            held = set(order[:k])
            train_idx = [i for i in range(n) if i not in held] if k else range(n)
            self._eval = Rows(RowBuilder(args, train_source), sorted(held))
        self._train = Rows(RowBuilder(args, train_source), train_idx)
        if len(self._train) == 0:
            raise ConfigError(f"task.args.train: no training rows in {args.train}")
        self._metrics = EvalRewards(args.eval_rewards, "task.args.eval_rewards")
        self.check(args.check_rows)

    def check(self, n: int) -> None:
        """Build the first ``n`` rows of each split; the first bad one raises :class:`DataError` (one line)."""
        for rows in (self._train, self._eval):
            for i in range(min(n, len(rows))):
                rows[i]

    def train_rows(self) -> Rows:
        return self._train

    def eval_rows(self) -> Rows:
        return self._eval

    def score(self, outputs: list, rows: list[dict]) -> dict[str, float] | None:
        if not self._metrics:
            return None  # the trainer scores with the configured rewards
        return self._metrics.score(outputs, rows)


def _validate(a: DatasetArgs) -> None:
    if not a.train:
        raise ConfigError(
            "task.args.train: give a .jsonl/.json/.csv/.parquet/.txt file, a save_to_disk directory or a hub id"
        )
    if not 0 <= a.eval_fraction < 1:
        raise ConfigError(f"task.args.eval_fraction: must be in [0, 1), got {a.eval_fraction}")
    if (a.eval or a.eval_split) and a.eval_fraction:
        raise ConfigError(
            "task.args.eval_fraction: give either eval / eval_split (held-out rows) or eval_fraction, not both"
        )
    if a.eval_split and not a.eval and Path(a.train).suffix.lower() in FILE_FORMATS:
        raise ConfigError(
            f"task.args.eval_split: {a.eval_split!r} names a split, but train {a.train!r} is one file without "
            "splits; give the held-out rows as task.args.eval (a file), or hold out task.args.eval_fraction"
        )
    if a.max_rows is not None and a.max_rows < 1:
        raise ConfigError(f"task.args.max_rows: must be >= 1 or null, got {a.max_rows}")
    if a.check_rows < 0:
        raise ConfigError(f"task.args.check_rows: must be >= 0, got {a.check_rows}")
    if isinstance(a.prompt_template, dict) and not a.template_column:
        raise ConfigError("task.args.template_column: a prompt_template mapping needs the column that picks the entry")


def _load(a: DatasetArgs, seed: int) -> DatasetTask:
    """The task from its checked ``task.args``; checks the first rows."""
    _validate(a)
    return DatasetTask(a, seed)


build_dataset_task = TASKS.register("dataset")(TaskSpec(args=DatasetArgs, cls=DatasetTask, load=_load))

__all__ = ["DatasetArgs", "DatasetTask", "EvalRewards", "Rows", "build_dataset_task"]
