"""World-size invariance: 1 process × P prompts and 2 processes × P/2 prompts sample the same rollouts and take
the same first update (``rollout_noise: keyed``; docs/architecture.md, "World-size invariance").

The fast tests split one batch of prompts in two inside one process (the adapters' part of the contract); the
slow tests launch ``tests/world_size_worker.py`` once alone and once as 2 gloo processes and compare the
rollouts of every global sample and the parameters after one step.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmgrpo import noise
from tests.adapter_cases import CASES, build
from tests.numerics import (
    Reductions,
    adapter_reductions,
    assert_one_adamw_step_apart,
    model_reductions,
    weight_deltas,
)

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests/world_size_worker.py"


@pytest.mark.parametrize(
    "name,over",
    [*((n, {}) for n in CASES), ("video", {"temporal_contrast": {"enabled": True, "num_shuffled": 2}})],
    ids=[*CASES, "video_tgrpo"],
)
def test_keyed_rollout_of_a_prompt_does_not_depend_on_its_batch(name, over, mmgrpo_cache):
    """Every family of the contract table (tests/adapter_cases.py): the rollout of prompts 0 and 1 together draws
    what the rollouts of prompt 0 and of prompt 1 draw apart, as a 2-process run splits them; the old log-probs agree
    to float rounding. T-GRPO's shuffled-frame rollouts are keyed too."""
    case = CASES[name]
    adapter = build(name, lora=False, **case.batch_invariant, **over)
    rows, G = case.rows(), 2
    whole = adapter.rollout(rows, G, noise.NoiseKeys(0, 2, (0, 1), G))
    parts = [adapter.rollout(rows[p : p + 1], G, noise.NoiseKeys(0, 2, (p,), G)) for p in (0, 1)]
    drawn = torch.cat([getattr(p.state, case.drawn) for p in parts])
    budget = adapter_reductions(adapter)
    if drawn.is_floating_point():  # flow latents: each step's denoiser output, batched in another shape
        steps = Reductions(budget.terms, budget.depth * case.args["num_steps"])  # each step carries the last's rounding
        steps.assert_close(getattr(whole.state, case.drawn), drawn, scale=max(1.0, float(drawn.abs().max())))
    else:  # token ids: the keyed draws themselves, equal by construction
        assert torch.equal(getattr(whole.state, case.drawn), drawn)
    old = torch.cat([p.old_logprobs for p in parts])  # [B, T]
    budget.assert_logprobs_close(whole.old_logprobs, old)  # batched in another shape
    assert torch.equal(whole.mask, torch.cat([p.mask for p in parts]))
    if over:
        assert whole.extras["shuffled_completions"] == [s for p in parts for s in p.extras["shuffled_completions"]]
    other_step = adapter.rollout(rows, G, noise.NoiseKeys(0, 3, (0, 1), G))  # another step: other draws
    assert not torch.equal(getattr(other_step.state, case.drawn), getattr(whole.state, case.drawn))
    with pytest.raises(ValueError, match="rows"):
        adapter.rollout(rows, G, noise.NoiseKeys(0, 2, (0,), G))  # keys made for other prompts


# ------------------------------------------------------------------------------------------ 1 vs 2 processes

VLM = [
    "configs/quickstart.yaml",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=4",  # several minibatches per update: gradient accumulation with global weights
    "model.args.max_new_tokens=5",
    "task.args.train_size=32",
    "warmup.steps=0",
    "optim.warmup_steps=0",
    "rewards=[{name: 'ws_rewards:distinct_chars'}]",  # varies within groups: a real gradient
    "algorithm.filter_zero_variance=true",  # the reward is constant on the 'blue' group (prompt 0, on process 0)
]
FLOW = [
    "configs/flow_grpo.yaml",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=4",
    "algorithm.updates_per_epoch=1",  # one update per step (see the docs: update splits are per process)
    "model.args.num_steps=4",
    "model.args.encode_batch_size=1",
    "model.args.decode_batch_size=1",
]
QUIET = [
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "logging.trackers=[]",
    "logging.progress=false",
    "logging.plot=false",
    "checkpoint.save_final=false",
]
REWARD = '''
def distinct_chars(completions, answer, **kwargs):
    """A tenth of the number of distinct characters of each completion; 0 for the rows whose answer is blue."""
    return [0.0 if a == "blue" else len(set(c)) / 10.0 for c, a in zip(completions, answer)]
'''


