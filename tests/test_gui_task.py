"""The GUI environment (mmgrpo.tools.GuiApp, tools/gui.py) and its task (mmgrpo/tasks/gui.py): transitions, action
parsing, rendering determinism, the rewards worked by hand, the task's splits, warm-up and score, the shipped
configs, and a 2-step run."""

import hashlib
from pathlib import Path

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.tasks.gui import GuiArgs, GuiTask
from mmgrpo.tools import GuiApp, make_environment, state_anchor
from mmgrpo.tools.gui import COLORS, GOALS, Screen, apply_action, parse_gui_action
from mmgrpo.types import Transcript
from tests.test_sokoban_task import check_credit_twins

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {credit: ROOT / "configs" / f"gui_{credit}.yaml" for credit in ("grpo", "gigpo")}


@pytest.fixture(scope="module")
def task():
    return GuiTask(GuiArgs(train_size=200, eval_size=40))


def _app(goal: str, state: Screen, **options) -> GuiApp:
    """An app in ``state`` with the goal whose instruction is ``goal``."""
    app = make_environment("gui", **options)
    app.reset({"seed": 0})
    app.task, app.goal = next((t, g) for t, g in GOALS if t == goal)
    app.state = state
    return app


def act(app: GuiApp, action: str):
    return app.step(f"<action>{action}</action>")


def test_parsing_reads_the_last_action_and_refuses_bad_ones_with_the_fix():
    assert parse_gui_action("I will open it. <action> TAP   Wifi </action>") == (("tap", "wifi"), "")
    assert parse_gui_action("<action>back</action> then <action>type hi there</action>")[0] == ("type", "hi there")
    assert parse_gui_action("<action>scroll down</action>")[0] == ("scroll", "down")
    for text, says in [
        ("tap wifi", "no <action>"),
        ("<action>wifi</action>", "is not an action"),
        ("<action>tap camera</action>", "tap one of settings, messages, wifi"),
        ("<action>type </action>", "type 1 to 12 characters"),
        ("<action>type héllo</action>", "type 1 to 12 characters"),
        ("<action>type a very long message</action>", "type 1 to 12 characters"),
        ("<action>scroll left</action>", "scroll up or scroll down"),
        ("<action>back home</action>", "back takes no argument"),
        ("<action>" * 10_000, "no <action>"),
        ("</action><action>", "no <action>"),
    ]:
        parsed, reason = parse_gui_action(text)
        assert parsed is None and says in reason, (text, reason)


def test_transitions_by_hand():
    home = Screen("home", 0, (False, True, False))
    settings = apply_action(home, "tap", "settings")
    assert settings == Screen("settings", 0, (False, True, False))
    assert apply_action(settings, "tap", "airplane") == settings  # not in view: a legal no-op
    down = apply_action(settings, "scroll", "down")
    assert down.offset == 1 and apply_action(down, "scroll", "down").offset == 1  # the list's end
    assert apply_action(down, "tap", "airplane").switches == (False, True, True)
    assert apply_action(down, "tap", "bluetooth").switches == (False, False, False)  # a tap flips the switch
    assert apply_action(apply_action(down, "scroll", "up"), "tap", "wifi").switches == (True, True, False)
    assert apply_action(settings, "back", "") == home and apply_action(home, "back", "") == home
    assert apply_action(home, "scroll", "down") == home and apply_action(home, "type", "hi") == home
    messages = apply_action(home, "tap", "messages")
    assert apply_action(messages, "tap", "send") == messages  # nothing typed: nothing sent
    typed = apply_action(messages, "type", "hi")
    assert typed.draft == "hi" and apply_action(typed, "type", "ok").draft == "ok"  # typing replaces the field
    sent = apply_action(typed, "tap", "send")
    assert (sent.sent, sent.draft, sent.screen) == ("hi", "", "messages")


def test_rewards_by_hand_format_penalty_and_task_reward():
    """format_reward 0.5, task_reward 1: 'turn on airplane' from home with airplane off takes tap settings, scroll
    down, tap airplane. Played: a malformed turn (-0.5), tap settings (0), tap airplane out of view (0, a legal
    no-op), scroll down (0), tap airplane (+1, done): the return is 1 - 0.5 = 0.5 in 5 steps."""
    app = _app("turn on airplane", Screen("home", 0, (False, False, False)))
    assert app.shortest_solution() == ["tap settings", "scroll down", "tap airplane"]
    obs, reward, done = app.step("I tap the settings")
    assert obs.error and "Invalid action" in obs.text and (reward, done, app.state.screen) == (-0.5, False, "home")
    steps = [act(app, a) for a in ("tap settings", "tap airplane", "scroll down", "tap airplane")]
    assert [r for _, r, _ in steps] == [0.0, 0.0, 0.0, 1.0]
    assert [d for *_, d in steps] == [False, False, False, True] and app.completed and app.steps == 5
    assert all(o.error is None for o, _, _ in steps)
    with pytest.raises(RuntimeError, match="call reset"):
        act(app, "back")


