"""Knapsack RL's per-prompt budgets (mmgrpo/budgets.py) and the ragged groups they make (mmgrpo/groups.py)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmgrpo import advantage_steps, budgets, credit, dynamic_sampling, noise
from mmgrpo import advantages as adv_lib
from mmgrpo.advantages import DifficultyOptions
from mmgrpo.config import ConfigError
from mmgrpo.groups import BUDGET_NOISE, Groups, split
from mmgrpo.loader import load_config
from mmgrpo.shaping import NoOptions
from tests.test_world_size import QUIET  # no evaluation, logging, plot or final model

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/variant_knapsack.yaml"
OFF = budgets.KnapsackOptions(min_budget=2, max_budget=8, unit=2, fallback=False)


# --- the paper's equations, by hand ----------------------------------------------------------------------------


def test_value_by_hand():
    # Value(N, p) = (1 − p^N − (1 − p)^N) · p (1 − p)^2
    assert budgets.value(2, 0.5) == pytest.approx(0.5 * 0.125)  # (1 − 1/4 − 1/4) · 0.5 · 0.25
    assert budgets.value(4, 0.5) == pytest.approx(0.109375)  # (1 − 2/16) · 0.125
    assert budgets.value(2, 0.1) == pytest.approx(0.18 * 0.081)  # (1 − 0.01 − 0.81) · 0.1 · 0.81
    assert budgets.value(8, 0.0) == 0.0 and budgets.value(8, 1.0) == 0.0  # no gradient, ever
    assert budgets.need(0.5, 0.9) == pytest.approx(math.log(0.1) / math.log(0.5))  # 3.32 samples
    assert budgets.need(0.9, 0.9) == pytest.approx(math.log(0.1) / math.log(0.9))  # 21.85: the likely outcome is 0.9


def test_allocation_by_hand():
    # P = 3, total 12 = 3 × G = 4, N in [2, 8] by units of 2; everyone starts at 2, 6 samples (3 units) to place.
    # gains of the next unit: p = 0.5: 2→4 0.046875, 4→6 0.01171875; p = 0.1: 2→4 0.0132678, 4→6 0.0101054;
    # p = 1: 0. Greedy: 0.5 (0.046875), then 0.1 (0.0132678 > 0.0117188), then 0.5 (0.0117188 > 0.0101054).
    assert budgets.allocate([0.5, 0.1, 1.0], 12, 4, OFF) == [6, 4, 2]
    # unseen prompts keep G; the rest is shared by value
    assert budgets.allocate([None, 0.5, 0.0], 12, 4, OFF) == [4, 6, 2]


def test_fallback_gives_the_unneeded_budget_to_the_never_solved():
    # p = 0.5 needs c = ln 0.1 / ln 0.5 = 3.32 → 4 samples (2 above N_low); of the 4 left, 2 go to the p = 0 prompt
    on = budgets.KnapsackOptions(min_budget=2, max_budget=8, unit=2)
    assert budgets.allocate([0.5, 0.0], 8, 4, on) == [4, 4]
    assert budgets.allocate([0.5, 0.0], 8, 4, OFF) == [6, 2]  # without it, p = 0 is worth nothing


def test_greedy_is_the_knapsack_optimum():
    # the separable concave knapsack: greedy marginal allocation equals the brute-force maximum (Fox 1966)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        rates = [round(float(x), 2) for x in torch.rand(4, generator=gen)]
        total = 4 * 4
        best = max(
            sum(budgets.value(n, p) for n, p in zip(ns, rates))
            for ns in itertools.product(range(2, 9, 2), repeat=4)
            if sum(ns) == total
        )
        got = budgets.allocate(rates, total, 4, OFF)
        assert sum(got) == total and all(2 <= n <= 8 and n % 2 == 0 for n in got)
        assert sum(budgets.value(n, p) for n, p in zip(got, rates)) == pytest.approx(best, abs=1e-12)


def test_allocation_spends_the_whole_budget_within_bounds():
    o = budgets.KnapsackOptions(min_budget=2, max_budget=12, unit=2)
    for rates in ([0.0] * 5, [1.0] * 5, [None] * 5, [0.0, 1.0, 0.3, None, 0.99], [0.5] * 5):
        got = budgets.allocate(rates, 5 * 8, 8, o)
        assert sum(got) == 40 and all(2 <= n <= 12 and n % 2 == 0 for n in got), (rates, got)


# --- ragged groups equal the same groups computed one by one ----------------------------------------------------

SIZES = (3, 6, 2, 5)


def _ragged_rewards(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (sum(SIZES), 2), generator=gen).float()  # [B, K]
    r[4, 1] = float("nan")  # a reward not applicable
    r[9:11] = 1.0  # the third group (2 samples) has zero variance
    return r


def test_equal_groups_are_the_fixed_grid():
    x = torch.randn(12, 3)
    g = Groups.uniform(4, 3)
    assert g.grid(x).data_ptr() == x.data_ptr() and torch.equal(g.grid(x), x.view(4, 3, 3))
    assert torch.equal(g.flat(g.grid(x)), x) and torch.equal(
        g.repeat(torch.arange(4)), torch.arange(4).repeat_interleave(3)
    )


def test_ragged_grid_round_trip():
    g = Groups(SIZES, 7)
    x = torch.arange(sum(SIZES), dtype=torch.float32)
    grid = g.grid(x)  # [4, 7]
    assert grid.shape == (4, 7) and torch.isnan(grid[0, 3:]).all() and grid[1, :6].tolist() == list(range(3, 9))
    assert torch.equal(g.flat(grid), x) and g.ids().tolist() == [0] * 3 + [1] * 6 + [2] * 2 + [3] * 5


@pytest.mark.parametrize(
    "estimator, scale", [("grpo", "group"), ("dr_grpo", "none"), ("rloo", "none"), ("rloo", "group")]
)
@pytest.mark.parametrize("combine", ["sum_then_normalize", "normalize_then_sum"])
def test_ragged_advantages_equal_one_group_at_a_time(estimator, scale, combine):
    r, w = _ragged_rewards(), torch.tensor([1.0, 0.5])
    kw = dict(combine=combine, estimator=estimator, scale=scale, unbiased=True, eps=1e-4)
    g = Groups(SIZES, 8)
    ragged, _ = adv_lib.compute_advantages(g.grid(r), w, **kw)  # [P, W]
    if combine == "normalize_then_sum":  # GDPO's batch z-score spans the batch: compare the per-group sums
        kw["combine"] = "sum_then_normalize"
        per_k = [adv_lib.compute_advantages(g.grid(r[:, k : k + 1]), w[k : k + 1], **kw)[0] for k in range(2)]
        ragged = sum(per_k)  # [P, W]
    alone = []
    for rows in r.split(SIZES):
        if combine == "normalize_then_sum":
            one = sum(adv_lib.compute_advantages(rows[None, :, k : k + 1], w[k : k + 1], **kw)[0] for k in range(2))
        else:
            one, _ = adv_lib.compute_advantages(rows[None], w, **kw)
        alone.append(one[0])
    torch.testing.assert_close(g.flat(ragged), torch.cat(alone), rtol=0, atol=1e-6)


def test_ragged_advantage_steps_equal_one_group_at_a_time():
    # transform (DGRPO's difficulty weight) → zero-variance filter → broadcast shaping, on a rollout of ragged groups
    gen = torch.Generator().manual_seed(1)
    r, w = _ragged_rewards(), torch.tensor([1.0, 0.5])
    B, T = sum(SIZES), 5
    mask = (torch.rand(B, T, generator=gen) > 0.2).float()  # [B, T]
    rollout = SimpleNamespace(
        mask=mask, old_logprobs=-torch.rand(B, T, generator=gen), unit_sigmas=None, unit_values=None
    )
    steps = [
        advantage_steps.Step("advantage_transform", "difficulty", DifficultyOptions(offset=1.5)),
        advantage_steps.Step("filter_zero_variance", "zero_variance", NoOptions()),
        advantage_steps.Step("shaping", "none", NoOptions()),
    ]
    kw = dict(combine="sum_then_normalize", estimator="grpo", scale="group", unbiased=True, eps=1e-4)

    def run(rewards, groups, rows):  # rewards [n, K] of the groups' samples, rows: their sample indices
        grid = groups.grid(rewards)  # [P, W, K]
        adv, _ = adv_lib.compute_advantages(grid, w, **kw)
        sub = SimpleNamespace(
            mask=mask[rows], old_logprobs=rollout.old_logprobs[rows], unit_sigmas=None, unit_values=None
        )
        state = advantage_steps.AdvantageState(adv, adv_lib.combine_rewards(grid, w), mask[rows].clone(), sub, None)
        state.groups = groups
        advantage_steps.run(steps, state)
        return state.unit, state.mask

    unit, kept = run(r, Groups(SIZES, 6), torch.arange(B))
    starts = [0, *itertools.accumulate(SIZES)]
    for p, n in enumerate(SIZES):
        rows = torch.arange(starts[p], starts[p] + n)
        one_unit, one_mask = run(r[rows], Groups.uniform(1, n), rows)
        torch.testing.assert_close(unit[rows], one_unit, rtol=0, atol=1e-6)
        assert torch.equal(kept[rows], one_mask)
    assert kept[9:11].sum() == 0 and kept[:9].sum() > 0  # the zero-variance group left the update, the others not


def test_ragged_dynamic_sampling_selection_equals_one_group_at_a_time():
    r, w = _ragged_rewards(), torch.tensor([1.0, 0.5])
    kept = dynamic_sampling.signal_groups(r, w, Groups(SIZES, 6))
    alone = [
        p
        for p, rows in enumerate(r.split(SIZES))
        if dynamic_sampling.signal_groups(rows, w, Groups.uniform(1, len(rows)))
    ]
    assert kept == alone and 2 not in kept


def test_ragged_gigpo_equals_one_group_at_a_time():
    gen = torch.Generator().manual_seed(2)
    B, S = sum(SIZES), 3
    rewards = torch.randint(0, 2, (B, S), generator=gen).float()  # [B, S]
    mask = torch.ones(B, S)
    mask[1, 2] = mask[5, 1:] = 0.0
    anchors = [[f"s{int(x)}" for x in torch.randint(0, 2, (S,), generator=gen)] for _ in range(B)]
    ragged, _ = credit.gigpo_advantages(rewards, mask, anchors, Groups(SIZES, 6).ids())
    starts = [0, *itertools.accumulate(SIZES)]
    for p, n in enumerate(SIZES):
        sl = slice(starts[p], starts[p] + n)
        one, _ = credit.gigpo_advantages(rewards[sl], mask[sl], anchors[sl], torch.zeros(n, dtype=torch.long))
        torch.testing.assert_close(ragged[sl], one, rtol=0, atol=1e-6)


# --- the rollout units and their noise keys --------------------------------------------------------------------


def test_split_keys_each_sample_by_prompt_position_and_index():
    keys = noise.NoiseKeys(seed=3, step=5, positions=(10, 11), group_size=4)
    units = split([{"q": "a"}, {"q": "b"}], keys, [6, 2], unit=2, width=6)
    assert [r["q"] for r in units.rows] == ["a", "a", "a", "b"] and [r["group_index"] for r in units.rows] == [
        0,
        0,
        0,
        1,
    ]
    assert units.keys.positions == (10, noise.mix(10, BUDGET_NOISE, 1), noise.mix(10, BUDGET_NOISE, 2), 11)
    assert units.size == 2 and units.groups == Groups((6, 2), 6)
    uniform = keys.row_seeds()
    assert units.keys.row_seeds()[:2] == uniform[:2]  # a prompt's first unit: the uniform rollout's first samples
    assert units.keys.row_seeds()[6:] == uniform[4:6]
    assert split([{}], None, [6], 2, 6).keys is None  # rollout_noise: per_process
    with pytest.raises(ValueError, match="multiples of the rollout unit 2"):
        split([{}, {}], keys, [5, 3], unit=2, width=6)


# --- refusals at load ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm.dynamic_sampling.enabled=true"],
            r"^algorithm\.dynamic_sampling\.enabled: not combined with knapsack",
        ),
        (["algorithm.gt_injection.enabled=true"], r"^algorithm\.gt_injection\.enabled: not combined with knapsack"),
        (
            ["algorithm.sampler=variance"],
            r"^algorithm\.rollout_steps\.knapsack_budget: not combined with algorithm\.sampler",
        ),
        (
            ["algorithm.shaping=temporal"],
            r"^algorithm\.rollout_steps\.knapsack_budget: not combined with algorithm\.shaping",
        ),
        (
            ["algorithm.surrogate=reg_grpo"],
            r"^algorithm\.rollout_steps\.knapsack_budget: not combined with algorithm\.surr",
        ),
        (
            ["algorithm.group_size=6", "algorithm.rollout_steps.knapsack_budget={unit: 4, min_budget: 4}"],
            r"group_size=6 .* multiple of unit",
        ),
        (["algorithm.rollout_steps.knapsack_budget.min_budget=3"], r"multiples of unit=2"),
    ],
)
def test_knapsack_refuses_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(CONFIG, overrides)
    assert "\n" not in str(err.value)


def test_knapsack_refuses_multi_turn_rollouts():
    with pytest.raises(
        ConfigError, match=r"^algorithm\.rollout_steps\.knapsack_budget is not supported with rollout\."
    ):
        load_config(ROOT / "configs/zoom_tools.yaml", ["algorithm.rollout_steps={knapsack_budget: {}}"])


# --- training: ragged steps, and kill + resume = the uninterrupted run ------------------------------------------

TINY = [
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=4",
    "algorithm.rollout_steps.knapsack_budget.max_budget=6",
    "model.args.max_new_tokens=5",
    "task.args.train_size=2",  # every row returns each step: budgets from step 2 on
    "task.args.eval_size=4",
    "rewards=[{name: 'tests.test_knapsack:position_reward'}]",
    "warmup.steps=0",
    *QUIET,
]


def position_reward(completions: list, group_index: list, **columns) -> list[float]:
    """The step's first prompt always succeeds (p = 1: N_low); the other by the parity of its completion's length
    (0 < p < 1, or p = 0: the rest of the budget), so the budgets are ragged from the second step on."""
    return [1.0 if g == 0 else float(len(str(c)) % 2) for c, g in zip(completions, group_index, strict=True)]


@pytest.mark.slow  # three short runs of the tiny VLM (~15 s alone)
def test_knapsack_resumes_exactly(tmp_path, mmgrpo_cache):
    from mmgrpo.trainer import Trainer

    whole = Trainer(load_config(CONFIG, [*TINY, "steps=4", f"output_dir={tmp_path / 'whole'}"]))
    whole.run()
    over = [*TINY, "steps=4", f"output_dir={tmp_path / 'cut'}", "checkpoint.every=2"]
    Trainer(load_config(CONFIG, [*over, "stop_after=2"])).run()
    resumed = Trainer(load_config(CONFIG, [*over, "resume=latest"]))
    resumed.run()
    (memory,) = [s.memory for s in resumed.rollout_steps if s.name == "knapsack_budget"]
    (expected,) = [s.memory for s in whole.rollout_steps if s.name == "knapsack_budget"]
    assert memory == expected and len(memory["rates"]) == 2
    a, b = whole.adapter.model.state_dict(), resumed.adapter.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    import json

    records = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    sizes = [(r["budget/min"], r["budget/max"]) for r in records if "budget/min" in r]
    assert sizes[0] == (4.0, 4.0) and any(lo != hi for lo, hi in sizes[1:]), sizes  # ragged once rates are known
    assert any(r["loss/policy"] != 0.0 for r in records)  # the weights did move


@pytest.mark.slow  # two processes (gloo): the budgets' grid width and success rates are gathered
def test_knapsack_trains_on_two_processes(tmp_path, mmgrpo_cache):
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [str(accelerate), "launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml"),
           "--main_process_port", "0", "-m", "mmgrpo", "train", str(CONFIG), *TINY, "steps=4",
           "task.args.train_size=4", f"output_dir={out}"]  # fmt: skip
    pythonpath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", PYTHONPATH=pythonpath)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "budget/max" in r]
    assert len(steps) == 4 and all(math.isfinite(r["loss/policy"]) for r in steps)
    assert any(r["budget/max"] > r["budget/min"] for r in steps)  # ragged steps ran under two processes
