"""Exporting and restoring a ``HashTable``'s state: entries, full rows, admission counters.

``TableState`` is a mixin of ``HashTable`` (its export and checkpoint half): the
exports read the occupied slots a batch of slots at a time, and the loads go through
the table's own write path (``_assign``) and admission counter.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from hashrec.table.errors import TableError
from hashrec.table.ops.export import occupied_slots
from hashrec.table.placement import place_at
from hashrec.table.storage import PROTECTED as _PROTECTED
from hashrec.table.unique import unique_pairs
from hashrec.table.validation import check_matrix, check_vector

_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


class TableState:
    """Mixin of ``HashTable``: exports of its entries and rows, and their loads."""

    def _export_slots(self, batch_size: int) -> Iterator[torch.Tensor]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is not valid; allowed: an int >= 1")
        version = self.version
        for start in range(0, self.storage.capacity, batch_size):
            if self.version != version:  # growth moved every entry: the rest would be lost
                raise TableError(
                    f"table {self.options.name!r}: the table grew while being exported, which "
                    f"moves every entry; export it again with no writes between the batches")
            slots = occupied_slots(self.storage, start,
                                   min(start + batch_size, self.storage.capacity))
            if slots.numel():
                yield slots

    def export_batch(self, batch_size: int, tag: int | None = None
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yields (keys (k,), values (k, dim) float32, scores (k,)) with k <= batch_size.

        ``tag`` (an int32 namespace) keeps only that namespace; batches left empty by it
        are skipped. The table must not change while iterating (a growth in between
        raises ``TableError``).
        """
        tag = self._checked_tag(tag)
        for slots in self._export_slots(batch_size):
            if tag is not None:
                slots = slots[self.storage.tags[slots] == tag]
                if slots.numel() == 0:
                    continue
            yield (self.storage.keys[slots],
                   self._rows.read(slots, 0, self.dim, admit=False).to(torch.float32),
                   self.storage.scores[slots])

    def _checked_tag(self, tag: object) -> int | None:
        if tag is None:
            return None
        name = self.options.name
        if isinstance(tag, bool) or not isinstance(tag, int):
            raise TypeError(f"table {name!r}: tag={tag!r} is not valid; allowed: None or an "
                            f"int (a namespace of the fused table)")
        if not _INT32_MIN <= tag <= _INT32_MAX:
            raise ValueError(f"table {name!r}: tag={tag!r} is not valid; allowed: an int in "
                             f"[{_INT32_MIN}, {_INT32_MAX}] (tags are int32)")
        return tag

    def export_state(self, batch_size: int, slots: bool = False
                     ) -> Iterator[tuple[torch.Tensor, ...]]:
        """Yields (keys, tags, rows (k, row_dim), scores): full rows for checkpoints, in
        slot order; with ``slots``, also each entry's slot (for ``load_state(slots=)``)."""
        for where in self._export_slots(batch_size):  # one compaction, four gathers
            storage = self.storage
            state = (storage.keys.index_select(0, where), storage.tags.index_select(0, where),
                     self._rows.read(where, 0, self.row_dim, admit=False),
                     storage.scores.index_select(0, where))
            yield (*state, where) if slots else state

    def load_state(self, keys: torch.Tensor, tags: torch.Tensor | None, rows: torch.Tensor,
                   scores: torch.Tensor, assume_unique: bool = False,
                   slots: torch.Tensor | None = None) -> None:
        """insert_or_assign of full rows (embedding + optimizer state) with their scores.

        Args:
            keys: (n,) int64; with duplicates the last one wins.
            tags: (n,) int32 namespaces or None.
            rows: (n, row_dim) full rows.
            scores: (n,) int64 scores stored as given.
            assume_unique: the caller guarantees that the (key, tag) pairs of this call
                are unique (checkpoint shards are, by construction); skips the
                deduplication. Duplicates passed with True corrupt the index.
            slots: (n,) int64 the slots the entries held when exported
                (``export_state(slots=True)``) from a table of this bucket count and
                bucket size, with ``assume_unique``: each key absent from this table
                goes back to its slot where that slot is empty, in its bucket (an exact
                layout: ties of equal scores evict as they would have); the others are
                placed as inserts place them (``hashrec.table.placement``).
        """
        keys, tags = self._keys(keys, tags)
        self._check_row_width(rows)
        rows = check_matrix(self.options.name, "rows", rows, keys.numel(), self.row_dim,
                            self.device)
        scores = check_vector(self.options.name, "scores", scores, torch.int64, self.device,
                              keys.numel())
        scores = scores.clamp(max=_PROTECTED - 1)
        self._operation = "load_state"
        if slots is not None and keys.numel():
            if not assume_unique:
                raise ValueError(f"table {self.options.name!r}: load_state places rows at "
                                 f"their slots only with assume_unique=True")
            slots = check_vector(self.options.name, "slots", slots, torch.int64, self.device,
                                 keys.numel())
            placed = place_at(self.storage, keys, tags, scores, slots)
            self._size_hint = None
            self._rows.begin_batch()
            self._write_full(slots[placed], rows[placed], None)
            if bool(placed.all()):
                return
            rest = ~placed
            keys, rows, scores = keys[rest], rows[rest], scores[rest]
            tags = None if tags is None else tags[rest]
        self._assign(keys, tags, rows, scores, exact=True, assume_unique=bool(assume_unique))

    def _check_row_width(self, rows: object) -> None:
        """ValueError explaining row_dim when ``rows`` is a matrix of another width. Equal
        widths of another dim / optimizer are not detectable here: the checkpoint layer
        compares its metadata (dims, optimizer) before loading."""
        if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or \
                rows.shape[1] == self.row_dim:
            return
        opts = self.options
        optimizer = "none" if opts.optimizer is None else type(opts.optimizer).__name__
        raise ValueError(
            f"table {opts.name!r}: rows must be (n, row_dim={self.row_dim}) with row_dim = "
            f"dim {opts.dim} + {opts.state_dim} optimizer state columns (optimizer "
            f"{optimizer}), got {rows.shape[1]} columns: the rows come from a table with "
            f"another dim or optimizer. Load rows that this table's export_state wrote, or "
            f"build the table with the dim and optimizer of the saved one")

    def admission_state(self, slots: bool = False) -> tuple[torch.Tensor, ...]:
        """(keys, tags, counts) of the admission counters (empty without admission); with
        ``slots``, also each counter's slot in the counter table."""
        if self._counter is None:
            empty = torch.empty(0, dtype=torch.int64, device=self.device)
            state = (empty, empty.to(torch.int32), empty)
            return (*state, empty) if slots else state
        return self._counter.state(slots)

    def load_admission_state(self, keys: torch.Tensor, tags: torch.Tensor | None,
                             counts: torch.Tensor, slots: torch.Tensor | None = None) -> None:
        """Restores admission counters of unique (key, tag) pairs with counts >= 1;
        ``slots`` (from ``admission_state(slots=True)`` of a counter table of this size)
        puts each back in its slot where that is empty (see ``load_state``)."""
        keys, tags = self._keys(keys, tags)
        name = self.options.name
        counts = check_vector(name, "counts", counts, torch.int64, self.device, keys.numel())
        if keys.numel() and bool((counts < 1).any()):
            raise ValueError(f"table {name!r}: admission counts must be >= 1, got "
                             f"{int(counts.min())}; load what admission_state() returned")
        if unique_pairs(keys, tags)[0].numel() != keys.numel():
            raise ValueError(f"table {name!r}: admission state has repeated (key, tag) "
                             f"pairs; each key has one counter: load what admission_state() "
                             f"returned")
        if self._counter is None:
            if keys.numel():
                raise TableError(f"table {self.options.name!r} has no admission; cannot load "
                                 f"{keys.numel()} admission counters")
            return
        if slots is not None:
            slots = check_vector(name, "slots", slots, torch.int64, self.device, keys.numel())
        self._counter.load_state(keys, tags, counts, slots)

    def random_state(self) -> dict | None:
        """Where the table's random initial values come from next, to put back with
        ``set_random_state`` (a resumed run then draws what an uninterrupted one would
        have): ``generator``, the state of its own generator (``TableOptions.seed``),
        and ``kernel_seeds``, the state of the seed sequence of the Triton path's
        in-kernel initializers once started. None when there is neither (the table
        draws from torch's default generator, whose state is the caller's to keep)."""
        state = {}
        if self._generator is not None:
            state["generator"] = self._generator.get_state()
        if self._seed_sequence is not None:
            version, internal, gauss = self._seed_sequence.getstate()
            state["kernel_seeds"] = [version, list(internal), gauss]
        return state or None

    def set_random_state(self, state: dict) -> None:
        """Puts back a ``random_state()``.

        Raises:
            TableError: the state holds a generator's and this table has no generator
                of its own (``TableOptions.seed`` differs from the saved table's).
        """
        if "generator" in state:
            if self._generator is None:
                raise TableError(f"table {self.options.name!r} has no generator of its own "
                                 f"(TableOptions.seed is None); the state is from a table "
                                 f"with one")
            self._generator.set_state(state["generator"])
        if "kernel_seeds" in state:
            version, internal, gauss = state["kernel_seeds"]
            self._seed_sequence = random.Random()
            self._seed_sequence.setstate((version, tuple(internal), gauss))
