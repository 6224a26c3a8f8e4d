"""Credit assignment across the turns of a multi-turn trajectory: per-turn advantages ``[B, S]``.

A trajectory here is **one token sequence** (the concatenated form of verl's agent loop, TRL, DeepEyes): assistant
turns (steps) ``s = 0..S-1`` interleaved with tool / environment observations. The rollout reports, per sample
``b`` and turn ``s``: ``turn_mask[b, s]`` (the turn exists), ``turn_rewards[b, s]`` (environment reward after the
turn's action), ``invalid[b, s]`` (the action did not parse / was not allowed), ``anchor_keys[b][s]`` (a hashable
key of the observation the turn's action was taken from; :func:`mmgrpo.tools.state_anchor`), and per token
``turn_of_token[b, t]`` (the turn a generated token belongs to, −1 for prompt / observation tokens). Three credit
functions, registered in :data:`CREDITS` (``algorithm.credit``) with one signature::

    credit_fn(advantages: Tensor[P, G], outcome: Tensor[B], turns: TurnInputs, options) -> (Tensor[B, S], metrics)

each with a frozen options dataclass (``algorithm.credit_args``, checked at load, :func:`mmgrpo.options.resolve`).
The registered functions only unpack :class:`TurnInputs` and the options into the math functions below, which keep
plain tensors and keyword parameters:

* ``trajectory`` (default) — one advantage per trajectory (the usual group estimator of :mod:`mmgrpo.advantages`)
  broadcast to every action token: :func:`trajectory_turn_advantages`. The advantage pipeline runs no credit step
  for it: the configured shaper does the broadcast (:mod:`mmgrpo.advantage_steps`; with ``shaping: none`` the same
  numbers, as ``tests/test_credits.py`` checks), and single-turn rollouts take that path too.
* ``gigpo`` — GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
  arXiv 2505.10978), as verl-agent computes it (``gigpo/core_gigpo.py`` ``compute_step_discounted_returns``,
  ``episode_norm_reward``, ``build_step_group``, ``step_norm_reward``, ``compute_gigpo_outcome_advantage``;
  ``verl/trainer/ppo/ray_trainer.py`` ``apply_invalid_action_penalty``): :func:`gigpo_advantages`.

      G_{b,s} = r_{b,s} + γ·G_{b,s+1}                          step return (Eq. 5), over the trajectory's turns
      G_{b,s} ← G_{b,s} − c·invalid_{b,s}                     penalty, not discounted or propagated
      E_{b,s} = R_b − c·invalid_{b,s},  R_b = Σ_s r_{b,s}      episode score of each step row
      A^E_{b,s} = (E_{b,s} − mean_g E) [/ (std_g E + ε)]      g = the episode group of b, over ALL its step rows
                                                               (``compute_mean_std_cross_steps=True``);
                                                               a group of one row: mean 0, std 1 (Eq. 3)
      A^S_{b,s} = (G_{b,s} − mean_k G) [/ (std_k G + ε)]      k = the rows of group g with an equal anchor
                                                               (Eq. 6, 7); a cluster of one: A^S = 0
      A_{b,s} = A^E_{b,s} + ω·A^S_{b,s}                         (Eq. 8)

  ``mode="mean_norm"`` drops the brackets (verl-agent's default), ``"mean_std_norm"`` keeps them; std is the
  unbiased (n−1) std, ε = 1e-6. Defaults γ = 0.95 (verl-agent's scripts; its config default is 1.0), ω = 1,
  c = 0.1 (``actor.invalid_action_penalty_coef``).
* ``mt_grpo`` — MT-GRPO (Zeng et al. 2025, "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit
  Assignment", arXiv 2505.11821; ``SiliangZeng/Multi-Turn-RL-Agent`` ``verifiers/trainers/mt_grpo_env_trainer.py``
  ``_assign_advantages``, normalisation ``grpo_env_trainer.py`` ``_compute_normalized_advantages``):
  :func:`mt_grpo_advantages`. Each reward family is group-normalised, Â = (r − mean_G)/(std_G + 1e-4) (unbiased
  std); turns before the first tool result get Â^O + λ·Â^T, turns after it Â^O, and a trajectory without a tool
  result gets Â^{O+T}, the normalised sum of both families (``advantage_est="aae"``). ``"cae"``: turns before the
  result get the normalised cumulative reward r^T + δ·r^O (δ = ``discount_factor``), after it Â^O; without a
  result, that cumulative advantage everywhere.

Where this departs from the sources. verl-agent trains one row per step; here a step is a turn of one sequence,
so "the rows of a group" are the valid ``(b, s)`` turns of its trajectories — the same numbers, as the hand-worked
tests check. The episode score R_b defaults to the sum of the turn rewards (verl-agent's ``episode_rewards``);
pass ``episode_rewards`` to use an outcome reward instead. MT-GRPO's group of one has torch's NaN std; here its
advantage is 0. Anchors match exactly (images by their pixels) unless ``similarity_thresh`` turns on verl-agent's
greedy text-similarity clustering (``enable_similarity``).

Everything is fp32 tensor math without ``.item()``; only :func:`anchor_clusters` walks Python keys (on the host,
once per rollout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from mmgrpo.config import ConfigError, Range
from mmgrpo.registry import Registry
from mmgrpo.shaping import NoOptions
from mmgrpo.tree import tree_grpo_advantages

GIGPO_MODES = ("mean_norm", "mean_std_norm")
MT_GRPO_ESTIMATORS = ("aae", "cae")


def pad_turns(rows: Sequence[Sequence[float]], *, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Per-turn values of B trajectories of different lengths as a padded tensor and its turn mask.

    Shape:
        rows: B lists (turn s of trajectory b at rows[b][s])
        returns: ([B, S] float32 values, 0 in the padding; [B, S] float32 mask), S = the longest trajectory (≥ 1)
    """
    B, S = len(rows), max([len(r) for r in rows] + [1])
    values = torch.zeros(B, S, dtype=torch.float32)  # [B, S]
    mask = torch.zeros(B, S, dtype=torch.float32)  # [B, S]
    for b, row in enumerate(rows):
        values[b, : len(row)] = torch.tensor([float(v) for v in row], dtype=torch.float32)
        mask[b, : len(row)] = 1.0
    return values.to(device), mask.to(device)


