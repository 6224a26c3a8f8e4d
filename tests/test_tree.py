"""Tree rollouts (mmgrpo/tree.py, modalities/tokens/tree.py): Tree-GRPO's intra- + inter-tree advantages on a
hand-worked tree, ARPO's fork rule on a hand-made entropy sequence, branches that copy their node's prefix (the same
tokens, sampled once) on the tiny Qwen2.5-VL in the grid world, and the combinations refused at load."""

from pathlib import Path

import pytest
import torch

from mmgrpo import noise
from mmgrpo.config import ConfigError, RolloutConfig
from mmgrpo.credit import CREDITS, TreeGRPOOptions, TurnInputs
from mmgrpo.loader import load_config
from mmgrpo.tree import entropy_branch_decisions, tree_grpo_advantages, turn_entropy

ROOT = Path(__file__).resolve().parents[1]


def test_tree_grpo_advantage_on_a_hand_worked_tree():
    """One prompt, G = 4 leaves in 2 trees, returns R = [1, 0 | 1, 1].
    inter: mean 0.75, unbiased std sqrt((3·0.25² + 0.75²)/3) = 0.5 → [0.5, −1.5, 0.5, 0.5];
    intra: tree 0 mean 0.5, std sqrt(0.5) = 0.70711 → [0.70711, −0.70711]; tree 1 has std 0 → [0, 0];
    A = intra + inter = [1.20711, −2.20711, 0.5, 0.5]. Mean-centred only (scale false): [0.75, −1.25, 0.25, 0.25].
    (AMAP-ML/Tree-GRPO ``adv_estimator: tree``: verl's GRPO over the prompt's leaves plus over the tree's.)"""
    r = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    tree = torch.tensor([[0, 0, 1, 1]])
    got = tree_grpo_advantages(r, tree)
    assert torch.allclose(got, torch.tensor([[1.20711, -2.20711, 0.5, 0.5]]), atol=1e-4)
    plain = tree_grpo_advantages(r, tree, scale=False)
    assert torch.allclose(plain, torch.tensor([[0.75, -1.25, 0.25, 0.25]]), atol=1e-6)
    # a tree of one leaf: mean 0, std 1 (verl's GRPO on a group of one), so its intra-tree term is R itself
    lone = tree_grpo_advantages(torch.tensor([[2.0, 0.0]]), torch.tensor([[0, 1]]), scale=False)
    assert torch.allclose(lone, torch.tensor([[1.0 + 2.0, -1.0 + 0.0]]))


