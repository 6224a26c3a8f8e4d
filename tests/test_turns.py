"""Multi-turn, tool-using rollouts of the token families (modalities/tokens/turns.py) on the tiny Qwen2.5-VL of the
real architecture: layout and masks, log-probs against a teacher-forced recomputation of the whole conversation,
hostile tool calls, turn and token budgets, an environment, config checks and GRPO steps with each credit option.

Where a test needs particular actions (a tool call, then an answer), ``script`` makes the policy's turns those texts
at ``TurnRunner.sample_turn`` (the one place the policy acts); the model, processor, template, tools, observation
rendering and log-prob forwards are the real ones. The other tests sample from the model.
"""

import math
from pathlib import Path

import pytest
import torch

from mmgrpo import losses
from mmgrpo.config import ConfigError, RolloutConfig
from mmgrpo.loader import load_config
from mmgrpo.modalities.tokens.turns import TurnState
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask
from tests.numerics import adapter_reductions

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CROP = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 40, 40]}}</tool_call>'


def _rows(n=1):
    return ShapesTask(ShapesArgs(train_size=n, eval_size=1, image_size=112)).train_rows()


def _adapter(path, max_new_tokens=24, **rollout):
    settings = RolloutConfig(**{"tools": ["crop"], "max_total_tokens": 400, **rollout})
    return build_vlm_adapter({"name_or_path": path, "max_new_tokens": max_new_tokens}, rollout=settings)


def script(adapter, turns, real_after=None):
    """Make trajectory b's turn k the text ``turns[b][k]`` (+ the end token); with ``real_after`` = k, turns from k
    on are sampled from the model. Returns the list of (rows, turn) the policy was asked for."""
    runner, tok = adapter.driver, adapter.tokenizer
    eos, sample, calls = int(adapter.eos_ids[0]), runner.sample_turn, []

    def scripted(encodings, n, greedy, keys, rows, turn):
        calls.append((list(rows), turn))
        if real_after is not None and turn >= real_after:
            return sample(encodings, n, greedy, keys, rows, turn)
        seqs = [tok.encode(turns[b][turn], add_special_tokens=False) + [eos] for b in rows]
        ids = torch.full((len(rows), max(map(len, seqs))), adapter.pad_id)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
        return ids, None

    runner.sample_turn = scripted
    return calls


def _teacher_forced(adapter, row, messages):
    """Log-probs of the assistant tokens of the conversation [row's prompt ; messages], rendered in one go by the
    chat template and processed with all its images, under the sampling distribution (temperature, media tokens
    banned). Returns (ids [L], prompt length, logprobs [L] aligned with ids: entry i scores token i)."""
    runner, processor = adapter.driver, adapter.processor
    conv = adapter._messages(row, {"image": 1}) + [
        {**m, "content": [{"type": "image"} if "image" in p else p for p in m["content"]]}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]
    text = processor.apply_chat_template(conv, tools=runner.schemas, chat_template=runner.template, tokenize=False)
    images = [row["image"]] + [p["image"] for m in messages if isinstance(m["content"], list) for p in m["content"]
                               if "image" in p]  # fmt: skip
    enc = processor(text=[text], images=images, return_tensors="pt")
    prompt = processor.apply_chat_template(
        adapter._messages(row, {"image": 1}),
        tools=runner.schemas,
        chat_template=runner.template,
        tokenize=False,
        add_generation_prompt=True,
    )
    Lp = processor(text=[prompt], images=[row["image"]], return_tensors="pt")["input_ids"].shape[1]
    with torch.no_grad():
        logits = adapter._unwrapped()(**enc).logits[0].float()  # [L, V]
    scores = logits / adapter.args.temperature
    scores[:, adapter.suppress_ids] = float("-inf")
    logp = scores.log_softmax(-1)[:-1].gather(1, enc["input_ids"][0, 1:, None]).squeeze(1)  # [L-1] scores token i+1
    return enc["input_ids"][0], Lp, torch.cat([torch.zeros(1), logp])


