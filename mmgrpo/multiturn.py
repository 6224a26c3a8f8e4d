"""Multi-turn rollouts in the core: their config checks at load, and per-turn credit → per-token advantages.

A token adapter with ``rollout.tools`` (``modalities/tokens/turns.py``) returns trajectories whose ``Rollout`` has
``turn_of_token [B, T]`` (the assistant turn of each generated token, −1 on observation tokens and padding) and these
``extras`` columns, B values each: ``num_turns`` (assistant turns), ``turn_rewards`` and ``turn_invalid`` (one value
per turn: the tool/environment reward after the turn's action, whether its observation was an error), ``anchors``
(one hashable key per turn: the state the turn acted on, :func:`mmgrpo.tools.state_anchor`) and ``tool_calls``.

:func:`unit_advantages` turns them into the per-token advantages ``[B, T]`` the loss takes, by ``algorithm.credit``:

* ``trajectory``: no credit step: the group advantage of the trajectory goes through the configured per-unit
  shaping (unchanged GRPO: every action token of every turn gets it; observation tokens have mask 0);
* the others: the credit function of :data:`mmgrpo.credit.CREDITS` with its resolved ``algorithm.credit_args``, fed
  :func:`turn_inputs` and the outcome reward (the combined reward of the configured reward functions):
  ``gigpo`` (:func:`mmgrpo.credit.gigpo_credit`: the outcome added to the last turn's reward, so R_b = Σ_s r_{b,s}
  as in verl-agent; ``outcome_on_last_turn: false`` leaves it out for a configured reward that already is the
  environment's return, ``env_return``, which would otherwise be counted twice), ``mt_grpo``
  (:func:`mmgrpo.credit.mt_grpo_credit`: r^O = the combined reward, r^T = the summed turn rewards; the first tool
  result = the turn after the first turn whose observation was not an error).

The per-turn advantages ``[B, S]`` reach the tokens through :func:`mmgrpo.credit.turn_to_token_advantages`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mmgrpo import credit, igpo, options, shaping, tree
from mmgrpo.config import ConfigError, TrainConfig, check_kwargs
from mmgrpo.types import Rollout

RETURN_REWARDS = {"env_return"}
"""Rewards that are the environment's return (the summed turn rewards), which gigpo reads from the turns already."""


def check_config(cfg: TrainConfig) -> None:
    """``rollout.tools`` and ``algorithm.credit`` against each other and the rest of the config (one line each)."""
    r, a = cfg.rollout, cfg.algorithm  # rewards that need a multi-turn rollout: checked by mmgrpo.loader
    tree.check_config(cfg)  # rollout.tree and algorithm.credit: tree_grpo
    igpo.check_config(cfg)  # rollout.ground_truth_probe and algorithm.credit: igpo
    _check_credit(cfg)
    if not r.multi_turn:
        return
    if r.max_turns < 2:  # the last turn's call is not run: one turn would never run a tool nor see an observation
        what, why = (
            (f"rollout.environment {r.environment!r}", "the policy acts once and never reads what the game answers")
            if r.environment
            else ("rollout.tools", "no tool call is ever run (a call in the last turn is not)")
        )
        raise ConfigError(
            f"rollout.max_turns: 1 with {what}: a trajectory ends after its first assistant turn, so {why}; set "
            f"rollout.max_turns >= 2 (DeepEyes 5), or remove {what.split(' ')[0]} for single-turn rollouts"
        )
    from mmgrpo.tool_check import check_tools  # the code policy of rewards (rewards/code_policy.py)
    from mmgrpo.tools import ENVIRONMENTS, make_environment, run_tool_call  # deferred: loads the built-ins
    from mmgrpo.tools.env import is_reference

    check_tools(
        r.tools, r.tool_limits
    )  # names known; import paths under the code policy, read in source: nothing imported
    check_kwargs(run_tool_call, r.tool_limits, "rollout.tool_limits", skip=3)
    if r.environment is not None and r.tools:
        raise ConfigError("rollout.tools and rollout.environment: choose one (the environment reads each turn)")
    if r.environment is not None and not is_reference(r.environment):  # references: mmgrpo/env_check.py, preflight
        if r.environment not in ENVIRONMENTS:
            raise ConfigError(
                f"rollout.environment: {r.environment!r} is not one of {', '.join(ENVIRONMENTS.names())}, nor a "
                "reference to your own (module:Class, module:factory(); docs/agents.md#your-own-environment)"
            )
        check_kwargs(ENVIRONMENTS.get(r.environment), r.environment_args, "rollout.environment_args")
        try:  # the values too (e.g. a room too small, an unknown floor): built as the first rollout builds it
            make_environment(r.environment, **r.environment_args)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"rollout.environment_args: {e}") from None
    if r.engine != "native" and cfg.model.adapter not in ("vlm", "video", "audio_llm"):
        raise ConfigError(
            f"rollout.tools / rollout.environment with rollout.engine: vllm is wired for model.adapter: vlm, video "
            f"and audio_llm, not {cfg.model.adapter!r} yet; set rollout.engine: native"
        )
    if a.token_weighting == "tw_grpo":  # (the rollout steps declare their own support: mmgrpo.rollout_steps)
        raise ConfigError(
            "algorithm.token_weighting: tw_grpo is not supported with rollout.tools (multi-turn rollouts) yet; "
            "turn it off"
        )
    if (cfg.model.args or {}).get("min_new_tokens", 0):
        raise ConfigError(
            "model.args.min_new_tokens > 0 with rollout.tools: the EOS ban would apply per turn when sampling but once "
            "per trajectory in the log-probs; set it to 0"
        )


