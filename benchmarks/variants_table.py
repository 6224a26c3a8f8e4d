"""Held-out effect of the GRPO variants (docs/variants.md), 3 seeds each, next to the GRPO default of the same task.

    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study quickstart --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study reg_grpo --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study tempsamp --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study published --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study gcpo --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study otc --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study step_grpo --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study thought_dropout --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study multichoice --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study tree --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study gui --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study scaffold --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study knapsack --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study replay --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study igpo --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study tas --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study llds --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study calibration --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study cppo --seeds 0 1 2 --out runs/variants
    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study entropy --seeds 0 1 2 --out runs/variants

Each row is one shipped config trained with ``mmgrpo train`` in its own process (seed and output directory set by
override, everything else as shipped), so a variant differs from its default only in the keys its config changes.
Studies:

- ``quickstart``: ``configs/quickstart.yaml`` (GRPO) vs ``configs/variant_variance_sampling.yaml`` (MMR1
  variance-aware sampling; the same task, model and hyper-parameters). Reported: held-out accuracy at every
  evaluation, and the mean over training steps of ``advantage/zero_std_fraction`` (groups without signal), the
  quantity the sampler is meant to lower.
- ``reg_grpo`` (video_motion, direction, 200 steps): ``configs/video_motion.yaml`` (GRPO, k3 KL β = 0.05) vs
  ``configs/variant_reg_grpo.yaml`` (Reg-GRPO as shipped: β = 0, ρ the token sum), the same with the default's KL
  term, the same with the length-normalised ρ (``reduction: mean``, the reading of the earlier measurement), and
  ``configs/variant_deepvideo_r1.yaml`` (Reg-GRPO + difficulty-aware augmentation); also TW-GRPO
  (``configs/variant_tw_grpo.yaml``, β = 0) next to the default without its KL term (``grpo_nokl``, β = 0), the
  baseline that differs from it only in the token weighting.
- ``published`` (the quickstart, 300 steps): ``configs/quickstart.yaml`` (GRPO) vs ``configs/variant_dynamic_kl.yaml``
  (GRPO-D, OThink-MR1 eq. 3), ``configs/variant_advantage_transforms.yaml`` (LENS + DGRPO's weight),
  ``configs/variant_dynamic_sampling.yaml`` (DAPO dynamic sampling) and ``configs/variant_self_consistency.yaml``
  (label-free: the self-consistency reward replaces the accuracy reward; held-out accuracy is still the task's).
- ``tempsamp`` (video_motion, "when" grounding, held-out temporal IoU, 200 steps): ``configs/variant_tempsamp.yaml``
  without injection and with the plain ``temporal_iou`` reward (GRPO), with the soft shaping only, and as shipped
  (shaping + ground-truth injection).
- ``gcpo`` (the same video_motion "when" task, plain ``temporal_iou`` + format, 200 steps):
  ``configs/variant_gcpo.yaml`` without a rollout step (GRPO), with ``algorithm.gt_injection`` (the span in every
  group, TempSamp-R1) and as shipped (GCPO: the span only in groups whose every IoU is <= 0.5).
- ``otc`` (the tool tasks, cut to a few minutes a run: 150 / 300 warm-up steps, 10 GRPO steps of 4 prompts × 8, 50
  held-out rows): ``configs/zoom_tools.yaml`` and ``configs/video_tools.yaml`` with the plain ``accuracy`` reward and
  with OTC-GRPO's ``otc`` (``configs/variant_otc.yaml`` is the zoom one). Also reported: ``tool_call_rate`` (tool calls
  per answer: at most one call here, ``rollout.max_turns: 2``) after the warm-up and after GRPO.
- ``step_grpo`` (the arithmetic task's two-change chains with R1-VL's ``### Step n:`` warm-up, 200 steps):
  ``configs/variant_step_grpo.yaml`` with the accuracy reward alone (``step_rar`` with ``step_weight: 0``: the final
  answer only, parsed as StepRAR parses it), with StepRAR alone, and as shipped (StepRAR + StepRVR, R1-VL's sum).
- ``thought_dropout`` (the same chains with ``<think>`` warm-up targets, 200 steps):
  ``configs/variant_thought_dropout.yaml`` with ``warmup.thought_dropout: 0`` and as shipped (0.5, TON). Also
  reported: the held-out reply length in characters and the share of replies with a non-empty think block (greedy),
  and the sampled completion length in tokens over the last 50 training steps. And
  CrowdVLM-R1's fuzzy count reward (``count_fuzzy``: partial credit for an answer within 50 % of the number) in
  place of the accuracy reward, next to ``no_dropout`` (the same config with the exact accuracy reward).
- ``multichoice`` (the shapes task's multi-answer ``colours`` question, held-out exact-set accuracy):
  ``configs/variant_multichoice.yaml`` with the exact-match ``accuracy`` reward and as shipped (TW-GRPO's
  ``multiple_choice_partial``). Also reported: the held-out mean partial reward at the warm-up and after training.
- ``scaffold`` (the real SmolLM2-135M-Instruct on one-step arithmetic word problems,
  ``configs/real_smollm2_arithmetic.yaml`` cut to fit a shared 2-core CPU: 6 steps of 2 prompts × G = 4, 50 held-out
  problems): GRPO vs Scaf-GRPO's hint
  scaffolding (``algorithm.rollout_steps: {scaffold: {exemption_steps: 1}}``, ``task.args.hints: true``;
  mmgrpo/scaffold.py). Needs ``bash scripts/setup_real_models.sh smollm2-135m-instruct``.

- ``replay`` (the quickstart cut to 30 steps and 256 training rows, so that a row returns every 8 steps, 100
  held-out rows): GRPO vs RePO/AVATAR replay (``configs/variant_replay.yaml``: 4 past completions per group of 8,
  reward-diverse, clipped ratio against the sampling policy; mmgrpo/replay.py).

- ``knapsack`` (the quickstart cut to 30 steps and 128 training rows, so that a row returns every 4 steps and its
  success rate is known from step 5 on, 100 held-out rows): GRPO vs Knapsack RL's per-prompt budgets
  (``configs/variant_knapsack.yaml``: Σ N_i = 32·8 per step, 2 ≤ N_i ≤ 32; mmgrpo/budgets.py).

- ``gui`` (the synthetic phone app, Mobile-R1's setting, held-out task success): ``configs/gui_grpo.yaml`` (GRPO,
  trajectory credit) vs ``configs/gui_gigpo.yaml`` (GiGPO), the GiGPO run starting from the GRPO run's warm-up of the
  same seed (its saved step 0); as shipped (150 warm-up steps, 30 RL steps, 50 held-out episodes evaluated every 10
  steps), the untrained policy not evaluated (it completes none). An override's ``<base>`` and ``<seed>`` are
  replaced by the study's output folder and the run's seed.

- ``tree`` (the grid world cut to a 100-step warm-up of 16 and 8 RL steps of 8 levels × 8, 30 held-out rows):
  GRPO (``configs/gridworld_grpo.yaml``, which saves its warm-up as step 0) vs Tree-GRPO
  (``configs/variant_tree_grpo.yaml``: tree rollouts + tree credit), GiGPO (``configs/gridworld_gigpo.yaml``) and
  ARPO's entropy forks (``configs/variant_arpo.yaml``), each from the GRPO run's step 0 of its seed.

- ``igpo`` (the zoom tool task, held-out accuracy on 100 rows): one shared warm-up (``configs/zoom_tools.yaml``'s,
  200 steps of 32, trained once with seed 0 and saved as step 0: the study's ``once`` run), then per seed 40 RL
  steps of 4 prompts × G = 8 from it: GRPO (``configs/zoom_tools.yaml``, trajectory credit) vs IGPO
  (``configs/variant_igpo.yaml``: the ground-truth probe + ``algorithm.credit: igpo``; mmgrpo/igpo.py), and IGPO
  with the gains and outcomes normalised apart (``normalization: separate``). Also reported: the held-out
  crop_hits_box and tool_call_rate.
- ``cppo`` (the quickstart cut to 60 steps of its 300, evaluations every 30 steps on 100 held-out rows):
  ``configs/quickstart.yaml`` (GRPO) vs ``configs/variant_cppo.yaml`` (CPPO, pruning rate 0.5 with allocation: 64
  prompts rolled out per step, the 256 samples of largest |advantage| trained) and the same without allocation (32
  prompts, 128 samples trained). Also reported: the mean over steps of each ``perf`` metric (step, rollout and update
  seconds, the pruning's estimated saving) and of ``cppo/kept_fraction``.

- ``calibration`` (the quickstart cut to 80 steps, 100 held-out rows, evaluated after the warm-up, at step 40 and
  after training; issue 51): GRPO (``configs/quickstart.yaml``) vs NGRPO (``configs/variant_ngrpo.yaml``: the
  virtual max-reward sample + asymmetric clipping), SEED-GRPO (``configs/variant_seed_grpo.yaml``) and the
  unlikeliness reward (``configs/variant_unlikeliness.yaml``). Also reported: held-out pass@1/4/16 of 16 sampled
  completions per row (``eval.pass_k``), after the warm-up and after training.

- ``tas`` (video_motion, direction, 200 steps as the ``reg_grpo`` study; the configs ship 400): GRPO
  (``configs/video_motion.yaml``) vs AVATAR's Temporal Advantage Shaping (``configs/variant_tas.yaml``: the same with
  ``algorithm.shaping: tas``, α = 0.5; mmgrpo/tas.py).

- ``llds`` (the zoom tool task, held-out accuracy on 100 rows): one shared warm-up as the ``igpo`` study's (200 steps
  of 32, seed 0), then per seed 30 RL steps of 4 prompts × G = 8, two updates per step: GRPO
  (``configs/variant_llds.yaml`` with ``coef: 0``: the same updates, the displacement logged, the loss unchanged) vs
  LLDS (as shipped: λ = 0.2, action-level gate; mmgrpo/llds.py). Also reported: held-out crop_hits_box and
  tool_call_rate, and the per-step means (``perf``) of ``llds/displacement`` (mean log π_θ − log π_old over tokens),
  ``llds/fell_fraction`` and ``loss/llds``.
- ``entropy`` (the quickstart cut to 60 steps of its 300, evaluations every 30 steps on 100 held-out rows):
  ``configs/quickstart.yaml`` (GRPO, with the ``entropy_bonus`` term at coef 0 so that it logs ``entropy/mean``) vs
  ``configs/variant_entropy_bonus.yaml`` (the entropy bonus, coef 0.01; also at coef 0.1) and
  ``configs/variant_aepo.yaml`` (AEPO, target entropy 0.5; mmgrpo/entropy_control.py). Also reported: the mean
  over steps of ``entropy/mean``, ``aepo/temperature``, ``aepo/reinforce_samples`` and ``perf/step_s``; the per-step
  entropy is in each run's ``metrics.jsonl``.

Writes ``<out>/<study>/results.json`` and ``table.md`` (one row per run plus a mean row per config), and prints the
table. Runs that already have a ``summary.json`` are reused (``--fresh`` retrains them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FROM_GRPO_STEP0 = [
    "model.args.name_or_path=<base>/grpo_seed<seed>/checkpoints/step-000000/model",
    "warmup.steps=0",
    "checkpoint.after_warmup=false",
]
"""Overrides that start a run from the GRPO run's warm-up of the same seed (its step 0), as docs/agents.md does."""


