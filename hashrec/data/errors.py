"""The error base of the data pipeline."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input data: missing or unreadable files, empty files, missing columns,
    unsupported or inconsistent column types, rows a feature cannot parse.

    Messages name the file (and column where known).
    """