def test_action_reward_is_potential_shaping_and_the_episode_ends_at_max_steps():
    """action_reward w = 0.25: w·(d_before - d_after) with d the fewest actions left. 'send hi' from settings: d = 4
    (back, tap messages, type hi, tap send). Played: scroll down (d 4 -> 4: 0), back (4 -> 3: +0.25), tap messages
    (3 -> 2: +0.25), type ok (2 -> 2: 0; max_steps 4 ends it, not completed)."""
    app = _app("send hi", Screen("settings", 0, (True, True, True)), action_reward=0.25, max_steps=4)
    assert app.distance() == 4
    rewards = [act(app, a)[1:] for a in ("scroll down", "back", "tap messages", "type ok")]
    assert rewards == [(0.0, False), (0.25, False), (0.25, False), (0.0, True)] and not app.completed
    again = _app("send hi", Screen("messages", 0, (True, True, True), draft="ok"), action_reward=0.25)
    assert [act(again, a)[1] for a in ("tap send", "type hi", "tap send")] == [0.0, 0.25, 1.25]  # wrong word first
    assert again.state.sent == "hi"


def test_reset_is_deterministic_and_never_starts_done():
    seen = set()
    for seed in range(300):
        a, b = GuiApp(), GuiApp()
        oa, ob = a.reset({"seed": seed}), b.reset({"seed": seed})
        assert a.episode_text() == b.episode_text() and oa.text == ob.text and oa.text.startswith(f"Task: {a.task}.")
        assert oa.images[0].tobytes() == ob.images[0].tobytes()
        assert not a.completed and 1 <= len(a.shortest_solution()) <= 4
        seen.add(a.episode_text())
    assert len(seen) > 150 and {t.split("|")[0] for t in seen} == {t for t, _ in GOALS}
    with pytest.raises(ValueError, match="integer 'seed'"):
        GuiApp().reset({"seed": "3"})


def test_task_every_turn_repeats_the_task_in_each_observation_and_leaves_the_rest():
    plain, every = GuiApp(), GuiApp(task_every_turn=True)
    first = (plain.reset({"seed": 7}), every.reset({"seed": 7}))
    task = f"Task: {every.task}. Your move?"
    assert first[0].text == first[1].text == task
    for action in ("back", "jump"):  # a valid action, then a malformed one
        (p_obs, p_reward, _), (e_obs, e_reward, _) = act(plain, action), act(every, action)
        assert e_obs.text.endswith(task) and "Task:" not in p_obs.text and p_obs.text.endswith("Your move?")
        assert e_reward == p_reward and state_anchor(e_obs) == state_anchor(p_obs)  # same screen, same reward
    assert e_obs.text.startswith("Invalid action (") and e_reward == -0.5


def test_rendering_is_deterministic_and_shows_the_state():
    app = _app("send hi", Screen("settings", 0, (False, True, False)))  # a goal the taps below do not complete
    image = app.render()
    assert image.size == (112, 112) and image.mode == "RGB"
    assert hashlib.sha256(image.tobytes()).hexdigest() == hashlib.sha256(app.render().tobytes()).hexdigest()
    assert image.getpixel((100, 5)) == COLORS["settings"]  # the title bar names the screen
    assert image.getpixel((98, 42)) == COLORS["off"] and image.getpixel((98, 70)) == COLORS["on"]  # the knobs
    assert image.getpixel((14, 42)) == COLORS["wifi"] and image.getpixel((14, 70)) == COLORS["bluetooth"]
    before = state_anchor(app.observe())
    act(app, "tap wifi")
    assert app.render().getpixel((98, 42)) == COLORS["on"] and state_anchor(app.observe()) != before
    act(app, "tap wifi")  # off again: the same screen, the same anchor
    assert state_anchor(app.observe()) == before
    screens = {s: _app("send hi", Screen(s, 0, (False,) * 3)).render() for s in ("home", "messages")}
    assert screens["home"].getpixel((100, 5)) == COLORS["home"]
    assert screens["messages"].getpixel((100, 5)) == COLORS["messages"]
    big = GuiApp(cell=40)
    big.reset({"seed": 1})
    assert big.render().size == (160, 160)
    with pytest.raises(ValueError, match="cell must be >= 8"):
        GuiApp(cell=4)


def test_splits_share_no_episode_and_the_expert_completes_every_one(task):
    train, held = task.train_rows(), task.eval_rows()
    assert len(train) == 200 and len(held) == 40

    def episode(row):
        task.game.reset(row)
        return task.game.episode_text()

    assert not {episode(r) for r in train} & {episode(r) for r in held}
    for row in held:
        task.game.reset(row)
        moves = 0
        while not task.game.done:
            act(task.game, task.game.shortest_solution()[0])
            moves += 1
        assert task.game.completed and moves == row["min_moves"], row


