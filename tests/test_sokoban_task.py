"""The sokoban task (mmgrpo/tasks/sokoban.py): level-disjoint deterministic splits, the solver and the ε-noisy
expert's warm-up targets, the held-out score's replay of the game, the env_return reward and gigpo's outcome option,
the shipped configs, and a few GiGPO steps end to end on rendered levels."""

import pickle
from pathlib import Path

import pytest
import torch
import yaml

from mmgrpo import multiturn, shaping
from mmgrpo.config import ConfigError
from mmgrpo.credit import GiGPOOptions
from mmgrpo.loader import load_config
from mmgrpo.rewards import load_reward
from mmgrpo.tasks.sokoban import SokobanArgs, SokobanTask, expert_move, level_text
from mmgrpo.tools import Sokoban, parse_action
from mmgrpo.tools.gridworld import ACTIONS
from mmgrpo.types import Rollout, Transcript

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {credit: ROOT / "configs" / f"sokoban_{credit}.yaml" for credit in ("grpo", "gigpo")}


@pytest.fixture(scope="module")
def task():
    return SokobanTask(SokobanArgs(train_size=300, eval_size=60))


def test_splits_are_deterministic_and_share_no_seed_and_no_level(task):
    again = SokobanTask(SokobanArgs(train_size=300, eval_size=60))
    assert task.train_rows() == again.train_rows() and task.eval_rows() == again.eval_rows()
    train, held = task.train_rows(), task.eval_rows()
    assert len(train) == 300 and len(held) == 60
    assert not {r["seed"] for r in train} & {r["seed"] for r in held}
    levels = {split: {level_text(task.game, r["seed"]) for r in rows} for split, rows in (("t", train), ("e", held))}
    assert len(levels["e"]) > 10 and not levels["t"] & levels["e"]
    assert {r["min_moves"] for r in held} <= {1, 2, 3, 4, 5} and all(r["prompt"] == task.args.prompt for r in held)
    other = SokobanTask(SokobanArgs(train_size=300, eval_size=60, seed=7))
    assert {r["seed"] for r in other.train_rows()}.isdisjoint(r["seed"] for r in train)


def _moves(target: list[str]) -> list[str]:
    moves = [parse_action(turn, ACTIONS) for turn in target]
    assert all(action is not None for action, _ in moves), moves
    return [action for action, _ in moves]


def _hand_level(game: Sokoban, player, box, target) -> None:
    game.reset({"seed": 0})
    game.player, game.boxes, game.targets = player, {box}, frozenset([target])


def test_expert_move_solves_every_one_move_level(task):
    one_move = [r for r in task.train_rows() + task.eval_rows() if r["min_moves"] == 1]
    assert len(one_move) > 50
    for row in one_move:
        task.game.reset(row)
        task.game.step(f"<action>{expert_move(task.game)}</action>")
        assert task.game.boxes == set(task.game.targets), row
    other = {}  # some other move fails on some of them: the test can tell the solver from a fixed move
    for move in ACTIONS:
        for row in one_move:
            task.game.reset(row)
            task.game.step(f"<action>{move}</action>")
            other[move] = other.get(move, 0) + (task.game.boxes != set(task.game.targets))
    assert all(n > 0 for n in other.values()), other


def test_solver_is_optimal_on_a_hand_worked_level():
    """6×6 room (floor rows / columns 1–4): the box at (2, 2), its target at (2, 4), the player between them at
    (2, 3). Pushing right needs the player at (2, 1): round the box above or below it (3 moves: up, left, left +
    down, or the mirror), then two pushes right: 6 moves, and the first is up or down (right, onto the target, makes
    the way round 8 moves; left pushes the box against the left wall, from where it can never be pushed right)."""
    game = Sokoban(size=6, max_steps=20)
    _hand_level(game, player=(2, 3), box=(2, 2), target=(2, 4))
    solution = game.shortest_solution()
    assert len(solution) == 6 and solution[0] in ("up", "down") and solution[-2:] == ["right", "right"]
    assert expert_move(game) == solution[0]
    for move in solution[:-1]:
        game.step(f"<action>{move}</action>")
        assert game.boxes != set(game.targets)
    game.step(f"<action>{solution[-1]}</action>")
    assert game.boxes == set(game.targets)
    _hand_level(game, player=(2, 3), box=(2, 2), target=(2, 4))
    game.step("<action>left</action>")  # the box is pushed against the left wall: no push right can follow
    assert game.boxes == {(2, 1)} and game.shortest_solution() is None
    _hand_level(game, player=(3, 2), box=(2, 2), target=(1, 2))  # one push up
    assert game.shortest_solution() == ["up"] and expert_move(game) == "up"