SHARED_WARMUP = [
    "steps=1",
    "warmup.steps=200",
    "checkpoint.after_warmup=true",
    "eval.before=false",
    "eval.after=false",
    "task.args.eval_size=100",
    "checkpoint.save_final=false",
]
"""Overrides of a study's one shared warm-up run (seed 0): 200 warm-up steps saved as step 0, every arm starts there."""

STUDIES: dict[str, dict] = {
    "quickstart": {
        "metric": "accuracy",
        "runs": {
            "grpo": ("configs/quickstart.yaml", []),
            "variance_sampling": ("configs/variant_variance_sampling.yaml", []),
        },
    },
    "reg_grpo": {
        "metric": "accuracy",
        "runs": {
            "grpo": ("configs/video_motion.yaml", []),
            "reg_grpo": ("configs/variant_reg_grpo.yaml", []),
            "reg_grpo_kl": ("configs/variant_reg_grpo.yaml", ["algorithm.beta=0.05", "algorithm.kl=k3"]),
            "reg_grpo_mean": ("configs/variant_reg_grpo.yaml", ["algorithm.surrogate_args.reduction=mean"]),
            "deepvideo_r1": ("configs/variant_deepvideo_r1.yaml", []),
            "grpo_nokl": ("configs/video_motion.yaml", ["algorithm.beta=0.0"]),
            "tw_grpo": ("configs/variant_tw_grpo.yaml", []),
        },
        "overrides": ["steps=200", "eval.every=50"],
    },
    "published": {
        "metric": "accuracy",
        "runs": {
            "grpo": ("configs/quickstart.yaml", []),
            "dynamic_kl": ("configs/variant_dynamic_kl.yaml", []),
            "advantage_transforms": ("configs/variant_advantage_transforms.yaml", []),
            "dynamic_sampling": ("configs/variant_dynamic_sampling.yaml", []),
            "self_consistency": ("configs/variant_self_consistency.yaml", []),
        },
    },
    "tempsamp": {
        "metric": "temporal_iou",
        "runs": {
            "grpo": (
                "configs/variant_tempsamp.yaml",
                [
                    "algorithm.gt_injection.enabled=false",
                    "rewards=[{name: temporal_iou, weight: 1.0}, {name: format, weight: 0.1, kwargs: {think: false}}]",
                ],
            ),
            "soft_shaping": ("configs/variant_tempsamp.yaml", ["algorithm.gt_injection.enabled=false"]),
            "tempsamp": ("configs/variant_tempsamp.yaml", []),
        },
        "overrides": ["steps=200", "eval.every=50"],
    },
    "gcpo": {
        "metric": "temporal_iou",
        "runs": {
            "grpo": ("configs/variant_gcpo.yaml", ["algorithm.rollout_steps={}"]),
            "gt_injection": (
                "configs/variant_gcpo.yaml",
                [
                    "algorithm.rollout_steps={}",
                    "algorithm.gt_injection.enabled=true",
                    "algorithm.gt_injection.template=<answer>{answer[0]:g} to {answer[1]:g}</answer>",
                ],
            ),
            "gcpo": ("configs/variant_gcpo.yaml", []),
        },
        "overrides": ["steps=200", "eval.every=50"],
    },
    "otc": {
        "metric": "accuracy",
        "extra": ["tool_call_rate"],
        "runs": {
            "zoom_accuracy": ("configs/zoom_tools.yaml", ["rewards=[{name: accuracy}]", "warmup.steps=150"]),
            "zoom_otc": ("configs/variant_otc.yaml", ["warmup.steps=150"]),
            "video_accuracy": ("configs/video_tools.yaml", ["rewards=[{name: accuracy}]", "warmup.steps=300"]),
            "video_otc": (
                "configs/video_tools.yaml",
                ["rewards=[{name: otc}, {name: accuracy, weight: 0.0}]", "warmup.steps=300"],
            ),
        },
        "overrides": [
            "steps=10",
            "algorithm.prompts_per_step=4",
            "algorithm.minibatch_size=32",
            "eval.before=false",
            "eval.max_rows=50",
        ],
    },
    "step_grpo": {
        "metric": "accuracy",
        "runs": {
            "grpo": (
                "configs/variant_step_grpo.yaml",
                ["rewards=[{name: step_rar, weight: 1.0, kwargs: {step_weight: 0.0}}]"],
            ),
            "step_rar": ("configs/variant_step_grpo.yaml", ["rewards=[{name: step_rar, weight: 1.0}]"]),
            "step_grpo": ("configs/variant_step_grpo.yaml", []),
        },
    },
    "thought_dropout": {
        "metric": "accuracy",
        "extra": ["reply_chars", "thought_share"],
        "runs": {
            "no_dropout": ("configs/variant_thought_dropout.yaml", ["warmup.thought_dropout=0.0"]),
            "thought_dropout": ("configs/variant_thought_dropout.yaml", []),
            "count_fuzzy": (
                "configs/variant_thought_dropout.yaml",
                [
                    "warmup.thought_dropout=0.0",
                    "rewards=[{name: count_fuzzy, weight: 1.0}, {name: format, weight: 0.2, kwargs: {think: true}}]",
                ],
            ),
        },
    },
    "tree": {
        "metric": "success_rate",
        "runs": {
            "grpo": ("configs/gridworld_grpo.yaml", []),
            "tree_grpo": ("configs/variant_tree_grpo.yaml", FROM_GRPO_STEP0),
            "gigpo": ("configs/gridworld_gigpo.yaml", FROM_GRPO_STEP0),
            "arpo": ("configs/variant_arpo.yaml", FROM_GRPO_STEP0),
        },
        "overrides": [
            "warmup.steps=100",
            "warmup.batch_size=16",
            "steps=8",
            "algorithm.prompts_per_step=8",
            "algorithm.minibatch_size=32",
            "task.args.eval_size=30",
            "eval.before=false",
            "eval.every=0",
            "checkpoint.save_final=false",
        ],
    },
    "multichoice": {
        "metric": "set_accuracy",
        "extra": ["partial"],
        "runs": {
            "exact_match": (
                "configs/variant_multichoice.yaml",
                ["rewards=[{name: accuracy, weight: 1.0}, {name: format, weight: 0.2, kwargs: {think: false}}]"],
            ),
            "partial": ("configs/variant_multichoice.yaml", []),
        },
    },
    "replay": {
        "metric": "accuracy",
        "runs": {
            "grpo": ("configs/quickstart.yaml", []),
            "replay": ("configs/variant_replay.yaml", []),
        },
        "overrides": ["steps=30", "task.args.train_size=256", "task.args.eval_size=100", "eval.before=false"],
    },
    "knapsack": {
        "metric": "accuracy",
        "runs": {
            "grpo": ("configs/quickstart.yaml", []),
            "knapsack": ("configs/variant_knapsack.yaml", []),
        },
        "overrides": ["steps=30", "task.args.train_size=128", "task.args.eval_size=100", "eval.before=false"],
    },
    "scaffold": {
        "metric": "accuracy",
        "runs": {
            "grpo": ("configs/real_smollm2_arithmetic.yaml", []),
            "scaf_grpo": (
                "configs/real_smollm2_arithmetic.yaml",
                ["task.args.hints=true", "algorithm.rollout_steps={scaffold: {exemption_steps: 1}}"],
            ),
        },
        "overrides": [
            "steps=6",
            "algorithm.group_size=4",
            "algorithm.minibatch_size=8",
            "task.args.eval_size=50",
            "checkpoint.save_final=false",
        ],
    },
    "igpo": {
        "metric": "accuracy",
        "extra": ["crop_hits_box", "tool_call_rate"],
        "once": {  # the shared warm-up, trained before the runs (seed 0), evaluated as their starting point
            "warmup": (
                "configs/zoom_tools.yaml",
                SHARED_WARMUP,
            ),
        },
        "runs": {
            "grpo": ("configs/zoom_tools.yaml", []),
            "igpo": ("configs/variant_igpo.yaml", []),
            "igpo_separate": ("configs/variant_igpo.yaml", ["algorithm.credit_args={normalization: separate}"]),
        },
        "overrides": [
            "model.args.name_or_path=<base>/warmup_seed0/checkpoints/step-000000/model",
            "warmup.steps=0",
            "steps=40",
            "algorithm.prompts_per_step=4",
            "algorithm.minibatch_size=32",
            "task.args.eval_size=100",
            "eval.before=false",
            "checkpoint.save_final=false",
        ],
    },
    "cppo": {  # CPPO's pruning (+ allocation) vs GRPO: held-out accuracy and the time of a step (perf/*)
        "metric": "accuracy",
        "perf": ["perf/step_s", "perf/rollout_s", "perf/update_s", "perf/pruned_update_saved_s", "cppo/kept_fraction"],
        "runs": {
            "grpo": ("configs/quickstart.yaml", []),
            "cppo": ("configs/variant_cppo.yaml", []),  # r = 0.5 with allocation: 64 prompts rolled out, 256 trained
            "cppo_noalloc": ("configs/variant_cppo.yaml", ["algorithm.rollout_steps.cppo.allocation=false"]),
        },
        "overrides": ["steps=60", "eval.every=30", "task.args.eval_size=100"],  # cut to ~3 min a run
    },
    "calibration": {  # issue 51 items 3, 4, 6: group statistics and advantage scales, with held-out pass@k
        "metric": "accuracy",
        "extra": ["pass@1", "pass@4", "pass@16"],
        "runs": {
            "grpo": ("configs/quickstart.yaml", []),
            "ngrpo": ("configs/variant_ngrpo.yaml", []),
            "seed_grpo": ("configs/variant_seed_grpo.yaml", []),
            "unlikeliness": ("configs/variant_unlikeliness.yaml", []),
        },
        "overrides": [  # cut to ~3 min a run; every arm reports pass@k of 16 samples per held-out row
            "steps=80",
            "eval.every=40",
            "eval.before=false",
            "task.args.eval_size=100",
            "eval.pass_k=[1, 4, 16]",
            "eval.pass_samples=16",
        ],
    },
    "tas": {
        "metric": "accuracy",
        "runs": {
            "grpo": ("configs/video_motion.yaml", []),
            "tas": ("configs/variant_tas.yaml", []),
        },
        "overrides": ["steps=200", "eval.every=50"],
    },
    "llds": {
        "metric": "accuracy",
        "extra": ["crop_hits_box", "tool_call_rate"],
        "perf": ["llds/displacement", "llds/fell_fraction", "loss/llds"],
        "once": {  # the shared warm-up (seed 0), as the igpo study's
            "warmup": (
                "configs/variant_llds.yaml",
                [*SHARED_WARMUP, "algorithm.loss_terms={llds: {coef: 0.0}}"],
            ),
        },
        "runs": {
            "grpo": ("configs/variant_llds.yaml", ["algorithm.loss_terms={llds: {coef: 0.0}}"]),
            "llds": ("configs/variant_llds.yaml", []),
        },
        "overrides": [
            "model.args.name_or_path=<base>/warmup_seed0/checkpoints/step-000000/model",
            "warmup.steps=0",
            "steps=30",
            "algorithm.prompts_per_step=4",
            "algorithm.minibatch_size=16",
            "task.args.eval_size=100",
            "eval.before=false",
            "checkpoint.save_final=false",
        ],
    },
    "gui": {
        "metric": "success_rate",
        "extra": ["first_move_share"],
        "runs": {
            "grpo": ("configs/gui_grpo.yaml", []),
            "gigpo": (
                "configs/gui_gigpo.yaml",
                [  # from the GRPO run's warm-up of the same seed (its step 0), which it evaluated
                    "model.args.name_or_path=<base>/grpo_seed<seed>/checkpoints/step-000000/model",
                    "warmup.steps=0",
                    "checkpoint.after_warmup=false",
                ],
            ),
        },
        "overrides": ["eval.before=false", "checkpoint.save_final=false"],  # as shipped; the untrained policy: 0.00
    },
    "entropy": {  # issue 51 item 7: the entropy bonus and AEPO vs GRPO; entropy/mean logged by every arm (coef 0)
        "metric": "accuracy",
        "perf": ["entropy/mean", "aepo/temperature", "aepo/reinforce_samples", "perf/step_s"],
        "runs": {
            "grpo": ("configs/quickstart.yaml", ["algorithm.loss_terms.entropy_bonus.coef=0.0"]),
            "entropy_bonus": ("configs/variant_entropy_bonus.yaml", []),
            "entropy_bonus_c0.1": (
                "configs/variant_entropy_bonus.yaml",
                ["algorithm.loss_terms.entropy_bonus.coef=0.1"],  # ten times the shipped coef
            ),
            "aepo": ("configs/variant_aepo.yaml", []),
        },
        "overrides": ["steps=60", "eval.every=30", "task.args.eval_size=100"],  # cut to ~3 min a run
    },
}