def test_warmup_targets_and_score(task):
    expert = GuiTask(GuiArgs(train_size=30, eval_size=2, warmup_expert_eps=0.0))
    rows = expert.warmup_rows(seed=0)
    assert rows == expert.warmup_rows(seed=0)
    for row in rows:
        assert len(row["target"]) == row["min_moves"] and expert.play(Transcript(row["target"]), row)[0]
    noisy = task.warmup_rows(seed=0)
    assert noisy != task.warmup_rows(seed=1)
    a, b = rows[0], rows[1]
    outputs = [Transcript(a["target"]), Transcript(["<action>open the app</action>", *b["target"][:-1]])]
    scores = expert.score(outputs, [a, b])
    assert scores["success_rate"] == 0.5
    assert scores["mean_steps"] == pytest.approx((len(a["target"]) + len(b["target"])) / 2)
    assert scores["invalid_rate"] == pytest.approx(1 / (len(a["target"]) + len(b["target"])))
    assert scores["first_move_share"] == 0.5 and 0.0 <= scores["random_success"] < 0.3
    assert expert.play("\n".join(a["target"]), a)[0]  # a plain string: turns at newlines


def test_shipped_configs_differ_only_in_credit_and_match_the_task(tmp_path):
    check_credit_twins(CONFIGS, tmp_path, "gui", ("max_steps",), GuiApp)


def test_bad_options_are_refused_at_load_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"task\.args: max_steps must be >= 1"):
        GuiTask(GuiArgs(max_steps=0))
    with pytest.raises(TypeError, match="environment 'gui': cannot build it"):
        make_environment("gui", screens=4)
    for config, override, says in [
        ("grpo", "rollout.environment_args={max_steps: 0}", "rollout.environment_args: max_steps must be >= 1"),
        ("grpo", "rollout.environment_args={colour: 3}", "allowed: max_steps, cell, task_reward, format_reward"),
        ("grpo", "rollout.environment_args={cell: 4}", "cell must be >= 8"),
        ("gigpo", "algorithm.credit_args={}", "set algorithm.credit_args.outcome_on_last_turn: false"),
    ]:
        with pytest.raises(ConfigError, match=says) as error:
            load_config(CONFIGS[config], [f"output_dir={tmp_path}", override])
        assert "\n" not in str(error.value)


@pytest.mark.slow
def test_two_gigpo_steps_train(tmp_path, mmgrpo_cache):
    """Two GiGPO steps of the shipped config (a short warm-up, small batches): finite loss, parameters move. A
    barely warmed-up policy rarely completes a task, so the reward is one that varies within a group (a completion
    length of a multiple of 4), added to the last turn (``outcome_on_last_turn``), and turns cut before their end token
    stay in the loss."""
    import torch

    from mmgrpo.trainer import Trainer

    overrides = ["steps=2", "task.args.train_size=32", "task.args.eval_size=4", "algorithm.prompts_per_step=2",
                 "algorithm.group_size=4", "algorithm.minibatch_size=8", "warmup.steps=2", "warmup.batch_size=4",
                 "eval.before=false", "eval.after=false", "logging.progress=false", "logging.plot=false",
                 "checkpoint.after_warmup=false", "rewards=[{name: 'tests.test_variants:length_reward'}]",
                 "algorithm.credit_args={outcome_on_last_turn: true}",
                 "model.args.mask_truncated=false"]  # its turns rarely end: keep the cut ones in the loss  # fmt: skip
    cfg = load_config(CONFIGS["gigpo"], [f"output_dir={tmp_path}", *overrides])
    trainer = Trainer(cfg)
    trainer._warmup()
    params = list(trainer.adapter.trainable_parameters())
    before = [p.detach().clone() for p in params]
    metrics = [trainer.train_step(step) for step in range(2)]
    assert all(torch.isfinite(torch.tensor(m["loss/policy"])) for m in metrics)
    assert any(not torch.equal(p, q) for p, q in zip(before, params))
    assert all(m["turns/mean"] >= 1 for m in metrics)


def test_every_task_has_a_fixed_plan_that_ignores_the_screen():
    """``back`` then a plan fixed per task completes every episode (docs/agents.md, "The GUI task": held-out success
    measures the task, not screen reading; the shortest path, which the warm-up's expert takes, needs the screen)."""
    plans = {"wifi": ["tap settings", "scroll up", "tap wifi"], "bluetooth": ["tap settings", "tap bluetooth"],
             "airplane": ["tap settings", "scroll down", "tap airplane"]}  # fmt: skip
    for seed in range(300):
        app = GuiApp()
        app.reset({"seed": seed})
        kind, target, _ = app.goal
        plan = ["back", *(plans[target] if kind == "switch" else ["tap messages", f"type {target}", "tap send"])]
        for action in plan:
            act(app, action)
        assert app.completed and len(plan) <= app.max_steps, seed
