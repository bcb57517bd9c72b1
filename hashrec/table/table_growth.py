"""Growth of a ``HashTable``: rehashing into more buckets, and inserting with growth.

``TableGrowth`` is a mixin of ``HashTable`` (its growth half): the table grows before
it evicts, up to ``max_capacity`` (see ``hashrec.table.hash_table``); an insert whose
keys overflow a bucket grows the table and places the rest again.
"""

from __future__ import annotations

import logging

import torch

from hashrec.table.capacity import next_buckets
from hashrec.table.fixed_lookup import PROTECTED as _PROTECTED
from hashrec.table.ops.find import find_slots
from hashrec.table.ops.insert import insert_keys
from hashrec.table.ops.rehash import rehash
from hashrec.table.options import ScoreStrategy

logger = logging.getLogger("hashrec.table.hash_table")


class TableGrowth:
    """Mixin of ``HashTable``: the bucket count, rehashing and the growing insert."""

    def _next_bucket_count(self) -> int:
        return next_buckets(self.storage.num_buckets, self._max_buckets)

    def _rehash(self, num_buckets: int, note: bool = True) -> None:
        """Moves every entry into ``num_buckets`` buckets; ``note``: log the growth (one
        INFO line where inserts grew it; a restore or an export says what it does itself)."""
        old = self.storage
        self.storage = rehash(old, num_buckets)
        self._rows.regrow(old, self.storage)
        self._stats["growths"] += 1
        self.version += 1
        if note:
            self._note_growth(old.num_buckets, num_buckets)

    def _note_growth(self, before: int, after: int) -> None:
        """One INFO line on a growth from ``before`` to ``after`` buckets; one by more than
        twice says why (the bucket counts on the way divide max_capacity's)."""
        o, slots = self.options, self.storage.bucket_capacity
        limit = f"max_capacity {o.max_capacity}"
        if o.whole_max_capacity is not None:
            limit += f" on this rank, {o.whole_max_capacity} over all ranks"
        why = ""
        if after > 2 * before:
            why = (f"; x{after // before} at once: max_capacity's {self._max_buckets} buckets of "
                   f"{slots} have no smaller multiple of {before}. A max_capacity (of a fused "
                   f"storage: its tables' sum) of {before * slots} * 2**k slots grows by doubling")
        logger.info("table %r grew from %d to %d slots (%s)%s", o.name, before * slots,
                    after * slots, limit, why)

    def grow_to(self, num_buckets: int) -> bool:
        """Grows to ``num_buckets`` where that is on the table's way to max_capacity (a
        multiple of its bucket count that divides max_capacity's); returns whether the
        table now has that many buckets. A restore grows an empty table to the count it
        was saved from, so that its rows go back to their slots."""
        current = self.storage.num_buckets
        if num_buckets != current and (num_buckets < current or num_buckets % current
                                       or self._max_buckets % num_buckets):
            return False
        if num_buckets != current:
            self._rehash(num_buckets, note=False)
        return True

    def grow_past_max_capacity(self) -> int:
        """Allocates twice the buckets of ``max_capacity`` (or of the last such growth),
        the table's limit from then on (it evicts there again); returns the slots now
        allocated.

        For tables nothing trains: a restore for evaluation or export
        (``restore_checkpoint(keep_every_row=True)``) grows a table whose buckets cannot
        hold every row of a nearly full checkpoint, because the keys spread over them
        otherwise under another number of ranks. Every entry keeps its row and score.
        """
        num_buckets = self._max_buckets * 2  # a multiple of the count on the way to it
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
            self._rehash(next_buckets(self.storage.num_buckets, self._max_buckets))
            rehashed = True
            placed = torch.nonzero(slots >= 0).flatten()
            slots[placed] = find_slots(self.storage, keys[placed], take(tags, placed))
            self.storage.scores[slots[placed]] = _PROTECTED
        if placed is not None:
            self.storage.scores[slots[placed]] = scores[placed]
        return slots, rehashed


def take(tensor: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """``tensor[index]``, or None for no tensor (tags of an untagged table)."""
    return None if tensor is None else tensor[index]