def _check_credit(cfg: TrainConfig) -> None:
    """``algorithm.credit`` against :data:`mmgrpo.credit.CREDITS`, ``credit_args`` against its options dataclass,
    and both against the rollout, the shaping and the rewards (one line each)."""
    r, a = cfg.rollout, cfg.algorithm
    if a.credit not in credit.CREDITS:
        raise ConfigError(
            f"algorithm.credit: {a.credit!r} is not allowed; choose one of: {', '.join(credit.CREDITS.names())}"
        )
    if a.credit != "trajectory" and not r.multi_turn:
        raise ConfigError(
            f"algorithm.credit: {a.credit} assigns credit across turns, but rollouts are single-turn; set "
            "rollout.tools (e.g. [crop]) or rollout.environment, or keep algorithm.credit: trajectory"
        )
    opts = options.resolve(credit.CREDITS, a.credit, a.credit_args, "algorithm.credit_args")
    if a.credit == "trajectory":
        return
    if a.shaping != "none":
        raise ConfigError(
            f"algorithm.shaping: {a.shaping} with algorithm.credit: {a.credit}: the per-turn credit sets the "
            "per-token advantages itself; set algorithm.shaping: none"
        )
    twice = sorted({spec.name for spec in cfg.rewards} & RETURN_REWARDS)
    if isinstance(opts, credit.GiGPOOptions) and opts.outcome_on_last_turn and twice:
        raise ConfigError(
            f"algorithm.credit: {a.credit} with the reward {twice[0]} (the environment's return): {a.credit} adds the "
            f"configured reward to the last turn's reward, so the return would count twice; set "
            f"algorithm.credit_args.outcome_on_last_turn: false (the episode return is then the environment's, as in "
            "verl-agent)"
        )


def tool_specs(names: list[str]) -> list[Any]:
    """``rollout.tools`` for :func:`mmgrpo.tools.load_tools`: registry names as they are, ``package.module:function``
    under the code policy in force (:func:`mmgrpo.tool_check.resolve_tools`: imported and checked for training, a
    placeholder at ``--dry-run`` and in an untrusted demo)."""
    from mmgrpo.tool_check import resolve_tools

    return resolve_tools(names)


