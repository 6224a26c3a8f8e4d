"""The one parser: tags (first/last, explicit), boxes, points, numbers, choices, spans, and malformed text."""

import pytest

from mmgrpo.rewards.parsing import (
    answer_or_text,
    completion_text,
    extract_answer,
    extract_tags,
    extract_think,
    is_think_answer_format,
    parse_box,
    parse_boxes,
    parse_choice,
    parse_choice_set,
    parse_json,
    parse_number,
    parse_numbers,
    parse_point,
    parse_points,
    parse_time,
    parse_time_span,
    parse_time_spans,
    prompt_text,
)

TWO = "<think>maybe <answer>A</answer>?</think> <answer> B </answer>"


def test_answer_first_and_last_are_explicit():
    assert extract_answer(TWO) == "B"
    assert extract_answer(TWO, which="last") == "B"
    assert extract_answer(TWO, which="first") == "A"
    assert extract_think("<think>\n step \n</think><answer>x</answer>") == "step"
    with pytest.raises(ValueError, match="which must be"):
        extract_answer(TWO, which="middle")


@pytest.mark.parametrize(
    "text",
    ["", "no tags at all", "<answer>unclosed", "</answer>reversed<answer>", "<ANSWER>unclosed</ANSWE>", "<answer"],
)
def test_malformed_answer_tags_give_none(text):
    assert extract_answer(text) is None
    assert answer_or_text(text, require_tags=True) is None


def test_answer_or_text_fallback_and_multiline():
    assert answer_or_text("  plain text ", require_tags=False) == "plain text"
    assert answer_or_text("<answer>\nline1\nline2\n</answer>") == "line1\nline2"
    assert answer_or_text([{"role": "assistant", "content": "<answer>7</answer>"}]) == "7"  # TRL conversational


def test_completion_and_prompt_text():
    assert completion_text(None) == ""
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]) == "hi"
    chat = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a cat"}]},
    ]
    assert prompt_text(chat) == "a cat"
    assert prompt_text("a dog") == "a dog"


@pytest.mark.parametrize(
    "text,think,ok",
    [
        ("<think>r</think><answer>a</answer>", True, True),
        ("  <think>r\n</think>\n\n<answer>\na</answer>\n", True, True),
        ("<think></think><answer></answer>", True, True),
        ("<answer>a</answer>", True, False),
        ("<think>r</think><answer>a</answer> trailing", True, False),
        ("prefix <think>r</think><answer>a</answer>", True, False),
        (
            "<think>r</think><answer>a</answer><answer>b</answer>",
            True,
            False,
        ),  # the reference implementations' regex lets this pass
        ("<think>r<think>x</think><answer>a</answer>", True, False),
        ("<think>r</think><answer>a", True, False),
        ("<answer>a</answer>", False, True),
        ("<think>r</think><answer>a</answer>", False, False),
        ("", True, False),
    ],
)
def test_think_answer_format(text, think, ok):
    assert is_think_answer_format(text, think=think) is ok


def test_numbers():
    assert parse_numbers("x 1,234.5 y -3 z .5 w 2e3") == [1234.5, -3.0, 0.5, 2000.0]
    assert parse_number("first 3 then 4") == 4.0
    assert parse_number("first 3 then 4", which="first") == 3.0
    assert parse_number("ratio 3/4 done") == 0.75
    assert parse_number("ratio 3/4 done", fractions=False) == 4.0
    assert parse_number("divide 3/0") is None  # division by zero is not a number
    assert parse_number("5kg") == 5.0
    assert parse_number("1,2") == 2.0  # not a thousands group: two numbers
    assert parse_number("") is None and parse_number("none here") is None and parse_number(None) is None
    assert parse_number("v2 model") is None  # inside an identifier


