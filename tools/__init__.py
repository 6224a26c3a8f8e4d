"""Tools and environments for multi-turn rollouts, found by name like rewards (``docs/agents.md``).

Public API:

- :class:`Observation`, :class:`ToolCall`, :class:`ToolContext` — what a tool returns, a parsed call, what a tool
  may read (the row's original media, the turn, earlier observations);
- :func:`parse_tool_calls` — Qwen/Hermes ``<tool_call>{json}</tool_call>`` out of generated text, errors as
  strings; :func:`render_tool_schemas` — OpenAI function schemas for ``apply_chat_template(tools=...)``;
- :data:`TOOLS`, :class:`Tool`, :func:`register_tool`, :func:`get_tool`, :func:`load_tools`, :class:`FunctionTool`
  — the registry and protocol; a typed, documented Python function is a tool (TRL's ``tools=``);
- :func:`run_tool_call`, :func:`run_tool_calls` — run calls bounded (time-out, argument and observation sizes);
  never raise;
- built-in tools ``crop`` / ``zoom`` (:class:`CropTool`, DeepEyes' ``bbox_2d`` interface) and ``select_frames``
  (:class:`SelectFramesTool`, a time span of the video → frames);
- :class:`Environment`, :data:`ENVIRONMENTS`, :func:`make_environment`, :func:`parse_action` — multi-step games;
  the built-in ``sokoban`` (:class:`Sokoban`), ``gridworld`` (:class:`GridWorld`) and ``gui`` (:class:`GuiApp`, a
  small phone app), rendered as images;
- :func:`anchor_key`, :func:`state_anchor` — hashable observation keys for GiGPO's anchor states.

This package never imports :mod:`mmgrpo.modalities` or :mod:`mmgrpo.tasks`: the rollout hands tools their media
through :class:`ToolContext`.
"""

from .base import (
    TOOLS,
    FunctionTool,
    Observation,
    Tool,
    ToolCall,
    ToolContext,
    anchor_key,
    as_observation,
    function_schema,
    get_tool,
    load_tools,
    register_tool,
    render_tool_schemas,
    state_anchor,
)
from .env import ENVIRONMENTS, Environment, make_environment, parse_action
from .gridworld import GridWorld, Sokoban
from .gui import GuiApp
from .image import CropTool, clamp_box
from .parsing import parse_tool_calls
from .runner import LIMITS, run_tool_call, run_tool_calls
from .video import SelectFramesTool, pick_uniform

__all__ = [
    "ENVIRONMENTS",
    "LIMITS",
    "TOOLS",
    "CropTool",
    "Environment",
    "FunctionTool",
    "GridWorld",
    "GuiApp",
    "Observation",
    "SelectFramesTool",
    "Sokoban",
    "Tool",
    "ToolCall",
    "ToolContext",
    "anchor_key",
    "as_observation",
    "clamp_box",
    "function_schema",
    "get_tool",
    "load_tools",
    "make_environment",
    "parse_action",
    "parse_tool_calls",
    "pick_uniform",
    "register_tool",
    "render_tool_schemas",
    "run_tool_call",
    "run_tool_calls",
    "state_anchor",
]
