"""GCPO (gold only where contrast fails, mmgrpo/gcpo.py) and OTC's tool-call reward (rewards/tool_efficiency.py):
the equations on hand-worked numbers, the injection on the tiny Qwen2.5-VL, and the refusals at load."""

import math
from pathlib import Path

import pytest
import torch

from mmgrpo import advantages as adv_lib
from mmgrpo import gcpo
from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.rewards.tool_efficiency import mapping, optimal_calls, otc, tool_score

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")

# --- GCPO -------------------------------------------------------------------------------------------------------


def test_all_failed_by_hand():
    scores = torch.tensor(
        [
            [0.0, 0.0, 0.0],  # every sample failed
            [0.0, 1.0, 0.0],  # one success: contrast exists
            [NAN, 0.0, 0.0],  # a not-applicable score is not a failure
            [0.5, 0.2, 0.4],  # all <= 0.5 (the threshold is inclusive)
        ]
    )  # [P, G]
    assert gcpo.all_failed(scores, 0.0).tolist() == [True, False, False, False]
    assert gcpo.all_failed(scores, 0.5).tolist() == [True, False, False, True]


def test_gold_sample_advantage_by_hand():
    """G = 3, the two sampled answers failed (0), the GA scores 1: mean 1/3; unbiased std sqrt(1/3) = 0.57735,
    A_GA = (2/3)/0.57735 = 1.15470, A = −(1/3)/0.57735 = −0.57735; population std sqrt(2/9) = 0.47140, A_GA =
    1.41421, A = −0.70711. The other group (0, 1, 1) keeps its GRPO advantages (−1.15470, 0.57735, 0.57735)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])[..., None]  # [P, G, K=1]
    common = dict(combine="sum_then_normalize", estimator="grpo", scale="group", eps=0.0)
    a, _ = adv_lib.compute_advantages(rewards, torch.ones(1), unbiased=True, **common)
    torch.testing.assert_close(a[0], torch.tensor([-0.57735, -0.57735, 1.15470]), atol=1e-5, rtol=0)
    torch.testing.assert_close(a[1], torch.tensor([-1.15470, 0.57735, 0.57735]), atol=1e-5, rtol=0)
    a, _ = adv_lib.compute_advantages(rewards, torch.ones(1), unbiased=False, **common)
    torch.testing.assert_close(a[0], torch.tensor([-0.70711, -0.70711, 1.41421]), atol=1e-5, rtol=0)


def _gold(row) -> str:
    return f"<answer>{row['answer']}</answer>"


def _context(adapter, G, reward_names=("accuracy",)):
    """The run as the gcpo step sees it: ``score`` gives 1 to an output equal to the row's gold answer, else 0."""
    from mmgrpo import rollout_steps

    calls = []

    def score(rows, outputs, extras, n=G):
        calls.append(([r.get("answer") for r in rows], list(outputs), {k: len(v) for k, v in extras.items()}))
        return torch.tensor([[float(o == _gold(rows[b // n]))] for b, o in enumerate(outputs)]), {}

    ctx = rollout_steps.RolloutContext(
        step=0,
        group_size=G,
        weights=torch.ones(len(reward_names)),
        reward_names=list(reward_names),
        adapter=adapter,
        positions=[0, 1, 2],
        seed=0,
        keys=lambda seed, at=None: None,
        rollout=None,
        read_rows=lambda indices: [],
        n_rows=3,
        acc=None,
        sampler=None,
        score=score,
    )
    return ctx, calls


def test_gcpo_injects_only_into_all_failed_groups(tiny_vlm_path):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.rollout_steps import RolloutBatch
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    torch.manual_seed(0)
    G = 3
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 8})
    rows = list(ShapesTask(ShapesArgs(train_size=3, eval_size=1)).train_rows())
    rows[2] = {k: v for k, v in rows[2].items() if k != "answer"}  # all failed but no gold answer: left alone
    rollout = adapter.rollout(rows, group_size=G)
    scores = torch.tensor([[0.0], [0.0], [0.0], [0.0], [1.0], [0.0], [0.0], [0.0], [0.0]])  # [B, K]: group 1 has one
    before = (list(rollout.outputs), rollout.old_logprobs.clone(), rollout.mask.clone(), scores.clone())
    ctx, calls = _context(adapter, G)
    batch = RolloutBatch(rows, rollout, scores, [0, 1, 2], {"reward/accuracy": 1 / 9})
    out = gcpo.apply(ctx, batch, gcpo.GCPOOptions(), {})
    assert out is batch
    # group 0 (all failed, has a gold answer): its last slot is the gold answer, teacher-forced, and the group rescored
    assert rollout.outputs[2] == _gold(rows[0]) and not rollout.truncated[2]
    ids = adapter.tokenizer.encode(_gold(rows[0]), add_special_tokens=False) + [int(adapter.eos_ids[0])]
    assert rollout.state.completion_ids[2, : len(ids)].tolist() == ids
    assert rollout.mask[2].tolist() == [1.0] * len(ids) + [0.0] * (8 - len(ids))
    m = rollout.mask[2].bool()
    assert (rollout.old_logprobs[2][m] < 0).all()  # the policy's teacher-forced log-probs
    with torch.no_grad():
        torch.testing.assert_close(adapter.logprobs(rollout, torch.tensor([2]))[0][m], rollout.old_logprobs[2][m])
    assert batch.scores[:, 0].tolist() == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert len(calls) == 1 and calls[0][0] == [rows[0]["answer"]]  # only group 0 was scored again, all G of it
    assert calls[0][1] == [before[0][0], before[0][1], _gold(rows[0])]
    # every other sample is untouched: outputs, old log-probs, mask and scores
    keep = torch.tensor([b != 2 for b in range(3 * G)])
    assert [o for o, k in zip(rollout.outputs, keep) if k] == [o for o, k in zip(before[0], keep) if k]
    assert torch.equal(rollout.old_logprobs[keep], before[1][keep]) and torch.equal(rollout.mask[keep], before[2][keep])
    assert batch.metrics["gcpo/failed_groups"] == pytest.approx(2 / 3)  # groups 0 and 2
    assert batch.metrics["gcpo/injected_groups"] == pytest.approx(1 / 3)  # group 2 has no answer column
    assert batch.metrics["reward/accuracy"] == pytest.approx(1 / 9)  # the sampled completions' metric, kept
    # a second pass sees no all-failed group with a gold answer: nothing changes
    snapshot = (list(rollout.outputs), batch.scores.clone())
    gcpo.apply(ctx, batch, gcpo.GCPOOptions(), {})
    assert (list(rollout.outputs), batch.scores.tolist()) == (snapshot[0], snapshot[1].tolist()) and len(calls) == 1


def test_gcpo_judges_by_the_named_reward():
    from types import SimpleNamespace

    from mmgrpo.rollout_steps import RolloutBatch

    ctx = SimpleNamespace(group_size=2, weights=torch.tensor([1.0, 0.1]), reward_names=["temporal_iou", "format"])
    scores = torch.tensor([[0.0, 1.0], [0.3, 1.0], [0.6, 1.0], [0.7, 0.0]])  # [B, K]
    batch = RolloutBatch([{}, {}], SimpleNamespace(group_size=2), scores, [0, 1])
    judged = gcpo.judged_scores(batch, ctx, gcpo.GCPOOptions(reward="temporal_iou"))  # [B]
    assert judged.tolist() == pytest.approx([0.0, 0.3, 0.6, 0.7])
    assert gcpo.judged_scores(batch, ctx, gcpo.GCPOOptions()).tolist() == pytest.approx([0.1, 0.4, 0.7, 0.7])
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.gcpo\.reward: 'iou' is not a configured reward"):
        gcpo.judged_scores(batch, ctx, gcpo.GCPOOptions(reward="iou"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.gt_injection.enabled=true"], r"^algorithm\.rollout_steps\.gcpo: not combined with gt_injection"),
        (["algorithm.dynamic_sampling.enabled=true"], r"^algorithm\.rollout_steps\.gcpo: not combined with .*turn one"),
        (["algorithm.rollout_steps.gcpo.slots=2"], r"algorithm\.rollout_steps\.gcpo"),
    ],
)
def test_gcpo_refuses_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(ROOT / "configs/variant_gcpo.yaml", overrides)
    assert "\n" not in str(err.value)


def test_gcpo_refuses_multi_turn_rollouts():
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.gcpo is not supported with rollout\.tools"):
        load_config(ROOT / "configs/zoom_tools.yaml", ["algorithm.rollout_steps={gcpo: {}}"])


# --- OTC --------------------------------------------------------------------------------------------------------


def test_otc_tool_score_by_hand():
    # OTC-GRPO, n > 0: f(m, n) = 2nm/(m+n), r_tool = sin(f·π/(2n))
    assert mapping(1, 1) == 1.0 and mapping(3, 1) == pytest.approx(1.5) and mapping(2, 0) == 2.0
    assert tool_score(1, 1) == pytest.approx(1.0)  # the optimum: sin(π/2)
    assert tool_score(2, 1) == pytest.approx(math.sqrt(3) / 2)  # f = 4/3: sin(2π/3) = 0.86603
    assert tool_score(3, 1) == pytest.approx(math.sqrt(2) / 2)  # f = 3/2: sin(3π/4) = 0.70711
    assert tool_score(4, 2) == pytest.approx(math.sqrt(3) / 2)  # f = 16/6: sin((8/3)·π/4) = sin(2π/3)
    # n = 0 (or OTC-PPO): r_tool = cos(m·π/(2m + c)); m = 0 gives 1
    assert tool_score(0, 0) == 1.0 and tool_score(0, None) == 1.0
    assert tool_score(1, 0) == pytest.approx(0.5)  # cos(π/3)
    assert tool_score(2, 0) == pytest.approx(0.30902, abs=1e-5)  # cos(2π/5)
    assert tool_score(1, None, c=2.0) == pytest.approx(math.sqrt(2) / 2)  # cos(π/4)


def test_otc_reward_by_hand():
    right, wrong = "<answer>red</answer>", "<answer>blue</answer>"
    completions = [wrong, right, right, right, right, right, wrong, wrong]
    columns = {
        "answer": ["red"] * 8,
        "tool_calls": [0, 1, 1, 2, 0, 1, 0, 0],
        "group_index": [0, 0, 0, 0, 1, 1, 2, 2],
    }
    # group 0: n = 1 (the right answers used 1, 1, 2 calls): 0, 1, 1, sin(2π/3); group 1: n = 0: 1, cos(π/3);
    # group 2: no right answer: 0
    expected = [0.0, 1.0, 1.0, math.sqrt(3) / 2, 1.0, 0.5, 0.0, 0.0]
    assert otc(completions, **columns) == pytest.approx(expected)
    assert otc(completions, alpha=2.0, **columns) == pytest.approx([2 * e for e in expected])
    # OTC-PPO: no group optimum, cos(m·π/(2m + 1)) for every right answer
    ppo = [0.0, 0.5, 0.5, math.cos(2 * math.pi / 5), 1.0, 0.5, 0.0, 0.0]
    assert otc(completions, mode="ppo", **columns) == pytest.approx(ppo)
    assert optimal_calls([2, 1, 3], [True, False, True], ["a", "a", "a"]) == [2, 2, 2]
    assert optimal_calls([2, 1], [False, False], ["a", "b"]) == [None, None]
    # a sample without ground truth is None; a batch without the tool-call column is an error naming it
    no_truth = otc([right, right], answer=[None, "red"], tool_calls=[0, 1], group_index=[0, 0])
    assert no_truth == [None, pytest.approx(1.0)]  # n = 1: the other sample is not scored
    with pytest.raises(KeyError, match="needs the column 'tool_calls'"):
        otc([right], answer=["red"])


def test_otc_refuses_a_one_turn_config_at_load():
    with pytest.raises(
        ConfigError, match=r"^rewards: 'otc' reads what a multi-turn rollout records .* no rollout\.tools"
    ):
        load_config(ROOT / "configs/quickstart.yaml", ["rewards=[{name: otc}]"])
    cfg = load_config(ROOT / "configs/variant_otc.yaml")
    assert [r.name for r in cfg.rewards] == ["otc"] and cfg.rollout.multi_turn


def test_gcpo_on_ragged_groups_injects_by_each_groups_own_slot():
    """Groups of 2 and 3 samples (a planned budget): the last slot of each all-failed group is its own last sample."""
    from types import SimpleNamespace

    from mmgrpo.groups import Groups
    from mmgrpo.rollout_steps import RolloutBatch

    injected = []
    adapter = SimpleNamespace(inject=lambda rollout, index, texts: injected.append((index.tolist(), texts)))
    rollout = SimpleNamespace(group_size=3, outputs=["x"] * 5, extras={"completion_ids": [[1]] * 5})
    scores = torch.tensor([[0.0], [0.0], [0.0], [0.0], [0.0]])  # [B, K]: both groups failed
    rows = [{"answer": "a"}, {"answer": "b"}]
    batch = RolloutBatch(rows, rollout, scores, [0, 1], groups=Groups((2, 3), 3))
    seen = []

    def score(rows, outputs, extras, n=3):
        seen.append((rows[0]["answer"], n, len(outputs), len(extras["completion_ids"])))
        return torch.full((n, 1), 0.5), {}

    ctx = SimpleNamespace(group_size=3, weights=torch.ones(1), reward_names=["accuracy"], adapter=adapter, score=score)
    gcpo.apply(ctx, batch, gcpo.GCPOOptions(), {})
    assert injected == [([1, 4], ["<answer>a</answer>", "<answer>b</answer>"])]
    assert seen == [("a", 2, 2, 2), ("b", 3, 3, 3)]
    assert batch.scores[:, 0].tolist() == [0.5] * 5 and batch.metrics["gcpo/injected_groups"] == 1.0