@pytest.mark.parametrize("template", ["auto", "qwen2.5_vl_tools_brief"])
def test_two_turn_image_trajectory_equals_teacher_forced_conversation(tiny_vlm_path, template):
    """Row 0 crops, sees the crop (image pads in its observation), answers; row 1 answers at once. The batched
    log-prob forward over [prompt ; trajectory] (both rows, padded together) equals a forward over the conversation
    rendered from the chat messages, to fp32 rounding; observation tokens are masked and score 0. The same with the
    brief template, whose prompt carries a one-line tool section instead of the JSON schemas."""
    adapter = _adapter(tiny_vlm_path, chat_template=template)
    row = _rows(1)[0]
    prompt = adapter.processor.apply_chat_template(
        adapter._messages(row, {"image": 1}), tokenize=False, **adapter.driver.template_kwargs()
    )
    assert ("# Tools: crop(bbox_2d). Call one as <tool_call>" in prompt) == (template != "auto")
    assert ('"description"' in prompt) == (template == "auto")
    calls = script(adapter, {0: [CROP, "<answer>red</answer>"], 1: ["<answer>blue</answer>"]})
    rollout = adapter.rollout([row], group_size=2)
    assert calls == [([0, 1], 0), ([0], 1)]  # turn 1 re-encodes the one still-running trajectory
    state: TurnState = rollout.state
    ex = rollout.extras
    assert ex["num_turns"] == [2, 1] and ex["tool_calls"] == [1, 0] and ex["tool_errors"] == [0, 0]
    assert rollout.outputs == [CROP + "\n<answer>red</answer>", "<answer>blue</answer>"]
    assert not rollout.truncated.any()
    image_pad = adapter.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    obs = (state.valid == 1) & (state.action == 0)  # [B, T]
    assert obs[0].sum() > 0 and obs[1].sum() == 0
    assert (state.completion_ids[obs] == image_pad).sum() == int(state.media[0]["image_grid_thw"].prod(-1).sum()) // 4
    assert (rollout.mask[obs] == 0).all() and (rollout.old_logprobs[obs] == 0).all()
    assert set(rollout.turn_of_token[0][state.action[0] == 1].tolist()) == {0, 1}
    assert (rollout.turn_of_token[obs] == -1).all()

    logp = adapter.logprobs(rollout, torch.arange(2)).detach()  # [2, T]
    tools = [m for m in ex["messages"][0] if m["role"] == "tool"]
    crop = tools[0]["content"][0]["image"]
    assert crop.size == (40, 40) and crop.tobytes() == row["image"].crop((0, 0, 40, 40)).tobytes()
    for b in range(2):
        ids, Lp, want = _teacher_forced(adapter, row, ex["messages"][b])
        n = int(state.valid[b].sum())
        got_ids = torch.cat([state.encodings[0]["input_ids"][0], state.completion_ids[b, :n]])
        assert ids[: Lp + n].tolist() == got_ids.tolist()  # token-in/token-out equals the rendered conversation
        act = state.action[b, :n].bool()
        torch.testing.assert_close(logp[b, :n][act], want[Lp : Lp + n][act], rtol=0, atol=1e-5)
        assert (logp[b, :n][~act] == 0).all()
    alone = adapter.logprobs(rollout, torch.tensor([1])).detach()  # no observation media: the prompt-sharing forward
    adapter_reductions(adapter).assert_logprobs_close(alone[0], logp[1])
    m = rollout.mask.bool()
    adapter_reductions(adapter).assert_logprobs_close(logp[m], rollout.old_logprobs[m])  # ratio 1 before an update


def test_sampled_turn_after_an_image_observation_matches_the_training_forward(tiny_vlm_path):
    """Turn 0 calls crop (scripted); turn 1 is sampled by the KV-cached decode loop over [prompt ; turn 0 ;
    observation with the crop]. The log-probs it drew with equal the training forward's (mRoPE over the whole
    sequence), so old_logprobs: sampler is exact up to rounding and the ratio is 1 before the first update."""
    adapter = _adapter(tiny_vlm_path, max_new_tokens=6)
    adapter.args.old_logprobs = "sampler"
    rows = _rows(2)
    script(adapter, {b: [CROP] for b in range(6)}, real_after=1)
    torch.manual_seed(0)
    rollout = adapter.rollout(rows, group_size=3)
    turn1 = rollout.turn_of_token == 1  # [B, T]
    assert turn1.any(dim=1).all() and all(n == 2 or n > 2 for n in rollout.extras["num_turns"])
    logp = adapter.logprobs(rollout, torch.arange(6)).detach()
    m = rollout.mask.bool() & turn1
    assert (rollout.old_logprobs[m] != 0).all()
    adapter_reductions(adapter).assert_logprobs_close(logp[m], rollout.old_logprobs[m])