def test_warmup_targets_at_eps_0_are_the_solvers_moves_and_solve_the_level():
    task = SokobanTask(SokobanArgs(train_size=200, eval_size=20, warmup_expert_eps=0.0))
    rows = task.warmup_rows(seed=0)
    assert len(rows) == len(task.train_rows())
    for row in rows:
        moves = _moves(row["target"])
        task.game.reset(row)
        for move in moves:
            assert move == expert_move(task.game), row
            task.game.step(f"<action>{move}</action>")
        assert len(moves) == row["min_moves"] and task.game.boxes == set(task.game.targets), row
    assert rows == task.warmup_rows(seed=1)  # no noise: the seed does not matter


def test_warmup_targets_at_eps_1_are_random_moves_and_between_they_mix(task):
    """ε = 1: uniform moves whatever the room (the format-only warm-up; a target ends early only on a solved level),
    agreeing with the solver about 1/4 of the time; ε = 0.5: 1/2 + 1/2·1/4 ≈ 0.62 of the moves are the solver's."""
    agree = {}
    for eps in (1.0, 0.5):
        noisy = SokobanTask(SokobanArgs(train_size=300, eval_size=20, warmup_expert_eps=eps))
        rows = noisy.warmup_rows(seed=0)
        moves, same = [], 0
        for row in rows:
            noisy.game.reset(row)
            target = _moves(row["target"])
            for move in target:
                same += move == expert_move(noisy.game)
                moves.append(move)
                noisy.game.step(f"<action>{move}</action>")
            assert len(target) == noisy.args.warmup_turns or noisy.game.boxes == set(noisy.game.targets)
        agree[eps] = same / len(moves)
        if eps == 1.0:
            share = {a: moves.count(a) / len(moves) for a in ACTIONS}
            assert all(0.2 < s < 0.3 for s in share.values()), share  # uniform, whatever the image shows
        assert rows == noisy.warmup_rows(seed=0) and rows != noisy.warmup_rows(seed=1)
    assert 0.15 < agree[1.0] < 0.35 and 0.5 < agree[0.5] < 0.75, agree
    assert task.args.warmup_expert_eps == SokobanArgs().warmup_expert_eps  # the fixture keeps the default


def test_score_replays_the_turns_through_the_game(task):
    rows = task.eval_rows()[:3]
    solutions = []
    for row in rows:
        task.game.reset(row)
        solutions.append([f"<action>{a}</action>" for a in task.game.shortest_solution()])
    outputs = [Transcript(s) for s in solutions[:2]] + [Transcript(["no move", *solutions[2]])]
    scores = task.score(outputs, rows)
    moves = sum(map(len, solutions)) + 1
    assert scores["success_rate"] == pytest.approx(2 / 3 if len(solutions[2]) == task.args.max_steps else 1.0)
    assert scores["mean_steps"] == pytest.approx(min(moves, moves - len(solutions[2]) + task.args.max_steps - 1) / 3)
    assert scores["invalid_rate"] == pytest.approx(1 / (3 * scores["mean_steps"]))
    assert 0.0 < scores["random_success"] < 1.0
    opening = {o.turns[0] for o in outputs}  # the solutions' first moves, and one turn without an action
    assert scores["first_move_share"] == pytest.approx((1 if len(opening) == 3 else 2) / 3)
    assert task.score([Transcript(["<action>up</action>"])] * 3, rows)["first_move_share"] == 1.0
    cut = Transcript(solutions[0], cut_last=True)  # the last turn had no end token: the rollout never played it
    assert task.play(cut, rows[0])[:2] == (False, len(solutions[0]) - 1)
    assert task.play("\n".join(solutions[0]), rows[0])[0]  # a plain string: turns at newlines
    assert pickle.loads(pickle.dumps(cut)) == cut and pickle.loads(pickle.dumps(cut)).cut_last


def test_env_return_sums_the_turn_rewards():
    reward = load_reward("env_return")
    assert reward(["a", "b"], turn_rewards=[[-0.1, 10.9], [-0.1, -0.1]]) == pytest.approx([10.8, -0.2])
    with pytest.raises(KeyError, match="turn_rewards"):
        reward(["a"], answer=["x"])


def _gigpo(outcome_on_last_turn: bool) -> torch.Tensor:
    """One group of two one-turn trajectories from the same state: returns (10.9, -0.1), outcome = the same."""
    rollout = Rollout(
        outputs=["a", "b"],
        old_logprobs=torch.zeros(2, 2),
        mask=torch.ones(2, 2),
        group_size=2,
        prompt_index=torch.tensor([0, 0]),
        truncated=torch.tensor([False, False]),
        state=None,
        turn_of_token=torch.zeros(2, 2, dtype=torch.long),
        extras={
            "num_turns": [1, 1],
            "turn_rewards": [[10.9], [-0.1]],
            "turn_invalid": [[False], [False]],
            "anchors": [["s"], ["s"]],
        },
    )
    rewards = torch.tensor([[10.9, -0.1]])  # [P, G] env_return
    options = GiGPOOptions(outcome_on_last_turn=outcome_on_last_turn)
    inputs = shaping.ShapingInputs(rollout.mask, rewards)
    return multiturn.unit_advantages("gigpo", options, rewards - rewards.mean(), inputs, rollout, {})[:, 0]


