"""Tree rollouts of multi-turn agents (``rollout.tree``): the G trajectories of a prompt branch from shared prefixes of
turns, as Tree-GRPO (Ji et al. 2025, arXiv 2509.21240, §3.2) and ARPO (Dong et al. 2025, arXiv 2507.19849, §3.2)
sample them; the math (options, the fork rule, the advantages) is :mod:`mmgrpo.tree`.

:class:`TreeRunner` is the multi-turn driver (:class:`.turns.TurnRunner`) with a different ``trajectories``:

1. **chains**: M = ``trees`` trajectories per prompt, turn 0 sampled as a single-turn rollout samples it (the prompt
   prefilled once, its cache expanded M ways), later turns as the chain driver samples them;
2. **nodes**: before each turn k ≥ 1 of a trajectory, the state it acts from (its tokens, observations and a copy of
   its environment) is kept as a node; a node is a whole agent step, as in both papers;
3. **expansion**, ``rounds`` times: ``select: random`` draws ``nodes`` nodes of each tree uniformly with replacement
   among its root and inner nodes (Tree-GRPO's ``get_expand_node``), ``select: entropy`` forks where ARPO's rule fires
   (:func:`mmgrpo.tree.entropy_branch_decisions`); each chosen node gets ``branches`` new trajectories that **copy
   the node's prefix** (its tokens, log-probs, observations and environment state: nothing of the prefix is sampled,
   run or stepped again) and continue from it. The first turns of a round's branches are one decode call per turn,
   each node's prefix prefilled once and its cache expanded ``branches`` ways (:mod:`.decode`, the prompt's prefix
   sharing of :mod:`.prefix_sharing` applied to a node); their later turns continue as the chain driver's do;
4. ``select: entropy`` fills slots no fork took with new chains from the root (ARPO's global samples), each its own
   tree.

Rows stay group-major (trajectory b belongs to prompt b // G); ``select: random`` keeps tree m of prompt p in rows
p·G + m·W … p·G + (m+1)·W − 1, W = G / M. The rollout's ``extras`` gain ``tree`` (the tree of each trajectory in its
group, what ``algorithm.credit: tree_grpo`` reads), ``branch_turn`` (the turn a branch started at; 0 for a chain) and
``branch_of`` (the row whose node it branched from; −1 for a chain).
The training forward scores each trajectory as its own sequence (the shared turns once per leaf, as the papers train
them); only the prompt is encoded once per group there (:func:`.turns.trajectory_logits`).

Noise: under keyed noise every draw has its own key — chains' turn 0 the rollout's keys of samples 0..M−1, a node's
branches (seed, ``TREE_NOISE``, turn) at the position of their first row, later turns the chain driver's per-row keys,
the node draws and fork coins per prompt, round and node — so a tree rollout is reproducible and independent of the
world size. Evaluation and the warm-up run chains (the parent's ``trajectories``).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``M`` trees, ``Z`` branches per node, ``T`` trajectory
tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from mmgrpo import noise
from mmgrpo.config import ConfigError, RolloutConfig
from mmgrpo.tree import TreeOptions, entropy_branch_decisions, tree_options, turn_entropy
from mmgrpo.types import Rollout

from .sampler import TokenSampler
from .turns import TurnRunner, TurnState, _Trajectory

TREE_NOISE = 0x7EE5
"""Tag mixed into the seeds of a tree's own draws (branches' first turns, node draws, fork coins)."""


@dataclass(frozen=True)
class Node:
    """A state a trajectory acted from: row ``row`` before its turn ``turn`` (turn 0: the prompt, the root)."""

    row: int
    turn: int


def fork(t: _Trajectory) -> _Trajectory:
    """A copy of trajectory record ``t`` whose lists can grow apart from ``t``'s (tensors and images are shared)."""
    out = copy.copy(t)
    out.__dict__.update({k: list(v) for k, v in vars(t).items() if isinstance(v, list)})
    return out


