"""Growth of a ``HashTable``: rehashing into more buckets, and inserting with growth.

``TableGrowth`` is a mixin of ``HashTable`` (its growth half): the table grows before
it evicts, up to ``max_capacity`` (see ``hashrec.table.hash_table``); an insert whose
keys overflow a bucket grows the table and places the rest again.
"""

from __future__ import annotations

import logging

import torch

from hashrec.table.capacity import next_buckets
from hashrec.table.ops.find import find_slots
from hashrec.table.ops.insert import insert_keys
from hashrec.table.ops.rehash import rehash
from hashrec.table.ops.rehash.reference import RehashOverflow
from hashrec.table.options import ScoreStrategy
from hashrec.table.storage import PROTECTED as _PROTECTED

logger = logging.getLogger("hashrec.table.hash_table")


class TableGrowth:
    """Mixin of ``HashTable``: the bucket count, rehashing and the growing insert."""

    def _next_bucket_count(self) -> int:
        return next_buckets(self.storage.num_buckets, self._max_buckets)

    def _rehash(self, num_buckets: int, note: bool = True) -> None:
        """Moves every entry into ``num_buckets`` buckets (a last growth to a count that is
        no multiple may drop the lowest-scored entries of crowded buckets: evictions);
        ``note``: log the growth (one INFO line where inserts grew it; a restore or an
        export says what it does itself)."""
        old = self.storage
        try:
            grown = rehash(old, num_buckets)
        except RehashOverflow:
            num_buckets = self._split_instead(num_buckets)
            if num_buckets == old.num_buckets:
                return
            grown = rehash(old, num_buckets)
        dropped = 0
        if num_buckets % old.num_buckets:
            dropped = int(torch.count_nonzero(old.digests) - torch.count_nonzero(grown.digests))
        self.storage = grown
        self._rows.regrow(old, self.storage)
        self._stats["growths"] += 1
        self._stats["evictions"] += dropped
        self.version += 1
        if note:
            self._note_growth(old.num_buckets, num_buckets, dropped)

    def _split_instead(self, num_buckets: int) -> int:
        """The count a growth to ``num_buckets`` takes where that would drop entries an
        insert holds: the largest multiple of the count now below it, or, where there is
        none, the count now, which becomes the table's limit (a WARNING says so)."""
        current = self.storage.num_buckets
        if num_buckets // current >= 2:
            return num_buckets // current * current
        slots = self.storage.bucket_capacity
        logger.warning(
            "table %r stays at %d slots (max_capacity %d): its buckets of %d slots cannot "
            "take the entries this lookup holds at %d buckets; a larger bucket_capacity "
            "spreads them", self.options.name, current * slots, self.options.max_capacity,
            slots, num_buckets)
        self._max_buckets = current
        return current

    def _note_growth(self, before: int, after: int, dropped: int) -> None:
        """One INFO line on a growth from ``before`` to ``after`` buckets, naming the
        entries a last growth dropped from crowded buckets."""
        o, slots = self.options, self.storage.bucket_capacity
        limit = f"max_capacity {o.max_capacity}"
        if o.whole_max_capacity is not None:
            limit += f" on this rank, {o.whole_max_capacity} over all ranks"
        why = ""
        if dropped:
            why = (f"; {dropped} lowest-scored entries evicted: their new buckets of {slots} "
                   "slots got more entries than slots")
        logger.info("table %r grew from %d to %d slots (%s)%s", o.name, before * slots,
                    after * slots, limit, why)

    def grow_to(self, num_buckets: int) -> bool:
        """Grows an empty table to ``num_buckets`` where that is between its count and
        max_capacity's; returns whether the table now has that many buckets. A restore
        grows an empty table to the count it was saved from, so that its rows go back to
        their slots."""
        current = self.storage.num_buckets
        if num_buckets != current and (not current < num_buckets <= self._max_buckets
                                       or int(self.size()) != 0):
            return False
        if num_buckets != current:
            self._rehash(num_buckets, note=False)
        return True

    def grow_past_max_capacity(self) -> int:
        """Allocates twice the buckets of ``max_capacity`` (or of the last such growth; the
        least multiple of the count now from there), the table's limit from then on (it
        evicts there again); returns the slots now allocated.

        For tables nothing trains: a restore for evaluation or export
        (``restore_checkpoint(keep_every_row=True)``) grows a table whose buckets cannot
        hold every row of a nearly full checkpoint, because the keys spread over them
        otherwise under another number of ranks. Every entry keeps its row and score.
        """
        current = self.storage.num_buckets  # a multiple of it: a split, which drops nothing
        num_buckets = -(-self._max_buckets * 2 // current) * current
        self._max_buckets = num_buckets
        self._rehash(num_buckets, note=False)
        return self.storage.capacity

    def _grow_for(self, incoming: int, size: int | None = None) -> bool:
        grown = False
        limit = self.options.max_load_factor
        num_buckets = self.storage.num_buckets
        size = self.size() if size is None and num_buckets < self._max_buckets else size
        while (num_buckets < self._max_buckets
               and size + incoming > limit * num_buckets * self.storage.bucket_capacity):
            num_buckets = next_buckets(num_buckets, self._max_buckets)
            grown = True
        if grown:
            self._rehash(num_buckets)
        return grown

    def _insert(self, keys: torch.Tensor, tags: torch.Tensor | None,
                scores: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Inserts absent unique keys, growing before evicting; returns (slots, rehashed).
        Keys placed before a growth are not evicted by the rounds after it (as the
        call's hits are not): they hold the protected score until the last round."""
        rehashed = self._grow_for(keys.numel())
        slots = torch.full_like(keys, -1)
        pending = torch.arange(keys.numel(), device=self.device)
        placed = None
        while True:
            at_max = self.storage.num_buckets >= self._max_buckets
            allow = at_max and self.options.score_strategy is not ScoreStrategy.NO_EVICTION
            result = insert_keys(self.storage, keys[pending], take(tags, pending),
                                 scores[pending], allow)
            slots[pending] = result.slots
            self._stats["evictions"] += int(result.evicted_keys.numel())
            pending = pending[result.slots < 0]
            if at_max or pending.numel() == 0:
                break
            placed = torch.nonzero(slots >= 0).flatten()
            self.storage.scores[slots[placed]] = _PROTECTED  # kept by the growth too
            self._rehash(next_buckets(self.storage.num_buckets, self._max_buckets))
            rehashed = True
            slots[placed] = find_slots(self.storage, keys[placed], take(tags, placed))
        if placed is not None:
            self.storage.scores[slots[placed]] = scores[placed]
        return slots, rehashed


def take(tensor: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """``tensor[index]``, or None for no tensor (tags of an untagged table)."""
    return None if tensor is None else tensor[index]
