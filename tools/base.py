"""What a tool call is, what a tool sees and returns, and the registry that finds tools by name.

A tool is anything with ``name``, ``schema`` (an OpenAI function schema, the form ``apply_chat_template(tools=...)``
renders) and ``__call__(arguments, context) -> Observation`` (:class:`Tool`). A plain Python function with a typed
signature and a Google-style docstring is one too once wrapped by :class:`FunctionTool` (TRL's ``tools=``): its
schema is inferred by ``transformers.utils.get_json_schema``, and what it returns (text, a PIL image, TRL's
``[{"type": "image", "image": ...}, {"type": "text", "text": ...}]`` blocks, or an :class:`Observation`) becomes an
:class:`Observation`.

Only tools in :data:`TOOLS` (or objects handed to the rollout directly) ever run: there is no shell or code tool,
and a call naming anything else is answered with an error observation (:func:`mmgrpo.tools.run_tool_call`).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL import Image

from mmgrpo.registry import Registry
from mmgrpo.suggest import did_you_mean


@dataclass
class Observation:
    """What a tool or an environment step gives back to the model, inserted as the template's tool message.

    ``error`` set means the call or action failed (unknown tool, bad arguments, time-out, an illegal move): the
    text then says what was wrong and how to call it instead, and the trajectory goes on. GiGPO's invalid-action
    penalty and verl's tool penalty key on it (:attr:`invalid`).
    """

    text: str = ""
    """Text for the model (tool output, or the error message with the fix)."""
    images: list[Image.Image] = field(default_factory=list)
    """New images for the model (a crop, a rendered game state), in the order they are inserted."""
    frames: list[Image.Image] = field(default_factory=list)
    """New video frames for the model, in time order."""
    frame_times: list[float] = field(default_factory=list)
    """Seconds of each of ``frames`` in the source video (same length as ``frames``)."""
    reward: float = 0.0
    """Tool reward of this call (verl's ``ImageZoomInTool`` gives −0.05 on an error), or an environment's step
    reward when an :class:`~mmgrpo.tools.Environment` fills it."""
    error: str | None = None
    """One line saying what failed, or ``None`` on success."""

    @property
    def invalid(self) -> bool:
        """The call or action failed (verl-agent's ``is_action_valid == 0``)."""
        return self.error is not None


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: ``<tool_call>{"name": name, "arguments": arguments}</tool_call>``; ``raw`` is the text
    between the tags (for logs and error messages)."""

    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass
class ToolContext:
    """What a tool may read besides its arguments: the row's original media and the trajectory so far.

    Images are the row's images as PIL at their **original** resolution (boxes are in their pixels, as DeepEyes
    and verl's ``ImageZoomInTool`` read them), not the resized copies the processor fed the model. Video is the
    frames the rollout decoded for the row with their timestamps, and optionally ``load_frames`` to decode a
    span more densely than the prompt's sampling (the rollout builds it from the video adapter's decoder; tools
    never import the modalities).
    """

    images: list[Image.Image] = field(default_factory=list)
    """The row's images, original resolution, in prompt order."""
    frames: list[Image.Image] = field(default_factory=list)
    """The row's decoded video frames, in time order."""
    frame_times: list[float] = field(default_factory=list)
    """Seconds of each of ``frames`` in the video (same length as ``frames``, increasing)."""
    video_fps: float | None = None
    """Native frame rate of the video file (``None`` without video or when unknown)."""
    video_duration: float | None = None
    """Seconds of video (``None`` = the last frame time)."""
    load_frames: Callable[[float, float, int], tuple[list[Image.Image], list[float]]] | None = None
    """``load_frames(start_s, end_s, n) -> (frames, times)``: decode ``n`` frames spread uniformly over the span;
    ``None``: tools pick from ``frames``."""
    turn: int = 0
    """Index of the assistant turn whose tool call is being run (0 = the first)."""
    observations: list[Observation] = field(default_factory=list)
    """Observations returned earlier in this trajectory, oldest first."""
    row: Mapping[str, Any] = field(default_factory=dict)
    """The dataset row (read-only), for tools that need a column."""


@runtime_checkable
class Tool(Protocol):
    """A callable tool: ``name``, ``schema`` (OpenAI function schema) and ``__call__(arguments, context)``.

    ``__call__`` may raise or run long: :func:`~mmgrpo.tools.run_tool_call` bounds it (time-out, sizes) and turns
    every failure into an error :class:`Observation`.
    """

    name: str
    schema: dict[str, Any]

    def __call__(self, arguments: dict[str, Any], context: ToolContext) -> Observation: ...


TOOLS: Registry[Tool] = Registry("tool")
"""Built-in and user-registered tools by name (instances satisfying :class:`Tool`)."""


class FunctionTool:
    """A plain Python function as a :class:`Tool` (TRL's ``tools=``).

    The schema comes from the signature and Google docstring (``transformers.utils.get_json_schema``: every
    argument typed and described under ``Args:``). A parameter named ``context`` is not in the schema: it receives
    the :class:`ToolContext`. The return value becomes an :class:`Observation`: an ``Observation`` as is, a PIL
    image as ``images=[it]``, TRL's content blocks (``[{"type": "image", "image": PIL}, {"type": "text", ...}]``)
    as images and text, anything else as ``text=str(value)`` (TRL's rule).
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None):
        self.fn = fn
        self.schema = function_schema(fn, name)
        self.name = self.schema["function"]["name"]
        self.takes_context = "context" in inspect.signature(fn).parameters

    def __call__(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        kwargs = dict(arguments)
        if self.takes_context:
            kwargs["context"] = context
        return as_observation(self.fn(**kwargs))

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"


def function_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The OpenAI function schema of ``fn`` (``{"type": "function", "function": {name, description,
    parameters}}``), from its signature and Google docstring; a ``context`` parameter is left out. Raises
    ``TypeError`` naming the function and the fix when an argument lacks a type hint or a description."""
    from transformers.utils import get_json_schema

    target = fn
    signature = inspect.signature(fn)
    if "context" in signature.parameters:  # the schema is of the function without its context parameter
        params = [p for n, p in signature.parameters.items() if n != "context"]

        def target(*args: Any, **kwargs: Any) -> Any:  # a stand-in that get_json_schema reads
            return fn(*args, **kwargs)

        target.__name__ = fn.__name__
        target.__doc__ = fn.__doc__
        target.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        target.__annotations__ = {k: v for k, v in inspect.get_annotations(fn).items() if k != "context"}
        target.__wrapped__ = fn  # type: ignore[attr-defined]  # get_type_hints resolves names in fn's module
    try:
        schema = get_json_schema(target)
    except Exception as e:  # transformers raises its own TypeError / DocstringParsingException
        raise TypeError(
            f"tool function {getattr(fn, '__qualname__', fn)!r}: cannot infer its schema ({e}); give every "
            "argument a type hint and describe it under 'Args:' in a Google-style docstring"
        ) from None
    schema["function"].pop("return", None)  # OpenAI's function schema has name, description, parameters
    if name is not None:
        schema["function"]["name"] = name
    return schema


def as_observation(value: Any) -> Observation:
    """A tool function's return value as an :class:`Observation` (see :class:`FunctionTool`)."""
    if isinstance(value, Observation):
        return value
    if isinstance(value, Image.Image):
        return Observation(images=[value])
    if isinstance(value, list) and value and all(isinstance(b, dict) and "type" in b for b in value):
        texts, images = [], []
        for block in value:  # TRL's multimodal tool result
            if block["type"] == "image" and isinstance(block.get("image"), Image.Image):
                images.append(block["image"])
            elif block["type"] == "text":
                texts.append(str(block.get("text", "")))
            else:
                texts.append(str(block))
        return Observation(text="\n".join(texts), images=images)
    return Observation(text="" if value is None else str(value))


def register_tool(name: str | None = None) -> Callable[[Any], Any]:
    """Decorator adding a tool to :data:`TOOLS`: on a plain function (wrapped in :class:`FunctionTool`, named
    ``name`` or the function's name) or on a :class:`Tool` instance. Returns the object it decorates unchanged;
    a taken name raises ``ValueError``."""

    def deco(obj: Any) -> Any:
        if isinstance(obj, Tool) and not inspect.isfunction(obj):
            tool = obj
            if name is not None and name != obj.name:
                raise ValueError(f"register_tool({name!r}) on a tool named {obj.name!r}: the names must agree")
        elif inspect.isfunction(obj):
            tool = FunctionTool(obj, name)
        else:
            raise TypeError(
                f"register_tool: {obj!r} is neither a function nor a Tool (an object with name, schema and "
                "__call__(arguments, context))"
            )
        TOOLS.add(tool.name, tool)
        return obj

    return deco


def get_tool(name: str) -> Tool:
    """The registered tool ``name``; an unknown name raises ``KeyError`` with the closest name ("did you mean")
    and the list of valid ones."""
    if name not in TOOLS:
        raise KeyError(_unknown(name, TOOLS.names()))
    return TOOLS.get(name)


def load_tools(specs: Sequence[str | Tool | Callable[..., Any]]) -> list[Tool]:
    """Tools from registry names, :class:`Tool` objects or plain functions (wrapped in :class:`FunctionTool`).
    Two tools with one name raise ``ValueError``."""
    out: list[Tool] = []
    for spec in specs:
        if isinstance(spec, str):
            out.append(get_tool(spec))
        elif isinstance(spec, Tool) and not inspect.isfunction(spec):
            out.append(spec)
        elif callable(spec):
            out.append(FunctionTool(spec))
        else:
            raise TypeError(f"a tool is a registry name, a Tool or a function, got {spec!r}")
    names = [t.name for t in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two tools are named {twice}; each tool name must be unique (rename one)")
    return out


def render_tool_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The tools' OpenAI function schemas, in order, for ``processor.apply_chat_template(..., tools=...)``."""
    return [tool.schema for tool in tools]


def anchor_key(value: Any) -> Hashable:
    """A hashable key that is equal exactly when two observations are equal (GiGPO's ``to_hashable``).

    PIL images by mode, size and a SHA-256 of their pixels (verl-agent compares the pixel tuples; the digest is
    the same equality up to hash collisions); an :class:`Observation` by its text, images and frames; strings
    and numbers as they are; lists/tuples and dicts element-wise (dicts by sorted keys); numpy arrays and tensors
    by dtype, shape and a digest of their bytes.
    """
    if value is None or isinstance(value, (str, int, float, bool, bytes)):
        return value
    if isinstance(value, Image.Image):
        return ("image", value.mode, value.size, _digest(value.tobytes()))
    if isinstance(value, Observation):
        return ("observation", value.text, anchor_key(value.images), anchor_key(value.frames))
    if isinstance(value, (list, tuple)):
        return tuple(anchor_key(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), anchor_key(v)) for k, v in value.items()))
    if type(value).__module__.startswith(("numpy", "torch")):  # arrays and tensors, without importing either
        array = value.detach().cpu().numpy() if type(value).__module__.startswith("torch") else value
        array = array.__array__()
        return ("array", str(array.dtype), tuple(array.shape), _digest(array.tobytes()))
    raise TypeError(
        f"anchor_key: cannot key a {type(value).__name__}; use str, numbers, PIL images, arrays, lists or dicts"
    )


def state_anchor(observation: Observation) -> Hashable:
    """GiGPO's anchor of an environment state: the key of the observation's images when it has any (the rendered
    state, as verl-agent's Sokoban and Gym Cards use the RGB array), else of its text."""
    return anchor_key(observation.images) if observation.images else observation.text


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unknown(name: str, valid: list[str]) -> str:
    close = did_you_mean(name, valid)
    hint = f"did you mean {close!r}? " if close else ""
    return f"unknown tool {name!r}; {hint}valid: {', '.join(valid) or '(none registered)'}"
