"""One parser for what policies write: ``<think>``/``<answer>`` tags, boxes, points, numbers, choice letters, spans.

Every anchor re-implements these with its own regex and its own silent choice (the first vs the last
``<answer>``, integer-only boxes, ``"12.5 to 17.8"`` but not ``"12.5 - 17.8"``); see
R1-V, VLM-R1 and VideoChat-R1 (Deep-Agent/R1-V, om-ai-lab/VLM-R1, OpenGVLab/VideoChat-R1). Here the choice is an
explicit argument and the
parsers never raise on malformed model output: they return ``None`` (or an empty list), and the reward decides
what that scores.

Conventions:

- ``which="last"`` (the default everywhere) takes the last match, ``"first"`` the first. A model that writes
  an example answer in its reasoning and the real one at the end is scored on the real one with ``"last"``.
- Tags are matched case-insensitively (``<ANSWER>…</Answer>`` is an answer tag; only ASCII letters are folded),
  non-greedily and across lines; an unclosed tag (a truncated completion) has no content.
- Every parser runs in time linear (or near-linear) in the text: no regex here backtracks over a run of digits or
  tags (tested on 80k-character adversarial inputs), so a reward built on them is bounded by its input length.
- Numbers accept a sign, thousands separators (``1,234.5``), decimals and exponents; ``"3/4"`` is a fraction
  only in :func:`parse_number` with ``fractions=True``.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable, Sequence
from typing import Any, Literal

Which = Literal["first", "last"]

# A number: optional sign, digits with optional thousands groups, optional decimals, optional exponent; or a
# bare decimal like ".5". Thousands groups need exactly three digits so "1,2" is two numbers.
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?"
NUMBER_PATTERN = _NUM
"""The regex of one number (sign, thousands groups, decimals, exponent), for matching a whole answer."""
NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUM})(?![\d])")
_FRACTION_RE = re.compile(r"(?<![\w./])([-+]?\d+)\s*/\s*(\d+)(?![\w./])")
_BOX_RE = re.compile(
    rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*[\])]"  # [x1, y1, x2, y2]
    rf"|\(\s*({_NUM})\s*,\s*({_NUM})\s*\)\s*,?\s*(?:<\|box_end\|>\s*<\|box_start\|>)?\s*\(\s*({_NUM})\s*,\s*({_NUM})\s*\)"
)  # Qwen2-VL "(x1,y1),(x2,y2)"
_CLOCK_RE = r"\d+(?::\d{1,2}){1,2}(?:\.\d+)?"
_TIME = rf"(?:{_CLOCK_RE}|\d+(?:\.\d+)?)"
_SPAN_RE = re.compile(  # starts only at the first digit of a run: no quadratic backtracking inside "1111…"
    rf"(?<![\d.:])({_TIME})\s*(?:s|sec|secs|seconds)?\s*(?:to|and|-|–|—|~|,|until|through)\s*({_TIME})(?:\s*(?:s|sec|secs|seconds))?",
    re.IGNORECASE,
)
_CHOICE_PREFIX_RE = re.compile(
    r"^\s*(?:the\s+)?(?:final\s+|correct\s+|best\s+)?(?:answer|option|choice)\s*(?:is|:)?\s*:?\s*", re.IGNORECASE
)


def completion_text(completion: Any) -> str:
    """The text of one completion: a ``str`` as is; a TRL conversational completion
    (``[{"role": "assistant", "content": ...}]``) → the content of its messages joined; ``None`` → ``""``.

    Message content given as a list of parts (``[{"type": "text", "text": ...}]``) is joined too.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content", ""))
    if isinstance(completion, (list, tuple)):
        return "".join(completion_text(m) for m in completion)
    return str(completion)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def prompt_text(prompt: Any) -> str:
    """The user text of a prompt: a ``str`` as is; a chat (list of messages) → the text of its user turns."""
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict) and "role" in prompt[0]:
        users = [m for m in prompt if m.get("role") == "user"] or list(prompt)
        return "\n".join(_content_text(m.get("content", "")) for m in users)
    return completion_text(prompt)


def _pick(items: Sequence, which: Which):
    if which not in ("first", "last"):
        raise ValueError(f"which must be 'first' or 'last', got {which!r}")
    if not items:
        return None
    return items[0] if which == "first" else items[-1]


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
"""Folds ASCII letters only, so the folded text has the same length as the original (``str.lower`` does not:
``"İ".lower()`` is two characters)."""


