"""The training lookup with fixed-size tensors: find, admit, insert, score, read.

``HashTable.lookup`` on the Triton backend (CUDA) with rows on the device
(HBM_ONLY) takes this path. Every tensor keeps the batch size u and subsets are
masks, so nothing is read back on the host except what decides growth:

* at ``max_capacity`` the lookup reads nothing back, except the refused count:
  every lookup under ``check_mode`` ERROR, at most once a minute under WARNING
  (whose warnings come at most once a minute anyway);
* below it, one read of two counts per insert round tells whether a bucket
  overflowed (then the table grows and the refused keys retry, as in the
  reference path), plus one read of the admitted count when the load factor may
  pass ``max_load_factor`` in this lookup.

The outcome equals the reference path's (``HashTable._upsert``): same admission,
insert rule, protection of this call's hits, eviction and refusal counts, score
updates and growth. Initializers drawing from a random generator draw u rows
instead of one per new or missing key, so their values (not their distribution)
differ from the reference path's; counter-seeded initializers (``key_seed``) agree.
"""

from __future__ import annotations

import logging
import math
import time

import torch

from hashrec.table.errors import TableFullError
from hashrec.table.initializers import initial_values
from hashrec.table.masked import gather_or, masked_assign_
from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.find import find_slots
from hashrec.table.ops.insert import reference as insert_reference
from hashrec.table.options import CheckMode, InitializerArgs, ScoreStrategy, StorageMode

PROTECTED = torch.iinfo(torch.int64).max
# Seconds between two "inserts refused" warnings of one table (refusals in between
# are summed into the next warning).
REFUSED_WARNING_INTERVAL_S = 60.0
logger = logging.getLogger("hashrec.table.hash_table")