def train(config: str, out: Path, seed: int, overrides: list[str], fresh: bool) -> float:
    """Train one run (or reuse it); return its wall seconds (0 when reused)."""
    if (out / "summary.json").exists() and not fresh:
        return 0.0
    cmd = [sys.executable, "-m", "mmgrpo", "train", config, f"output_dir={out}", f"seed={seed}",
           "logging.progress=false", "logging.plot=false", *overrides]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - t0


def read_run(out: Path, metric: str, extra: list[str] = (), perf: list[str] = ()) -> dict:
    """Held-out ``metric`` at each evaluation (in order), the mean zero-variance fraction, the final value, and the
    final value of each ``extra`` held-out metric at the warm-up and after training (with ``extra``, also the mean
    sampled completion length of the last 50 training steps)."""
    evals, zero, units = [], [], []
    steps: dict[str, list[float]] = {k: [] for k in perf}  # each ``perf`` training metric, per step
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for k in perf:
            if record.get(k) is not None:
                steps[k].append(record[k])
        for key, value in record.items():
            if key.startswith("eval/") and key.endswith(f"/{metric}"):
                evals.append((key.split("/")[1], record.get("step"), value))
        if record.get("advantage/zero_std_fraction") is not None:
            zero.append(record["advantage/zero_std_fraction"])
        if record.get("completion/units_mean") is not None:
            units.append(record["completion/units_mean"])  # sampled completion length in tokens (with EOS)
    summary = json.loads((out / "summary.json").read_text())
    return {
        "evals": evals,
        "after": summary.get(f"eval/after/{metric}"),
        "zero_std_fraction": statistics.fmean(zero) if zero else None,
        "train_wall_s": summary.get("train/wall_s"),
        "extra": {
            **{f"{stage}/{k}": summary.get(f"eval/{stage}/{k}") for k in extra for stage in ("warmup", "after")},
            **({"train units, last 50 steps": statistics.fmean(units[-50:])} if extra and units else {}),
            **{f"mean {k}": statistics.fmean(v) if v else None for k, v in steps.items()},
        },
    }