def test_observation_tokens_get_no_loss_and_no_kl_gradient(tiny_vlm_path):
    """The trainer's loss (PPO-clip + β·k3 KL, token-mean) has zero gradient with respect to the log-probs of
    observation tokens (which are finite: their targets are not scored) and a non-zero one on the policy's tokens."""
    adapter = _adapter(tiny_vlm_path)
    script(adapter, {0: [CROP, "<answer>red</answer>"], 1: ["<answer>blue</answer>"]})
    rollout = adapter.rollout(_rows(1), group_size=2)
    state, idx, m = rollout.state, torch.arange(2), rollout.mask
    raw = adapter._token_logprobs(adapter.model, state, idx)  # [2, T] unmasked
    raw.retain_grad()
    obs = (state.valid == 1) & (state.action == 0)
    assert torch.isfinite(raw[obs]).all()
    logp = raw * m  # what adapter.logprobs returns
    adv = torch.tensor([[1.0], [-1.0]]).expand_as(m) * m
    per_unit, _ = losses.SURROGATES.get("ppo_clip")(logp - rollout.old_logprobs, adv, m, losses.PPOClipOptions())
    kl = losses.KL_ESTIMATORS.get("k3")(logp, rollout.old_logprobs - 0.1, losses.SampleKLOptions()) * m
    aggregate = losses.AGGREGATIONS.get("token_mean")
    loss = aggregate(per_unit, m, max_units=m.shape[1]) + 0.1 * aggregate(kl, m, max_units=m.shape[1])
    loss.backward()
    assert (raw.grad[obs] == 0).all()
    assert (raw.grad[m.bool()] != 0).all()


def test_hostile_tool_calls_become_bounded_observations(tiny_vlm_path):
    """A huge box (clamped: the whole image), a negative box, an unknown tool, broken JSON and a 10 MB argument are
    answered by observations of bounded size; the trajectory goes on to its answer."""
    adapter = _adapter(tiny_vlm_path, max_turns=6, max_total_tokens=2000)
    turns = [
        '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 1e9, 1e9]}}</tool_call>',
        '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [-50, -50, -10, -10]}}</tool_call>',
        '<tool_call>{"name": "shell", "arguments": {"cmd": "rm -rf /"}}</tool_call>',
        '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0</tool_call>',
        "<answer>red</answer>",
    ]
    script(adapter, {0: turns})
    rollout = adapter.rollout(_rows(1), group_size=1)
    ex = rollout.extras
    assert ex["num_turns"] == [5] and not rollout.truncated.any()
    assert ex["turn_invalid"][0] == [False, True, True, True, False]
    assert ex["tool_errors"] == [3]
    texts = [m["content"][-1]["text"] for m in ex["messages"][0] if m["role"] == "tool"]
    assert "shell" in texts[2] and "crop" in texts[2]  # the unknown name and the valid ones
    assert "JSON" in texts[3]
    state = rollout.state
    obs_tokens = ((state.valid == 1) & (state.action == 0)).sum()
    assert obs_tokens < 1000
    runner = adapter.driver  # a 10 MB argument (no policy turn is that long: the runner's answer to the text)
    from mmgrpo.modalities.tokens.turns import _Trajectory
    from mmgrpo.tools import ToolContext, run_tool_calls

    huge = '<tool_call>{"name": "crop", "arguments": {"label": "' + "x" * 10_000_000 + '", "bbox_2d": [0, 0, 9, 9]}}'
    t = _Trajectory()
    obs = runner._run_calls(huge + "</tool_call>", ToolContext(images=[_rows(1)[0]["image"]]), t, run_tool_calls)
    assert len(obs) == 1 and obs[0].invalid and len(obs[0].text) <= runner.limits["max_observation_chars"]
    ids, media, _ = runner.encode_observation(obs, t)
    assert len(ids) < 400 and not media