def extract_tags(text: str, tag: str) -> list[str]:
    """Contents of every closed ``<tag>…</tag>`` in ``text``, in order (non-greedy, across lines, the tag name
    case-insensitive: ``<ANSWER>`` is ``<answer>``).

    A linear scan (``str.find``), not a regex: ``re.findall(r"<a>(.*?)</a>")`` rescans the rest of the text
    from every unclosed ``<a>``, which is quadratic in their number (64k characters of ``<answer>`` took
    seconds). Same result as that regex: after a match the scan resumes behind its closing tag.
    """
    open_, close = f"<{tag}>".translate(_ASCII_LOWER), f"</{tag}>".translate(_ASCII_LOWER)
    low = text.translate(_ASCII_LOWER)  # same length as text: indices carry over
    out: list[str] = []
    start = low.find(open_)
    while start != -1:
        end = low.find(close, start + len(open_))
        if end == -1:  # no closing tag after this opening one: none after any later one either
            break
        out.append(text[start + len(open_) : end])
        start = low.find(open_, end + len(close))
    return out


def extract_tag(text: str, tag: str, which: Which = "last") -> str | None:
    """Content of the first or last closed ``<tag>…</tag>``, stripped; ``None`` when there is none."""
    found = _pick(extract_tags(text, tag), which)
    return None if found is None else found.strip()


def extract_answer(text: str, which: Which = "last") -> str | None:
    """Content of the first or last ``<answer>…</answer>``, stripped; ``None`` when there is none."""
    return extract_tag(text, "answer", which)


def extract_think(text: str, which: Which = "first") -> str | None:
    """Content of the first (default) or last ``<think>…</think>``, stripped; ``None`` when there is none."""
    return extract_tag(text, "think", which)


def answer_or_text(completion: Any, which: Which = "last", require_tags: bool = True) -> str | None:
    """The answer a reward scores: the ``<answer>`` content, else (``require_tags=False``) the whole text.

    Returns ``None`` when tags are required and absent (the reward then scores 0, not "not applicable").
    """
    text = completion_text(completion)
    ans = extract_answer(text, which)
    if ans is None and not require_tags:
        ans = text.strip()
    return ans


def ground_truth_text(gt: Any, which: Which = "last") -> str:
    """The answer a ground truth states, read with the completion's rules: the ``<answer>`` content when the
    text has one (R1-V, VLM-R1 and Video-R1 store ``solution`` as ``"<answer> 3 </answer>"``), else the text.
    """
    text = completion_text(gt)
    ans = extract_answer(text, which)
    return text.strip() if ans is None else ans


_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def is_think_answer_format(text: str, think: bool = True) -> bool:
    """True iff ``text`` is exactly ``<think>…</think><answer>…</answer>`` (or ``<answer>…</answer>`` when
    ``think=False``), whitespace tolerated around and between the blocks, tags case-insensitive.

    Stricter than the reference implementations' ``re.fullmatch(r"<think>.*?</think>\\s*<answer>.*?</answer>", DOTALL)``
    (Video-R1, R1-V, VideoChat-R1): their non-greedy groups still span a second block, so
    ``<answer>a</answer><answer>b</answer>`` passes there. Here each block holds no other think/answer tag,
    as TW-GRPO's "at most one of each tag" check intends. A linear scan: that regex is quadratic on text
    with many ``</think>`` and no ``</answer>``.
    """
    low = text.translate(_ASCII_LOWER).strip()
    pos = 0
    for open_, close in (("<think>", "</think>"), ("<answer>", "</answer>"))[0 if think else 1 :]:
        if not low.startswith(open_, pos):
            return False
        end = low.find(close, pos + len(open_))  # a block ends at its first closing tag (no tag may be inside)
        if end == -1 or any(t in low[pos + len(open_) : end] for t in _TAGS):
            return False
        pos = end + len(close)
        while pos < len(low) and low[pos].isspace():
            pos += 1
    return pos == len(low)


def _to_float(s: str) -> float:
    return float(s.replace(",", ""))


def parse_numbers(text: str) -> list[float]:
    """Every number in ``text`` in order (``"1,234.5"`` → 1234.5; ``"1e-3"`` → 0.001)."""
    return [_to_float(m.group(0)) for m in NUMBER_RE.finditer(text)]


