"""Storage of a dynamic table: a bucketed index plus value rows, all on one device.

Layout (pinned; the reference and Triton ops both read and write it)::

    num_buckets, bucket_capacity; capacity = num_buckets * bucket_capacity
    keys    (capacity,) int64
    tags    (capacity,) int32    key namespace (table fusion), 0 when unfused
    digests (capacity,) uint8    0 = empty slot, else digest_of(h) in [1, 255]
    scores  (capacity,) int64
    values  (capacity, row_dim)  [embedding (dim) | optimizer state]

An entry's identity is (key, tag) with ``h = mix_tagged(key, tag)``; it lives only
in bucket ``bucket_of(h, num_buckets)``, i.e. slots ``[b * bucket_capacity,
(b + 1) * bucket_capacity)``. Occupancy lives in ``digests``, outside the key
space, so every int64 value is a legal key.

``tagged`` False records that every entry has tag 0 (an unfused table): probes of
keys without tags then skip the tag array, and inserts without tags neither read nor
write it. An empty storage starts so; the first insert given tags sets it for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# The score of entries an insert must not evict (the call's hits, and its keys placed
# before a growth) while the call runs: the largest int64.
PROTECTED = torch.iinfo(torch.int64).max


@dataclass
class TableStorage:
    """Mutable tensors of one table (see the module docstring for the layout)."""

    num_buckets: int
    bucket_capacity: int
    keys: torch.Tensor
    tags: torch.Tensor
    digests: torch.Tensor
    scores: torch.Tensor
    values: torch.Tensor
    tagged: bool = True  # see the module docstring; True is always correct
    # What past calls of the write path left on the host to pick the next call's kernel
    # launch (``ops/insert/upsert.py``); never read for an outcome.
    launch_hints: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def empty(cls, num_buckets: int, bucket_capacity: int, row_dim: int,
              dtype: torch.dtype = torch.float32,
              device: torch.device | str = "cpu") -> TableStorage:
        """Allocates an empty storage (all digests 0; values zero)."""
        capacity = num_buckets * bucket_capacity
        return cls(
            num_buckets=num_buckets,
            bucket_capacity=bucket_capacity,
            keys=torch.zeros(capacity, dtype=torch.int64, device=device),
            tags=torch.zeros(capacity, dtype=torch.int32, device=device),
            digests=torch.zeros(capacity, dtype=torch.uint8, device=device),
            scores=torch.zeros(capacity, dtype=torch.int64, device=device),
            values=torch.zeros(capacity, row_dim, dtype=dtype, device=device),
            tagged=False,
        )

    def note_tags(self, tags: torch.Tensor | None) -> None:
        """Called by the insert ops before they write entries with ``tags`` (None: tag 0)."""
        if tags is not None:
            self.tagged = True

    def probe_tags(self, tags: torch.Tensor | None) -> torch.Tensor | None:
        """The tag array a kernel given keys with ``tags`` reads and writes; None when it
        need not (every entry has tag 0 and the keys come without tags)."""
        return self.tags if self.tagged or tags is not None else None

    @property
    def capacity(self) -> int:
        return self.num_buckets * self.bucket_capacity

    @property
    def row_dim(self) -> int:
        return self.values.shape[1]

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def size(self) -> int:
        """Occupied slots."""
        return int(torch.count_nonzero(self.digests))

    def nbytes(self) -> int:
        """Bytes held by the tensors."""
        return sum(t.numel() * t.element_size()
                   for t in (self.keys, self.tags, self.digests, self.scores, self.values))


@dataclass
class InsertResult:
    """Outcome of ``insert_keys``.

    Attributes:
        slots: (m,) int64 slot of each incoming key, -1 when refused.
        evicted_keys: (e,) int64 keys that lost their slot.
        evicted_tags: (e,) int32 their tags.
        evicted_scores: (e,) int64 their scores.
    """

    slots: torch.Tensor
    evicted_keys: torch.Tensor
    evicted_tags: torch.Tensor
    evicted_scores: torch.Tensor