def test_boxes_all_forms():
    assert parse_boxes('{"bbox_2d": [10, 20.5, 30, 40]}') == [[10.0, 20.5, 30.0, 40.0]]
    assert parse_boxes("(1,2,3,4) and [ -1.5 , 0, 2, 3 ]") == [[1.0, 2.0, 3.0, 4.0], [-1.5, 0.0, 2.0, 3.0]]
    assert parse_boxes("<|box_start|>(100,200),(300,400)<|box_end|>") == [[100.0, 200.0, 300.0, 400.0]]
    assert parse_box("[1,2,3,4] [5,6,7,8]") == [1.0, 2.0, 3.0, 4.0]
    assert parse_box("[1,2,3,4] [5,6,7,8]", which="last") == [5.0, 6.0, 7.0, 8.0]
    for bad in ["", "[1,2,3]", "[1,2,3,4,5]", "[a,b,c,d]", "[1, 2, 3, 4"]:
        assert parse_box(bad) is None, bad


def test_points():
    assert parse_points("click (10, 20) then [0.5,0.25]") == [[10.0, 20.0], [0.5, 0.25]]
    assert parse_points("box (1,2),(3,4)") == []  # half of a Qwen2-VL box is not a point
    assert parse_point('{"point_2d": [7, 8]}') == [7.0, 8.0]
    assert parse_point("[1,2,3,4]") is None and parse_point("") is None


@pytest.mark.parametrize(
    "text,letter",
    [
        ("B", "B"),
        ("(C)", "C"),
        ("The answer is D.", "D"),
        ("Answer: (a)", None),  # lower-case a is an article
        ("A", "A"),
        ("A. red car", "A"),
        ("B) blue", "B"),
        ("A cat sits on C", "C"),  # the article "A" is not a choice
        ("Apple", None),
        ("", None),
        ("option E is right", "E"),
    ],
)
def test_choice(text, letter):
    assert parse_choice(text) == letter


def test_choice_set_and_custom_choices():
    assert parse_choice_set("A, C") == {"A", "C"}
    assert parse_choice_set("(B)(D)") == {"B", "D"}
    assert parse_choice_set("") == set() and parse_choice_set(None) == set()
    assert parse_choice("E", choices="ABCD") is None


def test_time_spans_all_forms():
    assert parse_time_span("The event happens 12.54 to 17.83") == (12.54, 17.83)
    assert parse_time_span("12.5s - 17s") == (12.5, 17.0)
    assert parse_time_span("between 3 and 4 seconds") == (3.0, 4.0)
    assert parse_time_span("[1.5, 2.5]") == (1.5, 2.5)
    assert parse_time_span("00:12 to 01:02.5") == (12.0, 62.5)
    assert parse_time_span('{"start_time": "1.5", "end_time": "3"}') == (1.5, 3.0)
    assert parse_time_spans("[(1, 2), (3.5, 4)]") == [(1.0, 2.0), (3.5, 4.0)]
    assert parse_time_span("first 1 to 2, last 5 to 6") == (5.0, 6.0)
    assert parse_time_span("first 1 to 2, last 5 to 6", which="first") == (1.0, 2.0)
    assert parse_time_span("9 to 3") == (9.0, 3.0)  # kept as written: the reward scores it
    for bad in ["", "at 12 seconds", "to to", None]:
        assert parse_time_span(bad) is None
    assert parse_time("1:02:03") == 3723.0 and parse_time("x") is None


def test_json_with_repairs():
    assert parse_json('```json\n[{"a": 1}]\n```') == [{"a": 1}]
    assert parse_json("[{'Position': [1, 2, 3, 4], 'Confidence': 0.9},]") == [
        {"Position": [1, 2, 3, 4], "Confidence": 0.9}
    ]
    assert parse_json("no json") is None and parse_json(None) is None


def test_tag_parser_is_linear_in_unclosed_tags():
    import time

    text = "<answer>" * 8192  # 64k characters of unclosed tags
    t0 = time.perf_counter()
    assert extract_answer(text) is None and extract_tags(text + "</answer>", "answer")[-1] == "<answer>" * 8191
    assert time.perf_counter() - t0 < 0.1


def test_tag_parser_matches_the_non_greedy_regex():
    import re

    for text in ["<a>1</a><a>2</a>", "<a><a>x</a></a>", "<a>open", "x</a><a>y</a>", "<a></a>", "<a>\n1\n</a>z<a>"]:
        assert extract_tags(text, "a") == re.findall(r"<a>(.*?)</a>", text, flags=re.DOTALL), text
