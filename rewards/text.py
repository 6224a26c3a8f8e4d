"""Text rewards: format, accuracy (exact, multiple choice, numeric, math), ROUGE, BLEU, length and repetition.

Every reward has the signature ``f(completions, *, prompts=None, <options>, **columns) -> list[float | None]``.
The ground truth is the column named by ``answer_key`` (default ``"answer"``); a sample whose ground truth is
``None`` scores ``None`` (not applicable). The prediction is the content of the ``<answer>`` tag
(``which="last"`` by default, ``"first"`` on request); with ``require_tags=False`` a completion without tags
is scored on its whole text. A missing or unclosed tag with ``require_tags=True`` scores 0 (a wrong answer,
not "not applicable").

Formulas and sources: Video-R1 (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``, arXiv 2503.21776),
VideoChat-R1 (OpenGVLab/VideoChat-R1, arXiv 2504.06958), TW-GRPO (arXiv 2505.24718), BLEU (arXiv 2509.16990),
VLM-R1 length/repetition (om-ai-lab/VLM-R1) and the papers cited per function.
"""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import math
import operator
import re
import string
import threading
import unicodedata
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ._common import group_ids, lengths, option, per_answer, reward_signature
from .parsing import (
    NUMBER_PATTERN as _NUM_PATTERN,
)
from .parsing import (
    Which,
    completion_text,
    extract_tag,
    ground_truth_text,
    is_think_answer_format,
    parse_choice,
    parse_choice_set,
    parse_number,
)
from .registry import register_reward


@register_reward(
    "format",
    "1 if the completion is exactly <think>…</think><answer>…</answer> (think=False: <answer>…</answer>), else 0",
)
def format_reward(completions: list, *, prompts: list | None = None, think: bool = True, **columns: Any) -> list[float]:
    """Think/answer format reward.

    ``r = 1`` if the completion is exactly ``<think>…</think><answer>…</answer>`` (``think=False``: exactly
    ``<answer>…</answer>``), whitespace tolerated around and between the blocks; else ``0``.

    Source: DeepSeek-R1's format reward as used by R1-V, Video-R1 and VideoChat-R1
    (``re.fullmatch(r"<think>.*?</think>\\s*<answer>.*?</answer>", DOTALL)``) and R1-AQA's answer-only variant
    (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``; xiaomi-research/r1-aqa, arXiv 2503.11197).
    Departure: a block may not contain another think/answer tag, so two ``<answer>``
    blocks fail here while they pass the reference implementations' regex (see
    :func:`~mmgrpo.rewards.parsing.is_think_answer_format`).
    """
    return [float(is_think_answer_format(completion_text(c), think=think)) for c in completions]


def _casefold(s: str) -> str:
    return s.strip().casefold()


@register_reward("accuracy", "1 if the <answer> content equals the answer column (strip, casefold), else 0")
@per_answer("accuracy")
def accuracy(pred: Any, gt: Any, *, which: Which) -> float:
    """Exact-match accuracy on the ``<answer>`` content.

    ``r = 1[norm(answer(completion)) == norm(gt)]`` with ``norm(s) = s.strip().casefold()``; ``answer`` is the
    ``which`` (``"last"`` by default) ``<answer>…</answer>`` content, or the whole completion when it has no
    tags and ``require_tags=False``. ``None`` when the sample's ground truth is ``None``.

    Source: R1-AQA / R1-V exact-match fallback and VideoChat-R1's classification reward
    (xiaomi-research/r1-aqa, arXiv 2503.11197; Deep-Agent/R1-V ``src/r1-v/src/open_r1/grpo.py``;
    OpenGVLab/VideoChat-R1 ``src/open_r1/grpo_tasks.py``); the explicit ``which`` fixes their silent
    first-vs-last ``<answer>`` divergence.
    """
    return float(pred is not None and _casefold(pred) == _casefold(ground_truth_text(gt, which)))


_ARTICLES = re.compile(r"\b(a|an|the)\b", re.IGNORECASE)
_PUNCT = re.compile(rf"[{re.escape(string.punctuation)}]")


def normalize_answer(text: str, mode: str = "basic") -> str:
    """Normalise an answer for comparison.

    ``"none"``: as is. ``"basic"``: Unicode NFKC, strip, casefold, collapse whitespace. ``"loose"``: basic,
    then remove punctuation and the articles a/an/the (SQuAD's normalisation, Rajpurkar et al. 2016).
    """
    if mode == "none":
        return text
    if mode not in ("basic", "loose"):
        raise ValueError(f"normalize must be 'none', 'basic' or 'loose', got {mode!r}")
    text = unicodedata.normalize("NFKC", text).casefold()
    if mode == "loose":
        text = _ARTICLES.sub(" ", _PUNCT.sub(" ", text))
    return " ".join(text.split())


