"""CPPO (mmgrpo/cppo.py, arXiv 2503.22342): which completions the pruning keeps (by hand), the allocation's prompt
count, the pruned advantage state, the load-time refusals, and a pruning rate of 0 that trains exactly as GRPO."""

import json
from pathlib import Path

import pytest
import torch

from mmgrpo import advantage_steps, cppo
from mmgrpo.config import ConfigError
from mmgrpo.groups import Groups
from mmgrpo.loader import load_config
from mmgrpo.types import Rollout
from tests.test_variants import SMALL as VARIANT_RUN

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/variant_cppo.yaml"

# GRPO advantages of two groups of 4 by hand, (r − mean) / population std:
#   rewards [1, 0, 0, 0]: mean 1/4, std √3/4 → A = [3/√3, −1/√3, −1/√3, −1/√3] = [1.7321, −0.5774, −0.5774, −0.5774]
#   rewards [1, 1, 0, 0]: mean 1/2, std 1/2  → A = [1, 1, −1, −1]
S3 = 3**0.5
HAND = torch.tensor([3 / S3, -1 / S3, -1 / S3, -1 / S3, 1.0, 1.0, -1.0, -1.0])  # [B = 8]


def test_keep_indices_by_hand():
    # batch scope, r = 0.5: k = ⌊8·0.5⌋ = 4 largest |A|: 1.732 (0), then the three 1's in position order (4, 5, 6)
    assert cppo.keep_indices(HAND, (4, 4), 0.5, "batch").tolist() == [0, 4, 5, 6]
    # group scope: ⌊4·0.5⌋ = 2 per group: (0, then 1 of the tied 0.577's) and (4, 5 of the tied 1's)
    assert cppo.keep_indices(HAND, (4, 4), 0.5, "group").tolist() == [0, 1, 4, 5]
    # r = 0.75: ⌊8·0.25⌋ = 2 → [0, 4]; per group ⌊4·0.25⌋ = 1 → [0, 4]
    assert cppo.keep_indices(HAND, (4, 4), 0.75, "batch").tolist() == [0, 4]
    assert cppo.keep_indices(HAND, (4, 4), 0.75, "group").tolist() == [0, 4]
    # at least one sample (a group of 3 at r = 0.9: ⌊0.3⌋ = 0 → 1); NaN counts as |A| = 0
    a = torch.tensor([0.1, float("nan"), -0.5, 0.2, 0.3])
    assert cppo.keep_indices(a, (3, 2), 0.9, "group").tolist() == [2, 4]
    assert cppo.keep_indices(a, (3, 2), 0.9, "batch").tolist() == [2]
    assert cppo.keep_indices(HAND, (4, 4), 0.0, "batch").tolist() == list(range(8))  # r = 0 keeps every sample
    with pytest.raises(ValueError, match=r"batch \| group"):
        cppo.keep_indices(HAND, (4, 4), 0.5, "prompt")


def test_allocated_prompts():
    assert cppo.allocated_prompts(32, 0.5) == 64  # the shipped config: ⌊32 / 0.5⌋
    assert cppo.allocated_prompts(32, 0.75) == 128
    assert cppo.allocated_prompts(10, 0.25) == 13  # ⌊13.33⌋, the authors' int()
    assert cppo.allocated_prompts(7, 0.0) == 7


class _SelectAdapter:
    """``select_samples`` as the token adapters': the state's rows of the kept samples."""

    def select_samples(self, state, index):
        return state[index]


def _state() -> advantage_steps.AdvantageState:
    B, T = 8, 3
    mask = torch.ones(B, T)
    mask[1, 2] = 0.0  # sample 1 has 2 units: 23 units in all
    rollout = Rollout(
        outputs=[f"o{b}" for b in range(B)],
        old_logprobs=-torch.arange(B * T, dtype=torch.float32).view(B, T) / 10 * mask,
        mask=mask,
        group_size=4,
        prompt_index=torch.arange(2).repeat_interleave(4),
        truncated=torch.zeros(B, dtype=torch.bool),
        state=torch.arange(B) * 10,
        extras={"completion_ids": [[b] for b in range(B)]},
    )
    state = advantage_steps.AdvantageState(HAND.view(2, 4), torch.zeros(2, 4), mask.clone(), rollout, _SelectAdapter())
    state.unit = HAND[:, None] * mask  # [B, T]
    return state


def test_prune_keeps_the_rollout_units_and_advantages_of_the_kept_samples():
    state = _state()
    step = advantage_steps.Step("cppo", "cppo", cppo.CPPOOptions(pruning_rate=0.5, scope="group"))
    step(state)
    keep = [0, 1, 4, 5]
    r = state.rollout
    assert r.outputs == ["o0", "o1", "o4", "o5"] and r.group_size == 1 and r.state.tolist() == [0, 10, 40, 50]
    assert r.extras["completion_ids"] == [[0], [1], [4], [5]]
    assert torch.equal(state.unit, HAND[keep][:, None] * state.mask)
    assert state.mask.sum() == 11  # 3 + 2 + 3 + 3 of the 23 units
    assert state.kept_units == pytest.approx(11 / 23)
    assert float(state.metrics["cppo/kept_fraction"]) == 0.5
    assert state.groups.sizes == (2, 2)
    saved = advantage_steps.saved_time(state, 2.0)  # 2 s for 11 units → 12 more units would have cost 2·12/11 s
    assert saved["perf/pruned_update_saved_s"] == pytest.approx(2.0 * 12 / 11)
    assert advantage_steps.saved_time(_state(), 2.0) == {}  # nothing pruned: no metric


