"""The config subsystem's error type."""

from __future__ import annotations


class ConfigError(ValueError):
    """A pipeline config that cannot be loaded, edited or run.

    Messages name the file and line, the field or the feature, and say what to
    change.
    """