def parse_number(text: str, which: Which = "last", fractions: bool = True) -> float | None:
    """The first or last number in ``text`` (a simple fraction ``a/b`` counts as one number when
    ``fractions=True``; ``b = 0`` is not a number). ``None`` when there is none."""
    if text is None:
        return None
    found: list[tuple[int, float]] = []
    spans: list[tuple[int, int]] = []
    if fractions:
        for m in _FRACTION_RE.finditer(text):
            den = int(m.group(2))
            if den != 0:
                found.append((m.start(), int(m.group(1)) / den))
            spans.append(m.span())
    for m in NUMBER_RE.finditer(text):
        if any(a <= m.start() < b for a, b in spans):
            continue
        found.append((m.start(), _to_float(m.group(0))))
    found.sort(key=lambda t: t[0])
    picked = _pick(found, which)
    return None if picked is None else picked[1]


def parse_boxes(text: str) -> list[list[float]]:
    """Every box in ``text`` as ``[x1, y1, x2, y2]`` floats, in order.

    Accepts ``[x1, y1, x2, y2]`` / ``(x1, y1, x2, y2)`` with ints or floats (VLM-R1's regex accepts only ints,
    the R1-style repositories disagree on the first vs the last ``<answer>``), JSON such as ``{"bbox_2d": [..]}``, and
    Qwen2-VL's ``(x1,y1),(x2,y2)`` with or without the
    ``<|box_start|>``/``<|box_end|>`` tokens. The coordinate space is the caller's business
    (:mod:`mmgrpo.rewards.visual`); nothing is reordered or clipped here.
    """
    out = []
    for m in _BOX_RE.finditer(text):
        groups = m.groups()
        nums = groups[:4] if groups[0] is not None else groups[4:]
        out.append([_to_float(g) for g in nums])
    return out


def parse_box(text: str, which: Which = "first") -> list[float] | None:
    """The first (default) or last box in ``text``; ``None`` when there is none."""
    return _pick(parse_boxes(text), which)


def parse_points(text: str) -> list[list[float]]:
    """Every 2-D point ``(x, y)`` / ``[x, y]`` in ``text`` (e.g. ``{"point_2d": [x, y]}``), as ``[x, y]``.

    Pairs that are half of a Qwen2-VL box ``(x1,y1),(x2,y2)`` are skipped.
    """
    box_spans = [m.span() for m in _BOX_RE.finditer(text)]  # in order, disjoint
    out, j = [], 0
    for m in re.finditer(rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*[\])]", text):
        while j < len(box_spans) and box_spans[j][1] <= m.start():  # one sweep: linear, not points x boxes
            j += 1
        if j < len(box_spans) and box_spans[j][0] <= m.start():
            continue
        out.append([_to_float(m.group(1)), _to_float(m.group(2))])
    return out


def parse_point(text: str, which: Which = "first") -> list[float] | None:
    """The first (default) or last point in ``text``; ``None`` when there is none."""
    return _pick(parse_points(text), which)


def parse_choice(text: str, choices: str = "ABCDEFGH", which: Which = "first") -> str | None:
    """The option letter a model chose, upper-case, or ``None``.

    Strips a leading "The answer is"/"Answer:"/"Option" (VideoChat-R1's GQA reward does the same), then takes
    a letter of ``choices`` that stands alone: ``"B"``, ``"(B)"``, ``"B."``, ``"B) text"``. A letter inside a
    word (the "A" of "Apple") or the article "a" (lower case) is not a choice; nor is a bare "A" or "I"
    followed by a lower-case word ("A cat sits", "I think"), which is prose.
    """
    if text is None:
        return None
    text = _CHOICE_PREFIX_RE.sub("", text.strip())
    letters = re.escape(choices.upper())
    found = []
    for m in re.finditer(rf"(?<![A-Za-z0-9])([{letters}])(?![A-Za-z0-9])", text):
        letter, end = m.group(1), m.end()
        rest = text[end:]
        # "A cat" (article) vs "A. cat" / "A) cat" / "(A)": a bare letter followed by a space and a word is prose.
        bracketed = (m.start() > 0 and text[m.start() - 1] in "([") or rest[:1] in ").:]"
        if not bracketed and letter in "AI" and re.match(r"\s+[a-z]", rest):  # English words "A", "I"
            continue
        found.append(letter)
    return _pick(found, which)