@register_reward("exact_match", "1 if the answer equals the ground truth (or any of a list) after normalisation")
@per_answer("exact_match")
def exact_match(pred: Any, gt: Any, *, which: Which, normalize: str = "basic") -> float:
    """Exact match with a chosen normalisation and several acceptable answers.

    ``r = 1[∃ g ∈ gts: normalize(answer) == normalize(g)]`` where ``gts`` is the ground truth, or the list of
    ground truths when the column holds a list. ``normalize`` is one of ``"none"``, ``"basic"``, ``"loose"``
    (:func:`normalize_answer`). ``None`` when the ground truth is ``None``.

    Source: the exact-match accuracy of the anchors (OpenGVLab/VideoChat-R1 ``src/open_r1/grpo_tasks.py``;
    Deep-Agent/R1-V ``src/r1-v/src/open_r1/grpo.py``) with SQuAD-style normalisation.
    """
    gts = gt if isinstance(gt, (list, tuple, set)) else [gt]
    return float(
        pred is not None
        and normalize_answer(pred, normalize) in {normalize_answer(ground_truth_text(g, which), normalize) for g in gts}
    )


@register_reward("multiple_choice", "1 if the chosen option letter equals the ground-truth letter")
@per_answer("multiple_choice")
def multiple_choice(pred: Any, gt: Any, *, which: Which, choices: str = "ABCDEFGH") -> float:
    """Multiple-choice accuracy on the option letter.

    ``r = 1[letter(answer) == letter(gt)]``, where ``letter`` is :func:`~mmgrpo.rewards.parsing.parse_choice`
    (strips "The answer is", reads ``"B"``, ``"(B)"``, ``"B. text"``; the article "A" in prose is not a
    choice). A ground truth without a letter raises ``ValueError`` (a data error).

    Source: Video-R1's multiple-choice reward and VideoChat-R1's GQA ``answer_reward`` (tulerfeng/Video-R1
    ``src/r1-v/src/open_r1/grpo.py``; OpenGVLab/VideoChat-R1 ``src/open_r1/grpo_tasks.py``).
    """
    gt_letter = parse_choice(ground_truth_text(gt, which), choices)
    if gt_letter is None:
        raise ValueError(f"reward 'multiple_choice': ground truth {gt!r} has no option letter among {choices!r}")
    return float(pred is not None and parse_choice(pred, choices) == gt_letter)


@register_reward(
    "multiple_choice_partial", "|pred|/|gt| if the chosen letters are a non-empty subset of the correct ones, else 0"
)
@per_answer("multiple_choice_partial")
def multiple_choice_partial(pred: Any, gt: Any, *, which: Which, choices: str = "ABCDEFGH") -> float:
    """Partial credit for multi-answer multiple choice.

    With P the set of letters in the answer and G the correct set: ``r = |P|/|G|`` if ``∅ ≠ P ⊆ G``, else 0
    (any wrong letter gives 0). An empty ground-truth set raises ``ValueError``.

    Source: TW-GRPO's multi-choice soft reward (arXiv 2505.24718; longmalongma/TW-GRPO, arXiv 2505.24718).
    """
    gt_set = set(gt) if isinstance(gt, (list, tuple, set)) else parse_choice_set(ground_truth_text(gt, which), choices)
    if not gt_set:
        raise ValueError(f"reward 'multiple_choice_partial': ground truth {gt!r} has no option letters")
    p = parse_choice_set(pred, choices) if pred is not None else set()
    return len(p) / len(gt_set) if p and p <= gt_set else 0.0


# --- math -------------------------------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``) with balanced braces; ``None`` if there is none."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    i = start = starts[-1]
    depth = 1
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
        i += 1
    return None  # unbalanced: truncated


def _strip_braced(expr: str, command: str, repl: str) -> str:
    """Rewrite ``\\command{a}{b}`` (two groups) or ``\\command{a}`` (one) with ``repl`` formatted by the groups."""
    pattern = re.compile(rf"\\{command}\s*\{{([^{{}}]*)\}}" + (r"\s*\{([^{}]*)\}" if "{1}" in repl else ""))
    prev = None
    while prev != expr:
        prev, expr = expr, pattern.sub(lambda m: repl.format(*m.groups()), expr)
    return expr


def normalize_math(expr: str) -> str:
    """A simple, robust normalisation of a math answer (no LaTeX parser).

    Removes ``$``, ``\\left``/``\\right``, spacing commands, ``\\text{…}``/``\\mathrm{…}`` wrappers, degree and
    percent signs, a leading ``x =``, a trailing period and all whitespace; maps ``\\dfrac``/``\\tfrac`` to
    ``\\frac``, ``\\frac{a}{b}`` (``\\frac12``) to ``(a)/(b)``, ``\\sqrt{a}`` (``\\sqrt8``) to ``sqrt(a)``,
    ``\\cdot``/``\\times`` to ``*``,
    ``^`` to ``**``, ``\\pi`` to ``pi``, and thousands separators ``1,000`` to ``1000``.
    """
    s = expr.strip()
    s = s.replace("$", "").replace("\\left", "").replace("\\right", "")
    for cmd in (r"\!", r"\,", r"\;", r"\:", r"\quad", r"\qquad", "\\ "):
        s = s.replace(cmd, "")
    s = re.sub(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("°", "").replace("\\%", "").replace("%", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)  # \frac12: one token per argument, as in LaTeX
    s = re.sub(r"\\sqrt\s*(\d)", r"\\sqrt{\1}", s)  # \sqrt8
    prev = None
    while prev != s:  # innermost first, whichever command it is: \frac{\sqrt{3}}{2}, \sqrt{\frac{1}{2}}
        prev = s
        s = _strip_braced(s, "frac", "({0})/({1})")
        s = _strip_braced(s, "sqrt", "sqrt({0})")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi").replace("^", "**")
    s = s.replace("{", "(").replace("}", ")")
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)
    s = s.rstrip(".").strip()
    return re.sub(r"\s+", "", s)


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


