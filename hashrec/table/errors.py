"""Errors of the table subsystem."""

from __future__ import annotations


class TableError(Exception):
    """Base of every error the dynamic table raises on purpose."""


class TableFullError(TableError):
    """Inserts were refused (bucket full and scores too low, or NO_EVICTION) in ERROR mode."""
