"""The feature subsystem's error type."""

from __future__ import annotations


class FeatureError(ValueError):
    """Input data a feature cannot turn into tensors.

    Messages name the feature, the column and, where known, the row (0-based
    within the parsed block), and say what was expected.
    """