def test_max_turns_token_budget_and_image_budget_end_trajectories(tiny_vlm_path):
    """A policy that always calls crop stops at max_turns (its last call not run, the trajectory truncated); a
    small token budget stops it when the next observation would not fit; max_images drops further crops."""
    always = {b: [CROP] * 8 for b in range(2)}
    adapter = _adapter(tiny_vlm_path, max_turns=3)
    script(adapter, always)
    rollout = adapter.rollout(_rows(1), group_size=2)
    assert rollout.extras["num_turns"] == [3, 3] and rollout.extras["tool_calls"] == [2, 2]
    assert rollout.truncated.all()
    script(adapter, always)
    assert adapter.evaluate(_rows(1)) == ["\n".join([CROP] * 3)]  # held-out: the same loop, one trajectory per row
    obs_len = int(((rollout.state.valid == 1) & (rollout.state.action == 0))[0].sum()) // 2  # one observation

    turn_len = len(adapter.tokenizer.encode(CROP)) + 1
    budget = 2 * turn_len + obs_len + 5  # room for turn 0, one observation, turn 1 — not a second observation
    adapter = _adapter(tiny_vlm_path, max_turns=8, max_total_tokens=budget)
    script(adapter, always)
    rollout = adapter.rollout(_rows(1), group_size=1)
    assert rollout.extras["num_turns"] == [2] and rollout.truncated.all()
    assert int(rollout.state.valid.sum()) <= budget and rollout.mask.shape[1] == budget

    adapter = _adapter(tiny_vlm_path, max_turns=4, max_images=1)
    script(adapter, always)
    rollout = adapter.rollout(_rows(1), group_size=1)
    assert int(rollout.state.media[0]["image_grid_thw"].shape[0]) == 1
    tools = [m for m in rollout.extras["messages"][0] if m["role"] == "tool"]
    assert "rollout.max_images=1" in tools[1]["content"][-1]["text"]


def test_environment_turns_step_the_game_and_key_anchors_by_its_images(tiny_vlm_path):
    """With rollout.environment: sokoban the first observation joins the prompt (its image after the row's), each turn
    is an env step with its reward, invalid actions are flagged, and the anchors are the rendered states."""
    settings = RolloutConfig(environment="sokoban", max_turns=3, max_total_tokens=600)
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 16}, rollout=settings)
    script(adapter, {b: ["<action>up</action>", "no move", "<action>left</action>"] for b in range(2)})
    row = {"prompt": "Play.", "seed": 3}
    rollout = adapter.rollout([row], group_size=2)
    ex = rollout.extras
    assert ex["num_turns"] == [3, 3] and ex["turn_invalid"][0][1] and not ex["turn_invalid"][0][0]
    assert all(math.isclose(r, -0.1) for r in ex["turn_rewards"][0][1:2])
    assert len(rollout.state.encodings[0]["image_grid_thw"]) == 1  # the level's first image, in the prompt
    assert ex["anchors"][0] == ex["anchors"][1]  # same level, same moves
    assert ex["anchors"][0][1] == ex["anchors"][0][2]  # an invalid move leaves the state as it was
    assert rollout.state.media[0]["image_grid_thw"].shape[0] == 2  # the states after turns 0 and 1


def test_the_demo_scores_a_game_answer_with_its_turn_rewards(tiny_vlm_path):
    """A greedy game answer (a ``Transcript``) keeps the environment's reward of each turn, so the demo's reward line
    scores ``env_return`` as training does: on a grid-world level with shaping, a wall bump (0), the moves toward the
    goal (+1 each) and the winning move (+1 + 10) sum to 10 + the distance, for the greedy answer and a sampled one."""
    from mmgrpo.demo.answer import score
    from mmgrpo.rewards.runner import RewardRunner
    from mmgrpo.tools import GridWorld
    from mmgrpo.types import Transcript

    env = {"distance_reward": 1.0, "max_steps": 6}
    settings = RolloutConfig(environment="gridworld", environment_args=env, max_turns=6, max_total_tokens=600)
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 16}, rollout=settings)
    game = GridWorld(**env)
    row = next({"prompt": "Walk.", "seed": s} for s in range(100) if game.reset({"seed": s}) and game.player[0] == 1)
    moves = [f"<action>{a}</action>" for a in game.shortest_solution()]
    turns = ["<action>up</action>", *moves]  # the player stands on the top row: up walks into the wall
    script(adapter, dict.fromkeys(range(2), turns))
    greedy = adapter.evaluate([row])[0]
    assert isinstance(greedy, Transcript) and greedy.turns == tuple(turns)
    assert greedy.turn_rewards == (0.0, *[1.0] * (len(moves) - 1), 11.0)
    rollout = adapter.rollout([row], group_size=1)
    runner = RewardRunner([("env_return", 1.0, {})], isolation="thread")
    extras = {"turn_rewards": [list(greedy.turn_rewards), *rollout.extras["turn_rewards"]]}
    lines = score(runner, [greedy, *rollout.outputs], row, True, extras)
    total = 10.0 + len(moves)
    assert lines == [f"reward {total:.3f} (env_return={total:.3f})"] * 2
    assert score(runner, [greedy], row, True)[0].startswith("reward n/a")  # without the turn rewards: not applicable


