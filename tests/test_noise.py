"""Keyed rollout noise (mmgrpo.noise): exact inverse-CDF draws, keys independent of the world size."""

import math

import pytest
import torch

from mmgrpo import noise
from mmgrpo.sampling import PromptSampler


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return noise.draw_by_inversion(probs, u)[0]


def test_inverse_cdf_picks_the_interval_that_holds_u():
    probs = torch.tensor([[0.25, 0.0, 0.5, 0.25]], dtype=torch.float64).expand(6, 4)  # [6, V], exact in binary
    u = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999], dtype=torch.float64)  # [6]
    assert _draw(probs, u).tolist() == [0, 0, 2, 2, 3, 3]  # token 1 (p = 0) never


def test_inverse_cdf_never_returns_a_zero_probability_token_at_the_top():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0]])  # [1, V]
    u = torch.tensor([1.0 - 2.0**-53])  # u · Σp rounds to Σp
    assert _draw(probs, u).tolist() == [1]
    unnormalised = torch.tensor([[2.0, 0.0, 6.0]])  # Σp = 8: u is scaled, not compared with 1
    assert _draw(unnormalised, torch.tensor([0.26])).tolist() == [2]


def test_keyed_draws_follow_the_softmax():
    """Empirical frequencies over 40 000 keys equal softmax(scores) within 4 standard errors per token."""
    scores = torch.tensor([2.0, 0.5, -1.0, 1.0, 0.0, -3.0])  # [V]
    p = scores.softmax(-1)
    keys = noise.NoiseKeys(seed=3, step=7, positions=tuple(range(10_000)), group_size=4)  # B = 40 000 rows
    gens = keys.generators()
    u = noise.uniforms(gens, 1)[:, 0]  # [B]
    tokens = _draw(p.expand(len(gens), -1), u)  # [B]
    freq = torch.bincount(tokens, minlength=6).double() / len(gens)
    se = (p.double() * (1 - p.double()) / len(gens)).sqrt()
    assert ((freq - p.double()).abs() <= 4 * se + 1e-12).all(), (freq, p)
    assert float(u.mean()) == pytest.approx(0.5, abs=4 / math.sqrt(12 * len(gens)))


def test_same_key_same_draw_and_different_keys_differ():
    a = noise.NoiseKeys(0, 5, (10, 11), 3)
    b = noise.NoiseKeys(0, 5, (10, 11), 3)
    ua, ub = noise.uniforms(a.generators(), 4), noise.uniforms(b.generators(), 4)  # [6, 4]
    assert torch.equal(ua, ub)
    assert len(set(a.row_seeds())) == 6  # every (prompt, sample) its own stream
    other_step = noise.uniforms(noise.NoiseKeys(0, 6, (10, 11), 3).generators(), 4)
    other_seed = noise.uniforms(noise.NoiseKeys(1, 5, (10, 11), 3).generators(), 4)
    assert not torch.equal(ua, other_step) and not torch.equal(ua, other_seed)
    shared = noise.normals(a.generators(shared=True), (2, 2))  # [P, 2, 2]: one per prompt, not per sample
    assert shared.shape == (2, 2, 2) and not torch.equal(shared[0], shared[1])


@pytest.mark.parametrize("world", [2, 4])
def test_keys_do_not_depend_on_the_world_size(world):
    """The global batch of a step holds the same positions at any world size, each process a contiguous slice,
    and the rows' draws are those of the one-process run, in the same global order."""
    P_global, G, step = 8, 2, 3
    one = PromptSampler(n_rows=50, prompts_per_step=P_global, world=1, rank=0, seed=0)
    many = [PromptSampler(50, P_global // world, world, r, 0) for r in range(world)]
    assert [i for s in many for i in s.positions(step)] == one.positions(step)
    assert [i for s in many for i in s.indices(step)] == one.indices(step)
    whole = noise.uniforms(noise.NoiseKeys(0, step, tuple(one.positions(step)), G).generators(), 5)  # [B, 5]
    parts = [noise.uniforms(noise.NoiseKeys(0, step, tuple(s.positions(step)), G).generators(), 5) for s in many]
    assert torch.equal(torch.cat(parts), whole)


def test_row_count_check():
    keys = noise.NoiseKeys(0, 0, (0, 1), 4)
    keys.check(8, "here")
    with pytest.raises(ValueError, match="2 prompts × 4 samples = 8 rows, but 6 rows"):
        keys.check(6, "here")


def test_mix_is_a_63_bit_hash():
    values = {noise.mix(0, 0, p, g) for p in range(100) for g in range(-1, 8)}
    assert len(values) == 900 and all(0 <= v < 2**63 for v in values)
    assert noise.mix(1, 2, 3) != noise.mix(3, 2, 1)
