"""What the demo page needs to know about one kind of value (:func:`mmgrpo.samples.kind_of`): how to show it as a
model's output, and, for a media kind, how to take it as the model's input (an upload box)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


def as_is(value):
    return value


def example_as_is(value, scratch: Path, stem: str):
    """A held-out row's media value, already a file path (videos, audio)."""
    return value


@dataclass(frozen=True)
class OutputKind:
    """One row of :data:`mmgrpo.demo.kinds.KINDS`."""

    name: str
    """The kind as :func:`mmgrpo.samples.save_value` names it (``text``, ``image``, ...)."""
    output: Callable[[str], Any]
    """``side -> gradio component`` showing one model's greedy output (``side`` is ``base`` or ``trained``)."""
    empty: Any
    """The component's value while the output is of another kind (it is hidden then)."""
    shown_as: Literal["text", "gallery", "files"]
    """Where sampled outputs of this kind go: text lines only, also the samples gallery, or the training tab's
    file list."""
    columns: tuple[str, ...] = ()
    """Row columns holding a model input of this kind; none for a kind that is never an input."""
    upload: Callable[[], Any] | None = None
    """``() -> gradio component``: the upload box replacing a held-out row's input of this kind."""
    suffixes: frozenset[str] = frozenset()
    """File suffixes an upload of this kind may have."""
    load_upload: Callable[[str], Any] = as_is
    """An uploaded (or held-out) file path -> the row value the adapter takes."""
    example_file: Callable[[Any, Path, str], Any] = example_as_is
    """``(row value, scratch dir, stem) -> file path`` the upload box shows for a held-out row."""
