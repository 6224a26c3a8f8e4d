"""The reward curve of a run (training reward per step, smoothed, with held-out evaluations marked)."""

from __future__ import annotations

from pathlib import Path


def plot_reward_curve(history: list[dict], path: Path, title: str = "") -> None:
    """Write a PNG of ``reward/mean`` over steps and every ``eval/*/accuracy``-style point in ``history``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [h for h in history if h.get("reward/mean") is not None]  # metrics.jsonl holds null for NaN / inf
    steps = [h["step"] for h in finite]
    rewards = [h["reward/mean"] for h in finite]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, alpha=0.35, label="train reward (per step)")
    window = max(1, len(rewards) // 20)
    if len(rewards) >= window > 1:
        smooth = [
            sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
            for i in range(len(rewards))
        ]
        ax.plot(steps, smooth, label=f"train reward (mean of {window})")
    for h in history:
        for key, value in h.items():
            if value is None:
                continue
            if key.startswith("eval/") and key.count("/") == 2 and key.endswith(("accuracy", "reward")):
                stage = key.split("/")[1]
                ax.scatter([h["step"]], [value], marker="o", zorder=3)
                ax.annotate(
                    f"{stage} {value:.2f}", (h["step"], value), textcoords="offset points", xytext=(4, 4), fontsize=8
                )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward / held-out metric")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