class TreeRunner(TurnRunner):
    """The tree-shaped multi-turn driver (module docstring), built instead of :class:`.turns.TurnRunner` when the
    config has ``rollout.tree``."""

    def __init__(self, adapter: TokenSampler, settings: RolloutConfig):
        super().__init__(adapter, settings)
        self.options: TreeOptions = tree_options(settings.tree)

    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        """The chain driver's rollout of tree-shaped trajectories, with ``tree`` and ``branch_turn`` columns."""
        self._tree, self._origin, self._parent = [], [], []
        rollout = super().rollout(prompts, group_size, keys)
        rollout.extras["tree"] = list(self._tree)
        rollout.extras["branch_turn"] = list(self._origin)
        rollout.extras["branch_of"] = list(self._parent)
        return rollout

    @torch.no_grad()
    def trajectories(self, prompts, encodings, group_size, keys, envs, greedy=False, script=None, **more):
        """Tree-shaped trajectories (module docstring); greedy evaluation and scripted warm-ups run chains."""
        if greedy or script is not None:
            return super().trajectories(prompts, encodings, group_size, keys, envs, greedy, script, **more)
        if more.get("probe") is not None:
            raise ConfigError(
                "rollout.ground_truth_probe with rollout.tree: the probe is not taken on tree rollouts yet; remove one"
            )
        o, G = self.options, group_size
        P = len(prompts)
        trajs, contexts = self.start(prompts, G)
        roots = [(fork(trajs[p * G]), copy.deepcopy(envs[p * G])) for p in range(P)]
        width = G // o.trees if o.select == "random" else 1
        chains = [p * G + m * width for p in range(P) for m in range(o.trees)]
        self._tree = [-1] * (P * G)
        self._origin = [0] * (P * G)
        self._parent = [-1] * (P * G)
        for i, b in enumerate(chains):
            self._tree[b] = i % o.trees
        self.nodes: dict[Node, tuple[_Trajectory, object]] = {}
        self._seen: set[Node] = set()
        self._keys, self._G, self._encodings = keys, G, encodings
        self._contexts, self._envs, self._trajs_all = contexts, envs, trajs
        chain_keys = None if keys is None else noise.NoiseKeys(keys.seed, keys.step, keys.positions, o.trees)
        ids, logps = self.sample_turn(encodings, o.trees, False, chain_keys, chains, 0)  # [P·M, T1]
        going = self.absorb_turn(ids, logps, trajs, chains, 0, contexts, envs, encodings, G)
        self._continue({1: going})
        used = {p: set(chains[p * o.trees : (p + 1) * o.trees]) for p in range(P)}
        for r in range(o.rounds):
            plan = self._plan_random(P, used, r) if o.select == "random" else self._plan_entropy(P, used, r)
            if not plan:
                break
            self._grow(plan, roots)
        if o.select == "entropy":
            self._fill(P, used, roots)
        return self._pack(trajs, encodings, G), trajs

    # ------------------------------------------------------------------------------------------- sampling

    def _continue(self, starts: dict[int, list[int]]) -> None:
        """Run rows to their end: ``starts[k]`` are rows whose next turn is k; a node is kept before each turn."""
        trajs, G, keys = self._trajs_all, self._G, self._keys
        active: list[int] = []
        for turn in range(min(starts, default=self.settings.max_turns), self.settings.max_turns):
            active = sorted(active + starts.get(turn, []))
            if not active:
                continue
            for b in active:
                self.nodes[Node(b, turn)] = (fork(trajs[b]), copy.deepcopy(self._envs[b]))
            batch = self._continuations(self._encodings, trajs, active, G)
            ids, logps = self.sample_turn(batch, 1, False, self._turn_keys(keys, turn, active), active, turn)
            active = self.absorb_turn(ids, logps, trajs, active, turn, self._contexts, self._envs, self._encodings, G)

    def _grow(self, plan: list[tuple[Node, list[int]]], roots: list) -> None:
        """Give each planned node its branch rows (a copy of the node's prefix and environment each), sample their
        first turn — one decode call per (branch count, turn), each node's prefix prefilled once for its branches —
        and run them to their end."""
        trajs, G, keys = self._trajs_all, self._G, self._keys
        for node, rows in plan:
            prefix, env = roots[node.row // G] if node.turn == 0 else self.nodes[node]
            for b in rows:
                trajs[b], self._envs[b] = fork(prefix), copy.deepcopy(env)
                if self._tree[b] < 0:  # a branch joins its node's tree (a fill-in chain has its own already)
                    self._tree[b] = self._tree[node.row]
                self._origin[b], self._parent[b] = node.turn, node.row if node.turn else -1
        starts: dict[int, list[int]] = {}
        for n, turn in sorted({(len(rows), node.turn) for node, rows in plan}):  # one decode call each
            group = [(node, rows) for node, rows in plan if (len(rows), node.turn) == (n, turn)]
            batch = [self._continuations(self._encodings, trajs, [rows[0]], G)[0] for _, rows in group]
            node_keys = None
            if keys is not None:
                positions = tuple(noise.mix(keys.positions[rows[0] // G], rows[0]) for _, rows in group)
                node_keys = noise.NoiseKeys(noise.mix(keys.seed, TREE_NOISE, keys.step), keys.step, positions, n)
            rows_all = [r for _, rows in group for r in rows]
            ids, logps = self.sample_turn(batch, n, False, node_keys, rows_all, turn)  # [len·n, T1]
            for i, (node, rows) in enumerate(group):
                part = slice(i * n, (i + 1) * n)
                lp = None if logps is None else logps[part]
                going = self.absorb_turn(
                    ids[part], lp, trajs, rows, node.turn, self._contexts, self._envs, self._encodings, G
                )
                starts.setdefault(node.turn + 1, []).extend(going)
        self._continue(starts)

    # ------------------------------------------------------------------------------------------- planning

    def _generator(self, *tags: int) -> torch.Generator | None:
        """A generator keyed by the rollout's keys and ``tags`` (None without keys: torch's global stream)."""
        keys = self._keys
        if keys is None:
            return None
        return torch.Generator().manual_seed(noise.mix(keys.seed, TREE_NOISE, keys.step, *tags))

    def _plan_random(self, P: int, used: dict, r: int) -> list[tuple[Node, list[int]]]:
        """Tree-GRPO's round ``r`` (``get_expand_node``): ``nodes`` draws per tree, uniform with replacement among
        its root and its inner nodes; each draw takes ``branches`` free rows of the tree."""
        o, G = self.options, self._G
        width = G // o.trees
        plan: dict[Node, list[int]] = {}
        for p in range(P):
            for m in range(o.trees):
                rows = range(p * G + m * width, p * G + (m + 1) * width)
                inner = sorted((n for n in self.nodes if n.row in rows), key=lambda n: (n.row, n.turn))
                candidates = [Node(rows[0], 0), *inner]  # the root first (its chain's row stands for it)
                draws = torch.randint(len(candidates), (o.nodes,), generator=self._generator(p, m, r)).tolist()
                free = [b for b in rows if b not in used[p]]
                for k, i in enumerate(draws):
                    take = free[k * o.branches : (k + 1) * o.branches]
                    used[p].update(take)
                    plan.setdefault(candidates[i], []).extend(take)
        return list(plan.items())

    def _plan_entropy(self, P: int, used: dict, r: int) -> list[tuple[Node, list[int]]]:
        """ARPO's forks of round ``r``: at each node after a response (turn ≥ 1), in row and turn order, fork
        ``branches`` rows where :func:`~mmgrpo.tree.entropy_branch_decisions` fires, while the prompt has free rows;
        ΔH = the entropy of the node's turn minus that of the row's first own turn."""
        o, G = self.options, self._G
        plan = []
        for p in range(P):
            nodes = sorted(
                (n for n in self.nodes if n.row // G == p and n.turn > self._origin[n.row] and n not in self._seen),
                key=lambda n: (n.row, n.turn),
            )
            self._seen.update(nodes)
            free = [b for b in range(p * G, (p + 1) * G) if b not in used[p]]
            if not nodes or not free:
                continue
            h_now, h_first = self._entropies(nodes)
            u = torch.rand(len(nodes), generator=self._generator(p, r, 1))  # [N]
            fire = entropy_branch_decisions(
                h_now, h_first, u, weight=o.entropy_weight, threshold=o.branch_probability
            ).tolist()
            for node, yes in zip(nodes, fire):
                take = free[: o.branches] if yes else []
                if take:
                    free = free[len(take) :]
                    used[p].update(take)
                    plan.append((node, take))
        return plan

    def _entropies(self, nodes: list[Node]) -> tuple[torch.Tensor, torch.Tensor]:
        """(H of each node's turn, H of its row's first own turn) — :func:`~mmgrpo.tree.turn_entropy`. [N] each."""
        now, first = [], []
        for n in nodes:
            t = self._trajs_all[n.row]
            h = turn_entropy(
                torch.tensor(t.logps), torch.tensor(t.turn), self.settings.max_turns, self.options.entropy_tokens
            )  # [S]
            now.append(h[n.turn])
            first.append(h[self._origin[n.row]])
        return torch.stack(now), torch.stack(first)

    def _fill(self, P: int, used: dict, roots: list) -> None:
        """Rows no fork took become new chains from the root, each its own tree (ARPO's global samples)."""
        G, plan = self._G, []
        for p in range(P):
            free = [b for b in range(p * G, (p + 1) * G) if b not in used[p]]
            for i, b in enumerate(free):
                self._tree[b] = self.options.trees + i
                plan.append((Node(b, 0), [b]))
        if plan:
            self._grow(plan, roots)


def turn_driver(adapter: TokenSampler, settings: RolloutConfig) -> TurnRunner:
    """The multi-turn driver the config asks for: :class:`TreeRunner` with ``rollout.tree``, else the chains'."""
    return TreeRunner(adapter, settings) if settings.tree is not None else TurnRunner(adapter, settings)


__all__ = ["Node", "TreeRunner", "TurnState", "fork", "turn_driver"]
