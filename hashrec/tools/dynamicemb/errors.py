"""Errors of the dynamic-embedding migration tools."""

from __future__ import annotations


class MigrationError(ValueError):
    """Input a migration tool cannot convert; the message names the table, file or row."""