def trajectory_turn_advantages(advantages: Tensor, turn_mask: Tensor) -> Tensor:
    """Trajectory-level GRPO: each trajectory's advantage on every one of its turns.

    Shape:
        advantages: [B] (from :func:`mmgrpo.advantages.compute_advantages`, flattened [P, G] → [B])
        turn_mask: [B, S]
        returns: [B, S], 0 where ``turn_mask`` is 0
    """
    _check_turns(turn_mask, {}, {"advantages": advantages})
    return advantages.float()[:, None] * turn_mask.float()  # [B, S]


def turn_to_token_advantages(turn_advantages: Tensor, turn_of_token: Tensor) -> Tensor:
    """Per-turn advantages onto the tokens: token ``t`` of sample ``b`` gets ``turn_advantages[b,
    turn_of_token[b, t]]``; tokens with turn −1 (prompt, tool / observation tokens, padding) get 0.

    Shape:
        turn_advantages: [B, S]
        turn_of_token: [B, T] long, values in −1..S−1
        returns: [B, T]
    """
    if turn_of_token.dim() != 2 or turn_of_token.shape[0] != turn_advantages.shape[0]:
        raise ValueError(
            f"turn_of_token must be [B, T] with B = {turn_advantages.shape[0]} (the rows of turn_advantages), got "
            f"{tuple(turn_of_token.shape)}"
        )
    index = turn_of_token.long().clamp(min=0)  # [B, T]
    picked = torch.gather(turn_advantages.float(), 1, index)  # [B, T]
    return torch.where(turn_of_token >= 0, picked, torch.zeros_like(picked))  # [B, T]


def step_discounted_returns(turn_rewards: Tensor, turn_mask: Tensor, gamma: float) -> Tensor:
    """G_{b,s} = r_{b,s} + γ·G_{b,s'} with s' the next valid turn of ``b`` (0 after the last); 0 where masked.

    Shape:
        turn_rewards: [B, S]
        turn_mask: [B, S]
        returns: [B, S]
    """
    _check_turns(turn_mask, {"turn_rewards": turn_rewards}, {})
    valid = turn_mask.bool()  # [B, S]
    r = torch.where(valid, turn_rewards.float(), torch.zeros_like(turn_rewards, dtype=torch.float32))  # [B, S]
    out = torch.zeros_like(r)  # [B, S]
    running = torch.zeros_like(r[:, 0])  # [B]
    for s in range(r.shape[1] - 1, -1, -1):
        running = torch.where(valid[:, s], r[:, s] + gamma * running, running)  # [B]
        out[:, s] = torch.where(valid[:, s], running, torch.zeros_like(running))
    return out