MAX_MATH_CHARS = 256
"""Longest answer (characters) the math checks look at; longer ones score 0. Final answers are short, and
parsing unbounded model output (``"(1," * 200``) can exhaust the parser's memory or take seconds."""


def safe_eval(expr: str) -> float | None:
    """Evaluate a normalised arithmetic expression (numbers, + − * / **, unary ±, ``sqrt``, ``pi``, ``e``)
    without ``eval``; ``None`` if it is anything else, too large, longer than :data:`MAX_MATH_CHARS`, nested
    deeper than 32 brackets, or divides by zero."""
    if len(expr) > MAX_MATH_CHARS or _depth(expr) > 32:
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in ("pi", "e"):
            return math.pi if node.id == "pi" else math.e
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            v = ev(node.operand)
            return v if isinstance(node.op, ast.UAdd) else -v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 1e6):
                raise OverflowError
            return _BINOPS[type(node.op)](a, b)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "sqrt"
            and len(node.args) == 1
        ):
            v = ev(node.args[0])
            if v < 0:
                raise ValueError
            return math.sqrt(v)
        raise ValueError

    try:
        value = ev(tree)
    except (ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError):
        return None
    return value if isinstance(value, float) and math.isfinite(value) else None


def _depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        depth += ch in "(["
        depth -= ch in ")]"
        deepest = max(deepest, depth)
    return deepest


def _split_top(s: str) -> list[str]:
    """Split on commas outside brackets; strip one pair of enclosing brackets first (tuples, intervals, sets)."""
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        depth = 0
        for i, ch in enumerate(s):
            depth += ch in "(["
            depth -= ch in ")]"
            if depth == 0 and i < len(s) - 1:
                break
        else:
            s = s[1:-1]
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "(["
        depth -= ch in ")]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


MAX_RESULT_BITS = 1 << 16
"""Largest number (in bits, about 20,000 decimal digits) that the math checks let sympy compute exactly. A power
tower such as ``9^{9^{9}}`` has about 1.2e9 bits: sympy computes it exactly when it compares (``doit``), in one
C-level integer power that holds the GIL for minutes and that no signal interrupts. Such an answer is "not
parsed" (so it scores 0 unless the plain check matches it), in milliseconds."""


def _log2_bound(expr: Any, depth: int = 0) -> float:
    """An upper bound on ``log2 |value|`` of a numeric sympy expression, computed in floats without evaluating
    it (``inf`` when the bound itself overflows); 0 for symbols and for nodes it does not model."""
    import sympy

    if depth > 64:
        return math.inf
    if isinstance(expr, sympy.Integer):
        return float(abs(int(expr)).bit_length())
    if isinstance(expr, sympy.Rational):
        return float(max(abs(expr.p).bit_length(), abs(expr.q).bit_length()))
    if isinstance(expr, sympy.Float):
        return math.log2(abs(float(expr)) + 1.0) if math.isfinite(float(expr)) else math.inf
    if isinstance(expr, sympy.Pow):
        base, exp = _log2_bound(expr.base, depth + 1), _log2_bound(expr.exp, depth + 1)
        if exp > 1000:  # the exponent alone exceeds 2**1000
            return math.inf
        return max(base, 1.0) * 2.0**exp
    if isinstance(expr, sympy.factorial):
        n = _log2_bound(expr.args[0], depth + 1)
        if n > 1000:
            return math.inf
        return 2.0**n * max(n, 1.0)  # log2(m!) <= m log2 m with m <= 2**n
    if isinstance(expr, sympy.Mul):
        return sum(_log2_bound(a, depth + 1) for a in expr.args)
    if expr.args:
        return max(_log2_bound(a, depth + 1) for a in expr.args) + math.log2(len(expr.args))
    return 0.0


def _too_large(parsed: list) -> bool:
    """True if any sympy expression in math-verify's parse result would be a number over :data:`MAX_RESULT_BITS`
    bits when evaluated."""
    import sympy

    for item in parsed:
        if isinstance(item, sympy.Basic):
            try:
                if _log2_bound(item) > MAX_RESULT_BITS:
                    return True
            except (TypeError, ValueError, OverflowError, RecursionError):
                return True
    return False


