"""Frequency admission: a bounded counter table decides when a key enters the table.

The counter table reuses the table layout (no value columns; the score is the
count), so a full counter bucket evicts its lowest counts through the same insert
rule. A key is admitted on the lookup where its count reaches the threshold; its
counter is then dropped. A key whose counter was evicted starts counting again.
"""

from __future__ import annotations

import math

import torch

from hashrec.table.ops.erase import erase_slots
from hashrec.table.ops.export import occupied_slots
from hashrec.table.ops.find import find_slots
from hashrec.table.ops.insert import insert_keys
from hashrec.table.storage import TableStorage


class AdmissionCounter:
    """Counts occurrences of keys not yet in the table, in ``capacity`` slots (rounded up
    to whole buckets of ``bucket_capacity``)."""

    def __init__(self, threshold: int, capacity: int, bucket_capacity: int,
                 device: torch.device) -> None:
        self.threshold = threshold
        num_buckets = math.ceil(capacity / bucket_capacity)
        self.storage = TableStorage.empty(num_buckets, bucket_capacity, 0, device=device)
        # Counters evicted by ``count`` (``count_masked`` leaves the count to its caller).
        self.evictions = 0

    def count(self, keys: torch.Tensor, tags: torch.Tensor | None,
              counts: torch.Tensor) -> torch.Tensor:
        """Adds ``counts`` for unique ``keys``; returns (u,) bool: admitted now.

        Args:
            keys: (u,) int64 unique keys absent from the table.
            tags: (u,) int32 or None.
            counts: (u,) int64 occurrences in this batch (>= 1).
        """
        slots = find_slots(self.storage, keys, tags)
        hit = slots >= 0
        totals = counts.clone()
        totals[hit] += self.storage.scores[slots[hit]]
        admitted = totals >= self.threshold
        erase_slots(self.storage, slots[hit & admitted])
        keep = hit & ~admitted
        self.storage.scores[slots[keep]] = totals[keep]
        new = ~hit & ~admitted
        if bool(new.any()):
            result = insert_keys(self.storage, keys[new], None if tags is None else tags[new],
                                 totals[new], allow_evict=True)
            self.evictions += int(result.evicted_keys.numel())
        return admitted

    def count_masked(self, keys: torch.Tensor, tags: torch.Tensor | None, counts: torch.Tensor,
                     active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` over ``keys[active]`` with every tensor kept at size u: no host sync.

        Same outcome as ``count(keys[active], ...)`` scattered back to (u,) (False
        where not active), and a (u,) bool mask with one True per counter evicted
        (the caller adds it to ``evictions``' count, with its other counters). Needs
        the Triton kernels (CUDA, or the interpreter).

        Args:
            keys: (u,) int64 unique keys; the active ones are absent from the table.
            tags: (u,) int32 or None.
            counts: (u,) int64 occurrences in this batch (>= 1).
            active: (u,) bool keys to count.
        """
        from hashrec.table.ops.insert.train import count_admission  # Triton only
        from hashrec.table.ops.insert.upsert import upsert_slots

        counted = count_admission(self.storage, keys, tags, counts, active, self.threshold)
        result = upsert_slots(self.storage, keys, tags, counted.totals, allow_evict=True,
                              active=counted.new)
        return counted.admitted, result.evicted

    def state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(keys (c,) int64, tags (c,) int32, counts (c,) int64) of every live counter."""
        slots = occupied_slots(self.storage, 0, self.storage.capacity)
        return self.storage.keys[slots], self.storage.tags[slots], self.storage.scores[slots]

    def load_state(self, keys: torch.Tensor, tags: torch.Tensor | None,
                   counts: torch.Tensor) -> None:
        """Sets the counters of unique ``keys`` (a full bucket keeps the highest counts)."""
        slots = find_slots(self.storage, keys, tags)
        hit = slots >= 0
        self.storage.scores[slots[hit]] = counts[hit]
        new = ~hit
        insert_keys(self.storage, keys[new], None if tags is None else tags[new], counts[new],
                    allow_evict=True)

    def nbytes(self) -> int:
        return self.storage.nbytes()
