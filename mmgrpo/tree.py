"""Tree rollouts of agents: what a tree is made of, where it branches, and its group advantages (pure math).

Two papers grow the G trajectories of a prompt as a tree of agent turns rather than G independent chains; the
driver that samples them is :class:`mmgrpo.modalities.tokens.tree.TreeRunner` (``rollout.tree``), the credit
function is ``algorithm.credit: tree_grpo`` (:data:`mmgrpo.credit.CREDITS`).

* **Tree-GRPO** — Ji et al. 2025, "Tree Search for LLM Agent Reinforcement Learning", arXiv 2509.21240 (seed
  002:9; code ``AMAP-ML/Tree-GRPO``). §3.2 "tree search" (``search_r1/llm_agent/generation_ts.py``
  ``run_llm_loop_tree_search``, ``search_r1/llm_agent/tree_node.py`` ``get_expand_node``): a node is a whole agent
  step (thought, action, observation); M trees are started as one chain each, then for L rounds N nodes of each tree
  are drawn uniformly **with replacement** among its root and its inner (non-leaf) nodes, and each draw continues the
  rollout from that node, so branches share the prefix of turns up to their node (the root: a new chain of the same
  tree). §3.3 "tree-based advantage" (``verl/trainer/ppo/ray_trainer_ts.py`` ``adv_estimator == 'tree'``, the
  scripts' choice): each leaf's outcome reward R is normalised among all the leaves of its prompt (inter-tree) and
  among the leaves of its own tree (intra-tree), both by verl's GRPO estimator (unbiased std, ε = 1e-6, a group of one
  leaf: mean 0, std 1), and the two are added (:func:`tree_grpo_advantages`)::

      Â_inter(H_i) = (R_i − mean_{j ∈ group(i)} R_j) / (std_{j ∈ group(i)} R_j + ε)
      Â_intra(H_i) = (R_i − mean_{j ∈ tree(i)} R_j) / (std_{j ∈ tree(i)} R_j + ε)
      A(H_i) = Â_inter(H_i) + Â_intra(H_i)                       on every action token of H_i

  The paper's own equations were not retrieved in this session; the formulas are the authors' code. Departures: the
  code keeps ``ts_k`` sampled leaves of each tree (its scripts: m = 2, n = 2, l = 1, k = 3, i.e. all 3); here every
  leaf is kept, so G = M·(1 + L·N·Z) (Z = ``branches`` draws of each node, 1 in the paper). A shared prefix is in
  every leaf below it, so its tokens collect the advantages of all those leaves — the step-level preference the paper
  derives; here as there each leaf is trained as its own sequence.

* **ARPO** — Dong et al. 2025, "Agentic Reinforced Policy Optimization", arXiv 2507.19849 (seed 002:303; code
  ``dongguanting/ARPO``, ``verl_arpo_entropy/verl/workers/rollout/vllm_rollout/vllm_rollout_with_tools.py``).
  §3.2 "entropy-based adaptive rollout": M of the G samples are chains; after each tool response the entropy H_t of
  the first k tokens the model generates is compared with the trajectory's initial entropy H_initial (its first
  turn), ΔH_t = H_t − H_initial, and the trajectory forks Z partial rollouts from that point when the branching
  probability passes the threshold (paper Eq. 2: P_t = α + β·ΔH_t, branch if P_t > τ); slots left after all forks
  are filled by new chains (global samples). The public code draws u ~ U(0, 1) and forks when
  ``clip(u − w·ΔH, 0, 1) ≤ τ`` (w = ``entropy_weight`` 0.2, τ = ``branch_probability`` 0.5 in its scripts), which is
  what :func:`entropy_branch_decisions` implements. Departure: H_t here is the mean surprisal −log π(x) of the k
  sampled tokens (a one-sample estimate of the entropy, read from the decode loop's log-probs with no extra forward),
  where the code computes it from vLLM's top-20 log-probs. ARPO's own advantage ("soft" attribution, §3.3) is plain
  GRPO over the G samples, so it runs with ``algorithm.credit: trajectory``; ``tree_grpo`` is available too.

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``S`` turns, ``T`` trajectory tokens, ``N`` candidate
branch points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from mmgrpo.config import ConfigError, Range, from_dict


@dataclass(frozen=True)
class TreeOptions:
    """``rollout.tree``: how the G trajectories of a prompt grow as trees of turns (module docstring)."""

    select: Literal["random", "entropy"] = "random"
    """random: Tree-GRPO's expansion (N nodes of each tree drawn uniformly per round) | entropy: ARPO's
    entropy-triggered forks after each tool / environment response."""
    trees: Annotated[int, Range(ge=1)] = 2
    """M: chains sampled first per prompt (Tree-GRPO's trees; ARPO's global samples)."""
    rounds: Annotated[int, Range(ge=1)] = 1
    """L: expansion rounds (each expands nodes of the trees as they stand, new branches included)."""
    nodes: Annotated[int, Range(ge=1)] = 1
    """N (select: random): nodes drawn per tree and round, with replacement, among its root and inner nodes."""
    branches: Annotated[int, Range(ge=1)] = 1
    """Z: branches per expanded node, sampled together (the node's prefix prefilled once, its cache expanded Z ways)."""
    entropy_tokens: Annotated[int, Range(ge=1)] = 20
    """k (select: entropy): the first k tokens of the turn after a response measure its entropy."""
    entropy_weight: Annotated[float, Range(ge=0)] = 0.2
    """w (select: entropy): how much a rise of entropy over the trajectory's first turn favours a fork."""
    branch_probability: Annotated[float, Range(ge=0, le=1)] = 0.5
    """τ (select: entropy): fork when clip(u − w·ΔH, 0, 1) ≤ τ, u ~ U(0, 1); the fork rate at ΔH = 0."""

    def leaves(self) -> int:
        """Trajectories per prompt of ``select: random``: M·(1 + L·N·Z)."""
        return self.trees * (1 + self.rounds * self.nodes * self.branches)


def tree_options(tree: dict[str, Any] | None) -> TreeOptions | None:
    """``rollout.tree`` as :class:`TreeOptions` (None: chains); unknown keys and bad values raise ``ConfigError``."""
    return None if tree is None else from_dict(TreeOptions, tree, "rollout.tree")


def check_config(cfg: Any) -> None:
    """``rollout.tree`` and ``algorithm.credit: tree_grpo`` against the rest of the config (one line each)."""
    r, a = cfg.rollout, cfg.algorithm
    opts = tree_options(r.tree)
    if opts is None:
        if a.credit == "tree_grpo":
            raise ConfigError(
                "algorithm.credit: tree_grpo normalises within the trees of a tree rollout, but rollout.tree is not "
                "set; set rollout.tree (e.g. {trees: 2, rounds: 1, nodes: 1}) or choose another credit"
            )
        return
    if not r.multi_turn:
        raise ConfigError(
            "rollout.tree branches multi-turn trajectories at their turns, but rollouts are single-turn; set "
            "rollout.environment or rollout.tools, or remove rollout.tree"
        )
    if r.engine != "native":
        raise ConfigError("rollout.tree is sampled by the native decode loop only; set rollout.engine: native")
    if r.ground_truth_probe is not None:
        raise ConfigError(
            "rollout.ground_truth_probe (IGPO) with rollout.tree: the probe is not taken on tree rollouts yet; "
            "remove one"
        )
    G = a.group_size
    if opts.select == "random" and opts.leaves() != G:
        raise ConfigError(
            f"rollout.tree: {opts.trees} trees × (1 + {opts.rounds} rounds × {opts.nodes} nodes × {opts.branches} "
            f"branches) = {opts.leaves()} trajectories per prompt, but algorithm.group_size is {G}; make them equal"
        )
    if opts.select == "entropy" and opts.trees >= G:
        raise ConfigError(
            f"rollout.tree.trees ({opts.trees}) leaves no slot of algorithm.group_size ({G}) for entropy forks; "
            "set trees below group_size (ARPO: half of it)"
        )


def tree_grpo_advantages(rewards: Tensor, tree: Tensor, *, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """Tree-GRPO's advantage A = Â_inter + Â_intra (module docstring; the authors' ``adv_estimator: tree``).

    Args:
        rewards: the outcome reward of each leaf.
        tree: the tree of each leaf within its prompt's group (any ids; equal id = same tree).
        scale: divide by the std (+ ε) as GRPO does; false: mean-centred only (Dr.GRPO's choice).
        eps: added to the std.

    Shape:
        rewards: [P, G]; tree: [P, G] long -> [P, G]
    """
    r = rewards.float()  # [P, G]
    inter = r - r.mean(1, keepdim=True)  # [P, G]
    if scale:
        inter = inter / (r.std(1, keepdim=True).nan_to_num(0.0) + eps)
    same = tree[:, :, None] == tree[:, None, :]  # [P, G, G] leaf j is in the tree of leaf i
    n = same.sum(-1).float()  # [P, G]
    single = n == 1  # [P, G] a tree of one leaf: mean 0, std 1 (verl's GRPO on a group of one)
    mean = torch.where(single, torch.zeros_like(r), (same * r[:, None, :]).sum(-1) / n)  # [P, G]
    intra = r - mean  # [P, G]
    if scale:
        var = (same * (r[:, None, :] - mean[:, :, None]) ** 2).sum(-1) / (n - 1).clamp(min=1)  # [P, G] unbiased
        intra = intra / (torch.where(single, torch.ones_like(var), var.sqrt()) + eps)
    return intra + inter  # [P, G]


def turn_entropy(logprobs: Tensor, turn_of_token: Tensor, turns: int, k: int) -> Tensor:
    """H of each turn: the mean surprisal −log π of its first ``k`` action tokens (0 for a turn without tokens).

    Shape:
        logprobs: [T] the sampled tokens' log-probs; turn_of_token: [T] long, −1 off the action tokens -> [S]
    """
    valid = turn_of_token >= 0  # [T]
    index = turn_of_token.clamp(min=0)  # [T]
    onehot = torch.nn.functional.one_hot(index, turns).bool() & valid[:, None]  # [T, S]
    rank = onehot.long().cumsum(0)  # [T, S] position of the token within its turn (1-based)
    first = onehot & (rank <= k)  # [T, S]
    total = (first * -logprobs.float()[:, None]).sum(0)  # [S]
    return total / first.sum(0).clamp(min=1)  # [S]


def entropy_branch_decisions(
    entropy: Tensor, initial: Tensor, uniforms: Tensor, *, weight: float, threshold: float
) -> Tensor:
    """ARPO's fork rule at N branch points: fork where ``clip(u − w·(H − H_initial), 0, 1) ≤ τ``.

    Shape:
        entropy: [N] H_t at each point; initial: [N] H_initial of its trajectory; uniforms: [N] u ~ U(0, 1) -> [N] bool
    """
    p = (uniforms - weight * (entropy - initial)).clamp(0.0, 1.0)  # [N]
    return p <= threshold
