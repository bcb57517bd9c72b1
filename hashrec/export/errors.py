"""Errors of the export and predict subsystem."""

from __future__ import annotations


class ExportError(Exception):
    """Export or prediction cannot proceed: bad paths, unsupported models or tables,
    missing or inconsistent export files. The message names the file, table or model."""
