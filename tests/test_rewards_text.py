"""Text and speech rewards: formulas with values worked by hand, and their edge cases."""

import math
import time

import pytest

from mmgrpo.rewards import (
    accuracy,
    bleu,
    cer,
    exact_match,
    format_reward,
    last_number,
    length_band,
    length_cosine,
    length_kimi,
    math_accuracy,
    multiple_choice,
    multiple_choice_partial,
    numeric,
    regression,
    repetition_penalty,
    rouge,
    wer,
)
from mmgrpo.rewards.speech import normalize_transcript
from mmgrpo.rewards.text import last_boxed, math_equal, normalize_math, safe_eval


def ans(x: str) -> str:
    return f"<think>t</think><answer>{x}</answer>"


# --- format / accuracy (the two names task code relies on) ------------------------------------------------


def test_format_contract():
    c = ["<think>a</think>\n<answer>b</answer>", "<answer>b</answer>", "", "<think>a</think><answer>b</answer>x"]
    assert format_reward(c, prompts=[""] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert format_reward(c, prompts=[""] * 4, think=False) == [0.0, 1.0, 0.0, 0.0]


def test_accuracy_contract():
    c = [
        ans("  Paris "),  # whitespace and case normalised
        "<answer>London</answer><answer>paris</answer>",  # last by default
        "Paris",  # no tags
        "",  # empty output
        ans("Lyon"),
        ans("x"),
    ]
    gt = ["paris", "Paris", "Paris", "Paris", "Paris", None]
    assert accuracy(c, prompts=[""] * 6, answer=gt) == [1.0, 1.0, 0.0, 0.0, 0.0, None]
    assert accuracy(c[:3], prompts=[""] * 3, answer=gt[:3], which="first") == [1.0, 0.0, 0.0]
    assert accuracy(c[:4], prompts=[""] * 4, answer=gt[:4], require_tags=False) == [1.0, 1.0, 1.0, 0.0]
    assert accuracy([ans("4")], solution=[4], answer_key="solution") == [1.0]  # non-str ground truth
    with pytest.raises(KeyError, match=r"needs the column 'answer'.*has columns \['solution'\]"):
        accuracy(["x"], prompts=["p"], solution=["x"])


def test_exact_match_normalisations_and_lists():
    c = [ans("The  Eiffel tower!"), ans("eiffel tower"), ans("tower")]
    gt = ["eiffel tower", ["Tour Eiffel", "Eiffel Tower"], "eiffel tower"]
    assert exact_match(c, answer=gt) == [0.0, 1.0, 0.0]
    assert exact_match(c, answer=gt, normalize="loose") == [1.0, 1.0, 0.0]
    assert exact_match([ans("A")], answer=["a"], normalize="none") == [0.0]
    with pytest.raises(ValueError, match="normalize must be"):
        exact_match([ans("a")], answer=["a"], normalize="weird")


def test_multiple_choice():
    c = [ans("B"), ans("The answer is (C)."), ans("A cat"), "B", ans("")]
    assert multiple_choice(c, answer=["B", "(C) red", "A", "B", "B"]) == [1.0, 1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="has no option letter"):
        multiple_choice([ans("B")], answer=["blue"])


def test_multiple_choice_partial():
    c = [ans("A, C"), ans("A"), ans("A, B"), ans(""), ans("A, C")]
    gt = ["A, C", "A, C", "A, C", "A, C", ["A", "B", "C", "D"]]
    assert multiple_choice_partial(c, answer=gt) == [1.0, 0.5, 0.0, 0.0, 0.5]
    with pytest.raises(ValueError, match="no option letters"):
        multiple_choice_partial([ans("A")], answer=["none"])


def test_numeric_tolerance():
    c = [ans("3.14159"), ans("1,000"), ans("3/4"), ans("about 7"), ans("nan"), ans(""), ans("inf")]
    gt = ["3.14159", 1000, 0.75, 7.0, 1.0, 1.0, 1.0]
    assert numeric(c, answer=gt) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert numeric([ans("3.14")], answer=[math.pi]) == [0.0]
    assert numeric([ans("3.14")], answer=[math.pi], abs_tol=0.005) == [1.0]
    assert numeric([ans("103")], answer=[100], rel_tol=0.05) == [1.0]
    with pytest.raises(ValueError, match="cannot read a number"):
        numeric([ans("1")], answer=["one"])


def test_last_number_reads_the_last_stated_number():
    replies = [
        "Tom has 8 + 5 = 13 apples.",  # the stated result is last: 13
        "8 + 5",  # no result stated; the last number is 5 (nothing is evaluated)
        "Tom has 8 apples.\nTom gets 5 more, so Tom has 8 + 5 =",  # cut off by the token budget: 5
        "13 apples.\n\nThis is a classic example of 2 numbers.",  # a trailing number wins: 2
        "It is 1,234.",  # thousands groups and a sentence's full stop
        "Ben has 3 - 5 = -2 marbles",  # a negative result
        "I do not know.",  # no number: 0
        "<answer>13</answer> and 7 more",  # a tagged answer is read inside its tag
        "3/4",  # fractions are not one number here: the last number is 4
    ]
    gt = [13, 13, 13, 13, "1234", -2, 0, 13, 4]
    assert last_number(replies, answer=gt) == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert last_number(["x 13.0", "so 13"], answer=["<answer>13</answer>", "The answer is 13."]) == [1.0, 1.0]
    assert last_number(["12.9"], answer=[13], abs_tol=0.2) == [1.0]
    assert last_number(["13"], answer=[None]) == [None]
    with pytest.raises(ValueError, match="'last_number': the ground truth 'thirteen' has no number"):
        last_number(["13"], answer=["thirteen"])


def test_regression_relative_error_and_zero_ground_truth():
    c = [ans("8"), ans("10"), ans("25"), ans("0"), ans("0.1"), ans("none")]
    gt = [10, 10, 10, 0, 0, 10]
    # 1 - |8-10|/10 = 0.8; exact = 1; |25-10|/10 = 1.5 clipped to 1 -> 0; g=0: exact only; no number -> 0
    assert regression(c, answer=gt) == pytest.approx([0.8, 1.0, 0.0, 1.0, 0.0, 0.0])


def test_math_normalisation_and_equality():
    assert last_boxed(r"so \boxed{\frac{1}{2}} and \boxed{x^{2}}") == "x^{2}"
    assert last_boxed(r"\boxed{unbalanced") is None
    assert normalize_math(r"$x = \dfrac{3}{4}$.") == "(3)/(4)"
    assert normalize_math(r"90^\circ") == "90"
    assert math_equal(r"\frac{1}{2}", "0.5")
    assert math_equal("1/2", r"\tfrac12")  # math-verify reads the brace-less form
    assert math_equal("1/2", r"\tfrac12", verifier="simple")  # so does the hand-written check (one digit per argument)
    assert not math_equal("1/2", r"\tfrac{13}", verifier="simple")
    assert math_equal(r"2\sqrt{2}", r"2\sqrt{2}")
    assert math_equal(r"\sqrt{2}", "1.41421356237")
    assert math_equal("(1, 2)", r"\left(1,2\right)") and not math_equal("(1, 2)", "(2, 1)")
    assert math_equal("1,000", "1000") and math_equal(r"50\%", "50")
    assert not math_equal("", "0") and not math_equal("1/0", "0")  # empty; division by zero is no number
    assert safe_eval("2**3") == 8.0 and safe_eval("1/0") is None and safe_eval("__import__('os')") is None
    assert safe_eval("9**9**9") is None  # bounded exponent, no hang


def test_math_accuracy():
    c = [
        r"<think>...</think><answer>\boxed{\frac{1}{2}}</answer>",
        r"The result is \boxed{0.5}",  # no tags: boxed in the text
        "<answer>0.50</answer>",
        "<answer>1/3</answer>",
        "",
        r"\boxed{x",  # truncated
    ]
    assert math_accuracy(c, answer=["1/2", "1/2", r"\boxed{\frac12}", "0.5", "0.5", "1"]) == [
        1.0,
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
    ]
    assert math_accuracy(["<answer>0.5</answer>"], answer=[None]) == [None]


# --- similarity: ROUGE, BLEU -------------------------------------------------------------------------------


def test_rouge_mean_f1_worked_by_hand():
    # ref "the cat sat", pred "the cats sat down" (stemmed "cat"): R1 F = 2·(3/4·1)/(3/4+1) = 6/7,
    # R2 bigrams {the cat, cat sat} vs {the cat, cat sat, sat down}: F = 0.8; RL LCS 3: 6/7.
    r = rouge([ans("the cats sat down")], answer=["the cat sat"])
    assert r == [pytest.approx((6 / 7 + 0.8 + 6 / 7) / 3)]
    assert rouge([ans(""), "no tags", ans("x")], answer=["the cat", "the cat", ""]) == [0.0, 0.0, 0.0]
    assert rouge([ans("the cat sat")], answer=["the cat sat"]) == [pytest.approx(1.0)]


def test_bleu_worked_by_hand():
    assert bleu([ans("the cat sat on the mat")], answer=["the cat sat on the mat"]) == [pytest.approx(1.0)]
    # "the cat" vs 6-word reference: all (effective-order) precisions 1, brevity penalty exp(1 - 6/2) = e^-2
    assert bleu([ans("the cat")], answer=["the cat sat on the mat"]) == [pytest.approx(math.exp(-2))]
    # several references: the closest length (2 words) gives no brevity penalty
    assert bleu([ans("the cat")], answer=[["the cat", "a dog ran far away"]]) == [pytest.approx(1.0)]
    assert bleu([ans(""), ans("x")], answer=["a b", None]) == [0.0, None]


# --- speech ------------------------------------------------------------------------------------------------


def test_wer_cer_worked_by_hand():
    # ref "a b c d", hyp "a x c": 1 substitution + 1 deletion over 4 words -> WER 0.5 -> r 0.5
    assert wer(["a x c"], answer=["a b c d"]) == [0.5]
    # normalisation: case and punctuation do not count
    assert wer(["Hello, World!"], answer=["hello world"]) == [1.0]
    assert wer(["Hello, World!"], answer=["hello world"], normalize=False) == [0.0]
    # WER > 1 (insertions) is clipped: r = 1 - min(1, 3/1) = 0
    assert wer(["a b c d"], answer=["z"]) == [0.0]
    assert cer(["abxd"], answer=["abcd"]) == [0.75]
    assert wer(["<answer>a b</answer>"], answer=["a b"]) == [1.0]  # tags are read when present


def test_wer_edge_cases():
    assert wer(["", "", "x", "y"], answer=["a b", "", "", None]) == [0.0, 1.0, 0.0, None]
    assert cer([""], answer=["...!"]) == [1.0]  # empty after normalisation on both sides
    assert normalize_transcript("Don't  STOP—now.") == "don't stop now"


# --- length and repetition -----------------------------------------------------------------------------------


def test_length_cosine_worked_by_hand():
    c = [ans("4"), ans("4"), ans("5"), ans("5"), ans("4"), ans("4")]
    ids = [[0] * 0, [0] * 500, [0] * 0, [0] * 1000, [0] * 2000, [0] * 2000]
    gt = ["4"] * 6
    r = length_cosine(c, answer=gt, completion_ids=ids, max_len=1000)
    # correct: 1.0 at L=0, 0.5 + 0.25·(1+cos(π/2)) = 0.75 at L=500; wrong: -1 at 0, -0.5 at max; beyond: end value
    assert r == pytest.approx([1.0, 0.75, -1.0, -0.5, 0.5, 0.5])
    r = length_cosine(c[4:], answer=gt[4:], completion_ids=ids[4:], max_len=1000, exceed=-10.0)
    assert r == [-10.0, -10.0]
    assert length_cosine([ans("4")], answer=[None], completion_ids=[[1]]) == [None]
    with pytest.raises(KeyError, match="no 'completion_ids' column; pass unit='words'"):
        length_cosine([ans("4")], answer=["4"])
    # 2 words of max 4: 0.5 + 0.25·(1 + cos(π/2)) = 0.75
    assert length_cosine(["<answer>4</answer> w"], answer=["4"], unit="words", max_len=4) == [pytest.approx(0.75)]
    with pytest.raises(ValueError, match="max_len must be > 0"):
        length_cosine([ans("4")], answer=["4"], unit="words", max_len=0)


def test_length_kimi_group_relative():
    c = [ans("4"), ans("4"), ans("5"), ans("4"), ans("1")]
    prompts = ["p", "p", "p", "q", "q"]
    lens = [[0] * 10, [0] * 30, [0] * 20, [0] * 7, [0] * 7]
    r = length_kimi(c, prompts=prompts, answer=["4"] * 5, completion_ids=lens)
    # group p: min 10, max 30; λ = 0.5 - (L-10)/20 -> 0.5, -0.5, 0.0 (wrong: min(0, 0) = 0)
    # group q: equal lengths -> λ = 0 (no division by zero)
    assert r == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0])
    r = length_kimi(c[:3], prompts=["a", "b", "c"], group_id=[1, 1, 1], answer=["4"] * 3, completion_ids=lens[:3])
    assert r == pytest.approx([0.5, -0.5, 0.0])


