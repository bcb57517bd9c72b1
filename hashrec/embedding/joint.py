"""Storages of one row width deduplicated and emitted together.

Each storage a forward reads costs the host a fixed set of launches whatever its
size: its ids' sort and layout, its features' pooling, and in backward their
gradient reduction. On one GPU, where the step is bound by the host, a dense
group of a few small single-valued features costs about as much as a dynamic
storage of a million ids. Storages whose rows have the same width therefore
share one *join*: their ids are deduplicated in one pass, as the logical tables
of one storage (the tags of the second storage follow those of the first),
each storage looks up its own slice of the unique keys, the rows are
concatenated, and one ``emit_storage`` pools every feature and reduces every
gradient; autograd hands each storage the gradient of its own rows.

Results equal those of storage-by-storage dedup, bit for bit: a storage's unique
keys, their counts and order are the same, and every feature's output and gradient
is a sum of the same terms in the same order. The Triton gradient reduction sums
fixed chunks of sorted positions; it is told the members' unique-row bounds
(``StorageBatch.member_rows``) and starts each member's positions on a chunk of
their own, so its terms are grouped as in the member alone.

Under several ranks a join holds at most one sharded (dynamic) storage: the dedup
counts the keys each rank owns over that storage's tags only, and the sizes the
ranks share tell each replicated member its rows per rank. Requests still reach
the exchanges storage by storage, in the storages' order. ZCH storages never join
(they are remapped after the others' ids are checked). ``HASHREC_JOINT_DEDUP=0``
keeps every storage on its own.
"""

from __future__ import annotations

import itertools
import os
from typing import NamedTuple

import torch

from hashrec.embedding.batching import FeatureIds, StorageBatch

ENV = "HASHREC_JOINT_DEDUP"


def joins_enabled() -> bool:
    """Whether storages of one row width share their dedup (``HASHREC_JOINT_DEDUP``).

    Raises:
        ValueError: the variable is set to neither 0 nor 1.
    """
    value = os.environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}={value!r}: expected 0 or 1")
    return value != "0"


def make_joins(storages: list, alone: set[str], sharded: frozenset[str] = frozenset()
               ) -> list[tuple[int, ...]]:
    """Indices of ``storages`` grouped by row width, each join in the order of its first
    member; storages named in ``alone`` form joins of their own, and a join takes at
    most one of the ``sharded`` storages (a second one starts a join of its own)."""
    joins: list[list[int]] = []
    by_dim: dict[int, list[int]] = {}
    for i, storage in enumerate(storages):
        if storage.name in alone:
            joins.append([i])
            continue
        join = by_dim.get(storage.table.dim)
        if join is not None and storage.name in sharded and \
                any(storages[j].name in sharded for j in join):
            joins.append([i])
            continue
        if join is None:
            join = by_dim[storage.table.dim] = []
            joins.append(join)
        join.append(i)
    return [tuple(join) for join in joins]


def owned_tags(storages: list, sharded: frozenset[str]) -> tuple[int, int] | None:
    """The tags [first, end) of a join's sharded member, None without one."""
    first = 0
    for storage in storages:
        end = first + len(storage.plan.tables)
        if storage.name in sharded:
            return first, end
        first = end
    return None


def joint_name(storages: list) -> str:
    return "+".join(s.name for s in storages)


def joint_ids(ids: list[list[list[FeatureIds]]]) -> list[list[FeatureIds]]:
    """The members' features per tag, as one storage's: member after member."""
    return [features for member in ids for features in member]


class Part(NamedTuple):
    """One member's share of a join's dedup: what its lookup and statistics read.

    Attributes:
        keys: (u,) its unique keys. tags: (u,) int32 its own tags (None when the
            storage is not fused). counts: (u,) occurrences. unique_per_table: per
            tag of the storage. key_ranges: per tag, smallest and largest id (or None).
        owner_counts, recv_counts: the sharded member's exchange sizes (see
            ``StorageBatch``), else None. unique_per_rank: every rank's unique keys of
            this member, when the ranks shared their sizes, else None. pair_max: the
            sharded member's ``StorageBatch.pair_max``, else None.
    """

    keys: torch.Tensor
    tags: torch.Tensor | None
    counts: torch.Tensor
    unique_per_table: list[int]
    key_ranges: list[tuple[int, int] | None]
    owner_counts: list[int] | None = None
    recv_counts: list[int] | None = None
    unique_per_rank: list[int] | None = None
    pair_max: int | None = None


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, copied where it does not start 16-byte aligned. A member's slice of the
    join's keys starts wherever the members before it end, which the data sets; the
    table kernels it reaches are compiled once per pointer alignment (16 bytes or not),
    so an unaligned slice would compile a second variant of each, mid-training."""
    return tensor if tensor.data_ptr() % 16 == 0 else tensor.clone()


def split_join(batch: StorageBatch, storages: list, sharded: frozenset[str] = frozenset()
               ) -> list[Part]:
    """Each member's slice of a join's ``batch`` (keys come tag by tag, members in
    order, so a member's keys are one slice), each starting 16-byte aligned
    (``aligned``)."""
    firsts = [0, *itertools.accumulate(len(storage.plan.tables) for storage in storages)]
    sizes = [sum(batch.unique_per_table[first:end]) for first, end in zip(firsts, firsts[1:])]
    # One split per tensor (views), not a slice per member and tensor.
    keys, counts = batch.keys.split(sizes), batch.counts.split(sizes)
    tags = batch.tags.split(sizes) if any(s.plan.fused for s in storages) else None
    per_rank = batch.unique_per_rank_table
    parts = []
    for m, storage in enumerate(storages):
        first, end = firsts[m], firsts[m + 1]
        own_tags = None
        if storage.plan.fused:
            own_tags = tags[m] - first if first else tags[m]  # the first: at 0
        exchange = (batch.owner_counts, batch.recv_counts) if storage.name in sharded \
            else (None, None)
        pair_max = batch.pair_max if storage.name in sharded else None
        parts.append(Part(aligned(keys[m]), own_tags, aligned(counts[m]),
                          batch.unique_per_table[first:end],
                          batch.key_ranges[first:end], *exchange,
                          None if per_rank is None else
                          [sum(row[first:end]) for row in per_rank], pair_max))
    return parts
