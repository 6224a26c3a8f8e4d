"""One options convention (issue 35 item 7): every registered component declares a frozen options dataclass, which
config validation builds from ``algorithm.<x>_args`` (unknown keys get "did you mean"); the math function's keyword
parameters and the dataclass agree; the post-advantage steps are one declared pipeline."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
import torch

from mmgrpo import advantage_steps, advantages, credit, losses, options, sampling, schedules, shaping
from mmgrpo.config import AlgorithmConfig, ConfigError
from mmgrpo.loader import load_config
from mmgrpo.registry import Registry

ROOT = Path(__file__).resolve().parents[1]

REGISTRIES = {
    "shaping": (shaping.SHAPERS, 2),  # (registry, positional parameters before the options)
    "token weighting": (shaping.TOKEN_WEIGHTINGS, 2),
    "beta schedule": (schedules.BETA_SCHEDULES, 3),
    "advantage transform": (advantages.ADVANTAGE_TRANSFORMS, 3),
}
LOSS_REGISTRIES = [losses.SURROGATES, losses.AGGREGATIONS, losses.KL_ESTIMATORS]


def _components():
    for label, (reg, skip) in REGISTRIES.items():
        for name in reg.names():
            yield pytest.param(reg, name, skip, id=f"{label}:{name}")


@pytest.mark.parametrize("registry, name, skip", list(_components()))
def test_every_component_declares_options_matching_its_keyword_parameters(registry, name, skip):
    """The dataclass is frozen and its fields are the function's keyword parameters, in order, with the same
    defaults (a parameter added to one and not the other fails here)."""
    cls = registry.options_class(name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    obj = registry.get(name)
    params = list(inspect.signature(obj.__init__ if isinstance(obj, type) else obj).parameters.values())
    params = params[skip + (1 if isinstance(obj, type) else 0) :]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [f.default for f in fields]


@pytest.mark.parametrize("name", sampling.SAMPLERS.names())
def test_every_sampler_takes_its_registered_options_as_one_parameter(name):
    """A sampler class is built with its options dataclass (``build_sampler``), not with the fields spread out: the
    ``options`` parameter after the five positional ones is annotated with the class registered for it."""
    cls = sampling.SAMPLERS.get(name)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params] == ["n_rows", "prompts_per_step", "world", "rank", "seed", "options"]
    options = sampling.SAMPLERS.options_class(name)
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen
    assert typing.get_type_hints(cls.__init__)["options"] in (options, options | None)


@pytest.mark.parametrize("registry", LOSS_REGISTRIES, ids=lambda r: r.kind)
def test_the_losses_options_are_found_the_same_way(registry):
    for name in registry.names():
        assert registry.options_class(name) is losses.options_class(registry.get(name))


def test_a_component_without_declared_options_is_named():
    reg: Registry = Registry("thing")
    reg.add("bare", lambda x, *, k=1: x)
    with pytest.raises(TypeError, match=r"^thing 'bare' declares no options dataclass: register it with options="):
        reg.options_class("bare")


def test_unknown_option_keys_get_did_you_mean():
    with pytest.raises(ConfigError, match=r"unknown field 'algorithm\.shaping_args\.weight'; .*did you mean 'weights'"):
        options.resolve(shaping.SHAPERS, "temporal", {"weight": "inv_dt"}, "algorithm.shaping_args")
    q = ROOT / "configs/quickstart.yaml"
    with pytest.raises(ConfigError, match=r"'algorithm\.sampler_args\.mixture'; .*did you mean 'mixture_ratio'"):
        load_config(q, ["algorithm.sampler=variance", "algorithm.sampler_args={mixture: 0.5}"])
    with pytest.raises(ConfigError, match=r"token_weighting_args\.chunk"):
        load_config(q, ["algorithm.token_weighting=tw_grpo", "algorithm.token_weighting_args={chunk: many}"])
    opts = options.resolve(schedules.BETA_SCHEDULES, "linear", {"beta_start": 1}, "algorithm.beta_schedule_args")
    assert opts == schedules.RampOptions(beta_start=1.0) and options.as_kwargs(opts) == {"beta_start": 1.0}


def test_the_pipeline_is_declared_in_order():
    a = AlgorithmConfig(
        advantage_transform=["negative_groups", "difficulty"],
        advantage_transform_args={"difficulty": {"offset": 1.0}},
        filter_zero_variance=True,
        shaping="temporal",
        shaping_args={"weights": "inv_dt"},
        token_weighting="tw_grpo",
    )
    steps = advantage_steps.build(a)
    assert [(s.kind, s.name) for s in steps] == [
        ("advantage_transform", "negative_groups"),
        ("advantage_transform", "difficulty"),
        ("filter_zero_variance", "zero_variance"),
        ("shaping", "temporal"),
        ("token_weighting", "tw_grpo"),
    ]
    assert steps[1].options == advantages.DifficultyOptions(offset=1.0)
    assert steps[3].options == shaping.TemporalOptions(weights="inv_dt")
    assert [s.kind for s in advantage_steps.build(AlgorithmConfig())] == ["shaping"]  # GRPO: broadcast only


class _Rollout:
    """The fields the steps read."""

    def __init__(self, mask, old_logprobs):
        self.mask, self.old_logprobs = mask, old_logprobs
        self.unit_sigmas = self.unit_values = None


def test_the_pipeline_equals_the_steps_written_out():
    """transform → filter → shaping on a hand-made batch: the values the trainer's former inline code gives."""
    torch.manual_seed(0)
    P, G, T = 3, 2, 4
    rewards = torch.tensor([[1.0, 0.0], [2.0, 2.0], [0.0, 1.0]])  # [P, G]; group 1 has zero variance
    adv = torch.randn(P, G)  # [P, G]
    mask = (torch.rand(P * G, T) > 0.3).float()  # [B, T]
    old = -torch.rand(P * G, T)  # [B, T]
    a = AlgorithmConfig(advantage_transform=["difficulty"], filter_zero_variance=True)
    state = advantage_steps.AdvantageState(adv, rewards, mask.clone(), _Rollout(mask, old), adapter=None)
    advantage_steps.run(advantage_steps.build(a), state)

    seq_lp = ((old * mask).sum(1) / mask.sum(1).clamp_min(1.0)).view(P, G)
    expect = advantages.difficulty_weight(adv, rewards, seq_lp, offset=2.0)  # [P, G]
    keep = torch.tensor([1.0, 0.0, 1.0]).repeat_interleave(G)[:, None]  # [B, 1]
    assert torch.equal(state.mask, mask * keep)
    assert torch.equal(state.unit, expect.reshape(-1, 1) * mask * keep)
    assert state.metrics["advantage/kept_group_fraction"] == pytest.approx(2 / 3)


def test_the_trainer_has_no_branch_per_post_advantage_variant():
    """The trainer reads none of the pipeline's config keys: they are the pipeline's (mmgrpo/advantage_steps.py)."""
    src = (ROOT / "mmgrpo" / "trainer.py").read_text()
    for key in ("advantage_transform", "filter_zero_variance", "a.shaping", "token_weighting"):
        assert key not in src, key


def test_multi_turn_credit_takes_the_shapers_place_in_the_pipeline():
    a = AlgorithmConfig(credit="gigpo", advantage_transform=["difficulty"])
    assert [(s.kind, s.name) for s in advantage_steps.build(a)] == [
        ("advantage_transform", "difficulty"),
        ("credit", "gigpo"),
    ]
    assert advantage_steps.build(a)[1].options == credit.GiGPOOptions()  # algorithm.credit_args, resolved
