"""Speech rewards: 1 − WER and 1 − CER against a reference transcript (jiwer), with text normalisation.

ASR policies (Whisper, Qwen2-Audio) usually write a bare transcript, so these rewards read the whole completion
unless it has an ``<answer>`` tag (``require_tags=False`` by default, unlike the text rewards). The reference
is the ``answer_key`` column (default ``"answer"``); ``None`` → not applicable. BLEU for speech translation is
:func:`mmgrpo.rewards.text.bleu`.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from ._common import column
from .parsing import Which, answer_or_text
from .registry import register_reward

_NON_WORD = re.compile(r"[^\w\s']|_")


def normalize_transcript(text: str) -> str:
    """Lower-case (casefold), Unicode NFKC, punctuation removed (apostrophes kept: "don't"), whitespace
    collapsed. A simple stand-in for Whisper's English normaliser (no number or spelling rewriting)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _NON_WORD.sub(" ", text).replace(" '", " ").replace("' ", " ")
    return " ".join(text.split())


def _error_rate_reward(completions, columns, *, metric: str, which, answer_key, require_tags, normalize) -> list:
    import jiwer

    fn = jiwer.wer if metric == "wer" else jiwer.cer
    refs = column(columns, answer_key, metric, len(completions))
    out: list[float | None] = []
    for c, ref in zip(completions, refs):
        if ref is None:
            out.append(None)
            continue
        hyp = answer_or_text(c, which, require_tags) or ""
        ref = str(ref)
        if normalize:
            hyp, ref = normalize_transcript(hyp), normalize_transcript(ref)
        if not ref.strip():  # WER is undefined for an empty reference (jiwer raises)
            out.append(float(not hyp.strip()))
        elif not hyp.strip():  # all deletions
            out.append(0.0)
        else:
            out.append(1.0 - min(1.0, fn(ref, hyp)))
    return out


@register_reward("wer", "1 - min(1, WER) against the reference transcript (jiwer, normalised text)")
def wer(
    completions: list,
    *,
    prompts: list | None = None,
    which: Which = "last",
    answer_key: str = "answer",
    require_tags: bool = False,
    normalize: bool = True,
    **columns: Any,
) -> list[float | None]:
    """Word-error-rate reward.

    ``r = 1 − min(1, WER(ref, hyp))`` with ``WER = (S + D + I) / N_ref`` words (``jiwer.wer``), after
    :func:`normalize_transcript` on both sides when ``normalize``. An empty hypothesis gives 0; an empty
    reference gives 1 if the hypothesis is empty too, else 0 (WER is undefined there).

    Source: the rule-based WER reward of GRPO for LLM-based ASR (Amazon, arXiv 2509.01939; exact form unverified)
    and Video-R1's OCR reward ``clip(1 − WER, 0, 1)`` (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``,
    ``accuracy_reward``).
    """
    return _error_rate_reward(
        completions,
        columns,
        metric="wer",
        which=which,
        answer_key=answer_key,
        require_tags=require_tags,
        normalize=normalize,
    )


@register_reward("cer", "1 - min(1, CER) against the reference transcript (jiwer, normalised text)")
def cer(
    completions: list,
    *,
    prompts: list | None = None,
    which: Which = "last",
    answer_key: str = "answer",
    require_tags: bool = False,
    normalize: bool = True,
    **columns: Any,
) -> list[float | None]:
    """Character-error-rate reward (for languages without spaces, or spelling-level credit).

    ``r = 1 − min(1, CER(ref, hyp))`` with ``CER = (S + D + I) / N_ref`` characters, spaces included
    (``jiwer.cer``); normalisation and empty cases as in :func:`wer`.

    Source: the character-level counterpart of the WER reward (arXiv 2509.01939), the usual ASR metric for
    Chinese/Japanese (Morris et al. 2004 define both rates).
    """
    return _error_rate_reward(
        completions,
        columns,
        metric="cer",
        which=which,
        answer_key=answer_key,
        require_tags=require_tags,
        normalize=normalize,
    )


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
def hallucination(
    completions: list,
    *,
    prompts: list | None = None,
    which: Which = "last",
    answer_key: str = "answer",
    require_tags: bool = False,
    normalize: bool = True,
    mode: str = "insertions",
    **columns: Any,
) -> list[float | None]:
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
    refs = column(columns, answer_key, "hallucination", len(completions))
    out: list[float | None] = []
    for c, ref in zip(completions, refs):
        if ref is None:
            out.append(None)
            continue
        hyp = answer_or_text(c, which, require_tags) or ""
        ref = str(ref)
        if normalize:
            hyp, ref = normalize_transcript(hyp), normalize_transcript(ref)
        n_ref, n_hyp = len(ref.split()), len(hyp.split())
        if n_ref == 0:
            out.append(-float(n_hyp > 0))
            continue
        if mode == "length" or n_hyp == 0:
            extra = max(0, n_hyp - n_ref)
        else:
            extra = jiwer.process_words(ref, hyp).insertions
        out.append(-min(1.0, extra / n_ref))
    return out
