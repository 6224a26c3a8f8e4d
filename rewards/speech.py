"""Speech rewards: 1 − WER and 1 − CER against a reference transcript (jiwer), with text normalisation.

ASR policies (Whisper, Qwen2-Audio) usually write a bare transcript, so these rewards read the whole completion
unless it has an ``<answer>`` tag (``require_tags=False`` by default, unlike the text rewards). The reference
is the ``answer_key`` column (default ``"answer"``); ``None`` → not applicable. BLEU for speech translation is
:func:`mmgrpo.rewards.text.bleu`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any, Literal

from ._common import per_answer
from .registry import register_reward

_NON_WORD = re.compile(r"[^\w\s']|_")


def normalize_transcript(text: str) -> str:
    """Lower-case (casefold), Unicode NFKC, punctuation removed (apostrophes kept: "don't"), whitespace
    collapsed. A simple stand-in for Whisper's English normaliser (no number or spelling rewriting)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _NON_WORD.sub(" ", text).replace(" '", " ").replace("' ", " ")
    return " ".join(text.split())


def _normalised(hyp: str | None, ref: Any, normalize: bool) -> tuple[str, str]:
    hyp, ref = hyp or "", str(ref)
    return (normalize_transcript(hyp), normalize_transcript(ref)) if normalize else (hyp, ref)


def _one_minus_rate(rate: Callable[[str, str], float], hyp: str, ref: str) -> float:
    if not ref.strip():  # the rate is undefined for an empty reference (jiwer raises)
        return float(not hyp.strip())
    if not hyp.strip():  # all deletions
        return 0.0
    return 1.0 - min(1.0, rate(ref, hyp))


@register_reward("wer", "1 - min(1, WER) against the reference transcript (jiwer, normalised text)")
@per_answer("wer", require_tags=False)
def wer(pred: str | None, gt: Any, *, normalize: bool = True) -> float:
    """Word-error-rate reward.

    ``r = 1 − min(1, WER(ref, hyp))`` with ``WER = (S + D + I) / N_ref`` words (``jiwer.wer``), after
    :func:`normalize_transcript` on both sides when ``normalize``. An empty hypothesis gives 0; an empty
    reference gives 1 if the hypothesis is empty too, else 0 (WER is undefined there).

    Source: the rule-based WER reward of GRPO for LLM-based ASR (Amazon, arXiv 2509.01939; exact form unverified)
    and Video-R1's OCR reward ``clip(1 − WER, 0, 1)`` (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``,
    ``accuracy_reward``).
    """
    import jiwer

    return _one_minus_rate(jiwer.wer, *_normalised(pred, gt, normalize))


@register_reward("cer", "1 - min(1, CER) against the reference transcript (jiwer, normalised text)")
@per_answer("cer", require_tags=False)
def cer(pred: str | None, gt: Any, *, normalize: bool = True) -> float:
    """Character-error-rate reward (for languages without spaces, or spelling-level credit).

    ``r = 1 − min(1, CER(ref, hyp))`` with ``CER = (S + D + I) / N_ref`` characters, spaces included
    (``jiwer.cer``); normalisation and empty cases as in :func:`wer`.

    Source: the character-level counterpart of the WER reward (arXiv 2509.01939), the usual ASR metric for
    Chinese/Japanese (Morris et al. 2004 define both rates).
    """
    import jiwer

    return _one_minus_rate(jiwer.cer, *_normalised(pred, gt, normalize))


def corpus_wer(hypotheses: list[str], references: list[str], normalize: bool = True) -> float:
    """Corpus word error rate ``Σ(S + D + I) / Σ N_ref`` over all utterances (jiwer), the usual ASR metric
    (not the mean of per-utterance rates). Empty hypotheses count as all deletions."""
    import jiwer

    refs = [normalize_transcript(r) if normalize else r for r in references]
    hyps = [normalize_transcript(h) if normalize else h for h in hypotheses]
    keep = [i for i, r in enumerate(refs) if r.strip()]
    if not keep:
        raise ValueError("corpus_wer: every reference is empty")
    return float(jiwer.wer([refs[i] for i in keep], [hyps[i] for i in keep]))


@register_reward("hallucination", "-(insertions beyond the reference length) / reference words (jiwer alignment)")
@per_answer("hallucination", require_tags=False)
def hallucination(
    pred: str | None, gt: Any, *, normalize: bool = True, mode: Literal["insertions", "length"] = "insertions"
) -> float:
    """Hallucination penalty for ASR: ``r = −min(1, X / N_ref)`` with ``N_ref`` reference words and

    - ``mode="insertions"`` (default): ``X`` = the inserted words of the jiwer alignment (words of the
      hypothesis that match no reference word), which a repeating or run-on decoder produces;
    - ``mode="length"``: ``X = max(0, |hyp| − |ref|)`` words, the excess length alone.

    0 when the hypothesis adds nothing. Meant to be added to ``wer`` with a small weight.

    Source: GRPO for LLM-based ASR reports fewer hallucinations with rule-based rewards (Amazon, arXiv
    2509.01939, abstract; the exact penalty is not published, this is our instantiation of "insertions beyond
    the reference length").
    """
    import jiwer

    if mode not in ("insertions", "length"):
        raise ValueError(f"reward 'hallucination': mode must be 'insertions' or 'length', got {mode!r}")
    hyp, ref = _normalised(pred, gt, normalize)
    n_ref, n_hyp = len(ref.split()), len(hyp.split())
    if n_ref == 0:
        return -float(n_hyp > 0)
    if mode == "length" or n_hyp == 0:
        extra = max(0, n_hyp - n_ref)
    else:
        extra = jiwer.process_words(ref, hyp).insertions
    return -min(1.0, extra / n_ref)