def test_length_band_video_r1():
    c = [ans("4"), ans("4"), ans("4"), ans("5")]
    lens = [[0] * 400, [0] * 100, [0] * 600, [0] * 400]
    assert length_band(c, prompts=["p"] * 4, answer=["4"] * 4, completion_ids=lens) == [0.2, 0.0, 0.0, 0.0]
    # only one correct sample in the group: no bonus (Video-R1's |S| > 1)
    assert length_band(c[:1] + c[3:], prompts=["p"] * 2, answer=["4"] * 2, completion_ids=[lens[0], lens[3]]) == [
        0.0,
        0.0,
    ]


def test_repetition_penalty_worked_by_hand():
    # "a b a b a b": 3-grams (a b a), (b a b), (a b a), (b a b) -> 2 unique of 4 -> -1·(1 - 2/4) = -0.5
    assert repetition_penalty(["a b a b a b", "a b c d", "", "a b"]) == [-0.5, 0.0, 0.0, 0.0]
    assert repetition_penalty(["x x x x"], ngram_size=1, max_penalty=-2.0) == [pytest.approx(-1.5)]
    with pytest.raises(ValueError):
        repetition_penalty(["x"], max_penalty=1.0)


# --- tagged ground truth (R1-V, VLM-R1, Video-R1 store `solution` as "<answer> … </answer>") ---------------