def anchor_clusters(
    anchor_keys: Sequence[Sequence[Hashable]],
    group_index: Tensor,
    turn_mask: Tensor,
    *,
    similarity_thresh: float | None = None,
) -> Tensor:
    """GiGPO's anchor-state groups (``build_step_group``): turns of the same episode group whose anchor keys are
    equal share a cluster id; ids are 0..C−1 in order of first appearance (sample-major, as verl-agent's rows), −1
    where masked. ``similarity_thresh`` (verl-agent's ``enable_similarity``, text anchors only): a turn joins the
    first cluster of its group whose first text has ``difflib.SequenceMatcher(None, text, first).ratio() >=
    similarity_thresh``, else starts a new one.

    Shape:
        anchor_keys: B lists, each with at least as many keys as ``b`` has valid turns (key s for turn s)
        group_index: [B] long, the episode group (prompt) of each trajectory
        turn_mask: [B, S]
        returns: [B, S] long
    """
    B, S = turn_mask.shape
    if len(anchor_keys) != B or group_index.shape != (B,):
        raise ValueError(
            f"anchor_keys needs B = {B} lists (got {len(anchor_keys)}) and group_index shape [{B}] "
            f"(got {tuple(group_index.shape)})"
        )
    if similarity_thresh is not None and not 0.0 < similarity_thresh < 1.0:
        raise ValueError(f"similarity_thresh must be in (0, 1) (None: exact matches), got {similarity_thresh}")
    valid = turn_mask.bool().tolist()
    groups = group_index.tolist()
    ids: dict[tuple[int, Hashable], int] = {}  # exact: (group, key) → id
    firsts: dict[int, list[tuple[str, int]]] = {}  # similarity: group → [(first text of a cluster, id)]
    out = [[-1] * S for _ in range(B)]
    for b in range(B):
        for s in range(S):
            if not valid[b][s]:
                continue
            if s >= len(anchor_keys[b]):
                raise ValueError(f"anchor_keys[{b}] has {len(anchor_keys[b])} keys but turn {s} of sample {b} is valid")
            key = anchor_keys[b][s]
            if similarity_thresh is None:
                out[b][s] = ids.setdefault((groups[b], key), len(ids))
                continue
            if not isinstance(key, str):
                raise ValueError(
                    f"similarity clustering compares text anchors; anchor_keys[{b}][{s}] is a {type(key).__name__} "
                    "(set similarity_thresh to None for exact matches of image anchors)"
                )
            clusters = firsts.setdefault(groups[b], [])
            match = next(
                (i for first, i in clusters if SequenceMatcher(None, key, first).ratio() >= similarity_thresh), None
            )
            if match is None:
                match = len(ids)
                ids[(groups[b], key)] = match
                clusters.append((key, match))
            out[b][s] = match
    return torch.tensor(out, dtype=torch.long, device=turn_mask.device).reshape(B, S)


def grouped_normalize(
    values: Tensor, groups: Tensor, *, std: bool, eps: float, singleton: str = "zero_mean_unit_std"
) -> tuple[Tensor, Tensor]:
    """(x − mean_g x) [/ (std_g x + eps)] over arbitrary groups, with the unbiased std; and each item's group size.

    ``singleton`` says what a group of one item uses: ``"zero_mean_unit_std"`` (verl's GRPO and GiGPO's episode
    groups: mean 0, std 1, so the item keeps its value), ``"self"`` (GiGPO's step clusters: its own mean, so 0),
    ``"zero_std"`` (MT-GRPO: std 0, so (x − x)/(0 + eps) = 0).

    Shape:
        values: [N] (the items; pass only valid ones)
        groups: [N] long, ids in 0..N−1 (any order)
        returns: ([N] normalised values, [N] group sizes as float)
    """
    if singleton not in ("zero_mean_unit_std", "self", "zero_std"):
        raise ValueError(f"singleton must be 'zero_mean_unit_std', 'self' or 'zero_std', got {singleton!r}")
    x = values.float()  # [N]
    n_groups = x.shape[0]
    ones = torch.ones_like(x)  # [N]
    count = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, groups, ones)  # [N groups]
    total = torch.zeros_like(count).index_add_(0, groups, x)  # [N groups]
    mean = total / count.clamp(min=1)  # [N groups]
    dev2 = torch.zeros_like(count).index_add_(0, groups, (x - mean[groups]) ** 2)  # [N groups]
    sd = (dev2 / (count - 1).clamp(min=1)).sqrt()  # [N groups], unbiased
    n = count[groups]  # [N]
    m, s = mean[groups], sd[groups]  # [N]
    single = n == 1  # [N]
    if singleton == "zero_mean_unit_std":
        m = torch.where(single, torch.zeros_like(m), m)
        s = torch.where(single, torch.ones_like(s), s)
    elif singleton == "self":
        s = torch.where(single, torch.ones_like(s), s)
    centred = x - m  # [N]
    return (centred / (s + eps) if std else centred), n