def test_tree_grpo_credit_puts_each_leafs_advantage_on_its_turns():
    """The registered credit: A of each trajectory on each of its turns (0 in the padding), from the outcome."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])  # [B, S]
    turns = TurnInputs(mask, torch.zeros(4, 2), torch.zeros(4, 2), [["a", "b"]] * 4, torch.full((4,), -1),
                       torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 1, 1]))  # fmt: skip
    out, metrics = CREDITS.get("tree_grpo")(torch.zeros(1, 4), torch.tensor([1.0, 0.0, 1.0, 1.0]), turns,
                                            TreeGRPOOptions())  # fmt: skip
    want = torch.tensor([[1.20711, 1.20711], [-2.20711, 0.0], [0.5, 0.0], [0.5, 0.5]])
    assert torch.allclose(out, want, atol=1e-4)
    assert metrics["credit/tree_adv_abs"] == pytest.approx((1.20711 + 2.20711 + 0.5 + 0.5) / 4, abs=1e-4)


def test_entropy_fork_rule_picks_the_points_after_an_entropy_rise():
    """A hand-made trajectory of 4 turns: turn 0 (the first) 3 tokens with log-probs −1, −1, −1 (H = 1), an
    observation (turn −1), turn 1 with −3, −3, −0.5 (k = 2: H = 3), turn 2 with −1, −1 (H = 1), turn 3 with −0.2, −0.2
    (H = 0.2). With w = 0.2, τ = 0.5 and the same coin u = 0.7 at every point: p = clip(0.7 − 0.2·ΔH) = 0.3 (ΔH = 2:
    fork), 0.7 (ΔH = 0: no), 0.86 (ΔH = −0.8: no); with u = 0.45 the no-change point forks too (0.45 ≤ 0.5)."""
    logps = torch.tensor([-1.0, -1.0, -1.0, 0.0, 0.0, -3.0, -3.0, -0.5, 0.0, -1.0, -1.0, 0.0, -0.2, -0.2])
    turn = torch.tensor([0, 0, 0, -1, -1, 1, 1, 1, -1, 2, 2, -1, 3, 3])
    h = turn_entropy(logps, turn, turns=5, k=2)
    assert torch.allclose(h, torch.tensor([1.0, 3.0, 1.0, 0.2, 0.0]))
    points = h[1:4]  # the turns after a response
    fire = entropy_branch_decisions(points, h[0].expand(3), torch.full((3,), 0.7), weight=0.2, threshold=0.5)
    assert fire.tolist() == [True, False, False]
    fire = entropy_branch_decisions(points, h[0].expand(3), torch.full((3,), 0.45), weight=0.2, threshold=0.5)
    assert fire.tolist() == [True, True, False]


def _gridworld_adapter(path, tree):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    env = {"distance_reward": 1.0, "max_steps": 6}
    settings = RolloutConfig(environment="gridworld", environment_args=env, max_turns=4, max_total_tokens=600,
                             tree=tree)  # fmt: skip
    return build_vlm_adapter({"name_or_path": path, "max_new_tokens": 16}, rollout=settings)


def test_branches_copy_their_nodes_prefix_and_sample_it_once(tiny_vlm_path):
    """Scripted moves make every trajectory run its 4 turns; each tree draws 1 node (the root or an inner node) and
    gives it 2 branches (Z = 2): the branches' tokens up to their node equal the chain's, the policy is asked only for
    the turns after the node (the prefix is not sampled again), both branches of a node come from one decode call with
    n = 2 (its prefix prefilled once), the rows are group-major trees, and a keyed rollout repeats itself."""
    adapter = _gridworld_adapter(tiny_vlm_path, {"trees": 2, "rounds": 1, "nodes": 1, "branches": 2})
    runner, calls, sample = adapter.driver, [], adapter.driver.sample_turn

    def counted(encodings, n, greedy, keys, rows, turn):
        calls.append((len(encodings), n, list(rows), turn))
        ids, _ = sample(encodings, n, greedy, keys, rows, turn)
        move = adapter.tokenizer.encode("<action>up</action>", add_special_tokens=False) + [int(adapter.eos_ids[0])]
        ids = torch.tensor([move] * ids.shape[0])  # every turn a valid move: the game answers, the trajectory goes on
        return ids, torch.full(ids.shape, -0.5)

    runner.sample_turn = counted
    rows = [{"prompt": "Walk.", "seed": s} for s in (3, 4)]
    keys = noise.NoiseKeys(0, 1, (0, 1), 6)
    r = adapter.rollout(rows, group_size=6, keys=keys)
    ex, state = r.extras, r.state
    assert ex["tree"] == [0, 0, 0, 1, 1, 1] * 2
    sampled_turns = 0
    for b in range(12):
        k, src = ex["branch_turn"][b], ex["branch_of"][b]
        sampled_turns += ex["num_turns"][b] - k
        if b % 3 == 0:  # the first row of each tree is its chain
            assert (k, src) == (0, -1)
        if src < 0:  # the chain, or a draw of the root: a new chain of the same tree
            assert k == 0
            continue
        assert src % 3 == 0 and ex["tree"][src] == ex["tree"][b] and 1 <= k < ex["num_turns"][src]
        start = state.turn_of_token[src].tolist().index(k)  # the node: where the chain's turn k began
        assert start > 0 and torch.equal(state.completion_ids[b, :start], state.completion_ids[src, :start])
        assert ex["turn_rewards"][b][:k] == ex["turn_rewards"][src][:k]
    assert any(src >= 0 for src in ex["branch_of"])  # (3 turns a chain: 2 inner nodes and the root to draw from)
    assert sum(len(rows) for _, _, rows, _ in calls) == sampled_turns  # each turn-row asked once: prefixes copied
    assert calls[0][:2] == (2, 2)  # the chains' turn 0: 2 prompts, M = 2 samples each
    branch_calls = [c for c in calls[1:] if c[1] == 2]
    assert sum(c[0] for c in branch_calls) == 4  # 4 drawn nodes (2 prompts × 2 trees), one encoding each ...
    assert all(len(c[2]) == 2 * c[0] for c in branch_calls)  # ... expanded n = 2 ways (a call per node turn)
    again = adapter.rollout(rows, group_size=6, keys=keys)
    assert again.extras["branch_of"] == ex["branch_of"] and torch.equal(
        again.state.completion_ids, state.completion_ids
    )


def test_entropy_select_fills_the_group_and_keys_its_trees(tiny_vlm_path):
    """ARPO's select: the G rows are the chains, forks of them (same tree) and fill-in chains (new trees)."""
    adapter = _gridworld_adapter(tiny_vlm_path, {"select": "entropy", "trees": 2, "rounds": 2})
    r = adapter.rollout([{"prompt": "Walk.", "seed": 5}], group_size=4, keys=noise.NoiseKeys(0, 1, (0,), 4))
    tree, parent = r.extras["tree"], r.extras["branch_of"]
    assert tree[:2] == [0, 1] and len(tree) == 4
    for b in range(2, 4):
        assert (parent[b] >= 0 and tree[b] == tree[parent[b]]) or (parent[b] == -1 and tree[b] >= 2)


