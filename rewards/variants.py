"""Rewards of the GRPO variants in docs/variants.md: test-time self-consistency (TTRV), step-wise rewards (R1-VL
StepRAR / StepRVR) and TempSamp-R1's asymmetric soft shaping of grounding rewards.

Every reward has the signature ``f(completions, *, prompts=None, <options>, **columns) -> list[float | None]``.
The fuzzy counting reward of CrowdVLM-R1 (``count_fuzzy``, :mod:`.visual`) and TW-GRPO's multi-choice soft reward
(``multiple_choice_partial``, :mod:`.text`) were already built in; docs/variants.md lists them with these.

Group-aware rewards (``self_consistency``) need to know which completions share a prompt: the trainer passes the
column ``group_index`` (b // G for the B = P·G completions, group-major); without it, completions with equal
prompts form a group.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from typing import Any

from ._common import group_ids, per_answer, whole_completion
from .parsing import Which, answer_or_text, completion_text, ground_truth_text, parse_number
from .registry import REWARDS, register_reward


def _norm(text: str) -> str:
    """Answer key for voting / matching: whitespace collapsed, case folded, trailing period dropped."""
    return " ".join(text.split()).casefold().rstrip(".")


def _same_answer(pred: str, gt: str) -> bool:
    """Equal after :func:`_norm`, or both a single number and numerically equal (rel. 1e-6)."""
    if _norm(pred) == _norm(gt):
        return True
    p, g = parse_number(pred, which="last"), parse_number(gt, which="last")
    return p is not None and g is not None and math.isclose(p, g, rel_tol=1e-6, abs_tol=1e-9)


# --- TTRV: self-consistency for test-time RL ------------------------------------------------------------------


@register_reward(
    "self_consistency",
    "TTRV test-time reward: the answer's frequency in its group (or 1 for the majority) + weight * log frequency",
)
def self_consistency(
    completions: list,
    *,
    prompts: list | None = None,
    vote: str = "frequency",
    entropy_weight: float = 0.0,
    which: Which = "last",
    require_tags: bool = True,
    group_key: str = "group_index",
    **columns: Any,
) -> list[float | None]:
    """Label-free self-consistency reward from the group's empirical answer distribution.

    Within a group of N completions (``group_key`` column, else equal prompts), with a_i the normalised answer of
    completion i and p̂(a) = (1/N)·#{j : a_j = a}::

        vote="frequency":  r_i = p̂(a_i) + λ·log p̂(a_i)                       (TTRV's frequency reward r_1)
        vote="majority":   r_i = 1[a_i = argmax_a p̂(a)] + λ·log p̂(a_i)       (TTRL's majority-vote pseudo-label)

    λ = ``entropy_weight``. A completion without an answer scores 0; majority ties go to the answer seen first.

    Sources: TTRV (Singh et al. 2025, "TTRV: Test-Time Reinforcement Learning for Vision Language Models",
    arXiv 2510.06783, project page akshit21112002.github.io/ttrvproject): r_1(ŷ_j) = Σ_m p(ỹ_m)·1[ŷ_j = ỹ_m], plus a
    diversity-control reward for low entropy of the empirical output distribution; TTRL (Zuo et al. 2025,
    arXiv 2504.16084) for the majority vote. Departure: the entropy reward is written per sample as λ·log p̂(a_i),
    whose group mean is −λ·H(p̂) (a reward constant within the group would be cancelled by the group baseline,
    this form is not); the paper's exact form and weight of that term could not be retrieved here, λ defaults to 0.
    """
    if vote not in ("frequency", "majority"):
        raise ValueError(f"reward 'self_consistency': vote must be 'frequency' or 'majority', got {vote!r}")
    if entropy_weight < 0:
        raise ValueError(f"reward 'self_consistency': entropy_weight must be >= 0, got {entropy_weight}")
    groups = group_ids(prompts if prompts is not None else [None] * len(completions), columns, group_key)
    answers = [answer_or_text(c, which, require_tags) for c in completions]
    keys = [_norm(a) if a is not None and a.strip() else None for a in answers]
    members: dict[Any, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out: list[float | None] = [0.0] * len(completions)
    for idx in members.values():
        order = [keys[i] for i in idx if keys[i] is not None]
        votes = Counter(order)
        if not votes:
            continue
        majority = max(votes, key=lambda k: (votes[k], -order.index(k)))
        for i in idx:
            if keys[i] is None:
                continue
            p = votes[keys[i]] / len(idx)
            base = p if vote == "frequency" else float(keys[i] == majority)
            out[i] = base + entropy_weight * math.log(p)
    return out


# --- R1-VL StepGRPO: StepRAR and StepRVR --------------------------------------------------------------------------

_FINAL = "### The final answer is:"
_STEP = re.compile(r"### Step (\d+):")


def _steps_text(text: str) -> str:
    """The concatenated text of the ``### Step n:`` sections (up to the final-answer marker)."""
    body = text.split(_FINAL)[0]
    parts = _STEP.split(body)  # [before, n1, text1, n2, text2, ...]
    return " ".join(parts[2::2])


def _final_answer(text: str) -> str | None:
    """The text after the last ``### The final answer is:`` (else the last ``<answer>``), stripped; None if none."""
    if _FINAL in text:
        return text.rsplit(_FINAL, 1)[1].strip()
    return answer_or_text(text, "last", True)


@register_reward(
    "step_rar",
    "R1-VL StepRAR: 1[final answer correct] + 0.1 · fraction of the key-step groups found in the ### Step texts",
)
@per_answer("step_rar", extract=whole_completion)
def step_rar(
    completion: Any, gt: Any, *, columns: dict[str, Any], i: int, step_weight: float = 0.1, steps_key: str = "key_steps"
) -> float:
    """Step-wise reasoning accuracy reward (StepRAR).

    ``r = 1[answer correct] + w·k/|K|`` with K the key steps of the sample (column ``steps_key``: a list of groups,
    each a list of alternative phrasings, or a string for a one-phrase group), k the groups of which some
    alternative occurs (lower-cased substring) in the concatenated ``### Step n:`` texts and w = ``step_weight``.
    The answer is the text after ``### The final answer is:`` (else the ``<answer>`` tag), correct when equal to the
    ground truth after normalisation or numerically equal. The step bonus is added whether or not the answer is
    right. A sample without key steps gets only the answer term; without a ground truth it is not applicable.

    Source: R1-VL StepGRPO (Zhang et al. 2025, arXiv 2503.12937, "StepRAR"; jingyi0000/R1-VL
    ``src/r1-vl/src/open_r1/grpo.py`` at commit 679be5c). Departure: math_verify is
    replaced by normalised-string / numeric equality.
    """
    text = completion_text(completion)
    pred = _final_answer(text)
    r = float(pred is not None and _same_answer(pred, ground_truth_text(gt)))
    ks = columns[steps_key][i] if steps_key in columns else None
    if ks:
        steps = _steps_text(text).lower()
        groups = [[g] if isinstance(g, str) else list(g) for g in ks]
        hit = sum(any(str(alt).lower() in steps for alt in g) for g in groups)
        r += step_weight * hit / len(groups)
    return r


@register_reward(
    "step_rvr",
    "R1-VL StepRVR: 1 if description, rationales, Steps 1..n and the final answer appear complete and in order",
)
def step_rvr(completions: list, *, prompts: list | None = None, **columns: Any) -> list[float]:
    """Step-wise reasoning validity reward (StepRVR): 1 if the reasoning is structurally complete and ordered.

    ``r = 1`` when the completion holds ``### Image Description:``, ``### Rationales:``, ``### Step 1:`` and
    ``### The final answer is:``, the steps are numbered 1, 2, …, n consecutively, the description comes before the
    rationales, the rationales before Step 1, and the final answer after the last step; else 0.

    Source: R1-VL StepGRPO (arXiv 2503.12937, "StepRVR"; jingyi0000/R1-VL ``src/r1-vl/src/open_r1/grpo.py`` at
    commit 679be5c).
    """
    out = []
    for c in completions:
        text = completion_text(c)
        marks = [text.find(m) for m in ("### Image Description:", "### Rationales:", "### Step 1:")]
        final = text.rfind(_FINAL)
        steps = [(int(m.group(1)), m.start()) for m in _STEP.finditer(text)]
        numbers = [n for n, _ in steps]
        ok = (
            min(marks) >= 0
            and final >= 0
            and marks[0] < marks[1] < marks[2]
            and numbers == list(range(1, len(numbers) + 1))
            and final > steps[-1][1]
        )
        out.append(float(ok))
    return out


# --- TempSamp-R1: asymmetric soft shaping of a grounding reward -------------------------------------------------


def tempsamp_shape(r: float, tau: float = 0.8, alpha: float = 1.0) -> float:
    """TempSamp-R1's non-linear soft reward transformation (arXiv 2509.18056).

    f(r) = τ + 0.01·ln(r − τ + 1) for r ≥ τ (compresses the high rewards: f(1) = 0.8018 at τ = 0.8);
    f(r) = τ − (e^{α(τ−r)} − 1)/(e^α − 1) for r < τ (expands the low ones: f(0) = 0.0870 at τ = 0.8, α = 1).
    Continuous at r = τ (both branches give τ), increasing in r.

    Source: TempSamp-R1 (arXiv 2509.18056, asymmetric soft advantage), as written in the public re-implementation
    ZhangZikun6666/TempSamp-R1 ``scripts/timelens/timelens_reward.py::transform_rewards`` (defaults τ = 0.8, α = 1).
    """
    if not alpha > 0:
        raise ValueError(f"tempsamp shaping: alpha must be > 0, got {alpha}")
    if r >= tau:
        return tau + 0.01 * math.log(r - tau + 1.0)
    return tau - (math.exp(alpha * (tau - r)) - 1.0) / (math.exp(alpha) - 1.0)


@register_reward(
    "tempsamp_soft",
    "TempSamp-R1 asymmetric soft shaping f(r; tau, alpha) of another reward (default temporal_iou)",
)
def tempsamp_soft(
    completions: list,
    *,
    prompts: list | None = None,
    inner: str = "temporal_iou",
    inner_kwargs: dict | None = None,
    tau: float = 0.8,
    alpha: float = 1.0,
    **columns: Any,
) -> list[float | None]:
    """The registered reward ``inner`` (a grounding IoU in [0, 1]) passed through :func:`tempsamp_shape`.

    ``None`` (not applicable) stays ``None``. TempSamp-R1 adds 0.1·format to the shaped IoU: configure the format
    reward beside this one with weight 0.1.

    Source: TempSamp-R1 (arXiv 2509.18056), shaping of the IoU term as in :func:`tempsamp_shape`.
    """
    fn = REWARDS.get(inner)
    values = fn(completions, prompts=prompts, **(inner_kwargs or {}), **columns)
    return [None if v is None else tempsamp_shape(float(v), tau, alpha) for v in values]
