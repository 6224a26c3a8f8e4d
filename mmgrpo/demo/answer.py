"""Answering one held-out (or edited) row with both models: greedy and G sampled outputs, scored by the rewards."""

from __future__ import annotations

from pathlib import Path

import torch

from mmgrpo import samples as sample_files
from mmgrpo.demo.kinds import MEDIA_KEYS, UPLOAD_SUFFIXES
from mmgrpo.demo.run import DemoError, Models
from mmgrpo.evaluation import output_columns


def _eval_rows(cfg, trust_run_config: bool = False) -> tuple[list[dict], str | None]:
    """Held-out rows of the run's task (at most 50), or ``([], reason)`` when the task cannot be built here.

    The task is built under the demo's reward code policy: its eval rewards given by import path are not imported
    unless ``trust_run_config``, nor one's own environment (``rollout.environment: module:Class``, loaded here when
    trusted: :func:`mmgrpo.env_check.check_environment`; untrusted, its games end at once, counted)."""
    from mmgrpo.env_check import check_environment
    from mmgrpo.loader import load_builtins
    from mmgrpo.plugins import TASKS
    from mmgrpo.rewards.registry import reward_code_policy

    load_builtins()
    try:
        with reward_code_policy("import" if trust_run_config else "registered"):
            task = TASKS.get(cfg.task.name)(cfg.task.args, seed=cfg.seed)
            check_environment(cfg, None)  # imports and registers it only under "import"
        return list(task.eval_rows()[:50]), None
    except Exception as e:  # e.g. a dataset that is not on this machine: the prompt box still works
        return [], f"held-out examples unavailable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def media_key(rows: list[dict]) -> str | None:
    """The row column holding the model's media input, or None for prompt-only rows."""
    for key in MEDIA_KEYS:
        if rows and rows[0].get(key) is not None:
            return key
    return None


def _check_upload(path: str | None, kind: str) -> None:
    if path is None:
        return
    suffix = Path(path).suffix.lower()
    if suffix not in UPLOAD_SUFFIXES[kind]:
        raise DemoError(f"upload {Path(path).name}: {kind} files must be one of {sorted(UPLOAD_SUFFIXES[kind])}")


def score(rewards, outputs: list, row: dict, with_ground_truth: bool, extras: dict | None = None) -> list[str]:
    """One line per output: the weighted reward and each reward function's value ("n/a" where it cannot apply);
    ``extras``: per-output columns a rollout gives the rewards (a multi-turn answer's ``turn_rewards``, the token
    ids: :func:`mmgrpo.evaluation.output_columns` of the greedy answer, ``Rollout.extras`` of the sampled ones)."""
    from mmgrpo.advantages import combine_rewards
    from mmgrpo.rewards import score_rows

    if rewards is None:
        return ["reward n/a (no reward loaded: see the note at the top of the page)"] * len(outputs)
    shown = row if with_ground_truth else {"prompt": row["prompt"]}
    try:
        scores, _ = score_rows(rewards, outputs, [shown], len(outputs), extras)  # [n, K]: one group, the row's
    except Exception as e:
        return [f"reward n/a ({type(e).__name__})"] * len(outputs)
    total = combine_rewards(scores.view(1, len(outputs), -1), rewards.weights)[0]  # [n]
    lines = []
    for t, per in zip(total.tolist(), scores.tolist()):
        parts = ", ".join(f"{n}={'n/a' if v != v else f'{v:.3f}'}" for n, v in zip(rewards.names, per))
        lines.append(f"reward {'n/a' if t != t else f'{t:.3f}'} ({parts})")
    return lines


def answer(models: Models, row: dict, seed: int, group: int, with_ground_truth: bool, out_dir: Path) -> dict:
    """Greedy (and G sampled) outputs of base and trained for one row, as display values, with rewards."""
    base, trained, rewards = models.get()
    result = {}
    for name, adapter in (("base", base), ("trained", trained)):
        torch.manual_seed(seed)
        greedy = adapter.evaluate([row])[0]
        sampled, extras = [], output_columns([greedy])  # the columns its rollout records (turn rewards, token ids)
        if group > 0:
            torch.manual_seed(seed)
            rollout = adapter.rollout([row], group)
            sampled = list(rollout.outputs)
            if extras:  # the greedy answer's columns (an Answer): the sampled ones' are the rollout's, as training's
                keys = dict.fromkeys([*extras, *rollout.extras])
                extras = {k: extras.get(k, [None]) + list(rollout.extras.get(k, [None] * group)) for k in keys}
        lines = score(rewards, [greedy] + sampled, row, with_ground_truth, extras or None)
        shown = [
            sample_files.save_value(_for_display(o), out_dir, f"{name}_{i}") for i, o in enumerate([greedy] + sampled)
        ]
        result[name] = {"greedy": shown[0], "samples": shown[1:], "rewards": lines}
    return result


def ground_truth_line(row: dict, key: str | None, edited: bool = False) -> str:
    """The line under the prompt: the row's ground-truth columns, or, once the input is edited (a new upload or
    question), that they no longer apply."""
    if edited:
        return "ground truth: n/a — edited input (an upload or a new question); rewards that need it show n/a"
    truth = {k: v for k, v in row.items() if k not in ("prompt", key) and isinstance(v, (str, int, float))}
    return "ground truth: " + ", ".join(f"`{k}`={v}" for k, v in truth.items())


def samples_text(samples: list[dict], reward_lines: list[str]) -> str:
    """The sampled answers as text lines with their rewards. A media sample (image, video, audio) is shown in the
    gallery beside it, so its line names its number and kind, never the file's path on the server."""
    lines = []
    for i, (s, line) in enumerate(zip(samples, reward_lines), 1):
        shown = s["text"] if "text" in s else f"sample {i} ({s.get('kind', 'file')})"
        lines.append(f"{shown}   [{line}]")
    return "\n".join(lines)


def _for_display(output):
    """Small generated images enlarged by an integer factor (nearest neighbour: the pixels are the model's)."""
    from PIL import Image

    if isinstance(output, Image.Image) and max(output.size) < 256:
        k = 256 // max(output.size)
        return output.resize((output.width * k, output.height * k), Image.NEAREST)
    return output


def _digest(path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
