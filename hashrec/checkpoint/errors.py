"""The one error base of the checkpoint subsystem."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file or table."""
