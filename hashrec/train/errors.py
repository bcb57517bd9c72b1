"""The one error base of the trainer."""

from __future__ import annotations


class TrainError(ValueError):
    """A training or evaluation setting that cannot run; the message names the field or path."""