def _math_verify_timeout() -> int | None:
    """math-verify's own per-call timeout (``signal.alarm``, 5 s, the library's default) where it can work: in
    the main thread, which a reward is in when the reward runner runs it in a worker process. In other
    threads ``None`` (signals cannot be set there); the runner's ``timeout_s`` bounds the call instead."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_verify_parse(text: str) -> list | None:
    """``math_verify.parse`` of ``text`` as LaTeX between ``$``, else as is; ``None`` when the library is not
    installed, nothing parses, or the value would be too large to compare (:data:`MAX_RESULT_BITS`)."""
    try:
        from math_verify import parse
    except ImportError:
        return None
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call when timeouts are off
    timeout = _math_verify_timeout()
    try:
        found = parse(f"${text}$", parsing_timeout=timeout) or parse(text, parsing_timeout=timeout)
    except Exception:
        return None
    if not found or _too_large(found):
        return None
    return found


def _math_verify(pred: str, gt: str) -> bool | None:
    """``math_verify.verify`` of the two answers (each parsed by :func:`math_verify_parse`); ``None`` when the
    library is not installed or cannot parse one of them. Bounded: answers whose value would exceed
    :data:`MAX_RESULT_BITS` are not compared, and math-verify's own timeouts are on where signals work
    (:func:`_math_verify_timeout`)."""
    try:
        from math_verify import verify
    except ImportError:
        return None
    parsed = []
    for text in (gt, pred):
        found = math_verify_parse(text)
        if found is None:
            return None
        parsed.append(found)
    try:
        return bool(verify(parsed[0], parsed[1], timeout_seconds=_math_verify_timeout()))
    except Exception:
        return None


def _warm_math_verify() -> None:
    """Import math-verify and sympy and parse once (about 1.3 s the first time): the reward runner calls this in
    its own process, so its forked workers start warm."""
    _math_verify("1", "1")


def math_equal(pred: str, gt: str, rel_tol: float = 1e-6, verifier: str = "auto") -> bool:
    """True if two math answers agree.

    ``verifier="auto"`` (default): ``math-verify`` says equal (symbolic: ``\\frac12`` = ``0.5``,
    ``2\\sqrt{2}`` = ``\\sqrt{8}``, sets, ``50\\%`` = ``0.5``), or the hand-written check below does.
    ``"math_verify"``: the library only (``ImportError`` when it is missing). ``"simple"``: the hand-written
    check only: equal after :func:`normalize_math`, or equal as numbers (relative tolerance ``rel_tol``),
    element-wise for comma-separated tuples. Answers longer than :data:`MAX_MATH_CHARS` are not equal.
    """
    if verifier not in ("auto", "math_verify", "simple"):
        raise ValueError(f"verifier must be 'auto', 'math_verify' or 'simple', got {verifier!r}")
    if len(pred) > MAX_MATH_CHARS or len(gt) > MAX_MATH_CHARS:
        return False
    if verifier != "simple":
        verdict = _math_verify(pred, gt)
        if verifier == "math_verify":
            if verdict is None:
                import math_verify  # noqa: F401  (raises ImportError with the package name when it is missing)
            return bool(verdict)
        if verdict:
            return True
    return _simple_math_equal(pred, gt, rel_tol)


def _simple_math_equal(pred: str, gt: str, rel_tol: float) -> bool:
    a, b = normalize_math(pred), normalize_math(gt)
    if not a or not b:
        return False
    if a == b:
        return True
    pa, pb = _split_top(a), _split_top(b)
    if len(pa) != len(pb):
        return False
    for x, y in zip(pa, pb):
        if x == y:
            continue
        vx, vy = safe_eval(x), safe_eval(y)
        if vx is None or vy is None or not math.isclose(vx, vy, rel_tol=rel_tol, abs_tol=1e-12):
            return False
    return True


_PLAIN_NUMBER_RE = re.compile(rf"\s*(?:{_NUM_PATTERN})\s*|\s*[-+]?\d+\s*/\s*\d+\s*")


def math_value(text: str) -> float | None:
    """The value of an answer as a float, read as ONE expression; ``None`` when it is not one number.

    In order: a plain number (``"1,234.5"``, ``"-2e3"``, ``"3/4"``); the hand-written reading
    (:func:`normalize_math` then :func:`safe_eval`: ``\\frac{\\sqrt3}{2}``, ``\\dfrac{\\sqrt5}{2}``, ``\\sqrt8``,
    ``2^{10}``, ``3\\cdot 4``, ``\\pi/2``); then, for LaTeX, math-verify's parse (:func:`math_verify_parse`:
    ``2\\sqrt{2}``, ``x = \\frac12`` (the right-hand side), ``50\\%``), evaluated numerically when it has no free
    symbol. Text without LaTeX (no ``\\``, ``^``, ``{``) that is none of these is prose, ``"about 42 apples"``: its
    last number. LaTeX that none of these reads (and, without math-verify installed, implicit products such as
    ``2\\sqrt{2}``) is not a number: ``None``. Values that would exceed :data:`MAX_RESULT_BITS` are ``None``.
    """
    s = text.strip()
    if not s:
        return None
    if _PLAIN_NUMBER_RE.fullmatch(s):
        return parse_number(s, which="last")
    latex = any(ch in s for ch in "\\^{")
    value = safe_eval(normalize_math(s)) if len(s) <= MAX_MATH_CHARS else None
    if value is None and latex and len(s) <= MAX_MATH_CHARS:
        value = _sympy_value(math_verify_parse(s))
    if value is None and not latex:
        value = parse_number(s, which="last")
    return value if value is not None and math.isfinite(value) else None


def _sympy_value(parsed: list | None) -> float | None:
    """The float value of the first sympy expression math-verify parsed (an equation's right-hand side)."""
    if not parsed:
        return None
    try:
        import sympy

        expr = parsed[0]
        if isinstance(expr, sympy.Eq):
            expr = expr.rhs
        if not isinstance(expr, sympy.Expr) or not expr.is_number:
            return None
        value = complex(expr.evalf(30))
    except Exception:  # sympy raises many types on odd input
        return None
    return value.real if value.imag == 0 and math.isfinite(value.real) else None


def _gt_value(gt: Any, which: Which, reward: str) -> float:
    if isinstance(gt, (int, float)) and not isinstance(gt, bool):
        return float(gt)
    value = math_value(ground_truth_text(gt, which))
    if value is None:
        raise ValueError(
            f"reward {reward!r}: cannot read a number from the ground truth {gt!r} (a number, a fraction, or one "
            "LaTeX expression such as \\frac{\\sqrt3}{2})"
        )
    return value


@register_reward(
    "numeric",
    "1 if the answer's value is within tolerance of the ground truth: |p-g| <= max(abs_tol, rel_tol*|g|)",
    unbounded=True,
    preload=_warm_math_verify,
)
@per_answer("numeric")
def numeric(pred: Any, gt: Any, *, which: Which, abs_tol: float = 1e-9, rel_tol: float = 1e-6) -> float:
    """Numeric accuracy with a tolerance, on the whole answer.

    ``p`` = :func:`math_value` of the answer (the whole expression: ``\\dfrac{\\sqrt5}{2}`` is 1.118, not its
    last number 2; ``"1,234.5"``, ``"3/4"``, ``"-2e3"``, ``\\sqrt8``; prose such as ``"about 42"`` gives its last
    number), ``g`` = the same of the ground truth; ``r = 1[|p − g| ≤ max(abs_tol, rel_tol·|g|)]``. An answer
    that is not one number (LaTeX that does not parse, a non-finite value) gives 0; a ground truth that is not
    one raises ``ValueError`` naming it. Video-R1's numerical reward ``round(p, 2) == round(g, 2)`` is close to
    ``abs_tol=0.005, rel_tol=0`` (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``).

    Source: Video-R1's numerical accuracy reward (arXiv 2503.21776; tulerfeng/Video-R1
    ``src/r1-v/src/open_r1/grpo.py``), with an explicit tolerance instead of its "exactly one side has a decimal
    point → 0" rule, and whole expressions read by HF ``math-verify`` (github.com/huggingface/Math-Verify).
    """
    g = _gt_value(gt, which, "numeric")
    p = math_value(pred) if pred is not None else None
    return float(p is not None and abs(p - g) <= max(abs_tol, rel_tol * abs(g)))


@register_reward(
    "regression",
    "1 - clip(|p-g|/|g|, 0, 1): relative-error credit for a numeric answer",
    unbounded=True,
    preload=_warm_math_verify,
)
@per_answer("regression")
def regression(pred: Any, gt: Any, *, which: Which) -> float:
    """Relative-error reward for numeric answers.

    ``r = 1 − clip(|p − g| / |g|, 0, 1)``, ``p`` and ``g`` read as in :func:`numeric` (whole expressions). When
    ``g = 0`` this is ``1[p = 0]``: the limit of Video-R1's ``(|p−g| + 1e-9)/(|g| + 1e-9)``
    (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``), without its division by ~0 (an unguarded division in
    the original). No number → 0.

    Source: Video-R1's regression reward (arXiv 2503.21776; tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``).
    """
    g = _gt_value(gt, which, "regression")
    p = math_value(pred) if pred is not None else None
    if p is None:
        return 0.0
    return float(p == 0) if g == 0 else 1.0 - min(1.0, abs(p - g) / abs(g))


@register_reward("last_number", "1 if the last number of the reply (or of its <answer>) equals the ground truth")
@per_answer("last_number", require_tags=False)
def last_number(pred: Any, gt: Any, *, which: Which, abs_tol: float = 1e-9) -> float:
    """Accuracy of the last number a reply states: a small instruct model's natural answer, no tags needed.

    ``p`` = the last number (:func:`~mmgrpo.rewards.parsing.parse_number`, ``fractions=False``: ``"1,234"`` →
    1234, ``"-3"`` → −3, ``"3/4"`` → 4) of the ``<answer>`` content, or of the whole reply when it has no tag
    (``require_tags=False`` by default); ``g`` = the ground truth's number (an int / float, or the last number of
    its text). ``r = 1[|p − g| ≤ abs_tol]``; a reply with no number scores 0. "5 + 7 = 12" → 12 (right for 12);
    "5 + 7" → 7 (no expression is evaluated: only a stated result counts). A reply cut off after "so 5 + 7 ="
    reads 7, so a truncated answer is wrong, as it should be.

    Source: the "flexible-extract" filter of EleutherAI's lm-evaluation-harness GSM8K task (the last number in the
    generation, ``lm_eval/tasks/gsm8k/gsm8k.yaml``), with ``,`` thousands groups read and a tolerance.
    """
    if isinstance(gt, (int, float)) and not isinstance(gt, bool):
        g = float(gt)
    else:
        g = parse_number(ground_truth_text(gt, which), which="last", fractions=False)
        if g is None:
            raise ValueError(f"reward 'last_number': the ground truth {gt!r} has no number")
    p = parse_number(pred, which="last", fractions=False) if pred is not None else None
    return float(p is not None and abs(p - g) <= abs_tol)


def _boxed_answer(completion: Any, which: Which, require_tags: bool) -> str | None:
    """math_accuracy's answer: the last ``\\boxed{}`` in the ``<answer>`` content, else in the text, else the
    ``<answer>`` content (the whole text when tags are not required)."""
    text = completion_text(completion)
    tagged = extract_tag(text, "answer", which)
    pred = (last_boxed(tagged) if tagged is not None else None) or last_boxed(text) or tagged
    return text.strip() if pred is None and not require_tags else pred


@register_reward(
    "math_accuracy",
    "1 if the final math answer (last \\boxed{} or <answer>) equals the ground truth, normalised or numerically",
    unbounded=True,
    preload=_warm_math_verify,
)
@per_answer("math_accuracy", require_tags=False, extract=_boxed_answer)
def math_accuracy(pred: Any, gt: Any, *, which: Which, rel_tol: float = 1e-6, verifier: str = "auto") -> float:
    """Math answer accuracy: ``math-verify`` (symbolic), then a numeric check.

    The prediction is the last ``\\boxed{…}`` in the ``<answer>`` content, else the last one in the whole
    completion, else the ``<answer>`` content, else (``require_tags=False``, the default here) the whole
    completion. The ground truth may itself hold a ``\\boxed{}``. ``r = 1[math_equal(pred, gt)]``:
    equal after :func:`normalize_math`, or numerically equal (``\\frac{1}{2}`` = ``0.5`` = ``1/2``,
    ``2\\sqrt{2}`` is not parsed — write ``2*\\sqrt{2}``), element-wise for tuples.

    The ground truth is read with the same rules (``"<answer> \\frac{1}{2} </answer>"`` and ``"\\boxed{3}"``
    are answers, not text). ``verifier`` is :func:`math_equal`'s: ``"auto"`` accepts what ``math-verify``
    accepts and, in addition, what the hand-written check accepts (a numeric tolerance ``rel_tol`` and
    comma-separated tuples compared element-wise, which math-verify may leave unparsed).

    Source: HF ``math-verify`` (github.com/huggingface/Math-Verify), the checker of TRL's ``accuracy_reward``
    (trl/rewards/accuracy_rewards.py) and of R1-V (github.com/Deep-Agent/R1-V, ``src/open_r1/grpo.py``) and
    VLM-R1 (github.com/om-ai-lab/VLM-R1, ``src/open-r1-multimodal/src/open_r1/grpo_rec.py``).
    """
    g_text = completion_text(gt) if not isinstance(gt, (int, float)) else str(gt)
    g_tag = extract_tag(g_text, "answer", which)
    g = (
        (last_boxed(g_tag) if g_tag is not None else None)
        or last_boxed(g_text)
        or (g_tag if g_tag is not None else g_text.strip())
    )
    return float(pred is not None and math_equal(pred, g, rel_tol, verifier=verifier))


# --- similarity to a reference ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _rouge_scorer(types: tuple[str, ...], use_stemmer: bool):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(types), use_stemmer=use_stemmer)


@register_reward("rouge", "mean F1 of ROUGE-1/2/L (rouge-score, Porter stemmer) against the reference, in [0, 1]")
@per_answer("rouge")
def rouge(
    pred: Any,
    gt: Any,
    *,
    which: Which,
    rouge_types: tuple[str, ...] = ("rouge1", "rouge2", "rougeL"),
    use_stemmer: bool = True,
) -> float:
    """ROUGE reward for free-form answers.

    ``r = mean_{t ∈ rouge_types} F1_t(answer, reference)`` with Google's ``rouge-score`` (Lin 2004). An empty
    answer or reference gives 0 (no n-grams to match).

    Source: Video-R1's free-form reward ``clip(mean(F1 of ROUGE-1, ROUGE-2, ROUGE-L), 0, 1)`` with the stemmer
    (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``).
    """
    ref = ground_truth_text(gt, which)
    if not pred or not ref:
        return 0.0
    scores = _rouge_scorer(tuple(rouge_types), use_stemmer).score(ref, pred)
    return min(1.0, max(0.0, sum(scores[t].fmeasure for t in rouge_types) / len(rouge_types)))


@register_reward("bleu", "sentence BLEU (sacrebleu, exp smoothing) / 100 against one or more references, in [0, 1]")
@per_answer("bleu")
def bleu(
    pred: Any,
    gt: Any,
    *,
    which: Which,
    smooth_method: str = "exp",
    tokenize: str = "13a",
    lowercase: bool = False,
) -> float:
    """Sentence-level BLEU.

    ``r = sacrebleu.sentence_bleu(answer, refs, smooth_method, tokenize, lowercase).score / 100`` (Papineni et
    al. 2002; Post 2018). ``refs`` is the ground truth, or its items when the column holds a list. An empty
    answer gives 0.

    Source: BLEU as the GRPO reward for spoken QA and speech translation (IBM, arXiv 2509.16990; arXiv 2509.16990),
    "sentence BLEU with smoothing, scaled to [0, 1]".
    """
    import sacrebleu

    refs = [ground_truth_text(g, which) for g in (gt if isinstance(gt, (list, tuple)) else [gt])]
    if not pred:
        return 0.0
    score = sacrebleu.sentence_bleu(pred, refs, smooth_method=smooth_method, tokenize=tokenize, lowercase=lowercase)
    return score.score / 100.0


# --- length and repetition --------------------------------------------------------------------------------


def per_length(
    name: str, *, grouped: bool = False
) -> Callable[[Callable[..., list[float | None]]], Callable[..., list[float | None]]]:
    """The shape of the length rewards: write the rule on correctness and lengths only.

    The decorated function ``rule(correct, lens, [groups,] *, <options>)`` gets, for the B completions,
    ``correct`` (1/0 as :func:`accuracy` scores them, ``None`` where the ground truth is ``None``), ``lens`` (the
    lengths in ``unit``, :func:`~mmgrpo.rewards._common.lengths`) and, with ``grouped``, ``groups`` (the
    ``group_key`` column, else equal prompts: :func:`~mmgrpo.rewards._common.group_ids`). The decorator returns
    the reward with the public signature
    ``(completions, *, prompts=None, <options>, unit="tokens", [group_key="group_id",] which="last",
    answer_key="answer", require_tags=True, **columns)`` and its annotations (what YAML ``kwargs`` are checked and
    coerced against).
    """
    shared = [
        option("unit", "tokens", "str"),
        *([option("group_key", "group_id", "str")] if grouped else []),
        option("which", "last", "Which"),
        option("answer_key", "answer", "str"),
        option("require_tags", True, "bool"),
    ]

    def deco(rule: Callable[..., list[float | None]]) -> Callable[..., list[float | None]]:
        options = [p for p in inspect.signature(rule).parameters.values() if p.kind is p.KEYWORD_ONLY]

        @functools.wraps(rule)
        def reward(
            completions: list,
            *,
            prompts: list | None = None,
            unit: str = "tokens",
            which: Which = "last",
            answer_key: str = "answer",
            require_tags: bool = True,
            **kwargs: Any,
        ) -> list[float | None]:
            opts = {p.name: kwargs.pop(p.name) for p in options if p.name in kwargs}
            group_key = kwargs.pop("group_key", "group_id") if grouped else None
            columns = kwargs
            correct = accuracy(completions, which=which, answer_key=answer_key, require_tags=require_tags, **columns)
            lens = lengths(completions, columns, unit, name)
            if not grouped:
                return rule(correct, lens, **opts)
            groups = group_ids(prompts if prompts is not None else [None] * len(completions), columns, group_key)
            return rule(correct, lens, groups, **opts)

        reward.__signature__ = reward_signature([*options, *shared])
        # the public parameters' annotations, not the rule's: check_kwargs reads them with typing.get_type_hints
        reward.__annotations__ = {n: p.annotation for n, p in reward.__signature__.parameters.items()}
        reward.__annotations__["return"] = reward.__signature__.return_annotation
        return reward

    return deco


def cosine_interp(length: float, max_len: float, start: float, end: float) -> float:
    """``end + (start − end)·(1 + cos(π·length/max_len))/2``: ``start`` at length 0, ``end`` at ``max_len``."""
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * length / max_len))


