"""Errors of the distributed subsystem: process groups, sharding and planning."""

from __future__ import annotations


class DistributedError(RuntimeError):
    """A distributed job cannot start or a collective got inconsistent input."""


class PlannerError(DistributedError):
    """No storage plan fits the memory budgets (the message names the tables and bytes)."""