def _launch(tmp_path: Path, out: Path, config: list[str], world: int, prompts: int, env: dict | None = None) -> None:
    cmd = [str(WORKER), config[0], str(out), *config[1:], *QUIET, f"algorithm.prompts_per_step={prompts}"]
    if world == 1:
        cmd = [sys.executable, *cmd]
    else:
        accelerate = Path(sys.executable).parent / "accelerate"
        launch = [str(accelerate), "launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml")]
        # any free rendezvous port, not 29500: launches on two test workers at once
        cmd = [*launch, "--main_process_port", "0", *cmd]
    pythonpath = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", PYTHONPATH=pythonpath, **(env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def vlm_budget() -> Reductions:
    """The rounding budget of one VLM step: the rollout's forward, the training forward and its backward."""
    from transformers import AutoConfig

    from mmgrpo.modalities.vlm.tiny import resolve_model_path

    forward = model_reductions(AutoConfig.from_pretrained(resolve_model_path("tiny-qwen2.5-vl")))
    return Reductions(forward.terms, 4 * forward.depth)


def flow_budget(steps: int = 4) -> Reductions:
    """The rounding budget of one flow step: ``steps`` denoiser forwards in the rollout (each transition carries the
    last one's rounding), the training forward and its backward."""
    from mmgrpo.modalities.flow.tiny import resolve_pipeline

    forward = model_reductions(resolve_pipeline("tiny-sd3-flow-shapes").transformer)
    return Reductions(forward.terms, (steps + 3) * forward.depth)


LR = 1e-3  # optim.lr of configs/quickstart.yaml and configs/flow_grpo.yaml; no LR warm-up in these runs