@pytest.mark.parametrize("layout", ["before_text", "after_text"])
def test_observation_images_go_before_or_after_their_text(tiny_vlm_path, layout):
    """rollout.observation_images places each observation's image pads before its text (the default, as Qwen's and
    TRL's processors place a user message's media) or after it, next to the reply: the first observation in the
    prompt (after the row's prompt and the observation's text) and each later one in its own user turn. Either way
    the log-probs of the trajectory equal a teacher-forced forward over the conversation rendered from its chat
    messages."""
    settings = RolloutConfig(
        environment="sokoban",
        max_turns=2,
        max_total_tokens=600,
        observation_images=layout,
        environment_args={"instruction": "Your move?"},
    )
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 16}, rollout=settings)
    script(adapter, {0: ["<action>up</action>", "<action>left</action>"]})
    row = {"prompt": "Play.", "seed": 3}
    rollout = adapter.rollout([row], group_size=1)
    state, tok = rollout.state, adapter.tokenizer

    def pads_before_move(ids: list[int]) -> bool:
        """Whether the image pads come before the observation's text ("... Your move?") in ``ids``."""
        text = tok.decode(ids)
        return text.rindex("<|image_pad|>") < text.rindex("move?")

    prompt = state.encodings[0]["input_ids"][0].tolist()
    n = int(state.valid[0].sum())
    observation = state.completion_ids[0, :n][state.action[0, :n] == 0].tolist()
    assert pads_before_move(prompt) == pads_before_move(observation) == (layout == "before_text")
    parts = [p["type"] for m in rollout.extras["messages"][0] if m["role"] == "user" for p in m["content"]]
    assert parts == (["image", "text"] if layout == "before_text" else ["text", "image"])

    env_row = adapter.driver.environments([row], 1)[0][0]  # the prompt row, the level's first image in it
    ids, Lp, want = _teacher_forced(adapter, {**env_row, "image": env_row["images"][0]}, rollout.extras["messages"][0])
    assert ids[: Lp + n].tolist() == prompt + state.completion_ids[0, :n].tolist()
    logp = adapter.logprobs(rollout, torch.arange(1)).detach()[0, :n]
    act = state.action[0, :n].bool()
    torch.testing.assert_close(logp[act], want[Lp : Lp + n][act], rtol=0, atol=1e-5)


def _cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"output_dir={tmp_path}",
            "steps=1",
            "model.args.name_or_path=tiny-qwen2.5-vl",
            "model.args.max_new_tokens=24",
            "task.args.train_size=4",
            "task.args.eval_size=2",
            "task.args.image_size=112",
            "rewards=[{name: accuracy}]",
            "algorithm.group_size=4",
            "algorithm.prompts_per_step=1",
            "algorithm.minibatch_size=2",
            "rollout.tools=[crop]",
            "rollout.max_total_tokens=300",
            "eval.before=false",
            "eval.after=false",
            "logging.trackers=[]",
            "logging.progress=false",
            "checkpoint.save_final=false",
            "optim.lr=1e-3",
            *extra,
        ],
    )


@pytest.mark.parametrize("credit", ["trajectory", "gigpo", "mt_grpo"])
def test_one_grpo_step_with_tools_is_finite_and_changes_parameters(tmp_path, mmgrpo_cache, credit):
    from mmgrpo.trainer import Trainer

    trainer = Trainer(_cfg(tmp_path, f"algorithm.credit={credit}"))
    answer = trainer.task.train_rows()[trainer.sampler.indices(0)[0]]["answer"]
    turns = {  # two crop, two answer at once; right and wrong answers in both
        0: [CROP, f"<answer>{answer}</answer>"],
        1: [CROP, "<answer>none</answer>"],
        2: [f"<answer>{answer}</answer>"],
        3: ["<answer>none</answer>"],
    }
    script(trainer.adapter, turns)
    params = list(trainer.adapter.trainable_parameters())
    before = [p.detach().clone() for p in params]
    metrics = trainer.train_step(0)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["tools/calls_mean"] == 0.5 and metrics["turns/mean"] == 1.5
    assert metrics["reward/mean"] == 0.5
    changed = sum(not torch.equal(b, p) for b, p in zip(before, params))
    assert changed > len(params) // 2
    if credit == "gigpo":
        assert metrics["credit/anchor_clusters"] >= 2  # turn 0 (shared prompt) and the crop's observation