def turn_inputs(rollout: Rollout) -> credit.TurnInputs:
    """The per-turn tensors of a multi-turn rollout (module docstring), padded by :func:`mmgrpo.credit.pad_turns`.

    Shape:
        returns turn_mask [B, S], turn_rewards [B, S], invalid [B, S] (S = the most turns of any trajectory),
        anchors (B lists of S_b keys), first_result_turn [B] (−1: no tool result), group [B]
    """
    ex = rollout.extras
    if rollout.turn_of_token is None or "num_turns" not in ex:
        raise ValueError("per-turn credit needs a multi-turn rollout (rollout.tools): no turn_of_token / num_turns")
    turns = [int(n) for n in ex["num_turns"]]
    rewards, mask = credit.pad_turns([row[:n] for row, n in zip(ex["turn_rewards"], turns)])  # [B, S]
    invalid, _ = credit.pad_turns([row[:n] for row, n in zip(ex["turn_invalid"], turns)])  # [B, S]
    first = torch.full((len(turns),), -1, dtype=torch.long)  # [B]
    for b, n in enumerate(turns):
        called = n - 1 if n > 1 else 0  # turns 0..n-2 were answered by an observation (the last turn was not)
        ok = [s for s in range(called) if not ex["turn_invalid"][b][s]]
        if ok:
            first[b] = ok[0] + 1
    trees = torch.tensor(ex["tree"], dtype=torch.long) if "tree" in ex else None  # [B] (tree rollouts)
    probe = credit.pad_turns([r[:n] for r, n in zip(ex["gt_logprobs"], turns)])[0] if "gt_logprobs" in ex else None
    return credit.TurnInputs(mask, rewards, invalid, ex["anchors"], first, rollout.prompt_index.long(), trees, probe)


def unit_advantages(
    name: str, opts: Any, advantages: Tensor, inputs: shaping.ShapingInputs, rollout: Rollout, metrics: dict
) -> Tensor:
    """Per-token advantages ``[B, T]`` of credit function ``name`` of :data:`mmgrpo.credit.CREDITS` with its
    resolved options ``opts`` (module docstring); adds its ``credit/*`` metrics to ``metrics``.

    Shape:
        advantages: [P, G] the group estimator's; inputs.rewards: [P, G] combined rewards (NaN: none applied)
        returns [B, T]
    """
    outcome = torch.nan_to_num(inputs.rewards.float().reshape(-1))  # [B]
    per_turn, mets = credit.CREDITS.get(name)(advantages, outcome, turn_inputs(rollout), opts)  # [B, S]
    metrics.update(mets)
    return credit.turn_to_token_advantages(per_turn, rollout.turn_of_token) * inputs.mask  # [B, T]


def turn_metrics(rollout: Rollout) -> dict[str, float]:
    """``turns/*`` and ``tools/*`` of a multi-turn rollout (empty for a single-turn one): mean assistant turns, tool
    calls run per trajectory, share of trajectories with a call, error observations per trajectory (malformed or
    failed calls, invalid environment actions); with an environment, ``env/error_fraction``: the share of
    trajectories an environment fault ended (it raised, timed out or broke the protocol: ``tools/env_guard.py``)."""
    ex = rollout.extras
    if "num_turns" not in ex:
        return {}
    turns = torch.tensor([float(n) for n in ex["num_turns"]])  # [B]
    calls = torch.tensor([float(n) for n in ex["tool_calls"]])  # [B]
    errors = torch.tensor([float(n) for n in ex["tool_errors"]])  # [B]
    return {
        "turns/mean": float(turns.mean()),
        "tools/calls_mean": float(calls.mean()),
        "tools/call_fraction": float((calls > 0).float().mean()),
        "tools/errors_mean": float(errors.mean()),
        **tree_metrics(ex),
        **({"env/error_fraction": sum(map(float, ex["env_errors"])) / len(turns)} if "env_errors" in ex else {}),
    }


def tree_metrics(ex: dict) -> dict[str, float]:
    """``tree/*`` of a tree rollout (``rollout.tree``; empty for chains): the share of trajectories that branched from
    an inner node, and the turns per trajectory copied from a node rather than sampled (``turns/mean`` minus it =
    the turns the policy sampled per trajectory)."""
    if "branch_of" not in ex:
        return {}
    branched = torch.tensor([float(src >= 0) for src in ex["branch_of"]])  # [B]
    copied = torch.tensor([float(k) for k in ex["branch_turn"]])  # [B]
    return {"tree/branch_fraction": float(branched.mean()), "tree/copied_turns_mean": float(copied.mean())}