class FixedSizeLookup:
    """Mixin of ``HashTable``: the sync-free training lookup (see the module docstring)."""

    _refused_pending = 0  # refused inserts not yet reported by a warning
    _refused_warned_at = -math.inf
    _refused_unread: torch.Tensor | None = None  # device-side count not yet read (WARNING)
    _refused_read_at = -math.inf

    def _announce_refused(self, refused: int) -> None:
        """Raises (ERROR) or warns (WARNING: at most once a minute, with the count since
        the last warning) about ``refused`` inserts."""
        mode = self.options.check_mode
        if mode is CheckMode.WARNING:
            self._refused_pending += refused
            if time.monotonic() - self._refused_warned_at < REFUSED_WARNING_INTERVAL_S:
                return
            refused, self._refused_pending = self._refused_pending, 0
            self._refused_warned_at = time.monotonic()
        message = (f"table {self.options.name!r}: {refused} inserts refused (their buckets are "
                   f"full at max_capacity={self.options.max_capacity} and hold no entry from "
                   f"before this call with a lower score, "
                   f"score_strategy={self.options.score_strategy.value}); refused keys read as "
                   f"the initializer value. Raise max_capacity or bucket_capacity.")
        if mode is CheckMode.ERROR:
            raise TableFullError(message)
        if mode is CheckMode.WARNING:
            logger.warning(message)

    def _fixed_path(self) -> bool:
        """Whether lookups take the fixed-size path: Triton ops and rows in the index."""
        if self.options.storage_mode is not StorageMode.HBM_ONLY:
            return False
        module = backend("hashrec.table.ops.insert", insert_reference, self.device)
        return module is not insert_reference

    def _upsert_fixed(self, keys: torch.Tensor, tags: torch.Tensor | None,
                      counts: torch.Tensor, given: torch.Tensor | None) -> torch.Tensor:
        """``_upsert(admit=True)`` of unique keys (u,) in fixed sizes; returns slots (u,)."""
        slots = find_slots(self.storage, keys, tags)
        hit = slots >= 0
        self._count_lookups(slots)
        hit_scores = self._hit_scores_fixed(slots, counts, given)
        pending = ~hit
        if self._counter is not None:
            admitted = self._counter.count_masked(keys, tags, counts, pending)
            self._stats["admission_rejected"] += (pending & ~admitted).sum()
            pending = admitted
        # This call's hits are never evicted, and a growth re-inserts them first.
        masked_assign_(self.storage.scores, slots, hit, PROTECTED)
        if self._grow_fixed(pending, keys.numel()):
            slots = torch.where(hit, find_slots(self.storage, keys, tags), -1)
        slots, placed, refused = self._insert_fixed(
            keys, tags, self._new_scores(counts, given), pending, slots, hit)
        masked_assign_(self.storage.scores, slots, hit, hit_scores)
        self._init_rows_fixed(slots, placed, keys, tags)
        self._stats["inserts"] += placed.sum()
        self._report_refused_fixed(refused)
        return slots

    def _hit_scores_fixed(self, slots: torch.Tensor, counts: torch.Tensor,
                          given: torch.Tensor | None) -> torch.Tensor:
        """Scores (u,) the hits get (entries of misses are unused)."""
        if given is not None:
            return given
        if self.options.score_strategy is ScoreStrategy.LFU:
            return gather_or(self.storage.scores, slots, 0) + counts
        return self._now(slots.numel())

    def _grow_fixed(self, pending: torch.Tensor, bound: int) -> bool:
        """Grows for the ``pending`` (u,) inserts like ``_grow_for``; reads the pending
        count only when ``bound`` (>= that count) new entries could pass the limit."""
        if self.storage.num_buckets >= self._max_buckets:
            return False
        if self._size_hint is None:
            self._size_hint = self.size()
        limit = self.options.max_load_factor * self.storage.capacity
        if self._size_hint + bound <= limit:
            return False
        return self._grow_for(int(pending.sum()), self._size_hint)

    def _insert_fixed(self, keys: torch.Tensor, tags: torch.Tensor | None,
                      scores: torch.Tensor, pending: torch.Tensor, slots: torch.Tensor,
                      hit: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int]:
        """Inserts ``pending`` (u,) keys, doubling on a bucket overflow below max_capacity
        like ``_insert``. Returns (slots, placed (u,) bool, refused: a 0-d count, or 0
        when the last round was below max_capacity and placed every key)."""
        from hashrec.table.ops.insert.upsert import upsert_slots  # Triton only

        placed = torch.zeros_like(pending)
        while True:
            at_max = self.storage.num_buckets >= self._max_buckets
            allow = at_max and self.options.score_strategy is not ScoreStrategy.NO_EVICTION
            result = upsert_slots(self.storage, keys, tags, scores, allow, active=pending)
            slots = torch.where(pending, result.slots, slots)
            placed = placed | result.created
            pending = pending & ~result.created
            if allow:
                self._stats["evictions"] += result.evicted.sum()
            if at_max:
                self._size_hint = None  # no growth from here on: the size is not needed
                return slots, placed, pending.sum()
            left, stored = torch.stack([pending.sum(), result.created.sum()]).tolist()
            self._size_hint += stored
            if left == 0:
                return slots, placed, 0
            self._rehash(self.storage.num_buckets * 2)
            slots = torch.where(hit | placed, find_slots(self.storage, keys, tags), slots)

    def _report_refused_fixed(self, refused: torch.Tensor | int) -> None:
        """Counts refused inserts on the device; reads the count for every lookup under
        ERROR, at most once a minute under WARNING, never under IGNORE."""
        mode = self.options.check_mode
        if not isinstance(refused, torch.Tensor) or mode is CheckMode.ERROR:
            self._report_refused(int(refused))
            return
        self._stats["refused"] += refused
        if mode is CheckMode.IGNORE:
            return
        unread = self._refused_unread
        self._refused_unread = refused if unread is None else unread + refused
        if time.monotonic() - self._refused_read_at < REFUSED_WARNING_INTERVAL_S:
            return
        self._refused_read_at = time.monotonic()
        unread, self._refused_unread = int(self._refused_unread), None
        if unread:
            self._announce_refused(unread)

    def _init_rows_fixed(self, slots: torch.Tensor, placed: torch.Tensor, keys: torch.Tensor,
                         tags: torch.Tensor | None) -> None:
        """Initializes the rows of ``placed`` (u,) keys: embedding and optimizer state."""
        from hashrec.table.ops.insert.rows import write_rows  # Triton only

        rows = torch.empty(keys.numel(), self.row_dim, dtype=self.options.dtype,
                           device=self.device)
        rows[:, :self.dim] = initial_values(self._initializer, keys, tags, self.dim,
                                            self.options.dtype, self._generator)
        if self._state_row is not None:
            rows[:, self.dim:] = self._state_row
        write_rows(self.storage.values, slots, placed, rows)

    def _read_fixed(self, slots: torch.Tensor, keys: torch.Tensor, tags: torch.Tensor | None,
                    missing_args: InitializerArgs) -> torch.Tensor:
        """Embeddings (u, dim) float32 of slots; -1 reads as ``missing_args``."""
        stored = self.storage.values[:, :self.dim]
        missing = initial_values(missing_args, keys, tags, self.dim, torch.float32,
                                 self._generator)
        return gather_or(stored, slots, 0).to(torch.float32).where(
            (slots >= 0)[:, None], missing)