def test_prune_drops_groups_left_empty():
    state = _state()
    state.groups = Groups.uniform(2, 4)
    advantage_steps.Step("cppo", "cppo", cppo.CPPOOptions(pruning_rate=0.875))(state)  # k = 1: sample 0
    assert state.rollout.outputs == ["o0"] and state.groups.sizes == (1,)


def test_the_pipeline_runs_pruning_last_with_the_rollout_step_options():
    cfg = load_config(CONFIG, ["algorithm.rollout_steps.cppo={pruning_rate: 0.25, scope: group}"])
    steps = advantage_steps.build(cfg.algorithm)
    assert steps[-1].kind == "cppo" and steps[-1].options == cppo.CPPOOptions(0.25, "group", True)
    assert all(s.kind != "cppo" for s in advantage_steps.build(load_config(ROOT / "configs/quickstart.yaml").algorithm))


def test_refused_at_load_in_one_line():
    cases = [
        (["algorithm.rollout_steps.cppo.pruning_rate=1.0"], r"pruning_rate must be in \[0, 1\)"),
        (["algorithm.rollout_steps.cppo.rate=0.5"], r"algorithm\.rollout_steps\.cppo"),
        (["algorithm.rollout_steps.cppo.scope=prompt"], r"scope"),
        (["algorithm.surrogate=reg_grpo", "algorithm.beta=0.0"], r"not combined with surrogate 'reg_grpo'"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            load_config(CONFIG, overrides)
        assert "\n" not in str(e.value)
    flow = ROOT / "configs/flow_grpo.yaml"  # no merge_states / select_samples on the flow adapter
    with pytest.raises(ConfigError, match=r"needs an adapter with (merge_states|select_samples)\(\)"):
        load_config(flow, ["algorithm.rollout_steps={cppo: {}}"])
    with pytest.raises(ConfigError, match=r"rollout_steps\.cppo is not supported with rollout\.tools"):
        load_config(ROOT / "configs/zoom_tools.yaml", ["algorithm.rollout_steps={cppo: {}}"])
    replay = ["algorithm.rollout_steps={replay: {}, cppo: {}}"]
    with pytest.raises(ConfigError, match=r"allocation is not combined with replay"):
        load_config(ROOT / "configs/variant_replay.yaml", replay)
    load_config(
        ROOT / "configs/variant_replay.yaml", ["algorithm.rollout_steps={replay: {}, cppo: {allocation: false}}"]
    )
    knapsack = ["algorithm.rollout_steps={knapsack_budget: {}, cppo: {allocation: false}}"]
    with pytest.raises(ConfigError, match=r"rollout_steps\.cppo: not combined with knapsack_budget"):
        load_config(ROOT / "configs/variant_knapsack.yaml", knapsack)


SMALL = [*VARIANT_RUN, "rewards=[{name: 'tests.test_variants:length_reward'}]"]  # rewards that differ within a group


def _run(tmp_path: Path, name: str, overrides: list[str]) -> list[dict]:
    from mmgrpo.trainer import train

    cfg = load_config(CONFIG, [*SMALL, *overrides, f"output_dir={tmp_path / name}"])
    train(cfg)
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_cppo_trains_on_the_kept_samples_and_rate_zero_is_grpo(tmp_path, mmgrpo_cache):
    records = [r for r in _run(tmp_path, "cppo", []) if "cppo/kept_fraction" in r]
    assert len(records) == 2
    for r in records:  # 2 prompts → ⌊2/0.5⌋ = 4 rolled out, 16 samples, the 8 of largest |A| trained
        assert r["cppo/prompts"] == 4.0 and r["cppo/kept_fraction"] == 0.5
        assert 0.0 < r["cppo/kept_unit_fraction"] <= 1.0 and r["perf/pruned_update_saved_s"] > 0.0
    # r = 0 without allocation keeps every sample in order: the same update as GRPO's, bit for bit
    zero = _run(tmp_path, "zero", ["algorithm.rollout_steps.cppo={pruning_rate: 0.0, allocation: false}"])
    grpo = _run(tmp_path, "grpo", ["algorithm.rollout_steps={}"])
    for a, b in zip(zero, grpo, strict=True):
        for key in ("loss/policy", "kl/mean", "optim/grad_norm", "reward/mean"):
            if key in b:
                assert a[key] == b[key], key
    assert all("cppo/prompts" not in r for r in zero)  # no allocation at r = 0