@pytest.mark.parametrize(
    "reward, completion, solution",
    [
        (accuracy, "<think>three cubes</think><answer>3</answer>", "<answer> 3 </answer>"),  # R1-V CLEVR counting
        (exact_match, "<answer>3</answer>", "<answer> 3 </answer>"),
        (math_accuracy, "<think>…</think><answer>3</answer>", "<answer> 3 </answer>"),
        (math_accuracy, r"<answer>\boxed{\frac{1}{2}}</answer>", "<answer>0.5</answer>"),  # VLM-R1 math-style
        (multiple_choice, "<answer>B</answer>", "<answer>B</answer>"),  # Video-R1 multiple choice
        (numeric, "<answer>3.5</answer>", "<answer>3.5</answer>"),  # Video-R1 numerical
        (regression, "<answer>12</answer>", "<answer>12</answer>"),  # Video-R1 regression
        (rouge, "<answer>a man opens the door</answer>", "<answer>a man opens the door</answer>"),  # Video-R1 free-form
        (bleu, "<answer>a man opens the door slowly</answer>", "<answer>a man opens the door slowly</answer>"),
    ],
)
def test_tagged_ground_truth_scores_one(reward, completion, solution):
    assert reward([completion], solution=[solution], answer_key="solution") == [pytest.approx(1.0)]