def test_gigpo_without_the_outcome_counts_the_environments_return_once():
    # mean_norm, γ = 0.95, ω = 1: A^E = R − mean R = ±5.5 and A^S the same (one anchor, one turn each).
    assert _gigpo(False).tolist() == pytest.approx([11.0, -11.0])
    assert _gigpo(True).tolist() == pytest.approx([22.0, -22.0])  # env_return added on top: twice the return


def check_credit_twins(configs: dict, tmp_path, environment: str, level_keys: tuple[str, ...], game) -> None:
    """A game's shipped GRPO and GiGPO configs: equal but for the credit (gigpo counting ``env_return`` once), the
    environment's level options equal to the task's, one turn per move, and options that build the game."""
    raw = {k: yaml.safe_load(p.read_text()) for k, p in configs.items()}
    for cfg in raw.values():
        cfg.pop("output_dir")
    gigpo_algo, grpo_algo = raw["gigpo"].pop("algorithm"), raw["grpo"].pop("algorithm")
    assert raw["gigpo"] == raw["grpo"]
    assert grpo_algo["credit"] == "trajectory" and gigpo_algo.pop("credit") == "gigpo"
    assert gigpo_algo.pop("credit_args") == {"outcome_on_last_turn": False}
    assert {**gigpo_algo, "credit": "trajectory"} == grpo_algo
    for credit, path in configs.items():
        cfg = load_config(path, [f"output_dir={tmp_path / credit}"])
        env, level = cfg.rollout.environment_args, cfg.task.args
        assert cfg.rollout.environment == environment and [r.name for r in cfg.rewards] == ["env_return"]
        assert all(env[k] == level[k] for k in level_keys), (env, level)
        assert cfg.rollout.max_turns == level["max_steps"]
        game(**env)  # the options build the game


def test_shipped_configs_differ_only_in_credit_and_match_the_task(tmp_path):
    check_credit_twins(CONFIGS, tmp_path, "sokoban", ("size", "boxes", "pulls", "max_steps"), Sokoban)


def test_gigpo_with_env_return_and_the_outcome_added_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="outcome_on_last_turn: false"):
        load_config(CONFIGS["gigpo"], [f"output_dir={tmp_path}", "algorithm.credit_args={}"])
    with pytest.raises(ConfigError, match="true or false"):
        load_config(CONFIGS["gigpo"], [f"output_dir={tmp_path}", "algorithm.credit_args={outcome_on_last_turn: 0}"])


@pytest.mark.slow
def test_a_few_gigpo_steps_on_rendered_levels_learn_from_step_level_groups(tmp_path, mmgrpo_cache):
    """Three GiGPO steps of the shipped config (short warm-up): finite loss, parameters move, and some anchor group
    (turns of one level acting from the same rendered state) has a non-zero step advantage."""
    from mmgrpo.trainer import Trainer

    cfg = load_config(
        CONFIGS["gigpo"],
        [
            f"output_dir={tmp_path}",
            "steps=3",
            "task.args.train_size=64",
            "task.args.eval_size=4",
            "algorithm.prompts_per_step=4",
            "warmup.steps=20",
            "eval.before=false",
            "eval.after=false",
            "logging.progress=false",
            "logging.plot=false",
        ],
    )
    trainer = Trainer(cfg)
    trainer._warmup()
    params = list(trainer.adapter.trainable_parameters())
    before = [p.detach().clone() for p in params]
    seen = []
    compute = multiturn.credit.gigpo_advantages

    def spy(*args, **kwargs):
        out = compute(*args, **kwargs)
        seen.append((args, kwargs, out[0]))
        return out

    multiturn.credit.gigpo_advantages = spy
    try:
        metrics = [trainer.train_step(step) for step in range(3)]
    finally:
        multiturn.credit.gigpo_advantages = compute
    assert all(torch.isfinite(torch.tensor(m["loss/policy"])) for m in metrics)
    assert any(not torch.equal(p, q) for p, q in zip(before, params))
    assert any(m["credit/step_adv_abs"] > 0 for m in metrics), metrics
    step_terms = []
    for args, kwargs, _ in seen:  # A^S alone: gigpo with ω = 1 minus gigpo with ω = 0
        episode_only = compute(*args, **{**kwargs, "step_advantage_w": 0.0})[0]
        step_terms.append((compute(*args, **kwargs)[0] - episode_only).abs().max())
    assert max(step_terms) > 0