def test_multi_turn_rewards_without_multi_turn_rollouts_fail_at_load():
    """deepeyes reads the rollout's tool calls and env_return its environment rewards: without rollout.tools /
    rollout.environment, load (and --dry-run) names the fix instead of the first GRPO step failing."""
    with pytest.raises(ConfigError, match=r"'deepeyes' reads what a multi-turn rollout records.*no rollout.tools"):
        load_config(CONFIGS / "zoom_no_tools.yaml", ["rewards=[{name: deepeyes}]"])
    with pytest.raises(ConfigError, match=r"'env_return'.*no rollout.environment"):
        load_config(CONFIGS / "zoom_tools.yaml", ["rewards=[{name: env_return}]"])
    load_config(CONFIGS / "zoom_tools.yaml")  # deepeyes with rollout.tools: fine


def test_config_checks_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.tools"):
        load_config(None, [f"output_dir={tmp_path}", "rewards=[{name: accuracy}]", "algorithm.credit=gigpo"])
    with pytest.raises(ConfigError, match="did you mean 'crop'"):
        _cfg(tmp_path, "rollout.tools=[crpo]")
    with pytest.raises(ConfigError, match="multi_turn"):
        load_config(
            None,
            [f"output_dir={tmp_path}", "rewards=[{name: accuracy}]", "model.adapter=flow", "task.name=flow_shapes",
             "rollout.tools=[crop]"],
        )  # fmt: skip
    with pytest.raises(ConfigError, match=r"algorithm\.shaping: none"):
        _cfg(tmp_path, "algorithm.credit=gigpo", "algorithm.shaping=temporal")
    with pytest.raises(ConfigError, match=r"algorithm\.credit_args\.gama"):
        _cfg(tmp_path, "algorithm.credit=gigpo", "algorithm.credit_args={gama: 0.9}")
    with pytest.raises(ConfigError, match="choose one"):
        _cfg(tmp_path, "rollout.environment=sokoban")
    with pytest.raises(ConfigError, match=r"^rollout\.environment_args: floor must be one of plain, coordinates"):
        load_config(CONFIGS / "sokoban_grpo.yaml", [f"output_dir={tmp_path}", "rollout.environment_args.floor=tiles"])
    with pytest.raises(ConfigError, match=r"^rollout\.environment_args: size must be >= 4"):
        load_config(CONFIGS / "sokoban_grpo.yaml", [f"output_dir={tmp_path}", "rollout.environment_args.size=3"])
    with pytest.raises(ConfigError, match=r"rollout\.tool_limits\.timeout"):
        _cfg(tmp_path, "rollout.tool_limits={timeout: 1}")
    with pytest.raises(ConfigError, match="min_new_tokens"):
        _cfg(tmp_path, "model.args.min_new_tokens=2")
    cfg = _cfg(tmp_path, "algorithm.credit=gigpo", "algorithm.credit_args={gamma: 0.9, step_advantage_w: 0.5}")
    assert cfg.algorithm.credit_args == {"gamma": 0.9, "step_advantage_w": 0.5}