def compare_world_sizes(
    tmp_path: Path, config: list[str], budget: Reductions, P: int = 4, env: dict | None = None
) -> dict[str, float]:
    """Run one step as 1 × P and 2 × P/2 prompts; check the rollouts per global sample; max |Δ| of each field (and
    ``scale/<field>``, its largest |value|, at least 1). The
    step's metrics (reductions over all samples, gathered in another order) agree within ``budget`` on a scale of
    at least 1 (rewards and advantages are of order one)."""
    (tmp_path / "ws_rewards.py").write_text(REWARD)
    one, two = tmp_path / "one", tmp_path / "two"
    _launch(tmp_path, one, config, world=1, prompts=P, env=env)
    _launch(tmp_path, two, config, world=2, prompts=P // 2, env=env)
    a = torch.load(one / "rank0.pt", weights_only=False)
    b = [torch.load(two / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert a["world"] == 1 and [r["world"] for r in b] == [2, 2] and [r["rank"] for r in b] == [0, 1]
    assert b[0]["positions"] + b[1]["positions"] == a["positions"] == list(range(P))
    assert a["outputs"] == b[0]["outputs"] + b[1]["outputs"]
    deltas = {}
    for key in ("completion_ids", "latents", "old_logprobs", "mask", "scores"):
        if a[key] is not None:
            joined = torch.cat([r[key] for r in b])  # rank 0's samples, then rank 1's: the global order
            assert joined.shape == a[key].shape, key
            deltas[key] = float((a[key].double() - joined.double()).abs().max())
            finite = a[key][torch.isfinite(a[key])] if a[key].is_floating_point() else a[key]
            deltas[f"scale/{key}"] = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    pa, pb = torch.load(one / "params.pt"), torch.load(two / "params.pt")
    assert pa.keys() == pb.keys() and len(pa) > 0
    deltas.update(weight_deltas(pa, pb))
    ma, mb = json.loads((one / "metrics.json").read_text()), json.loads((two / "metrics.json").read_text())
    for key in ("reward/mean", "reward/std", "advantage/abs_mean", "optim/grad_norm", "completion/units_mean"):
        assert abs(mb[key] - ma[key]) <= budget.tol(max(1.0, abs(ma[key]))), (key, ma[key], mb[key])
    assert ma["optim/grad_norm"] > 0
    print("max |Δ|:", json.dumps(deltas))
    return deltas


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_sum_const_norm"])
def test_vlm_one_step_is_the_same_on_one_and_two_processes(aggregation, tmp_path, mmgrpo_cache):
    """Process 0's first group is filtered out (zero reward variance), so the processes train on different unit
    counts: the update equals the 1-process one only if the loss is normalised by the global count."""
    budget = vlm_budget()
    d = compare_world_sizes(tmp_path, [*VLM, f"algorithm.aggregation={aggregation}"], budget)
    scores = [torch.load(tmp_path / "two" / f"rank{r}.pt", weights_only=False)["scores"][:, 0] for r in (0, 1)]
    assert float(scores[0][:4].std()) == 0 and all(float(s[4:].std()) > 0 for s in scores)
    assert float(scores[1][:4].std()) > 0  # rank 1 keeps both groups: uneven trained units
    assert d["completion_ids"] == 0 and d["mask"] == 0 and d["scores"] == 0
    assert d["old_logprobs"] <= budget.tol(d["scale/old_logprobs"])
    assert_one_adamw_step_apart(d, budget, LR)


@pytest.mark.slow
def test_vlm_late_tied_gradient_is_the_same_on_one_and_two_processes(tmp_path, mmgrpo_cache):
    """The tiny VLM's tied head with its weight gradient made at the end of the backward (``TiedGrad``; the size
    threshold set to 0, as a 151,936-row head is): DDP's reduction sees that gradient, and one step on two processes
    equals one step on one, which equals one step with the gradient made in the head's backward."""
    budget = vlm_budget()
    d = compare_world_sizes(tmp_path, VLM, budget, env={"WS_LATE_GRADIENT_MIN_BYTES": "0"})
    assert d["completion_ids"] == 0 and d["old_logprobs"] <= budget.tol(d["scale/old_logprobs"])
    assert_one_adamw_step_apart(d, budget, LR)
    at_once = tmp_path / "at_once"
    _launch(tmp_path, at_once, VLM, world=1, prompts=4, env={"WS_LATE_GRADIENT_MIN_BYTES": str(2**40)})
    late, now = torch.load(tmp_path / "one" / "params.pt"), torch.load(at_once / "params.pt")
    assert_one_adamw_step_apart(weight_deltas(late, now), budget, LR)  # the head's gradient summed in another order
    deferred = [torch.load(d / f"rank{r}.pt", weights_only=False)["late_heads"] for d, r in ((tmp_path / "one", 0),
                (tmp_path / "two", 0), (tmp_path / "two", 1), (at_once, 0))]  # fmt: skip
    assert all(n > 0 for n in deferred[:3]) and deferred[3] == 0, deferred  # the late branch ran, and only there


@pytest.mark.slow
def test_flow_one_step_is_the_same_on_one_and_two_processes(tmp_path, mmgrpo_cache):
    budget = flow_budget(steps=4)  # FLOW's model.args.num_steps
    d = compare_world_sizes(tmp_path, FLOW, budget)
    assert d["mask"] == 0 and d["latents"] <= budget.tol(d["scale/latents"])
    assert d["scores"] <= budget.tol(d["scale/scores"])
    assert d["old_logprobs"] <= budget.tol(d["scale/old_logprobs"])
    assert_one_adamw_step_apart(d, budget, LR)