def parse_choice_set(text: str, choices: str = "ABCDEFGH") -> set[str]:
    """The set of option letters in a multi-choice answer such as ``"A, C"`` or ``"(A)(C)"`` (TW-GRPO)."""
    if text is None:
        return set()
    text = _CHOICE_PREFIX_RE.sub("", text.strip())
    letters = re.escape(choices.upper())
    return set(re.findall(rf"(?<![A-Za-z0-9])([{letters}])(?![A-Za-z0-9])", text))


def parse_time(text: str) -> float | None:
    """Seconds from ``"12.5"``, ``"01:02.5"`` (mm:ss) or ``"1:02:03"`` (hh:mm:ss); ``None`` if unparsable."""
    text = text.strip()
    if re.fullmatch(_CLOCK_RE, text):
        parts = [float(p) for p in text.split(":")]
        secs = 0.0
        for p in parts:
            secs = secs * 60 + p
        return secs
    try:
        return float(text)
    except ValueError:
        return None


def parse_time_spans(text: str) -> list[tuple[float, float]]:
    """Every ``(start, end)`` span in seconds, in order.

    Accepts ``"12.5 to 17.8"`` (VideoChat-R1), ``"12.5 - 17.8"``, ``"12.5 and 17.8"``, ``"[12.5, 17.8]"``,
    ``"(12.5, 17.8)"``, clock times ``"00:12 to 00:17.5"``, trailing units ``"12.5s to 17.8s"`` and the JSON
    ``{"start_time": "12.5", "end_time": "17.8"}`` (Temporal-R1). ``start > end`` is kept as written: the
    reward decides (VideoChat-R1 scores it 0).
    """
    if text is None:
        return []
    spans = []
    for obj in _json_objects(text):
        if isinstance(obj, dict) and "start_time" in obj and "end_time" in obj:
            s, e = parse_time(str(obj["start_time"])), parse_time(str(obj["end_time"]))
            if s is not None and e is not None:
                spans.append((s, e))
    if spans:
        return spans
    for m in _SPAN_RE.finditer(text):
        s, e = parse_time(m.group(1)), parse_time(m.group(2))
        if s is not None and e is not None:
            spans.append((s, e))
    return spans


def parse_time_span(text: str, which: Which = "last") -> tuple[float, float] | None:
    """The first or last ``(start, end)`` span of :func:`parse_time_spans`; ``None`` when there is none."""
    return _pick(parse_time_spans(text), which)


def _json_objects(text: str) -> Iterable[Any]:
    """JSON objects/arrays found in ``text`` (best effort; malformed ones are skipped)."""
    dec = json.JSONDecoder()
    end = 0
    for m in re.finditer(r"[{\[]", text):  # one pass over the openers (not a find() per opener: quadratic)
        i = m.start()
        if i < end:  # inside the object just decoded
            continue
        try:
            obj, end = _decode_at(dec, text, i)
        except ValueError:
            continue
        yield obj


def _decode_at(dec: json.JSONDecoder, text: str, i: int) -> tuple[Any, int]:
    """``dec.raw_decode(text, i)`` for an object or array at ``i``, on a window of the text that doubles while
    the value runs past its end. ``raw_decode`` on the whole text costs O(i) per failure (its error counts the
    lines before ``i``), which made scanning ``"{" * 80_000`` quadratic (3 s); a value that closes inside a window
    decodes exactly as in the whole text."""
    width = 256
    while True:
        chunk = text[i : i + width]
        try:
            obj, end = dec.raw_decode(chunk)
            return obj, i + end
        except json.JSONDecodeError as e:
            cut = i + width < len(text) and (e.pos >= len(chunk) - 8 or e.msg.startswith("Unterminated string"))
            if not cut:
                raise
            width *= 2


def parse_json(text: str) -> Any:
    """The first JSON value in ``text`` (inside a ```json fence or not), tolerating single quotes and a
    trailing comma; ``None`` when none parses."""
    if text is None:
        return None
    fence = re.search(r"```(?:json)?\s*(.*?)```", text, flags=re.DOTALL)
    if fence:
        text = fence.group(1)
    repaired = re.sub(r",\s*([\]}])", r"\1", text.replace("'", '"'))
    dec = json.JSONDecoder()
    for candidate in (text, repaired):  # the outermost value first, as written, then repaired
        starts = [p for p in (candidate.find("{"), candidate.find("[")) if p >= 0]
        if starts:
            try:
                return dec.raw_decode(candidate, min(starts))[0]
            except ValueError:
                pass
    for obj in _json_objects(repaired):  # else any inner value that parses
        return obj
    return None