def test_video_turns_insert_selected_frames_and_agree_with_the_training_forward(tiny_vlm_path, mmgrpo_cache):
    """The video adapter on the same loop: select_frames returns frames of the row's file decoded densely in the
    span (not the prompt's sparser frames), inserted as images after the prompt's video; turn 1 is sampled over
    [video prompt ; call ; frames] and its log-probs equal the training forward's (mRoPE over the video, the frames
    and the text)."""
    from mmgrpo.modalities.video.adapter import build_video_adapter
    from mmgrpo.tasks.video_motion import VideoMotionArgs, VideoMotionTask

    rows = VideoMotionTask(VideoMotionArgs(questions=["direction"], train_size=2, eval_size=1)).train_rows()
    sampling = {"fps": 3.0, "min_frames": 4, "max_frames": 8, "min_pixels": 3136, "max_pixels": 3136}
    settings = RolloutConfig(tools=["select_frames"], tool_limits={"max_frames": 2}, max_total_tokens=300)
    adapter = build_video_adapter(
        {"name_or_path": tiny_vlm_path, "max_new_tokens": 6, "video": sampling, "old_logprobs": "sampler"},
        rollout=settings,
    )
    call = '<tool_call>{"name": "select_frames", "arguments": {"start": 0, "end": 1, "num_frames": 2}}</tool_call>'
    script(adapter, {b: [call] for b in range(4)}, real_after=1)
    torch.manual_seed(0)
    rollout = adapter.rollout(rows, group_size=2)
    assert rollout.extras["tool_calls"] == [1] * 4 and rollout.extras["tool_errors"] == [0] * 4
    assert all(m["image_grid_thw"].shape[0] == 2 for m in rollout.state.media)  # the two frames, as images
    # decoded densely from the file (8 fps: 0 s and 1 s), not picked from the prompt's 3-fps frames (0 s, 0.75 s)
    tool_text = next(m for m in rollout.extras["messages"][0] if m["role"] == "tool")["content"][-1]["text"]
    assert "Frames at 0s, 1s of the video." in tool_text, tool_text
    assert "video_grid_thw" in rollout.state.encodings[0]
    m = rollout.mask.bool() & (rollout.turn_of_token == 1)
    assert m.any(dim=1).all()
    logp = adapter.logprobs(rollout, torch.arange(4)).detach()
    adapter_reductions(adapter).assert_logprobs_close(logp[m], rollout.old_logprobs[m])


def lookup(word: str) -> str:
    """Look a word up in the tiny dictionary.

    Args:
        word: The word to look up.
    """
    return {"seven": "7", "two": "2"}.get(word.strip().lower(), f"{word!r} is not in the dictionary")


def test_audio_llm_turns_with_a_plain_function_tool(mmgrpo_cache):
    """The audio LLM (Qwen2-Audio) on the same loop, with a plain Python function named by import path (TRL's
    tools=): text observations, the prompt-sharing log-prob forward, ratio 1 and sampler agreement on turn 1."""
    import shutil

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    from mmgrpo.modalities.speech.audio_llm import build_audio_llm_adapter
    from mmgrpo.modalities.speech.tiny import resolve_model_path
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    rows = SpokenDigitsTask(SpokenDigitsArgs(question="second_word", train_size=2, eval_size=1)).train_rows()
    path = resolve_model_path("tiny-qwen2-audio")
    settings = RolloutConfig(tools=["tests.test_turns:lookup"], max_total_tokens=300)
    adapter = build_audio_llm_adapter(
        {"name_or_path": path, "max_new_tokens": 6, "old_logprobs": "sampler"}, rollout=settings
    )
    call = '<tool_call>{"name": "lookup", "arguments": {"word": "seven"}}</tool_call>'
    script(adapter, {b: [call] for b in range(4)}, real_after=1)
    torch.manual_seed(0)
    rollout = adapter.rollout(rows, group_size=2)
    tools = [m for m in rollout.extras["messages"][0] if m["role"] == "tool"]
    assert tools[0]["content"][-1]["text"] == "7" and rollout.extras["tool_errors"] == [0] * 4
    assert not any(rollout.state.media)
    m = rollout.mask.bool() & (rollout.turn_of_token == 1)
    assert m.any(dim=1).all()
    logp = adapter.logprobs(rollout, torch.arange(4)).detach()
    adapter_reductions(adapter).assert_logprobs_close(logp[m], rollout.old_logprobs[m])


def test_multi_turn_warmup_loss_is_the_teacher_forced_conversation_loss(tiny_vlm_path):
    """A warm-up target that is a list of turns (a crop call, then an answer) is teacher-forced with the real crop
    between them: its loss is the mean cross-entropy of the assistant tokens of the rendered conversation, and
    supervised steps on it lower it."""
    adapter = _adapter(tiny_vlm_path)
    row = dict(_rows(1)[0], target=[CROP, "<answer>red</answer>"])
    loss = adapter.supervised_loss([row])
    script(adapter, {0: row["target"]})
    rollout = adapter.rollout([row], group_size=1)
    assistant = [m["content"] for m in rollout.extras["messages"][0] if m["role"] == "assistant"]
    assert assistant == row["target"] and rollout.extras["tool_calls"] == [1]
    state = rollout.state
    n = int(state.valid[0].sum())
    act = state.action[0, :n].bool()
    _, Lp, want = _teacher_forced(adapter, row, rollout.extras["messages"][0])
    torch.testing.assert_close(loss.detach(), -want[Lp : Lp + n][act].mean(), rtol=1e-5, atol=1e-6)
    opt = torch.optim.AdamW(adapter.trainable_parameters(), lr=1e-3)
    for _ in range(3):
        step = adapter.supervised_loss([row])
        step.backward()
        opt.step()
        opt.zero_grad()
    assert float(adapter.supervised_loss([row]).detach()) < float(loss.detach()) - 0.1


