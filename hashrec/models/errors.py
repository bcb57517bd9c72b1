"""The one error base of the models subsystem."""

from __future__ import annotations


class ModelError(ValueError):
    """A model config that cannot be built; the message names the group, tower or feature."""
