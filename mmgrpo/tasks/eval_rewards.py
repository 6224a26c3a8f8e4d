"""A task's own held-out metrics (``task.args.eval_rewards``), shared by the dataset and t2i_prompts tasks."""

from __future__ import annotations

from mmgrpo.config import ConfigError


class EvalRewards:
    """A task's own evaluation metrics ``[{name, kwargs}]``: checked when the task is built (registered names and
    their kwargs; no module imported, no model loaded), loaded at the first :meth:`score` (a model-based reward
    such as PickScore loads its weights then, not at ``--dry-run``)."""

    def __init__(self, specs: list[dict], where: str):
        from mmgrpo.rewards.registry import REWARDS, check_reward_spec

        self.specs, self._loaded = [], None
        for i, spec in enumerate(specs):
            if not isinstance(spec, dict) or "name" not in spec:
                raise ConfigError(f"{where}[{i}]: expected {{name: ..., kwargs: {{}}}}, got {spec!r}")
            if spec["name"] in REWARDS:
                try:
                    check_reward_spec(spec["name"], spec.get("kwargs", {}))
                except ValueError as e:
                    raise ConfigError(f"{where}[{i}] ({spec['name']}): {e}") from None
            self.specs.append((spec["name"], dict(spec.get("kwargs") or {})))

    def __bool__(self) -> bool:
        return bool(self.specs)

    def score(self, outputs: list, rows: list[dict]) -> dict[str, float]:
        """Mean of each metric over ``rows`` (``None`` values left out; NaN when none is left)."""
        if self._loaded is None:
            from mmgrpo.rewards.registry import load_reward

            self._loaded = [(name, load_reward(name, **kwargs)) for name, kwargs in self.specs]
        prompts = [r["prompt"] for r in rows]
        columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
        out = {}
        for name, fn in self._loaded:
            vals = [v for v in fn(outputs, prompts=prompts, **columns) if v is not None]
            out[name] = float(sum(vals) / len(vals)) if vals else float("nan")
        return out


__all__ = ["EvalRewards"]
