"""The core's error for a wrong configuration value, below every other module: the reward and tool packages raise it
without importing the config schema (docs/architecture.md, "Dependency rule"). Standard library only."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field and how to fix it."""
