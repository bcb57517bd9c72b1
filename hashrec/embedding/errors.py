"""Errors of the embedding layer."""

from __future__ import annotations


class EmbeddingError(ValueError):
    """Bad embedding-layer input or configuration; the message names the feature or table."""
