"""The grid world (mmgrpo.tools.GridWorld, mmgrpo/tasks/gridworld.py): the game's rules, levels and rendering, the
task's level-disjoint splits, expert warm-up and score (Sokoban's, on the other game), and the shipped configs."""

from pathlib import Path

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.tasks.gridworld import GridWorldArgs, GridWorldTask
from mmgrpo.tasks.sokoban import expert_move, level_text
from mmgrpo.tools import GridWorld, make_environment, parse_action
from mmgrpo.tools.gridworld import ACTIONS, COLORS
from mmgrpo.types import Transcript
from tests.test_sokoban_task import check_credit_twins

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {credit: ROOT / "configs" / f"gridworld_{credit}.yaml" for credit in ("grpo", "gigpo")}


@pytest.fixture(scope="module")
def task():
    return GridWorldTask(GridWorldArgs(train_size=300, eval_size=60))


def _distance(game: GridWorld) -> int:
    (goal,) = game.targets
    return abs(goal[0] - game.player[0]) + abs(goal[1] - game.player[1])


def test_levels_keep_the_distance_and_the_shortest_path_is_the_manhattan_distance():
    game = GridWorld(size=6, min_distance=3)
    seen = set()
    for seed in range(200):
        game.reset({"seed": seed})
        (goal,) = game.targets
        assert not game.boxes and goal != game.player and _distance(game) >= 3
        assert len(game.shortest_solution()) == _distance(game)
        seen.add(game.render_text())
        again = GridWorld(size=6, min_distance=3)
        again.reset({"seed": seed})
        assert again.render_text() == game.render_text()
    assert len(seen) > 50
    with pytest.raises(ValueError, match="min_distance must be from 1 to 6"):
        GridWorld(size=6, min_distance=7)


def test_rules_on_a_hand_worked_level():
    game = make_environment("gridworld", max_steps=4)
    game.reset({"seed": 0})
    game.player, game.targets = (1, 1), frozenset([(2, 2)])
    assert game.shortest_solution() == ["down", "right"]  # ties in the order up, down, left, right
    obs, reward, done = game.step("<action>up</action>")  # into the wall: a legal step that changes nothing
    assert (game.player, reward, done, obs.error) == ((1, 1), 0.0, False, None)
    obs, reward, done = game.step("go down")  # no action: invalid, costs a step, the room unchanged
    assert obs.error and "Invalid action" in obs.text and (game.player, reward, done) == ((1, 1), 0.0, False)
    game.step("<action>down</action>")
    obs, reward, done = game.step("<action>right</action>")
    assert (game.player, reward, done, game.solved, game.steps) == ((2, 2), 10.0, True, True, 4)
    with pytest.raises(RuntimeError, match="call reset"):
        game.step("<action>up</action>")
    game.reset({"seed": 0})
    game.player, game.targets = (1, 1), frozenset([(4, 4)])
    for _ in range(4):
        *_, done = game.step("<action>left</action>")
    assert done and not game.solved  # out of moves


def test_distance_shaping_pays_each_move_its_progress_and_telescopes():
    """Potential-based shaping (Ng et al. 1999) with w = 0.5, goal at (3, 2), player from (1, 1): a move toward the
    goal +0.5, away -0.5, into the wall 0; the episode's shaped sum is w·(first distance - last distance)."""
    game = GridWorld(distance_reward=0.5, max_steps=6)
    game.reset({"seed": 0})
    game.player, game.targets = (1, 1), frozenset([(3, 2)])
    moves = ["up", "down", "right", "left", "down", "right"]  # wall, closer, closer, away, closer, closer: on the goal
    rewards = [game.step(f"<action>{m}</action>")[1] for m in moves]
    assert rewards == [0.0, 0.5, 0.5, -0.5, 0.5, 10.5] and game.solved
    assert sum(rewards) - 10.0 == 0.5 * (3 - 0)


def test_the_goal_is_filled_red_and_the_player_blue():
    game = GridWorld(cell=28, floor="coordinates")
    game.reset({"seed": 3})
    image = game.render()
    assert image.size == (6 * 28, 6 * 28)
    (goal,) = game.targets
    for cell, colour in ((goal, "target"), (game.player, "player")):  # the middle pixel of the cell, (x, y)
        assert image.getpixel((cell[1] * 28 + 14, cell[0] * 28 + 14)) == COLORS[colour]
    corner = (goal[1] * 28 + 1, goal[0] * 28 + 1)  # the floor's colour shows around the goal
    assert image.getpixel(corner) not in (COLORS["target"], COLORS["floor"])
    game.border = False  # the floor alone: 4x4 cells, 112x112 pixels (one tiny-Qwen2.5-VL image token a cell)
    floor = game.render()
    assert floor.size == (4 * 28, 4 * 28)
    for cell, colour in ((goal, "target"), (game.player, "player")):  # every cell one up and one left
        assert floor.getpixel(((cell[1] - 1) * 28 + 14, (cell[0] - 1) * 28 + 14)) == COLORS[colour]
    assert floor.crop((0, 0, 112, 112)).tobytes() == image.crop((28, 28, 140, 140)).tobytes()


def test_splits_share_no_level_and_the_expert_wins_every_level_in_its_shortest_path(task):
    train, held = task.train_rows(), task.eval_rows()
    assert len(train) == 300 and len(held) == 60
    levels = {k: {level_text(task.game, r["seed"]) for r in rows} for k, rows in (("t", train), ("e", held))}
    assert len(levels["e"]) > 10 and not levels["t"] & levels["e"]
    assert {r["min_moves"] for r in train + held} <= {2, 3, 4, 5, 6}
    for row in held:
        task.game.reset(row)
        moves = 0
        while not task.game.done:
            task.game.step(f"<action>{expert_move(task.game)}</action>")
            moves += 1
        assert task.game.solved and moves == row["min_moves"], row


def test_warmup_targets_at_eps_0_walk_the_shortest_path():
    task = GridWorldTask(GridWorldArgs(train_size=100, eval_size=10, warmup_expert_eps=0.0))
    for row in task.warmup_rows(seed=0):
        task.game.reset(row)
        for turn in row["target"]:
            task.game.step(turn)
        assert len(row["target"]) == row["min_moves"] and task.game.solved, row
        assert all(parse_action(turn, ACTIONS)[0] is not None for turn in row["target"])


def test_score_counts_a_win_only_on_the_goal():
    expert = GridWorldTask(GridWorldArgs(train_size=20, eval_size=2, warmup_expert_eps=0.0))
    rows = expert.warmup_rows(seed=0)[:2]  # two train levels, each with its shortest path as the target
    paths = [row["target"] for row in rows]
    scores = expert.score([Transcript(paths[0]), Transcript(paths[1][:-1])], rows)  # the second stops one short
    assert scores["success_rate"] == 0.5
    assert scores["mean_steps"] == pytest.approx((len(paths[0]) + len(paths[1]) - 1) / 2)
    assert 0.0 < scores["random_success"] < 0.5


def test_shipped_configs_differ_only_in_credit_and_match_the_task(tmp_path):
    check_credit_twins(CONFIGS, tmp_path, "gridworld", ("size", "min_distance", "max_steps"), GridWorld)


def test_bad_level_options_are_refused_at_load():
    with pytest.raises(ConfigError, match=r"task\.args: min_distance must be from 1 to 4"):
        GridWorldTask(GridWorldArgs(size=5, min_distance=5))