@register_reward(
    "length_cosine",
    "cosine length reward: short correct answers earn most, short wrong ones lose most (Yeo et al. 2025)",
)
@per_length("length_cosine")
def length_cosine(
    correct: list[float | None],
    lens: list[int],
    *,
    max_len: int = 1000,
    correct_start: float = 1.0,
    correct_end: float = 0.5,
    wrong_start: float = -1.0,
    wrong_end: float = -0.5,
    exceed: float | None = None,
) -> list[float | None]:
    """Cosine length-scaled correctness reward.

    With L the completion length (``unit``: ``"tokens"`` from the ``completion_ids`` column, ``"words"`` or
    ``"chars"``) and ``c = 1[correct]`` as in :func:`accuracy`::

        r = r_end + (r_start − r_end)·(1 + cos(π·L/max_len))/2,   (r_start, r_end) = correct ? (correct_start,
        correct_end) : (wrong_start, wrong_end)

    so a correct answer earns ``correct_start`` at L=0 falling to ``correct_end`` at ``max_len``, and a wrong one
    loses most when short (``wrong_start``) and least when long (``wrong_end``). ``L > max_len`` gives ``exceed``
    if set, else the end value. ``None`` when the ground truth is ``None``.

    Source: the cosine reward of Yeo et al. 2025, "Demystifying Long Chain-of-Thought Reasoning in LLMs"
    (arXiv 2502.03373, §4), whose defaults are ``correct 2→1, wrong −10→0, exceed −10``; the defaults here are
    the smaller open-r1 / VLM-R1 values (``1→0.5``, ``−1→−0.5``, max 1000) that sit beside a 0/1 accuracy
    reward (om-ai-lab/VLM-R1 ``src/open-r1-multimodal/src/open_r1/vlm_modules/qwen_module.py``).
    """
    if max_len <= 0:
        raise ValueError(f"length_cosine: max_len must be > 0, got {max_len}")
    out: list[float | None] = []
    for c, L in zip(correct, lens):
        if c is None:
            out.append(None)
        elif max_len < L and exceed is not None:
            out.append(float(exceed))
        else:
            start, end = (correct_start, correct_end) if c else (wrong_start, wrong_end)
            out.append(cosine_interp(min(L, max_len), max_len, start, end))
    return out


