"""Step selectors: which transitions are stochastic and trained, for each GRPO variant."""

import pytest
import torch

from mmgrpo.modalities.flow.steps import (
    STEP_SELECTORS,
    chunk_ids,
    relative_latent_change,
    sample_chunks,
)

T, B, G = 10, 8, 4


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_fraction_prefix():
    plan = STEP_SELECTORS.get("fraction")(T, B, G, generator=gen(), fraction=0.99)
    assert plan.sde.all()
    assert plan.train[:, :9].all() and not plan.train[:, 9].any()  # 9 of 10, the last step skipped
    half = STEP_SELECTORS.get("fraction")(T, B, G, generator=gen(), fraction=0.5)
    assert half.train.sum(1).tolist() == [5] * B and half.train[:, :5].all()


def test_random_subset_per_sample():
    plan = STEP_SELECTORS.get("random_subset")(T, B, G, generator=gen(), fraction=0.6)
    assert plan.sde.all()
    assert plan.train.sum(1).tolist() == [5] * B  # floor(0.6 * 9), last step excluded
    assert not plan.train[:, -1].any()
    assert len({tuple(r.tolist()) for r in plan.train}) > 1  # samples differ


def test_sde_window_inside_range():
    for seed in range(20):
        plan = STEP_SELECTORS.get("sde_window")(T, B, G, generator=gen(seed), window=3, low=0, high=5)
        cols = plan.sde[0].nonzero().flatten().tolist()
        assert len(cols) == 3 and cols == list(range(cols[0], cols[0] + 3)) and 0 <= cols[0] <= 2
        assert torch.equal(plan.sde, plan.train) and (plan.sde == plan.sde[0]).all()
    full = STEP_SELECTORS.get("sde_window")(T, B, G, generator=gen(), window=0)
    assert full.sde[0].tolist() == [True] * 9 + [False]
    with pytest.raises(ValueError):
        STEP_SELECTORS.get("sde_window")(T, B, G, generator=gen(), window=6, high=5)


def test_sliding_window_progressive_and_roll_back():
    sel = STEP_SELECTORS.get("sliding_window")
    starts = []
    for it in range(0, 16 * 5, 5):
        plan = sel(T, B, G, generator=gen(), iteration=it, window=4, stride=1, every=5, roll_back=True)
        starts.append(int(plan.sde[0].float().argmax()))
        assert plan.sde[0].sum() == 4 and not plan.sde[0, -1]  # never the last transition
    assert starts == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3]
    stay = sel(T, B, G, generator=gen(), iteration=100, window=4, every=1, roll_back=False)
    assert int(stay.sde[0].float().argmax()) == 5


def test_branching_one_step_per_group_shared_noise():
    plan = STEP_SELECTORS.get("branching")(T, B, G, generator=gen(3))
    assert plan.shared_noise
    assert plan.sde.sum(1).tolist() == [1] * B and torch.equal(plan.sde, plan.train)
    k = plan.sde.float().argmax(1).view(B // G, G)
    assert (k == k[:, :1]).all() and (k < T - 1).all()  # one branch step per group, never the last step


def test_chunk_ids_and_latent_change():
    assert chunk_ids([2, 3, 5], 10).tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 2, 2]
    with pytest.raises(ValueError):
        chunk_ids([2, 3], 10)
    lat = torch.tensor([[1.0, -2.0], [2.0, -2.0], [2.0, 0.0]]).view(1, 3, 2)  # [B=1, T+1=3, D=2]
    torch.testing.assert_close(relative_latent_change(lat), torch.tensor([[1 / 3, 2 / 4]]))


def test_weighted_chunk_sampling_prefers_large_change():
    """Chunk 0 changes the latents 100x more than chunk 1: with normalised weights it is drawn ~99% of the time."""
    steps = torch.cat([torch.full((3,), 1.0), torch.full((3,), 0.01)])  # per-step relative change
    x = [torch.ones(64, 4)]
    for r in steps:
        x.append(x[-1] * (1 + r))
    lat = torch.stack(x, 1)  # [64, 7, 4]
    train = sample_chunks(lat, [3, 3], fraction=0.5, weighting="latent_change", exclude_last=False, generator=gen())
    first = train[:, 0].float().mean()
    assert train.sum(1).tolist() == [3] * 64 and first > 0.9
    uniform = sample_chunks(lat, [3, 3], fraction=0.5, weighting="uniform", exclude_last=True, generator=gen())
    assert 0.2 < uniform[:, 0].float().mean() < 0.8 and not uniform[:, -1].any()


def test_chunks_selector_post_rule():
    plan = STEP_SELECTORS.get("chunks")(T, B, G, generator=gen(), chunk_sizes=[2, 3, 5], fraction=0.5)
    assert plan.post is not None and plan.sde.all()
    train = plan.post(torch.randn(B, T + 1, 2), gen())
    assert train.shape == (B, T)
    full = STEP_SELECTORS.get("chunks")(T, B, G, generator=gen(), chunk_sizes=[2, 3, 5])
    assert full.post is None and full.train[:, :9].all() and not full.train[:, 9].any()
