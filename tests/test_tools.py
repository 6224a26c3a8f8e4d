"""mmgrpo.tools: the tool-call parser on good, malformed and hostile text; the bounded runner; crop / zoom pixel for
pixel against PIL; select_frames' timestamps; the registry; the sokoban environment's rules and rendering."""

from __future__ import annotations

import json
import time
from collections import deque

import numpy as np
import pytest
from PIL import Image

from mmgrpo.tools import (
    ENVIRONMENTS,
    TOOLS,
    CropTool,
    FunctionTool,
    Observation,
    SelectFramesTool,
    Sokoban,
    ToolCall,
    ToolContext,
    anchor_key,
    clamp_box,
    get_tool,
    load_tools,
    make_environment,
    parse_action,
    parse_tool_calls,
    pick_uniform,
    register_tool,
    render_tool_schemas,
    run_tool_call,
    run_tool_calls,
    state_anchor,
)
from mmgrpo.tools.gridworld import COLORS


def noise_image(w: int = 300, h: int = 200, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def bare_schema(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": "", "parameters": {}}}


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def image_ctx() -> ToolContext:
    return ToolContext(images=[noise_image()])


BUILTINS = load_tools(["crop", "zoom", "select_frames"])

# ---------------------------------------------------------------------------------------------------- parsing


def test_parse_good_calls_in_order_with_text_around():
    text = (
        "I will zoom. <tool_call>\n"
        '{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3, 4], "label": "cat"}}\n'
        '</tool_call> then <tool_call>{"name":"select_frames","arguments":"{\\"start\\": 1, \\"end\\": 2}"}</tool_call>'
    )
    calls, errors = parse_tool_calls(text)
    assert errors == []
    assert [c.name for c in calls] == ["crop", "select_frames"]
    assert calls[0].arguments == {"bbox_2d": [1, 2, 3, 4], "label": "cat"}
    assert calls[1].arguments == {"start": 1, "end": 2}  # OpenAI's string-encoded arguments
    assert calls[0].raw.strip().startswith('{"name": "crop"')
    assert parse_tool_calls("no call here, just <answer>4</answer>") == ([], [])
    assert parse_tool_calls('<tool_call>{"name": "crop"}</tool_call>')[0][0].arguments == {}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<tool_call>crop(1, 2, 3, 4)</tool_call>", "not valid JSON"),
        ("<tool_call>{'name': 'crop'}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "crop", "arguments": {"bbox_2d": [NaN, 0, 1, 1]}}</tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>["crop", {}]</tool_call>', "JSON list, not an object"),
        ('<tool_call>{"name": "crop", "arguments": [1, 2]}</tool_call>', '"arguments" is a list'),
        ('<tool_call>{"name": "crop", "arguments": "not json"}</tool_call>', "string that is not a JSON object"),
        ('<tool_call>{"name": "crop", "arguments": {}}', "never closed"),
        ('<tool_call><tool_call>{"name": "crop", "arguments": {}}</tool_call></tool_call>', "inside another"),
        ('</tool_call><tool_call>{"name": "crop", "arguments": {}}</tool_call>', "stray"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),  # RecursionError inside json
    ],
)
def test_parse_malformed_calls_become_errors_that_name_the_fix(text, expected):
    _, errors = parse_tool_calls(text)
    assert errors and expected in errors[0], errors
    assert all("<tool_call>" in e or "</tool_call>" in e for e in errors)  # each error shows the format to use
    assert all(len(e) < 400 for e in errors)  # the bad text is quoted short, never whole


def test_nested_tags_give_an_error_and_no_call():
    calls, errors = parse_tool_calls('<tool_call><tool_call>{"name": "crop", "arguments": {}}</tool_call></tool_call>')
    assert calls == []
    assert len(errors) == 2  # the nested call, then the stray closing tag


def test_a_10_mb_argument_is_parsed_then_refused_by_the_runner(image_ctx):
    text = call("crop", bbox_2d=[0, 0, 50, 50], label="x" * 10_000_000)
    t0 = time.process_time()  # CPU time: bounded work, whatever else the machine runs
    calls, errors = parse_tool_calls(text)
    assert errors == [] and len(calls[0].raw) > 10_000_000
    obs = run_tool_call(calls[0], BUILTINS, image_ctx, max_argument_chars=10_000)
    assert time.process_time() - t0 < 5.0
    assert obs.invalid and "10000" in obs.text and "characters" in obs.text and obs.images == []
    assert len(obs.text) < 1000


def test_render_tool_schemas_are_openai_function_schemas():
    schemas = render_tool_schemas(BUILTINS)
    assert [s["function"]["name"] for s in schemas] == ["crop", "zoom", "select_frames"]
    for s in schemas:
        assert s["type"] == "function"
        assert set(s["function"]) == {"name", "description", "parameters"}
        assert s["function"]["parameters"]["type"] == "object"
    assert schemas[0]["function"]["parameters"]["required"] == ["bbox_2d"]


# ---------------------------------------------------------------------------------------------------- runner


def test_run_tool_call_answers_every_failure_with_a_bounded_observation(image_ctx):
    def run(text: str, **kw) -> Observation:
        (out,) = run_tool_calls(text, BUILTINS, image_ctx, **kw)
        return out

    obs = run(call("zom", bbox_2d=[0, 0, 10, 10]))
    assert obs.invalid and "did you mean 'zoom'" in obs.text and "crop, select_frames, zoom" in obs.text
    assert "missing required argument(s) ['bbox_2d']" in run(call("crop", box=[0, 0, 1, 1])).text
    assert "unknown argument(s) ['box']" in run(call("crop", bbox_2d=[0, 0, 40, 40], box=1)).text
    assert "must be a JSON array" in run(call("crop", bbox_2d="0,0,40,40")).text
    assert "must be a JSON integer" in run(call("crop", bbox_2d=[0, 0, 40, 40], image=0.5)).text
    assert "from 0 to 0" in run(call("crop", bbox_2d=[0, 0, 40, 40], image=3)).text
    for box in ([-5, -5, -1, -1], [50, 50, 10, 10], [10, 10, 10, 50], [0, 0, 300, 1], ["a", 0, 1, 1], [1, 2, 3]):
        obs = run(call("crop", bbox_2d=box), error_reward=-0.05)
        assert obs.invalid and obs.images == [] and obs.reward == -0.05, box
        assert "bbox_2d" in obs.text and "[x1, y1, x2, y2]" in obs.text, obs.text
    huge = run(call("crop", bbox_2d=[-1e300, -1e300, 1e300, 1e300]))  # clamped to the whole image
    assert not huge.invalid and huge.images[0].size == (300, 200)
    only_shell = run('<tool_call>{"name": "bash", "arguments": {"cmd": "rm -rf /"}}</tool_call>')
    assert only_shell.invalid and "unknown tool 'bash'" in only_shell.text


def test_a_slow_tool_is_abandoned_at_the_time_out(image_ctx):
    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long.
        """
        time.sleep(seconds)
        return "woke up"

    tool = FunctionTool(slow)
    t0 = time.perf_counter()
    obs = run_tool_call(ToolCall("slow", {"seconds": 3.0}, ""), [tool], image_ctx, timeout_s=0.2)
    assert time.perf_counter() - t0 < 2.5  # well before the tool's 3 s, even on a loaded machine
    assert obs.invalid and "did not finish within 0.2 s" in obs.text
    fast = run_tool_call(ToolCall("slow", {"seconds": 0.0}, ""), [tool], image_ctx, timeout_s=5.0)
    assert fast.text == "woke up" and not fast.invalid


def test_tool_exceptions_and_bad_returns_become_errors(image_ctx):
    class Boom:
        name = "boom"

        def __init__(self, value):
            self.value = value
            self.schema = bare_schema("boom")

        def __call__(self, arguments, context):
            if isinstance(self.value, Exception):
                raise self.value
            return self.value

    for value, expected in (
        (ZeroDivisionError("division by zero"), "boom failed (ZeroDivisionError: division by zero)"),
        ("a string", "returned a str, not an Observation"),
        (Observation(text="ok", reward=float("nan")), "non-finite reward"),
        (Observation(images=["not an image"]), "images that are not a list of PIL images"),
        (Observation(frames=[Image.new("RGB", (2, 2))]), "0 frame_times for 1 frames"),
        (Observation(text=b"bytes"), "text of type bytes"),
    ):
        obs = run_tool_call(ToolCall("boom", {}, ""), [Boom(value)], image_ctx)
        assert obs.invalid and expected in obs.text, obs.text


def test_observations_are_cut_to_the_limits(image_ctx):
    class Flood:
        name = "flood"
        schema = property(lambda self: bare_schema("flood"))

        def __call__(self, arguments, context):
            frames = [Image.new("RGB", (8, 8), (i, 0, 0)) for i in range(40)]
            return Observation(
                text="A" * 5000 + "MIDDLE" + "Z" * 5000,
                images=[Image.new("RGB", (4000, 3000))] * 9,
                frames=frames,
                frame_times=[i / 2 for i in range(40)],
            )

    obs = run_tool_call(
        ToolCall("flood", {}, ""), [Flood()], image_ctx, max_observation_chars=300, max_images=2, max_frames=5,
        max_pixels=1_000_000,
    )  # fmt: skip
    assert len(obs.text) <= 300 and obs.text.startswith("A") and "Z" in obs.text and "MIDDLE" not in obs.text
    assert "characters cut" in obs.text and "7 more image(s) dropped" in obs.text
    assert len(obs.images) == 2 and all(im.width * im.height <= 1_000_000 for im in obs.images)
    assert obs.images[0].size == (1154, 866)  # 4000x3000 scaled by sqrt(1e6 / 12e6)
    assert obs.frame_times == [0.0, 5.0, 10.0, 14.5, 19.5]  # round(linspace(0, 39, 5)) = 0, 10, 20, 29, 39
    assert [f.getpixel((0, 0))[0] for f in obs.frames] == [0, 10, 20, 29, 39]


def test_run_tool_calls_runs_max_calls_and_reports_the_rest(image_ctx):
    text = call("crop", bbox_2d=[0, 0, 40, 40]) + call("crop", bbox_2d=[0, 0, 50, 50]) + "<tool_call>oops</tool_call>"
    out = run_tool_calls(text, BUILTINS, image_ctx, max_calls=1)
    assert [o.invalid for o in out] == [False, True, True]
    assert out[0].images[0].size == (40, 40)
    assert "not valid JSON" in out[1].text and "1 were skipped" in out[2].text
    assert run_tool_calls("plain answer", BUILTINS, image_ctx) == []
    with pytest.raises(TypeError, match="unknown limits"):
        run_tool_calls("x", BUILTINS, image_ctx, timeout=1)


# ------------------------------------------------------------------------------------------------ crop / zoom


@pytest.mark.parametrize(
    "box, pil_box",
    [
        ([10, 20, 110, 120], (10, 20, 110, 120)),
        ([-10, -30, 50, 60], (0, 0, 50, 60)),  # clamped to the image
        ([250, 150, 999, 999], (250, 150, 300, 200)),
        ([10.4, 20.6, 60.2, 70.9], (10, 20, 61, 71)),  # floor the top-left, ceil the bottom-right
        # 4 x 10 box: scaled ×7 about its centre (102, 105) to 28 x 70 → left 88, top 70
        ([100, 100, 104, 110], (88, 70, 116, 140)),
        ([0, 0, 2, 2], (0, 0, 28, 28)),  # grown, then shifted back inside the image
        ([298, 198, 300, 200], (272, 172, 300, 200)),
    ],
)
def test_crop_is_pixel_exact_against_pil(image_ctx, box, pil_box):
    image = image_ctx.images[0]
    (obs,) = run_tool_calls(call("crop", bbox_2d=box, label="thing"), BUILTINS, image_ctx)
    assert not obs.invalid, obs.text
    assert np.array_equal(np.asarray(obs.images[0]), np.asarray(image.crop(pil_box)))
    assert obs.text == f"Zoomed in on the image to the region {list(pil_box)} with label thing."


def test_crop_rules_match_verl_image_zoom_in_tool():
    assert clamp_box([0, 0, 2800, 28], 3000, 100)[0] == (0, 0, 2800, 28)  # aspect 100: allowed
    assert clamp_box([0, 0, 2801, 28], 3000, 100)[0] is None  # aspect > 100
    assert "thinner than 1:100" in clamp_box([0, 0, 2801, 28], 3000, 100)[1]
    assert clamp_box([0, 0, 10, 10], 20, 20)[0] is None  # the image is under 28 px: no valid crop
    assert "smaller than the minimum crop of 28x28" in clamp_box([0, 0, 10, 10], 20, 20)[1]
    assert clamp_box([float("nan"), 0, 10, 10], 50, 50)[0] is None
    assert clamp_box([True, 0, 10, 10], 50, 50)[0] is None
    # a 1 x 40 box (clamped) in a 40 px tall image: scaled ×28 to 28 x 1120, then down to fit the height → 1 x 40,
    # which still has a side under 28 and is rejected (verl's final check)
    assert clamp_box([10, 0, 11, 50], 100, 40)[0] is None


def test_zoom_enlarges_the_crop_to_the_target_size(image_ctx):
    (obs,) = run_tool_calls(call("zoom", bbox_2d=[0, 0, 100, 50]), BUILTINS, image_ctx)
    assert obs.images[0].size == (448, 224)
    expected = image_ctx.images[0].crop((0, 0, 100, 50)).resize((448, 224), Image.Resampling.BICUBIC)
    assert np.array_equal(np.asarray(obs.images[0]), np.asarray(expected))
    big = CropTool("zoom_small", target_size=32)
    assert big(dict(bbox_2d=[0, 0, 100, 50]), image_ctx).images[0].size == (100, 50)  # never shrinks
    assert CropTool()({"bbox_2d": [0, 0, 40, 40]}, ToolContext()).error == "no image"


# ------------------------------------------------------------------------------------------------ select_frames


@pytest.fixture
def video_ctx() -> ToolContext:
    frames = [Image.new("RGB", (16, 16), (10 * i, 0, 0)) for i in range(10)]  # 10 frames at 2 fps: 0.0 .. 4.5 s
    return ToolContext(frames=frames, frame_times=[i / 2 for i in range(10)], video_fps=2.0, video_duration=5.0)


def test_pick_uniform():
    assert pick_uniform(10, 4) == [0, 3, 6, 9]
    assert pick_uniform(5, 3) == [0, 2, 4]
    assert pick_uniform(5, 1) == [2]
    assert pick_uniform(3, 8) == [0, 1, 2]


def test_select_frames_picks_the_frames_inside_the_span(video_ctx):
    def run(**args) -> Observation:
        return run_tool_call(ToolCall("select_frames", args, ""), BUILTINS, video_ctx)

    obs = run(start=1.0, end=3.0)  # 5 frames inside: 1.0, 1.5, 2.0, 2.5, 3.0 (both ends included)
    assert obs.frame_times == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert [f.getpixel((0, 0))[0] for f in obs.frames] == [20, 30, 40, 50, 60]
    assert obs.text == "Frames at 1s, 1.5s, 2s, 2.5s, 3s of the video."
    assert run(start=1.0, end=3.0, num_frames=3).frame_times == [1.0, 2.0, 3.0]  # positions 0, 2, 4 of the 5
    # all 10 frames are inside; 8 of them at positions round(i·9/7) = 0, 1, 3, 4, 5, 6, 8, 9
    assert run(start=0, end=100).frame_times == [0.0, 0.5, 1.5, 2.0, 2.5, 3.0, 4.0, 4.5]
    assert run(start=0, end=100, num_frames=4).frame_times == [0.0, 1.5, 3.0, 4.5]  # end clamped to 5 s
    assert "no frame between 1.1s and 1.4s" in run(start=1.1, end=1.4).text
    assert "0, 0.5, 1, 1.5" in run(start=1.1, end=1.4).text  # the error lists the frame times
    assert "need 0 <= start <= end" in run(start=3, end=1).text
    assert "past the end of the video (5s)" in run(start=6, end=7).text
    assert "num_frames must be an integer from 1 to 8" in run(start=0, end=1, num_frames=9).text
    assert "needs a video" in run_tool_call(ToolCall("select_frames", {"start": 0, "end": 1}, ""), BUILTINS,
                                            ToolContext()).text  # fmt: skip


def test_select_frames_uses_the_rollouts_loader_when_given(video_ctx):
    asked = []

    def load(start, end, n):
        asked.append((start, end, n))
        return [Image.new("RGB", (4, 4))] * n, [start + i * (end - start) / max(1, n - 1) for i in range(n)]

    video_ctx.load_frames = load
    obs = SelectFramesTool(max_frames=4)({"start": 1.0, "end": 9.0}, video_ctx)
    assert asked == [(1.0, 5.0, 4)]  # end clamped to the 5 s duration; n = max_frames
    assert obs.frame_times == pytest.approx([1.0, 2.3333333, 3.6666667, 5.0])


# -------------------------------------------------------------------------------------------------- registry


def test_registry_refuses_duplicates_and_suggests_names():
    assert {"crop", "zoom", "select_frames"} <= set(TOOLS.names())
    with pytest.raises(ValueError, match="already registered"):
        TOOLS.add("crop", CropTool("crop"))
    with pytest.raises(KeyError, match="did you mean 'select_frames'"):
        get_tool("select_frame")
    with pytest.raises(ValueError, match="two tools are named"):
        load_tools(["crop", CropTool("crop")])


def test_a_typed_documented_function_is_a_tool(image_ctx):
    def count_pixels(threshold: int, context: ToolContext) -> list:
        """Count bright pixels of the first image.

        Args:
            threshold: brightness above which a pixel counts (0-255).
        """
        gray = np.asarray(context.images[0].convert("L"))
        return [
            {"type": "text", "text": str(int((gray > threshold).sum()))},
            {"type": "image", "image": context.images[0]},
        ]

    tool = FunctionTool(count_pixels)
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "count_pixels",
            "description": "Count bright pixels of the first image.",
            "parameters": {
                "type": "object",
                "properties": {
                    "threshold": {"type": "integer", "description": "brightness above which a pixel counts (0-255)."}
                },
                "required": ["threshold"],
            },
        },
    }
    obs = run_tool_call(ToolCall("count_pixels", {"threshold": 300}, ""), [tool], image_ctx)
    assert obs.text == "0" and obs.images == [image_ctx.images[0]]
    assert "must be a JSON integer" in run_tool_call(ToolCall("count_pixels", {"threshold": "x"}, ""), [tool],
                                                     image_ctx).text  # fmt: skip

    def undocumented(x: int) -> str:
        return str(x)

    with pytest.raises(TypeError, match="describe it under 'Args:'"):
        FunctionTool(undocumented)


def test_register_tool_on_a_function():
    def shout_for_test(word: str) -> str:
        """Upper-case a word.

        Args:
            word: the word.
        """
        return word.upper()

    try:
        assert register_tool("shout_for_test")(shout_for_test) is shout_for_test
        assert get_tool("shout_for_test")({"word": "hi"}, ToolContext()).text == "HI"
    finally:
        TOOLS._items.pop("shout_for_test", None)


# -------------------------------------------------------------------------------------------------- anchors


def test_anchor_keys_compare_pixels_not_objects():
    a, b, c = noise_image(seed=1), noise_image(seed=1), noise_image(seed=2)
    assert a is not b and anchor_key(a) == anchor_key(b) and anchor_key(a) != anchor_key(c)
    assert anchor_key(a.convert("L")) != anchor_key(a)
    assert hash(anchor_key(Observation(text="t", images=[a]))) == hash(anchor_key(Observation(text="t", images=[b])))
    assert anchor_key(np.zeros((2, 2))) == anchor_key(np.zeros((2, 2))) != anchor_key(np.zeros((4,)))
    assert anchor_key({"b": [1, 2], "a": "x"}) == anchor_key({"a": "x", "b": (1, 2)})
    with pytest.raises(TypeError, match="cannot key a"):
        anchor_key(object())


# ------------------------------------------------------------------------------------------------- sokoban


def test_sokoban_levels_are_deterministic_and_differ_by_seed():
    first, again = make_environment("sokoban"), make_environment("sokoban")
    keys = set()
    for seed in range(8):
        o1, o2 = first.reset({"seed": seed}), again.reset({"seed": seed})
        assert np.array_equal(np.asarray(o1.images[0]), np.asarray(o2.images[0]))
        assert (first.player, first.boxes, first.targets) == (again.player, again.boxes, again.targets)
        assert first.boxes != set(first.targets)  # never solved at the start
        keys.add(state_anchor(o1))
    assert len(keys) >= 6  # seeds give different levels
    assert "sokoban" in ENVIRONMENTS
    with pytest.raises(ValueError, match="integer 'seed' column"):
        first.reset({"level": 3})
    with pytest.raises(KeyError, match="did you mean 'sokoban'"):
        make_environment("sokobn")


def _solve(env: Sokoban) -> int | None:
    """Breadth-first search over (player, boxes): the fewest moves that solve the level, or None."""
    start = (env.player, frozenset(env.boxes))
    seen, todo = {start}, deque([(start, 0)])
    while todo:
        (player, boxes), depth = todo.popleft()
        if boxes == env.targets:
            return depth
        for dr, dq in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nxt = (player[0] + dr, player[1] + dq)
            if env._wall(nxt):
                continue
            new_boxes = boxes
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dq)
                if env._wall(beyond) or beyond in boxes:
                    continue
                new_boxes = (boxes - {nxt}) | {beyond}
            state = (nxt, new_boxes)
            if state not in seen:
                seen.add(state)
                todo.append((state, depth + 1))
    return None


def test_every_generated_level_is_solvable():
    env = Sokoban(size=6, boxes=1)
    for seed in range(20):
        env.reset({"seed": seed})
        moves = _solve(env)
        assert moves is not None and moves >= 1, seed


def _set(env: Sokoban, player, boxes, targets) -> None:
    env.player, env.boxes, env.targets, env.steps, env.done = player, set(boxes), frozenset(targets), 0, False


def test_sokoban_transitions_and_rewards():
    env = Sokoban(size=6, max_steps=5)
    env.reset({"seed": 0})
    _set(env, (2, 1), {(2, 2)}, {(2, 3)})  # player, box, target in a row
    obs, reward, done = env.step("<think>push</think><action>right</action>")
    assert (env.player, env.boxes) == ((2, 2), {(2, 3)})
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0) and done and obs.error is None
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("<action>up</action>")

    _set(env, (2, 2), {(2, 3)}, {(2, 3)})  # push a box off its target, into the next cell
    _, reward, done = env.step("<action>right</action>")
    assert env.boxes == {(2, 4)} and reward == pytest.approx(-0.1 - 1.0) and not done
    _, reward, _ = env.step("<action>right</action>")  # the box is against the wall: nothing moves
    assert (env.player, env.boxes) == ((2, 3), {(2, 4)}) and reward == pytest.approx(-0.1)
    _, _, _ = env.step("<action>up</action>")
    _, _, _ = env.step("<action>up</action>")
    assert env.player == (1, 3)  # the second up walked into the wall
    before = (env.player, set(env.boxes))
    obs, reward, done = env.step("I go <action>jump</action>")  # 5th step: invalid, and the last one
    assert obs.invalid and "'jump' is not an action" in obs.error and "board is unchanged" in obs.text
    assert (env.player, env.boxes) == before and reward == pytest.approx(-0.1) and done


def test_parse_action_takes_the_last_tag():
    assert parse_action("<action>up</action> no, <action> Left </action>", ("up", "left")) == ("left", "")
    action, reason = parse_action("left", ("up", "left"))
    assert action is None and "no <action>" in reason and "<action>one of up, left</action>" in reason
    assert parse_action("<action>up</action><action>down", ("up", "down")) == ("up", "")  # the last closed one
    t0 = time.process_time()
    assert parse_action("<action>" * 200_000, ("up",))[0] is None
    assert time.process_time() - t0 < 1.0


def test_sokoban_rendering_is_deterministic_and_shows_the_state():
    env = Sokoban(size=6, cell=16)
    env.reset({"seed": 0})
    _set(env, (1, 1), {(2, 2)}, {(3, 3), (2, 2)})
    image = env.render()
    assert image.size == (96, 96) and image.mode == "RGB"
    assert np.array_equal(np.asarray(image), np.asarray(env.render()))

    def centre(cell):
        return image.getpixel((cell[1] * 16 + 8, cell[0] * 16 + 8))

    assert centre((0, 0)) == COLORS["wall"]
    assert centre((1, 1)) == COLORS["player"]
    assert centre((2, 2)) == COLORS["box_on_target"]
    assert centre((3, 3)) == COLORS["floor"] and image.getpixel((3 * 16 + 3, 3 * 16 + 8)) == COLORS["target"]
    assert centre((4, 4)) == COLORS["floor"]
    env.boxes = {(4, 4)}
    assert env.render().getpixel((4 * 16 + 8, 4 * 16 + 8)) == COLORS["box"]


def test_sokoban_coordinates_floor_paints_each_floor_cell_by_its_row_and_column():
    """floor="coordinates": a floor cell at (row, column) is (255 − 40·row, 255 − 40·column, 200) at size 6; the
    things stand on the middle half of their cell with the floor's colour around them; walls are unchanged."""
    env = Sokoban(size=6, cell=28, floor="coordinates")
    env.reset({"seed": 0})
    _set(env, (1, 1), {(2, 3)}, {(4, 2), (2, 3)})
    image = env.render()

    def at(cell, dx=14, dy=14):
        return image.getpixel((cell[1] * 28 + dx, cell[0] * 28 + dy))

    assert at((0, 0)) == COLORS["wall"] and at((5, 3), 1, 1) == COLORS["wall"]
    assert at((3, 4)) == (255 - 40 * 3, 255 - 40 * 4, 200) and at((4, 1)) == (95, 215, 200)
    assert at((1, 1)) == COLORS["player"] and at((1, 1), 2, 2) == (215, 215, 200)
    assert at((2, 3)) == COLORS["box_on_target"] and at((2, 3), 2, 2) == (175, 135, 200)
    assert at((4, 2), 7, 14) == COLORS["target"] and at((4, 2)) == (95, 175, 200)
    floors = {at((r, q)) for r in range(1, 5) for q in range(1, 5) if (r, q) not in {(1, 1), (2, 3), (4, 2)}}
    assert len(floors) == 13  # every empty floor cell has a colour of its own
    plain = Sokoban(size=6, cell=28)
    plain.reset({"seed": 0})
    _set(plain, (1, 1), {(2, 3)}, {(4, 2), (2, 3)})
    assert plain.render().getpixel((4 * 28 + 14, 3 * 28 + 14)) == COLORS["floor"]
    with pytest.raises(ValueError, match="floor must be one of plain, coordinates, got 'tiles'"):
        Sokoban(floor="tiles")


def test_equal_states_give_equal_anchors_across_episodes():
    a, b = Sokoban(), Sokoban()
    oa, ob = a.reset({"seed": 5}), b.reset({"seed": 5})
    assert state_anchor(oa) == state_anchor(ob)
    _set(a, (1, 1), {(3, 3)}, {(4, 4)})
    _set(b, (1, 1), {(3, 3)}, {(4, 4)})
    ra, _, _ = a.step("<action>down</action>")
    rb, _, _ = b.step("<think>other words</think><action>down</action>")
    assert a.player == (2, 1) and state_anchor(ra) == state_anchor(rb)  # same state reached by two trajectories
    moved, _, _ = a.step("<action>right</action>")
    assert state_anchor(moved) != state_anchor(rb)  # another state
    invalid, _, _ = b.step("nothing")  # an invalid action: same state and anchor, other text
    assert invalid.text != rb.text and state_anchor(invalid) == state_anchor(rb)


def test_sokoban_text_mode():
    env = Sokoban(size=5, visual=False)
    env.reset({"seed": 0})
    _set(env, (1, 1), {(2, 2)}, {(3, 3), (2, 2)})
    obs = env.observe()
    assert obs.images == [] and obs.text.startswith("#####\n#P__#\n#_√_#\n#__O#\n#####\n(# wall")
    assert state_anchor(obs) == obs.text
    env.player = (3, 3)
    assert env.render_text().splitlines()[3] == "#__S#"


def test_parsing_hostile_tag_floods_is_linear_and_reports_few_errors():
    for text in ("<tool_call>" * 200_000, "</tool_call>" * 200_000, "<tool_call>x</tool_call>" * 100_000):
        t0 = time.process_time()  # CPU time: the suite's other worker does not count (a quadratic scan takes minutes)
        calls, errors = parse_tool_calls(text)
        assert time.process_time() - t0 < 2.0
        assert calls == [] and 1 <= len(errors) <= 9
    _, errors = parse_tool_calls("</tool_call>" * 20)
    assert len(errors) == 9 and errors[-1] == "… and 12 more malformed tool calls"
