"""The shared decode loop's stop check (modalities/tokens/decode.py): checking every k steps (CUDA's setting, so the
host does not wait for the device each token) gives the same tokens and log-probs as checking every step, runs at
most k - 1 steps past the last EOS, and still stops before the length cap."""

import pytest
import torch

from mmgrpo.modalities.tokens import decode as decode_lib
from mmgrpo.modalities.tokens.decode import SamplingSpec, decode

V, EOS, PAD = 6, 0, 5


class EndsAtRow:
    """A stepper whose row b puts all its mass on token 1 + (step mod 3) until step ``ends[b]``, then on EOS: the
    decode loop's contract (prefill, scores, step) with logits known by hand."""

    def __init__(self, ends: list[int]):
        self.ends, self.steps = torch.tensor(ends), 0

    def _logits(self, t: int) -> torch.Tensor:
        logits = torch.full((len(self.ends), V), -30.0)
        logits[:, 1 + t % 3] = 0.0
        logits[self.ends <= t, :] = -30.0
        logits[self.ends <= t, EOS] = 0.0
        return logits  # [B, V]

    def prefill(self, group_size: int) -> torch.Tensor:
        return self._logits(0)

    def scores(self, logits, step, spec):
        return decode_lib.sampling_scores(logits, step, spec)

    def step(self, tokens, step):
        self.steps += 1
        return self._logits(step + 1)


@pytest.mark.parametrize("every", [1, 3, 8])
def test_checking_every_k_steps_keeps_the_output_and_bounds_the_extra_steps(monkeypatch, every):
    ends, T = [2, 4, 1, 5], 12  # the last row ends at step 5: its EOS is token 5
    spec = SamplingSpec(max_new_tokens=T, eos_ids=[EOS], pad_id=PAD, greedy=True)
    reference = EndsAtRow(ends)
    ids_1, logp_1 = decode(reference, 1, spec)
    monkeypatch.setitem(decode_lib.STOP_CHECK_EVERY, "cpu", every)
    stepper = EndsAtRow(ends)
    ids_k, logp_k = decode(stepper, 1, spec)
    assert torch.equal(ids_k, ids_1) and torch.equal(logp_k, logp_1)
    expected = torch.full((4, T), PAD)
    for b, end in enumerate(ends):
        expected[b, :end] = torch.tensor([1 + t % 3 for t in range(end)])
        expected[b, end] = EOS
    assert torch.equal(ids_1, expected)
    assert reference.steps == max(ends)  # checked every step: it stops right after the last EOS
    assert max(ends) <= stepper.steps <= max(ends) + every - 1 and stepper.steps < T - 1
    assert stepper.steps == -(-(max(ends) + 1) // every) * every - 1  # the first check after the last EOS


def test_cuda_checks_every_eight_steps_and_the_cpu_every_step():
    assert decode_lib.STOP_CHECK_EVERY == {"cuda": 8}
    assert decode_lib.STOP_CHECK_EVERY.get("cpu", 1) == 1
