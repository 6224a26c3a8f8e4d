"""Tool calls out of generated text: Qwen / Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

The format of Qwen2.5 / Qwen3 / Qwen3-VL chat templates, of verl's ``HermesToolParser``
(``verl/experimental/agent_loop/tool_parser.py``: regex ``<tool_call>(.*?)</tool_call>``, JSON with ``name`` and
``arguments``; the same pairing here, by a linear scan) and of TRL's ``qwen3_schema``. verl drops a call whose JSON
does not parse; here every malformed call becomes an error string that names the fix, so the rollout can answer it
as an observation (and penalise it). Nothing here raises on model output.
"""

from __future__ import annotations

import json
from typing import Any

from .base import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FORMAT = '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>'
_SHOW = 80  # characters of a bad call quoted in its error
MAX_ERRORS = 8
"""Malformed calls reported one by one; the rest are counted in one more line."""


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """The well-formed tool calls in ``text`` and one error line per malformed one, both in text order.

    A call is the JSON object between ``<tool_call>`` and the next ``</tool_call>``: ``name`` a non-empty string,
    ``arguments`` an object (or a JSON string holding one, OpenAI's form; absent = ``{}``). Errors: JSON that does
    not parse (or uses NaN/Infinity), not an object, no name, arguments not an object, a ``<tool_call>`` nested in
    another, an unclosed ``<tool_call>`` (a generation cut off mid-call), a stray ``</tool_call>``; after
    ``MAX_ERRORS`` of them one more line counts the rest. Text outside the tags is ignored. Never raises on a
    ``str``, and takes time linear in its length (a scan with ``str.find``, not a backtracking regex: thousands of
    unclosed tags cost one pass).
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos, opening, closing = 0, text.find(OPEN), text.find(CLOSE)
    while opening != -1 or closing != -1:
        if closing != -1 and (opening == -1 or closing < opening):
            errors.append(f"a stray {CLOSE} without {OPEN} before it; write {_FORMAT}")
            pos = closing + len(CLOSE)
        elif closing == -1:
            errors.append(f"a {OPEN} is never closed (the turn ended inside it); close every call with {CLOSE}")
            break
        else:
            raw = text[opening + len(OPEN) : closing]
            call, error = _parse_one(raw, len(calls) + len(errors) + 1)
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
            pos = closing + len(CLOSE)
        if opening != -1 and opening < pos:
            opening = text.find(OPEN, pos)
        if closing < pos:
            closing = text.find(CLOSE, pos)
    if len(errors) > MAX_ERRORS:
        errors = errors[:MAX_ERRORS] + [f"… and {len(errors) - MAX_ERRORS} more malformed tool calls"]
    return calls, errors


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse_one(raw: str, number: int) -> tuple[ToolCall | None, str]:
    where = f"tool call {number}"
    if OPEN in raw:
        return None, f"{where}: a {OPEN} inside another; write one call per {OPEN}...{CLOSE} pair"
    body = raw.strip()
    try:
        obj = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError; deep nesting → RecursionError
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        return None, f"{where} is not valid JSON ({reason}): {_quote(body)}; write {_FORMAT}"
    if not isinstance(obj, dict):
        return None, f"{where} is a JSON {type(obj).__name__}, not an object: {_quote(body)}; write {_FORMAT}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f'{where} has no "name" (a non-empty string): {_quote(body)}; write {_FORMAT}'
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's wire form: arguments as a JSON string
        try:
            arguments = json.loads(arguments, parse_constant=_reject_constant) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return None, f'{where} ({name!r}): "arguments" is a string that is not a JSON object; write {_FORMAT}'
    if not isinstance(arguments, dict):
        kind = type(arguments).__name__
        return None, f'{where} ({name!r}): "arguments" is a {kind}, not an object; write {_FORMAT}'
    return ToolCall(name=name.strip(), arguments=arguments, raw=raw), ""


def _quote(body: str) -> str:
    return repr(body) if len(body) <= _SHOW else repr(body[: _SHOW - 20]) + f"… ({len(body)} characters)"
