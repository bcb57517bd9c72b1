"""Frequency admission: a bounded counter table decides when a key enters the table.

The counter table reuses the table layout (no value columns; the score is the
count), so a full counter bucket evicts its lowest counts through the same insert
rule. A key is admitted on the lookup where its count reaches the threshold; its
counter is then dropped. Under LFU the table takes the count as the new key's score,
and a key the full table refuses gets its counter back (``recount``), so that it keeps
counting until its count beats the lowest score of its bucket. A key whose counter was
evicted starts counting again.

The counter table holds the slots asked for (``counter_capacity``, or a rank's share of
it) as closely as its layout allows (``counter_layout``): the fewest buckets of at most
``counter_bucket_capacity`` slots that hold them, each of the same size, a multiple of
the 128-slot segments the GPU probe reads (of gcd(bucket capacity, 128) slots in
general). A table whose counter differs from what was asked says so once, at INFO.
"""

from __future__ import annotations

import logging
import math

import torch

from hashrec.table.capacity import COUNTER_SEGMENT, counter_layout
from hashrec.table.ops.erase import erase_slots
from hashrec.table.ops.export import occupied_slots
from hashrec.table.ops.find import find_slots
from hashrec.table.ops.insert import insert_keys
from hashrec.table.placement import place_at
from hashrec.table.storage import TableStorage

logger = logging.getLogger(__name__)

class AdmissionCounter:
    """Counts occurrences of keys not yet in the table, in ``capacity`` slots, or the
    closest ``counter_layout`` allows with buckets of at most ``bucket_capacity``;
    ``name``: the table's, for the INFO line where the two differ."""

    def __init__(self, threshold: int, capacity: int, bucket_capacity: int,
                 device: torch.device, name: str = "") -> None:
        self.threshold = threshold
        num_buckets, slots = counter_layout(capacity, bucket_capacity)
        if num_buckets * slots != capacity:
            logger.info("table %r: its admission counter holds %d slots (%d bucket%s of %d) "
                        "for the %d asked (counter_capacity, per rank where sharded): its "
                        "buckets hold at most counter_bucket_capacity %d slots, in multiples "
                        "of %d", name, num_buckets * slots, num_buckets,
                        "s" if num_buckets > 1 else "", slots, capacity, bucket_capacity,
                        math.gcd(bucket_capacity, COUNTER_SEGMENT))
        self.storage = TableStorage.empty(num_buckets, slots, 0, device=device)
        # Counters evicted by ``count`` and ``recount`` (``count_masked`` leaves the count
        # to its caller), and by ``recount_masked``, on the device.
        self.evictions = 0
        self.device_evictions = torch.zeros((), dtype=torch.int64, device=device)

    def count(self, keys: torch.Tensor, tags: torch.Tensor | None,
              counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Adds ``counts`` for unique ``keys``; returns (admitted now (u,) bool, the
        keys' counts after this batch (u,) int64).

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
        return admitted, totals

    def recount(self, keys: torch.Tensor, tags: torch.Tensor | None,
                totals: torch.Tensor) -> None:
        """Counters for unique ``keys`` admitted by ``count`` (theirs dropped) that the
        table refused, holding their ``totals``; a full counter bucket evicts its lowest
        counts."""
        if keys.numel():
            result = insert_keys(self.storage, keys, tags, totals, allow_evict=True)
            self.evictions += int(result.evicted_keys.numel())

    def count_masked(self, keys: torch.Tensor, tags: torch.Tensor | None, counts: torch.Tensor,
                     active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``count`` over ``keys[active]`` with every tensor kept at size u: no host sync.

        Same outcome as ``count(keys[active], ...)`` scattered back to (u,) (admitted
        False where not active), and a (u,) bool mask with one True per counter evicted
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
        return counted.admitted, counted.totals, result.evicted

    def recount_masked(self, keys: torch.Tensor, tags: torch.Tensor | None,
                       totals: torch.Tensor, refused: torch.Tensor) -> None:
        """``recount`` of ``keys[refused]`` with every tensor kept at size u: no host
        sync; the evicted counters are added to ``device_evictions``."""
        from hashrec.table.ops.insert.upsert import upsert_slots  # Triton only

        result = upsert_slots(self.storage, keys, tags, totals, allow_evict=True,
                              active=refused)
        self.device_evictions += result.evicted.sum()

    def state(self, slots: bool = False) -> tuple[torch.Tensor, ...]:
        """(keys (c,) int64, tags (c,) int32, counts (c,) int64) of every live counter, in
        slot order; with ``slots``, also their slots (c,) int64."""
        where = occupied_slots(self.storage, 0, self.storage.capacity)
        state = (self.storage.keys[where], self.storage.tags[where], self.storage.scores[where])
        return (*state, where) if slots else state

    def load_state(self, keys: torch.Tensor, tags: torch.Tensor | None,
                   counts: torch.Tensor, slots: torch.Tensor | None = None) -> None:
        """Sets the counters of unique ``keys`` (a full bucket keeps the highest counts);
        ``slots`` (from ``state(slots=True)`` of a counter table of this size) puts each
        absent key's counter back in its slot where that is empty
        (``hashrec.table.placement``)."""
        if slots is not None and keys.numel():
            rest = ~place_at(self.storage, keys, tags, counts, slots)
            keys, counts = keys[rest], counts[rest]
            tags = None if tags is None else tags[rest]
        slots = find_slots(self.storage, keys, tags)
        hit = slots >= 0
        self.storage.scores[slots[hit]] = counts[hit]
        new = ~hit
        insert_keys(self.storage, keys[new], None if tags is None else tags[new], counts[new],
                    allow_evict=True)

    def nbytes(self) -> int:
        return self.storage.nbytes()
