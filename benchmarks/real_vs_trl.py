"""TRL's GRPOTrainer and mmgrpo on a real pretrained model: held-out accuracy against training seconds.

    bash scripts/setup_real_models.sh smollm2-135m-instruct
    python benchmarks/real_vs_trl.py --out runs/real_vs_trl            # CUDA when there is one, else CPU

What is compared. Both toolkits train SmolLM2-135M-Instruct (``smollm2-135m-instruct``, docs/real_models.md) on the
built-in ``arithmetic`` task exactly as ``configs/real_smollm2_arithmetic.yaml`` sets it: the same 1,000 train
problems (each toolkit draws its own order from the run seed), the same reward (mmgrpo's ``last_number``, called
through the same scoring path in both), G = 8, 2 prompts per step (B = 16; TRL ``per_device_train_batch_size = 16``,
``num_generations = 8``), 32 new tokens at temperature 0.7, no top-k / top-p, β = 0, μ = 1, clip ε = 0.2, group std
scaling (ε 1e-4) and token-mean aggregation (TRL's default ``loss_type="dapo"``), fp32, TRL's lm_head on its
GPU rule (completion positions only; on a CPU run it is switched to it, as in ``vs_trl.py``), the same AdamW (fused,
betas 0.9/0.999, no weight decay, gradient norm clipped to 1) and the same learning-rate schedule (lr 2e-5, the
config's 2 warm-up steps; TRL gets the schedule through ``optimizers=``, since its ``constant_with_warmup`` starts
at lr 0). Gradient checkpointing is off in both (TRL's default is on; it would only slow TRL down). TRL skips the
old-log-prob forward at μ = 1, and so does mmgrpo by default (``mmgrpo/on_policy.py``, as ``Trainer.run``).

How it is measured. One subprocess per (toolkit, seed), the order alternating, the same imports in both. Every
``--eval-every`` steps the held-out accuracy is measured by one function for both toolkits (:func:`held_out`: the
task's 100 held-out problems, greedy, 32 new tokens, the task's own ``score``); the evaluation's time is not counted.
Per run: training seconds at each evaluation (step wall time, device synchronised), median step time, peak memory
(CUDA: ``max_memory_allocated`` over the training steps; CPU: the process's ``VmHWM``). Time to reward: the first
training second at which a run's held-out accuracy reaches ``--target`` (default: the pretrained accuracy + 0.1).
Writes ``real_vs_trl.json`` and ``real_vs_trl.md`` under ``--out`` and prints the table.
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
CONFIG = ROOT / "configs" / "real_smollm2_arithmetic.yaml"
TOOLKITS = ("mmgrpo", "trl")


def _config(seed: int, steps: int, out: Path, extra: list[str] = ()):
    """The run's mmgrpo config: the shipped YAML with the seed and step count, no checkpoints, no own evaluation, then
    ``extra`` overrides (``--set``: mmgrpo's options, e.g. ``model.args.compile_decode=true``)."""
    from mmgrpo.loader import load_config

    return load_config(
        CONFIG,
        [
            f"seed={seed}",
            f"steps={steps}",
            f"output_dir={out}",
            "eval.before=false",
            "eval.after=false",
            "checkpoint.save_final=false",
            "logging.plot=false",
            *extra,
        ],
    )


def _task(cfg):
    from mmgrpo.plugins import TASKS

    return TASKS.get(cfg.task.name)(cfg.task.args, seed=cfg.seed)


def chat_text(tokenizer, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def held_out(model, tokenizer, task, max_new_tokens: int, rows: int | None = None, batch_size: int = 50) -> float:
    """Greedy held-out accuracy, the same for both toolkits: left-padded batches, ``max_new_tokens`` new tokens,
    special tokens dropped, scored by the task's own ``score`` (``last_number``)."""
    import torch

    rows, outputs, was_training = task.eval_rows()[:rows], [], model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            texts = [chat_text(tokenizer, r["prompt"]) for r in rows[i : i + batch_size]]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            out = model.generate(
                **enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id
            )
            outputs += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    return task.score(outputs, rows)["accuracy"]


class Meter:
    """Training seconds (device synchronised) and the held-out curve [(step, seconds, accuracy)]."""

    def __init__(self, device: str, eval_rows: int | None = None):
        self.eval_rows = eval_rows
        self.device, self.seconds, self.steps, self.curve, self.rewards = device, 0.0, [], [], []
        self._t0 = 0.0

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def begin(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def end(self) -> None:
        self._sync()
        dt = time.perf_counter() - self._t0
        self.steps.append(dt)
        self.seconds += dt

    def evaluate(self, step: int, model, tokenizer, task, max_new_tokens: int) -> None:
        acc = held_out(model, tokenizer, task, max_new_tokens, self.eval_rows)
        self.curve.append((step, round(self.seconds, 3), acc))
        print(f"  step {step:3d}  {self.seconds:8.1f} s  held-out {acc:.3f}", flush=True)


def _peak_reset(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()


def _peak_mb(device: str) -> float:
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def run_mmgrpo(cfg, task, device: str, every: int, meter: Meter) -> dict:
    from mmgrpo import on_policy
    from mmgrpo.trainer import Trainer

    trainer = Trainer(cfg)
    on_policy.configure(trainer.adapter, cfg)  # as Trainer.run: at μ = 1 no old-log-prob forward (mmgrpo/on_policy.py)
    model = trainer.acc.unwrap_model(trainer.adapter.model)
    tokenizer = trainer.adapter.tokenizer
    row = task.train_rows()[0]
    prompt_ids = tokenizer(trainer.adapter._prompt_text(row, {}), add_special_tokens=False)["input_ids"]
    new_tokens = cfg.model.args["max_new_tokens"]
    meter.evaluate(0, model, tokenizer, task, new_tokens)
    _peak_reset(device)
    phases = []  # per step: the trainer's own split of its wall time (rollout, reward, update)
    for step in range(cfg.steps):
        meter.begin()
        metrics = trainer.train_step(step)
        meter.end()
        meter.rewards.append(_reward_of(metrics))
        if isinstance(metrics, dict):
            phases.append({k.removeprefix("perf/"): round(float(v), 4) for k, v in metrics.items() if k in PHASES})
        if (step + 1) % every == 0 or step + 1 == cfg.steps:
            meter.evaluate(step + 1, model, tokenizer, task, new_tokens)
    return {"prompt_ids": prompt_ids, "device_seen": str(next(model.parameters()).device), "phases": phases}


PHASES = ("perf/rollout_s", "perf/reward_s", "perf/update_s")
"""mmgrpo's per-step wall-time split (``Trainer.train_step``), recorded per step in its runs' JSON."""


def _reward_of(metrics) -> float | None:
    if not isinstance(metrics, dict):
        return None
    return float(metrics["reward/mean"]) if "reward/mean" in metrics else None


def run_trl(cfg, task, device: str, every: int, meter: Meter, out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl_side import grpo_trainer, record_prompt_ids, use_gpu_head_rule

    from mmgrpo import schedules
    from mmgrpo.modalities.real_models import resolve
    from mmgrpo.tasks.eval_rewards import EvalRewards

    if device == "cpu":
        use_gpu_head_rule()  # as benchmarks/vs_trl.py --trl-fused-head compact
    model_dir = resolve(cfg.model.args["name_or_path"], "vlm")
    if model_dir is None:
        raise SystemExit(f"{cfg.model.args['name_or_path']} is not set up: bash scripts/setup_real_models.sh")
    a, o, margs = cfg.algorithm, cfg.optim, cfg.model.args
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in task.train_rows()]
    scorer = EvalRewards([{"name": r.name, "kwargs": r.kwargs} for r in cfg.rewards], "benchmark")

    def reward(prompts, completions, answer, **_) -> list[float]:
        """mmgrpo's reward, called through its own scoring path (score_rows) on the completion texts."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        questions = [p[-1]["content"] if isinstance(p, list) else p for p in prompts]
        rows = [{"prompt": q, "answer": x} for q, x in zip(questions, answer)]
        return scorer.scores(texts, rows)[:, 0].tolist()

    reward.__name__ = cfg.rewards[0].name
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, fused=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: schedules.lr_lambda(s, o.warmup_steps, cfg.steps, o.schedule)
    )
    B = a.prompts_per_step * a.group_size
    config = dict(
        output_dir=str(out / "trl_out"),
        per_device_train_batch_size=B,
        num_generations=a.group_size,
        max_completion_length=margs["max_new_tokens"],
        num_iterations=a.epochs,
        beta=a.beta,
        learning_rate=o.lr,
        max_grad_norm=o.max_grad_norm,
        temperature=margs["temperature"],
        loss_type="dapo",
        scale_rewards="group",
        max_steps=cfg.steps,
        logging_steps=1,
        use_cpu=device == "cpu",
        gradient_checkpointing=False,
        seed=cfg.seed,
    )
    seen: dict = {}

    class Hooks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            meter.evaluate(0, model, tokenizer, task, margs["max_new_tokens"])
            _peak_reset(device)

        def on_step_begin(self, args, state, control, **kw):
            meter.begin()

        def on_step_end(self, args, state, control, **kw):
            meter.end()
            step = state.global_step
            if step % every == 0 or step == cfg.steps:
                meter.evaluate(step, model, tokenizer, task, margs["max_new_tokens"])

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                meter.rewards.append(float(logs["reward"]))

    trainer = grpo_trainer(model, tokenizer, reward, rows, Hooks(), optimizers=(optimizer, scheduler), **config)

    def record(prompts, prompt_ids):
        for p, ids in zip(prompts, prompt_ids):  # the ids TRL feeds, by question: compared with ours at the end
            seen.setdefault("by_text", {}).setdefault(p[-1]["content"], [int(i) for i in ids])

    record_prompt_ids(trainer, record)
    trainer.train()
    first = task.train_rows()[0]["prompt"]
    recorded = seen.get("by_text", {})
    ours = {q: tokenizer(chat_text(tokenizer, q), add_special_tokens=False)["input_ids"] for q in recorded}
    return {
        "prompt_ids": tokenizer(chat_text(tokenizer, first), add_special_tokens=False)["input_ids"],
        "trl_prompts_checked": len(recorded),
        "trl_prompts_equal_ours": all(ids == ours[q] for q, ids in recorded.items()),  # unpadded lists
        "device_seen": str(next(model.parameters()).device),
    }


def worker(
    toolkit: str, seed: int, steps: int, every: int, device: str, result: Path, eval_rows: int | None, extra: list[str]
) -> None:
    import datasets  # noqa: F401  (the same imports in both workers)
    import torch
    import trl  # noqa: F401

    import mmgrpo.modalities
    import mmgrpo.rewards  # noqa: F401

    torch.manual_seed(seed)
    out = result.parent / f"{toolkit}_{seed}"
    cfg = _config(seed, steps, out, extra)
    task = _task(cfg)
    meter = Meter(device, eval_rows)
    start = time.perf_counter()
    if toolkit == "mmgrpo":
        info = run_mmgrpo(cfg, task, device, every, meter)
    else:
        info = run_trl(cfg, task, device, every, meter, out)
    result.write_text(
        json.dumps(
            {
                "toolkit": toolkit,
                "seed": seed,
                "device": device,
                "curve": meter.curve,
                "step_s": meter.steps,
                "train_s": meter.seconds,
                "sampled_reward": meter.rewards,
                "peak_mb": _peak_mb(device),
                "wall_s": time.perf_counter() - start,
                **info,
            }
        )
    )


# ----------------------------------------------------------------------------------------------- driver


def time_to(curve: list, target: float) -> float | None:
    """Training seconds at the first evaluation whose held-out accuracy reaches ``target`` (None: never)."""
    return next((s for _, s, acc in curve if acc >= target - 1e-9), None)


def summarize(runs: list[dict], target: float) -> dict:
    table = {}
    for tk in TOOLKITS:
        mine = [r for r in runs if r["toolkit"] == tk]
        if not mine:
            continue
        reach = [time_to(r["curve"], target) for r in mine]
        table[tk] = {
            "seeds": [r["seed"] for r in mine],
            "before": [r["curve"][0][2] for r in mine],
            "after": [r["curve"][-1][2] for r in mine],
            "best": [max(acc for _, _, acc in r["curve"]) for r in mine],
            "time_to_target_s": reach,
            "median_step_s": statistics.median(s for r in mine for s in r["step_s"]),
            "train_s": [r["train_s"] for r in mine],
            "peak_mb": max(r["peak_mb"] for r in mine),
        }
    if len(table) == 2:
        t, m = table["trl"], table["mmgrpo"]
        pairs = [(a, b) for a, b in zip(t["time_to_target_s"], m["time_to_target_s"]) if a and b]
        table["ratios"] = {
            "step (TRL / mmgrpo)": t["median_step_s"] / m["median_step_s"],
            "peak memory (TRL / mmgrpo)": t["peak_mb"] / m["peak_mb"],
            "time to target, per seed (TRL / mmgrpo)": [a / b for a, b in pairs],
        }
    return table


def markdown(table: dict, target: float, device: str, steps: int) -> str:
    lines = [
        f"device: {device}; {steps} steps; target held-out accuracy {target:.2f}",
        "",
        "| toolkit | seed | held-out before | after | best | seconds to target | median step (s) | peak memory (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tk in TOOLKITS:
        if tk not in table:
            continue
        t = table[tk]
        for i, seed in enumerate(t["seeds"]):
            reach = t["time_to_target_s"][i]
            lines.append(
                f"| {tk} | {seed} | {t['before'][i]:.2f} | {t['after'][i]:.2f} | {t['best'][i]:.2f} | "
                f"{'not reached' if reach is None else f'{reach:.1f}'} | {t['median_step_s']:.3f} | "
                f"{t['peak_mb']:.0f} |"
            )
    if "ratios" in table:
        r = table["ratios"]
        per_seed = ", ".join(f"{x:.2f}" for x in r["time to target, per seed (TRL / mmgrpo)"]) or "n/a"
        lines += [
            "",
            f"TRL / mmgrpo: step {r['step (TRL / mmgrpo)']:.2f}x, peak memory "
            f"{r['peak memory (TRL / mmgrpo)']:.2f}x, time to target per seed {per_seed}",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/real_vs_trl"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=18, help="GRPO steps per run (the config's 18)")
    p.add_argument("--eval-every", type=int, default=3)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--target", type=float, default=None, help="held-out accuracy to reach (default: before + 0.1)")
    p.add_argument("--toolkits", nargs="+", choices=TOOLKITS, default=list(TOOLKITS))
    p.add_argument("--budget-s", type=float, default=None, help="launch no new run after this many seconds")
    p.add_argument("--eval-rows", type=int, default=None, help="held-out rows (default 100)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an mmgrpo config override for its runs (repeatable), e.g. model.args.compile_decode=true; the model, "
        "data and GRPO settings both toolkits share come from the config and are not to be changed here",
    )
    p.add_argument("--worker", choices=TOOLKITS, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.device == "auto":
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.worker:
        worker(a.worker, a.seed, a.steps, a.eval_every, a.device, a.result, a.eval_rows, a.set)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    runs, failed, start = [], [], time.perf_counter()
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    for i, seed in enumerate(a.seeds):
        order = a.toolkits if i % 2 == 0 else a.toolkits[::-1]
        for tk in order:
            if a.budget_s is not None and time.perf_counter() - start > a.budget_s:
                print(f"budget spent: {tk} seed {seed} not run", flush=True)
                continue
            result = a.out / f"{tk}_{seed}.json"
            print(f"{tk} seed {seed} on {a.device}", flush=True)
            cmd = [sys.executable, __file__, "--worker", tk, "--seed", str(seed), "--result", str(result)]
            cmd += ["--steps", str(a.steps), "--eval-every", str(a.eval_every), "--device", a.device]
            cmd += [] if a.eval_rows is None else ["--eval-rows", str(a.eval_rows)]
            cmd += [x for kv in a.set for x in ("--set", kv)]
            proc = subprocess.run(cmd, env=env)
            if proc.returncode != 0:
                print(f"{tk} seed {seed} failed (exit {proc.returncode})", flush=True)
                failed.append(f"{tk} seed {seed}")
                continue
            runs.append(json.loads(result.read_text()))
    if not runs:
        return 1
    target = a.target if a.target is not None else round(statistics.median(r["curve"][0][2] for r in runs) + 0.1, 2)
    table = summarize(runs, target)
    ids = {json.dumps(r["prompt_ids"]) for r in runs}
    same = len(ids) == 1 and all(r.get("trl_prompts_equal_ours", True) for r in runs)
    checked = sum(r.get("trl_prompts_checked", 0) for r in runs)
    text = markdown(table, target, a.device, a.steps)
    text += f"\nprompt token ids equal in both toolkits: {same} (TRL's fed prompts checked: {checked})\n"
    text += f"\nFAILED (not in the table): {', '.join(failed)}\n" if failed else ""
    result = {"target": target, "table": table, "runs": runs, "failed": failed}
    (a.out / "real_vs_trl.json").write_text(json.dumps(result, indent=1))
    (a.out / "real_vs_trl.md").write_text(text)
    print(text)
    return 1 if failed else 0  # a failed run fails the comparison (the table holds the others)


if __name__ == "__main__":
    sys.exit(main())