def test_tagged_ground_truth_still_scores_wrong_answers_zero():
    assert accuracy(["<answer>4</answer>"], answer=["<answer> 3 </answer>"]) == [0.0]
    assert math_accuracy(["<answer>4</answer>"], answer=["<answer> 3 </answer>"]) == [0.0]
    assert rouge(["<answer>zzz</answer>"], answer=["<answer>a man opens the door</answer>"]) == [0.0]


@pytest.mark.parametrize(
    "pred, gt",
    [(r"\frac12", "0.5"), (r"2\sqrt{2}", r"\sqrt{8}"), (r"\{1,2\}", r"\{2,1\}"), (r"50\%", "0.5"), ("x=3", "3")],
)
def test_math_verify_accepts_equivalent_forms_the_simple_check_may_miss(pred, gt):
    pytest.importorskip("math_verify")
    assert math_equal(pred, gt) and math_equal(pred, gt, verifier="math_verify")


def test_simple_check_adds_a_numeric_tolerance():
    pytest.importorskip("math_verify")
    assert not math_equal("3.14159", r"\pi", verifier="math_verify")
    assert math_equal("3.14159", r"\pi")  # the hand-written check's rel_tol=1e-6 accepts it


def test_math_inputs_are_bounded():
    t0 = time.monotonic()
    assert math_accuracy(["<answer>" + "(1," * 200 + "</answer>"], answer=["3"]) == [0.0]  # no MemoryError
    assert safe_eval("(1," * 200) is None and safe_eval("(" * 100 + "1" + ")" * 100) is None
    assert time.monotonic() - t0 < 1.0