def test_deepeyes_reward_reads_the_rollouts_tool_calls(tiny_vlm_path):
    """The DeepEyes reward on a multi-turn rollout: 0.8·acc + 1.2 for a right answer reached through a tool call,
    0.8 for a right answer without one, 0 for a wrong one (its format term is 0 for balanced tags)."""
    from mmgrpo.rewards import RewardRunner, score_rows

    adapter = _adapter(tiny_vlm_path)
    row = _rows(1)[0]
    right = f"<answer>{row['answer']}</answer>"
    script(adapter, {0: [CROP, right], 1: [right], 2: [CROP, "<answer>none</answer>"]})
    rollout = adapter.rollout([row], group_size=3)
    runner = RewardRunner([("deepeyes", 1.0, {})], isolation="thread")
    scores, _ = score_rows(runner, rollout.outputs, [row], 3, rollout.extras)
    torch.testing.assert_close(scores[:, 0], torch.tensor([2.0, 0.8, 0.0]))


def test_auto_template_refuses_a_model_whose_template_is_not_qwens(mmgrpo_cache):
    """SmolVLM's template renders images as <image> and has no tool role: our Qwen tool template would change its
    prompts, so rollout.chat_template: auto refuses it and names the fix (a template file)."""
    with pytest.raises(ConfigError, match=r"rollout\.chat_template: auto: .*Jinja file"):
        build_vlm_adapter({"name_or_path": "tiny-smolvlm", "max_new_tokens": 4}, rollout=RolloutConfig(tools=["crop"]))


def test_the_demo_shows_a_multi_turn_answer_with_its_observation_images(tiny_vlm_path, tmp_path):
    """A multi-turn greedy answer is a ``Transcript``: the assistant text rewards read, carrying every message; the
    demo saves each observation image as a file (``samples.save_value``) and shows the exchange as chat messages
    (the crop as its own message), which gradio's Chatbot takes."""
    gr = pytest.importorskip("gradio", reason="the demo needs the demo extra: pip install -e '.[demo]'")
    from PIL import Image

    from mmgrpo import samples
    from mmgrpo.demo.model_tab import trajectory_messages
    from mmgrpo.types import Transcript

    adapter = _adapter(tiny_vlm_path)
    row = _rows(1)[0]
    script(adapter, {0: [CROP, "<answer>red</answer>"]})
    out = adapter.evaluate([row])[0]
    assert isinstance(out, Transcript) and out == CROP + "\n<answer>red</answer>"
    assert out.turns == (CROP, "<answer>red</answer>") and not out.cut_last
    assert [m["role"] for m in out.messages] == ["assistant", "tool", "assistant"]
    crop = out.messages[1]["images"][0]
    assert crop.tobytes() == row["image"].crop((0, 0, 40, 40)).tobytes()  # what the policy was shown
    shown = samples.save_value(out, tmp_path, "trained_0")
    assert shown["kind"] == "text" and shown["text"] == str(out)
    path = shown["turns"][1]["images"][0]
    with Image.open(path) as saved:
        assert saved.convert("RGB").tobytes() == crop.convert("RGB").tobytes()
    messages = trajectory_messages(shown["turns"])
    assert messages[0] == {"role": "assistant", "content": CROP}
    assert messages[1]["role"] == "user" and messages[1]["content"].startswith("[tool]")
    assert messages[2] == {"role": "user", "content": {"path": path}}
    assert messages[3] == {"role": "assistant", "content": "<answer>red</answer>"}
    assert len(gr.Chatbot().postprocess(messages).root) == 4
    record = samples.write_samples(tmp_path / "run", "after", [(row, out)])[0]  # the run's held-out samples too
    assert record["output"] == str(out) and (tmp_path / "run" / record["turns"][1]["images"][0]).is_file()