def gigpo_advantages(
    turn_rewards: Tensor,
    turn_mask: Tensor,
    anchor_keys: Sequence[Sequence[Hashable]],
    group_index: Tensor,
    *,
    invalid: Tensor | None = None,
    episode_rewards: Tensor | None = None,
    gamma: float = 0.95,
    step_advantage_w: float = 1.0,
    mode: str = "mean_norm",
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
    similarity_thresh: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GiGPO's per-turn advantages A = A^E + ω·A^S (module docstring; verl-agent ``core_gigpo.py``).

    Args:
        turn_rewards: environment reward of each turn's action.
        turn_mask: 1 for the turns that exist.
        anchor_keys: hashable key of the state each turn acted from (:func:`mmgrpo.tools.state_anchor`).
        group_index: episode group (prompt / seed) of each trajectory; B // G for group-major batches.
        invalid: 1 where the turn's action was invalid (penalised by ``invalid_penalty``); None = all valid.
        episode_rewards: R_b; None = the sum of the trajectory's turn rewards.
        gamma: discount of the step returns (γ).
        step_advantage_w: ω, the weight of the step advantage.
        mode: ``mean_norm`` (no std division) or ``mean_std_norm``.
        invalid_penalty: c, subtracted from the episode score and the step return of an invalid turn.
        eps: added to the std in ``mean_std_norm``.
        similarity_thresh: None = anchors match exactly (verl-agent's default); a ratio in (0, 1) clusters text
            anchors by similarity (its ``enable_similarity``; its search script uses 0.9).

    Returns:
        ``(advantages [B, S] (0 where masked), metrics)``; metrics (detached scalars): ``credit/episode_adv_abs``,
        ``credit/step_adv_abs`` (mean |A^E|, |ω·A^S| over valid turns), ``credit/anchor_clusters`` (C),
        ``credit/anchor_cluster_size`` (mean turns per cluster), ``credit/anchor_singleton_fraction`` (clusters of
        one turn, whose A^S is 0).

    Shape:
        turn_rewards, turn_mask, invalid: [B, S]
        group_index, episode_rewards: [B]
    """
    if mode not in GIGPO_MODES:
        raise ValueError(f"gigpo mode must be one of {GIGPO_MODES}, got {mode!r}")
    _check_turns(
        turn_mask,
        {"turn_rewards": turn_rewards, "invalid": invalid},
        {"group_index": group_index, "episode_rewards": episode_rewards},
    )
    valid = turn_mask.bool()  # [B, S]
    r = torch.where(valid, turn_rewards.float(), torch.zeros_like(turn_rewards, dtype=torch.float32))  # [B, S]
    bad = torch.zeros_like(r) if invalid is None else (invalid.float() * valid)  # [B, S]
    R = r.sum(1) if episode_rewards is None else episode_rewards.float()  # [B]
    returns = step_discounted_returns(r, valid, gamma) - invalid_penalty * bad  # [B, S]
    episode = R[:, None] - invalid_penalty * bad  # [B, S]
    groups = group_index.long()[:, None].expand_as(valid)[valid]  # [N] episode group of each valid turn
    _, groups = torch.unique(groups, return_inverse=True)  # [N] ids 0..g−1
    clusters = anchor_clusters(anchor_keys, group_index, turn_mask, similarity_thresh=similarity_thresh)[valid]  # [N]
    use_std = mode == "mean_std_norm"
    a_episode, _ = grouped_normalize(episode[valid], groups, std=use_std, eps=eps)  # [N]
    a_step, size = grouped_normalize(returns[valid], clusters, std=use_std, eps=eps, singleton="self")  # [N]
    out = torch.zeros_like(r)  # [B, S]
    out[valid] = a_episode + step_advantage_w * a_step
    n_clusters = (1.0 / size).sum()  # each cluster of size k contributes k·(1/k) = 1
    metrics = {
        "credit/episode_adv_abs": a_episode.abs().mean(),
        "credit/step_adv_abs": (step_advantage_w * a_step).abs().mean(),
        "credit/anchor_clusters": n_clusters,
        "credit/anchor_cluster_size": size.new_tensor(float(size.numel())) / n_clusters.clamp(min=1),
        "credit/anchor_singleton_fraction": (size == 1).float().sum() / n_clusters.clamp(min=1),
    }
    return out, {k: v.detach() for k, v in metrics.items()}


def mt_grpo_advantages(
    outcome_rewards: Tensor,
    turn_level_rewards: Tensor,
    first_result_turn: Tensor,
    turn_mask: Tensor,
    group_index: Tensor,
    *,
    turn_advantage_coef: float = 1.0,
    advantage_est: str = "aae",
    discount_factor: float = 1.0,
    eps: float = 1e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """MT-GRPO's per-turn advantages (module docstring; ``mt_grpo_env_trainer.py`` ``_assign_advantages``).

    Args:
        outcome_rewards: r^O, the trajectory's outcome reward (weighted sum of its outcome reward functions).
        turn_level_rewards: r^T, the trajectory's turn-level reward (weighted sum of its turn reward functions:
            the tool ran, the result holds the answer).
        first_result_turn: the first assistant turn that comes after a tool result (turns before it get the turn
            advantage; 1 when turn 0's call returned a result); −1 = no tool result in the trajectory.
        turn_mask: 1 for the turns that exist.
        group_index: the group (prompt) of each trajectory.
        turn_advantage_coef: λ.
        advantage_est: ``aae`` (the paper's) or ``cae`` (the cumulative variant of the same file).
        discount_factor: δ of ``cae``.
        eps: added to the std (1e-4 as in the source).

    Returns:
        ``(advantages [B, S] (0 where masked), metrics)``: ``credit/turn_adv_abs`` (mean |λ·Â^T| over turns that
        get it), ``credit/tool_result_fraction`` (trajectories with a tool result).

    Shape:
        outcome_rewards, turn_level_rewards, first_result_turn, group_index: [B]
        turn_mask: [B, S]
    """
    if advantage_est not in MT_GRPO_ESTIMATORS:
        raise ValueError(f"advantage_est must be one of {MT_GRPO_ESTIMATORS}, got {advantage_est!r}")
    _check_turns(
        turn_mask,
        {},
        {
            "outcome_rewards": outcome_rewards,
            "turn_level_rewards": turn_level_rewards,
            "first_result_turn": first_result_turn,
            "group_index": group_index,
        },
    )
    _, groups = torch.unique(group_index.long(), return_inverse=True)  # [B]
    ro, rt = outcome_rewards.float(), turn_level_rewards.float()  # [B]

    def norm(x: Tensor) -> Tensor:
        return grouped_normalize(x, groups, std=True, eps=eps, singleton="zero_std")[0]  # [B]

    a_o, a_t = norm(ro), norm(rt)  # [B]
    S = turn_mask.shape[1]
    has = first_result_turn >= 0  # [B]
    before = torch.arange(S, device=turn_mask.device)[None, :] < first_result_turn.long()[:, None]  # [B, S]
    if advantage_est == "aae":
        early, no_result = a_o + turn_advantage_coef * a_t, norm(ro + rt)  # [B]
    else:
        early = no_result = norm(rt + discount_factor * ro)  # [B]
    per_turn = torch.where(before, early[:, None], a_o[:, None])  # [B, S]
    out = torch.where(has[:, None], per_turn, no_result[:, None]) * turn_mask.float()  # [B, S]
    gets_turn = (before & has[:, None] & turn_mask.bool()).float()  # [B, S]
    turn_term = (turn_advantage_coef * a_t).abs()[:, None] * gets_turn  # [B, S]
    metrics = {
        "credit/turn_adv_abs": turn_term.sum() / gets_turn.sum().clamp(min=1),
        "credit/tool_result_fraction": has.float().mean(),
    }
    return out, {k: v.detach() for k, v in metrics.items()}


def _check_turns(turn_mask: Tensor, per_turn: dict[str, Tensor | None], per_sample: dict[str, Tensor | None]) -> None:
    """Shapes against ``turn_mask`` [B, S]: ``per_turn`` tensors must be [B, S], ``per_sample`` ones [B]; one line
    naming the argument otherwise (a rollout bug, so it says which)."""
    if turn_mask.dim() != 2:
        raise ValueError(f"turn_mask must be [B, S] (samples × turns), got {list(turn_mask.shape)}")
    B, S = turn_mask.shape
    for want, named in (((B, S), per_turn), ((B,), per_sample)):
        for name, t in named.items():
            if t is not None and tuple(t.shape) != want:
                raise ValueError(
                    f"{name} must have shape {list(want)} to match turn_mask {[B, S]}, got {list(t.shape)}"
                )


# ------------------------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class TurnInputs:
    """What a credit function reads about B multi-turn trajectories, padded to S turns (the longest one's);
    :func:`mmgrpo.multiturn.turn_inputs` builds it from a rollout's columns.

    Shape:
        turn_mask: [B, S] float32, 1 for the turns that exist
        turn_rewards: [B, S] float32, the environment / tool reward after each turn's action (0 in the padding)
        invalid: [B, S] float32, 1 where the turn's action was invalid (its observation an error)
        anchors: B lists, key s the state turn s acted from (:func:`mmgrpo.tools.state_anchor`)
        first_result_turn: [B] long, the first turn after a tool result (−1: none)
        group: [B] long, the episode group (prompt) of each trajectory
        tree: [B] long or None, the tree of each trajectory within its group (``rollout.tree``)
    """

    turn_mask: Tensor  # [B, S]
    turn_rewards: Tensor  # [B, S]
    invalid: Tensor  # [B, S]
    anchors: Sequence[Sequence[Hashable]]
    first_result_turn: Tensor  # [B]
    group: Tensor  # [B]
    tree: Tensor | None = None  # [B]
    """The tree of each trajectory within its group (tree rollouts, ``rollout.tree``); None for chains."""
    gt_logprobs: Tensor | None = None  # [B, S]
    """ℓ, the mean log-prob of the ground truth given the context before each turn (``rollout.ground_truth_probe``,
    :mod:`mmgrpo.igpo`; 0 in the padding); None without the probe."""


CreditFn = Callable[[Tensor, Tensor, TurnInputs, Any], tuple[Tensor, dict[str, Tensor]]]
"""``credit_fn(advantages [P, G], outcome [B], turns, options) -> (per-turn advantages [B, S], metrics)``."""

CREDITS: Registry[CreditFn] = Registry("credit")
"""``algorithm.credit`` → its credit function and options dataclass (module docstring)."""


@dataclass(frozen=True)
class GiGPOOptions:
    """``algorithm.credit_args`` of ``gigpo``: :func:`gigpo_advantages`'s options (its other parameters come from
    the rollout), and where the outcome reward goes."""

    gamma: float = 0.95
    """γ, the discount of the step returns (verl-agent's scripts; its config default is 1.0)."""
    step_advantage_w: float = 1.0
    """ω, the weight of the step (anchor-state) advantage."""
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"
    """mean_norm: subtract the group mean (verl-agent's default) | mean_std_norm: and divide by std + eps."""
    invalid_penalty: float = 0.1
    """c, subtracted from the episode score and the step return of an invalid turn."""
    eps: float = 1e-6
    """Added to the std in mean_std_norm."""
    similarity_thresh: Annotated[float, Range(gt=0, lt=1)] | None = None
    """null: anchors match exactly | a ratio in (0, 1): text anchors clustered by similarity (enable_similarity)."""
    outcome_on_last_turn: bool = True
    """Add the outcome reward (the configured rewards, combined) to the last turn's reward, so R_b = Σ_s r_{b,s};
    false when the configured reward already is the environment's return (env_return), which would count twice."""


@dataclass(frozen=True)
class MTGRPOOptions:
    """``algorithm.credit_args`` of ``mt_grpo``: :func:`mt_grpo_advantages`'s options."""

    turn_advantage_coef: float = 1.0
    """λ, the weight of the turn-level advantage on the turns before the first tool result."""
    advantage_est: Literal["aae", "cae"] = "aae"
    """aae: the paper's Â^O + λ·Â^T | cae: the normalised cumulative reward r^T + δ·r^O."""
    discount_factor: float = 1.0
    """δ of cae."""
    eps: float = 1e-4
    """Added to the std (1e-4 as in the source)."""


@CREDITS.register("trajectory", options=NoOptions)
def trajectory_credit(
    advantages: Tensor, outcome: Tensor, turns: TurnInputs, options: NoOptions
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO over whole trajectories: :func:`trajectory_turn_advantages` of the group estimator's advantages.

    Shape:
        advantages: [P, G]; outcome: [B] (unused) -> [B, S]
    """
    return trajectory_turn_advantages(advantages.reshape(-1), turns.turn_mask), {}  # [B, S]


@CREDITS.register("gigpo", options=GiGPOOptions)
def gigpo_credit(
    advantages: Tensor, outcome: Tensor, turns: TurnInputs, options: GiGPOOptions
) -> tuple[Tensor, dict[str, Tensor]]:
    """GiGPO (:func:`gigpo_advantages`) on the turn rewards, the outcome added to each trajectory's last turn
    unless ``options.outcome_on_last_turn`` is false (the episode return R_b = Σ_s r_{b,s}, as in verl-agent, where
    the environment's final step reward carries the success).

    Shape:
        advantages: [P, G] (unused); outcome: [B] -> [B, S]
    """
    rewards = turns.turn_rewards  # [B, S]
    if options.outcome_on_last_turn:
        last = (turns.turn_mask.sum(1).long() - 1).clamp(min=0)  # [B]
        rewards = rewards.clone()
        rewards[torch.arange(len(last)), last] += outcome
    kwargs = dataclasses.asdict(options)  # the other fields are gigpo_advantages's keyword parameters
    del kwargs["outcome_on_last_turn"]
    return gigpo_advantages(rewards, turns.turn_mask, turns.anchors, turns.group, invalid=turns.invalid, **kwargs)


@CREDITS.register("mt_grpo", options=MTGRPOOptions)
def mt_grpo_credit(
    advantages: Tensor, outcome: Tensor, turns: TurnInputs, options: MTGRPOOptions
) -> tuple[Tensor, dict[str, Tensor]]:
    """MT-GRPO (:func:`mt_grpo_advantages`) with r^O = the outcome reward and r^T = the trajectory's summed turn
    rewards.

    Shape:
        advantages: [P, G] (unused); outcome: [B] -> [B, S]
    """
    turn_reward = (turns.turn_rewards * turns.turn_mask).sum(1)  # [B]
    return mt_grpo_advantages(
        outcome, turn_reward, turns.first_result_turn, turns.turn_mask, turns.group, **dataclasses.asdict(options)
    )


@dataclass(frozen=True)
class TreeGRPOOptions:
    """``algorithm.credit_args`` of ``tree_grpo``: :func:`mmgrpo.tree.tree_grpo_advantages`'s options."""

    scale: bool = True
    """Divide each normalisation by its std + eps (GRPO); false: mean-centred only."""
    eps: float = 1e-6
    """Added to the std."""


@CREDITS.register("tree_grpo", options=TreeGRPOOptions)
def tree_grpo_credit(
    advantages: Tensor, outcome: Tensor, turns: TurnInputs, options: TreeGRPOOptions
) -> tuple[Tensor, dict[str, Tensor]]:
    """Tree-GRPO (Ji et al. 2025, arXiv 2509.21240, §3.3; :mod:`mmgrpo.tree`): the outcome normalised within the
    trajectory's tree plus within its prompt's group, on every turn of the trajectory.

    Shape:
        advantages: [P, G] (gives P, G); outcome: [B] -> [B, S]
    """
    if turns.tree is None:
        raise ConfigError("algorithm.credit: tree_grpo needs tree rollouts (rollout.tree); the rollout has no tree ids")
    P, G = advantages.shape
    tree = turns.tree.to(outcome.device).reshape(P, G)  # [P, G]
    adv = tree_grpo_advantages(outcome.reshape(P, G), tree, **dataclasses.asdict(options))  # [P, G]
    return trajectory_turn_advantages(adv.reshape(-1), turns.turn_mask), {"credit/tree_adv_abs": adv.abs().mean()}
