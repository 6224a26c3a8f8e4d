"""The run directory behind the demo: its config, its checkpoints, and the two policies built from them.

Both models are built by the SAME adapter builder from the run's config (:func:`build_policy`, the one place the
demo looks an adapter up in the registry): the base with the config's ``model.args`` as given, the trained one with
the config's LoRA settings and then the checkpoint's weights. Without ``trust_run_config`` a config that sets
``trust_remote_code`` is refused and rewards given as code to import are not loaded (see :mod:`mmgrpo.demo`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("mmgrpo.demo")


class DemoError(Exception):
    """A one-line, user-facing problem with the run directory or the options."""


def load_run_config(run_dir: Path, trust_run_config: bool = False):
    """The run's resolved config (``RUN_DIR/config.yaml``), or a one-line :class:`DemoError`.

    Loading checks the rewards without importing their code (:func:`mmgrpo.rewards.check_reward_spec`); without
    ``trust_run_config`` rewards given as code are not even looked for (their module need not be on this machine's
    path: the demo loads registered rewards only and says so), and a config that sets ``trust_remote_code``
    anywhere under ``model.args`` is refused.
    """
    from mmgrpo.config import ConfigError
    from mmgrpo.loader import load_config
    from mmgrpo.rewards.registry import reward_code_policy

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise DemoError(f"{run_dir}: no config.yaml — not an mmgrpo run directory (mmgrpo train writes one)")
    try:  # untrusted: rewards given as code (my_rewards:fn) are neither imported nor looked for (not on this path)
        with reward_code_policy("import" if trust_run_config else "registered"):
            cfg = load_config(path)
    except ConfigError as e:
        raise DemoError(f"{path}: {e}") from None
    if not trust_run_config:
        for where in _remote_code_flags(cfg.model.args, "model.args"):
            raise DemoError(
                f"{path}: {where}: true would run code from the model's repository; a run directory from elsewhere "
                "is code: pass --trust-run-config if you trust this one"
            )
    return cfg


def _remote_code_flags(value: Any, where: str) -> list[str]:
    """Dotted paths of every truthy ``trust_remote_code`` in a nested mapping."""
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if k == "trust_remote_code" and v:
                out.append(f"{where}.{k}")
            else:
                out += _remote_code_flags(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [w for i, v in enumerate(value) for w in _remote_code_flags(v, f"{where}[{i}]")]
    return []


def untrusted_rewards(cfg) -> list[str]:
    """The config's rewards that are code to import (``module:function``, factories): without
    ``--trust-run-config`` the demo does not load them."""
    from mmgrpo.rewards.registry import is_code_spec

    return [r.name for r in cfg.rewards if is_code_spec(r.name)]


def untrusted_message(names: list[str]) -> str:
    return (
        f"reward(s) {', '.join(repr(n) for n in names)} not loaded: the run's config.yaml names them as code to import "
        "(module:function); a run directory from elsewhere is code, so the demo runs it only with --trust-run-config"
    )


def _weights(directory: Path) -> Path | None:
    path = Path(directory) / "state" / "model.safetensors"  # the layout of mmgrpo.checkpoint.save
    return path if path.is_file() else None


def find_checkpoint(run_dir: Path, checkpoint: str | None = None) -> Path:
    """``--checkpoint`` if given, else ``checkpoints/final``, else the newest complete ``checkpoints/step-*``."""
    from mmgrpo import checkpoint as ckpt

    run_dir = Path(run_dir)
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_absolute() and not path.exists():
            path = run_dir / "checkpoints" / checkpoint  # a name such as final or step-000010
        if not (path / "COMPLETE").is_file() or _weights(path) is None:
            raise DemoError(
                f"--checkpoint {checkpoint}: not a complete mmgrpo checkpoint (COMPLETE and state/model.safetensors)"
            )
        if (why := ckpt.damage(path)) is not None:
            raise DemoError(f"--checkpoint {checkpoint}: the checkpoint is damaged ({why}); pick another one")
        return path
    final = run_dir / "checkpoints" / "final"
    if (final / "COMPLETE").is_file() and _weights(final) is not None and ckpt.damage(final) is None:
        return final
    steps = [p for p in ckpt.complete_checkpoints(run_dir) if _weights(p) is not None and ckpt.damage(p) is None]
    if steps:
        return steps[-1]
    raise DemoError(
        f"{run_dir}: no checkpoint to show (no checkpoints/final or complete checkpoints/step-*); train with "
        "checkpoint.save_final=true or checkpoint.every=N, or pass --checkpoint PATH"
    )


def build_policy(cfg, checkpoint: Path | None):
    """The adapter the run's config describes; with ``checkpoint``, carrying that checkpoint's weights."""
    from safetensors.torch import load_model

    from mmgrpo.loader import load_builtins
    from mmgrpo.plugins import ADAPTERS

    load_builtins()
    build = ADAPTERS.get(cfg.model.adapter)
    lora = cfg.model.lora if checkpoint is not None else None  # the base is the model as named, without LoRA
    adapter = build(
        cfg.model.args,
        seed=cfg.seed,
        lora=lora,
        dtype=cfg.model.dtype,
        need_reference=False,
        rollout=cfg.rollout,  # tools or an environment answer its turns, as in training (docs/agents.md)
    )
    if checkpoint is not None:
        from safetensors import SafetensorError

        try:
            missing, unexpected = load_model(adapter.model, str(_weights(checkpoint)), strict=False)
        except SafetensorError as e:  # a truncated or corrupt file: one line, not the library's traceback
            raise DemoError(f"{_weights(checkpoint)}: unreadable ({str(e).splitlines()[0][:160]})") from None
        if missing or unexpected:
            raise DemoError(
                f"{checkpoint}: weights do not match the model the run's config builds "
                f"({len(missing)} missing, {len(unexpected)} unexpected, e.g. {(missing or unexpected)[0]})"
            )
    adapter.model.eval()
    return adapter


@dataclass
class Models:
    """Base and trained policies plus the run's reward functions, built on first use (one at a time)."""

    cfg: Any
    checkpoint: Path | None
    base_checkpoint: Path | None = None
    trust_run_config: bool = False
    """Import the code the config names (rewards by import path). False: registered rewards only."""
    _built: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def skipped_rewards(self) -> list[str]:
        """Rewards of the config not loaded because they are code and the run config is not trusted."""
        return [] if self.trust_run_config else untrusted_rewards(self.cfg)

    def policy(self):
        """The reward code policy everything built for the demo runs under."""
        from mmgrpo.rewards.registry import reward_code_policy

        return reward_code_policy("import" if self.trust_run_config else "registered")

    def get(self) -> tuple[Any, Any, Any]:
        with self._lock, self.policy():
            if not self._built:
                self._built = {
                    "base": build_policy(self.cfg, self.base_checkpoint),
                    "trained": build_policy(self.cfg, self.checkpoint),
                    "rewards": self._rewards(),
                }
            return self._built["base"], self._built["trained"], self._built["rewards"]

    def _rewards(self):
        """The run's RewardRunner over the rewards the demo may load, or ``None`` when there are none."""
        from mmgrpo.rewards import RewardRunner

        skipped = set(self.skipped_rewards)
        if skipped:
            logger.warning("mmgrpo demo: %s", untrusted_message(sorted(skipped)))
        kept = [r for r in self.cfg.rewards if r.name not in skipped]
        if not kept:
            return None
        rt = self.cfg.reward_runtime
        return RewardRunner(
            [(r.name, r.weight, r.kwargs) for r in kept],
            timeout_s=rt.timeout_s,
            on_error="nan",
            max_workers=rt.workers,
            reward_types=[r.reward_types for r in kept],
            isolation=rt.isolation,
        )