@register_reward("length_kimi", "Kimi k1.5 group length penalty: 0.5 - (len-min)/(max-min), wrong answers capped at 0")
@per_length("length_kimi", grouped=True)
def length_kimi(correct: list[float | None], lens: list[int], groups: list[Any]) -> list[float | None]:
    """Kimi k1.5 length penalty, relative to the group.

    For the samples of one group (the ``group_key`` column if present, else equal prompts) with lengths
    ``L_i`` (``unit`` as in :func:`length_cosine`)::

        λ_i = 0.5 − (L_i − min_j L_j) / (max_j L_j − min_j L_j);   r_i = λ_i if correct else min(0, λ_i)

    A group whose lengths are all equal has ``λ = 0`` (no division by zero). ``None`` when the ground truth
    is ``None``; such samples do not count in their group's min/max.

    Source: Kimi Team 2025, "Kimi k1.5: Scaling Reinforcement Learning with LLMs" (arXiv 2501.12599, §2.3.3).
    """
    members: dict[Any, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        if correct[i] is not None:
            members[g].append(i)
    out: list[float | None] = [None] * len(correct)
    for idx in members.values():
        lo, hi = min(lens[i] for i in idx), max(lens[i] for i in idx)
        for i in idx:
            lam = 0.0 if hi == lo else 0.5 - (lens[i] - lo) / (hi - lo)
            out[i] = lam if correct[i] else min(0.0, lam)
    return out


@register_reward(
    "length_band",
    "Video-R1 length bonus: +bonus for correct answers of length in [lo, hi] when >= min_correct of the group are",
)
@per_length("length_band", grouped=True)
def length_band(
    correct: list[float | None],
    lens: list[int],
    groups: list[Any],
    *,
    lo: int = 320,
    hi: int = 512,
    bonus: float = 0.2,
    min_correct: int = 2,
) -> list[float | None]:
    """Length-band bonus.

    ``r_i = bonus`` if sample i is correct (as in :func:`accuracy`), ``lo ≤ L_i ≤ hi`` and at least
    ``min_correct`` samples of its group (``group_key`` column, else equal prompts) are correct; else 0.
    ``None`` when the ground truth is ``None``.

    Source: Video-R1's length-control reward (arXiv 2503.21776; tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``):
    +0.2 for
    ``r_acc > 0.1`` and 320–512 tokens when more than one sample of the group is correct. Video-R1 reads the
    correctness from its first reward column; here it is recomputed with :func:`accuracy`.
    """
    n_correct: dict[Any, int] = defaultdict(int)
    for g, c in zip(groups, correct):
        n_correct[g] += bool(c)
    return [
        None if c is None else float(bonus) if (c and lo <= L <= hi and n_correct[g] >= min_correct) else 0.0
        for c, L, g in zip(correct, lens, groups)
    ]


@register_reward(
    "repetition_penalty", "n-gram repetition penalty: max_penalty * (1 - unique n-grams / n-grams), in [max_penalty, 0]"
)
def repetition_penalty(
    completions: list,
    *,
    prompts: list | None = None,
    ngram_size: int = 3,
    max_penalty: float = -1.0,
    **columns: Any,
) -> list[float]:
    """N-gram repetition penalty on the whole completion.

    With the lower-cased whitespace words of the completion and N its ``ngram_size``-grams:
    ``r = max_penalty · (1 − |unique(N)| / |N|)`` (0 for no repetition, ``max_penalty`` in the limit of one
    n-gram repeated). Fewer words than ``ngram_size`` (including the empty completion) gives 0.

    Source: the n-gram repetition penalty of Yeo et al. 2025 (arXiv 2502.03373) as implemented in open-r1 and
    VLM-R1 (``repetition``, max −1; om-ai-lab/VLM-R1 ``src/open-r1-multimodal/src/open_r1/vlm_modules/qwen_module.py``).
    """
    if ngram_size < 1:
        raise ValueError(f"repetition_penalty: ngram_size must be >= 1, got {ngram_size}")
    if max_penalty > 0:
        raise ValueError(f"repetition_penalty: max_penalty must be <= 0, got {max_penalty}")
    out = []
    for c in completions:
        words = completion_text(c).lower().split()
        grams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
        out.append(0.0 if not grams else max_penalty * (1.0 - len(set(grams)) / len(grams)))
    return out