def _load(*over):
    return load_config(ROOT / "configs/variant_tree_grpo.yaml", ["output_dir=/tmp/unused", *over])


def test_refused_combinations_name_the_fix():
    with pytest.raises(ConfigError, match=r"^rollout.tree: 2 trees × \(1 \+ 1 rounds × 3 nodes × 1 branches\) = 8 .*"
                                          r"group_size is 4; make them equal$"):  # fmt: skip
        _load("algorithm.group_size=4")
    with pytest.raises(ConfigError, match=r"^algorithm.credit: tree_grpo .* rollout.tree is not set; set rollout.tree"):
        _load("rollout.tree=null")
    with pytest.raises(ConfigError, match=r"^rollout.tree branches multi-turn trajectories .*single-turn; set "):
        load_config(ROOT / "configs/quickstart.yaml", ["output_dir=/tmp/unused", "rollout.tree={trees: 1, nodes: 1}",
                                                       "algorithm.group_size=2"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"^rollout.tree.trees \(8\) leaves no slot .*set trees below group_size"):
        _load("rollout.tree={select: entropy, trees: 8}")
    with pytest.raises(ConfigError, match=r"^rollout.tree is sampled by the native decode loop only"):
        _load("rollout.engine=vllm")
    with pytest.raises(ConfigError, match=r"^rollout.ground_truth_probe \(IGPO\) with rollout.tree: .*remove one$"):
        _load("rollout.ground_truth_probe={column: answer}")
    with pytest.raises(ConfigError, match=r"rollout.tree.*branch"):
        _load("rollout.tree={trees: 2, branch: 1}")


def test_tool_branches_share_the_observation_images_of_their_prefix(tiny_vlm_path):
    """With a tool (the zoom task's crop): each trajectory calls crop at turn 0 and then answers; a branch from the
    node after the crop's observation carries the same observation tokens and the same image tensors (copied, the
    tool not run again), and the log-prob forward takes it like any trajectory."""
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    crop = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 40, 40]}}</tool_call>'
    settings = RolloutConfig(tools=["crop"], max_total_tokens=400, max_turns=3, tree={"trees": 1, "nodes": 2})
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 24}, rollout=settings)
    runner, eos = adapter.driver, int(adapter.eos_ids[0])

    def scripted(encodings, n, greedy, keys, rows, turn):
        text = crop if turn == 0 else "42"
        seq = adapter.tokenizer.encode(text, add_special_tokens=False) + [eos]
        return torch.tensor([seq] * (len(encodings) * n)), None

    runner.sample_turn = scripted
    row = ShapesTask(ShapesArgs(train_size=1, eval_size=1, image_size=112)).train_rows()[0]
    r = adapter.rollout([row], group_size=3, keys=noise.NoiseKeys(0, 2, (0,), 3))
    ex, state = r.extras, r.state
    assert ex["tree"] == [0, 0, 0] and ex["tool_calls"] == [1, 1, 1]
    assert sorted(ex["branch_of"][1:]) == [-1, 0]  # (these keys draw the root once and the node after the crop once)
    for b in (1, 2):
        k, src = ex["branch_turn"][b], ex["branch_of"][b]
        if src < 0:
            continue  # a draw of the root: its own crop
        assert (k, src) == (1, 0)
        start = state.turn_of_token[0].tolist().index(1)
        assert torch.equal(state.completion_ids[b, :start], state.completion_ids[0, :start])
        assert torch.equal(state.media[b]["pixel_values"], state.media[0]["pixel_values"])
    assert torch.isfinite(adapter.batched_logprobs(r, adapter.model)).all()


def test_tree_metrics_count_branches_and_copied_turns():
    """tree/* by hand: rows 1 and 3 branched (from rows 0 and 2) after 2 and 1 turns; rows 0 and 2 are chains."""
    from mmgrpo.multiturn import tree_metrics

    got = tree_metrics({"branch_of": [-1, 0, -1, 2], "branch_turn": [0, 2, 0, 1]})
    assert got == {"tree/branch_fraction": 0.5, "tree/copied_turns_mean": 0.75}
    assert tree_metrics({"num_turns": [1]}) == {}