def table(results: dict[str, dict[int, dict]]) -> str:
    extra = next((list(r.get("extra", {})) for runs in results.values() for r in runs.values()), [])
    lines = [
        "| run | seed | held-out metric at each evaluation | **after** | mean zero_std_fraction | train s |"
        + "".join(f" {k} |" for k in extra),
        "|---|---|---|---|---|---|" + "---|" * len(extra),
    ]
    for name, runs in results.items():
        for seed, r in sorted(runs.items()):
            curve = " ".join(f"{v:.2f}" for _, _, v in r["evals"])
            zero = "–" if r["zero_std_fraction"] is None else f"{r['zero_std_fraction']:.3f}"
            cells = "".join(f" {_fmt(r['extra'].get(k))} |" for k in extra)
            lines.append(
                f"| `{name}` | {seed} | {curve} | **{r['after']:.3f}** | {zero} | {r['train_wall_s']:.0f} |{cells}"
            )
        afters = [r["after"] for r in runs.values()]
        zeros = [r["zero_std_fraction"] for r in runs.values() if r["zero_std_fraction"] is not None]
        zero = f"{statistics.fmean(zeros):.3f}" if zeros else "–"
        means = "".join(f" {_fmt(_mean([r['extra'].get(k) for r in runs.values()]))} |" for k in extra)
        lines.append(f"| `{name}` | mean | | **{statistics.fmean(afters):.3f}** | {zero} | |{means}")
    return "\n".join(lines)


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", choices=sorted(STUDIES), required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--only", nargs="*", help="config names of the study to run (default: all)")
    p.add_argument("--out", type=Path, default=Path("runs/variants"))
    p.add_argument("--fresh", action="store_true", help="retrain runs that already have a summary.json")
    args = p.parse_args()
    study = STUDIES[args.study]
    base = (args.out / args.study).resolve()
    results: dict[str, dict[int, dict]] = {}
    for name, (config, overrides) in study.get("once", {}).items():  # shared by every run (a warm-up): seed 0
        train(config, base / f"{name}_seed0", 0, [o.replace("<base>", str(base)) for o in overrides], args.fresh)
        r = read_run(base / f"{name}_seed0", study["metric"], study.get("extra", []), study.get("perf", []))
        results[name] = {0: {**r, "after": r["evals"][-1][2] if r["after"] is None else r["after"]}}  # its last eval
    for name, (config, overrides) in study["runs"].items():
        if args.only and name not in args.only:
            continue
        for seed in args.seeds:
            out = base / f"{name}_seed{seed}"
            given = [*study.get("overrides", []), *overrides]
            given = [o.replace("<base>", str(base)).replace("<seed>", str(seed)) for o in given]
            seconds = train(config, out, seed, given, args.fresh)
            results.setdefault(name, {})[seed] = read_run(
                out, study["metric"], study.get("extra", []), study.get("perf", [])
            )
            print(f"{name} seed {seed}: after {results[name][seed]['after']} ({seconds:.0f} s)", flush=True)
    (base / "results.json").write_text(json.dumps(results, indent=2))
    text = table(results)
    (base / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
