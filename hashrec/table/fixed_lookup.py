"""The training lookup with fixed-size tensors: find, admit, insert, score, read.

``HashTable.lookup`` on the Triton backend (CUDA) with rows on the device
(HBM_ONLY) takes this path, and so do ``find`` (a find and one kernel reading every
row), ``find_or_insert`` (the same work on its unique keys) and the index part of
``insert_or_assign`` / ``load_state`` (no admission; the new rows get the optimizer's
initial state, their embeddings are the caller's). The write calls deduplicate their
batch in fixed sizes (``ops.dedup.unique_pairs_fixed``: the unique count stays on
the device and the keys past it are padding). Every tensor keeps the batch size u and
subsets are masks, so nothing is read back on the host except what decides growth:

* at ``max_capacity`` the lookup reads nothing back, except the refused count:
  every lookup under ``check_mode`` ERROR, at most once a minute under WARNING
  (whose warnings come at most once a minute anyway; on the CPU, after a read that
  found none, a copy of the count a lookup tells when refusals come);
* below it, one read of two counts per insert round tells whether a bucket
  overflowed (then the table grows and the refused keys retry, as in the
  reference path), plus one read of the admitted count when the load factor may
  pass ``max_load_factor`` in this lookup.

Besides find and upsert, a lookup is three kernels: the hits' scores and protection
and the admission count (``ops/insert/train.py``), and one pass that restores the
hits' scores, initializes the new rows and reads every key's embedding
(``ops/insert/finish.py``).

At max_capacity on CUDA the training lookup is replayed from a CUDA graph per size
class of u (``hashrec.table.lookup_graphs``), with the same outcome. Its keys past u
are padding, told apart on the device, so two more kernels serve it: one splits the
find into the masks (hit, pending, taking part) and a flag of whether any key is
pending, and one adds the counters to the table's device totals. Without a pending key
the hits take their new scores in the protect kernel, not after the insert.

The outcome equals the reference path's (``HashTable._upsert``): same admission,
insert rule, protection of this call's hits, eviction and refusal counts, score
updates and growth. UNIFORM and NORMAL initializers without ``key_seed`` draw in
the kernel (Philox, a seed per call from ``options.seed``), so their values (not
their distribution) differ from the reference path's; counter-seeded
initializers (``key_seed``) agree.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.find import find_slots
from hashrec.table.ops.insert import reference as insert_reference
from hashrec.table.options import CheckMode, InitializerArgs, ScoreStrategy, StorageMode
from hashrec.table.storage import PROTECTED

if TYPE_CHECKING:
    from hashrec.table.ops.dedup import FixedUnique



def _no_seed() -> int:
    """The seed of a captured lookup's random initializers: read on the device instead."""
    return 0


class FixedSizeLookup:
    """Mixin of ``HashTable``: the sync-free training lookup (see the module docstring)."""

    _seed_sequence: random.Random | None = None  # seeds of in-kernel random initializers
    # Counter sums not yet in _stats, by the tuple of counter names (_add_device_counts).
    _device_counts: dict[tuple[str, ...], torch.Tensor] | None = None
    # Totals that captured lookups add their counters to in place, by counter names
    # (``_count_in_place``); ``stats()`` reads and zeroes them.
    _device_totals: dict[tuple[str, ...], torch.Tensor] | None = None
    # Captured training lookups (LookupGraphs); False where they are not used.
    _lookup_graphs = None

    def _fixed_path(self) -> bool:
        """Whether lookups take the fixed-size path: Triton ops and rows in the index."""
        if self.options.storage_mode is not StorageMode.HBM_ONLY:
            return False
        module = backend("hashrec.table.ops.insert", insert_reference, self.device)
        return module is not insert_reference

    def _lookup_fixed(self, keys: torch.Tensor, tags: torch.Tensor | None,
                      counts: torch.Tensor | None, given: torch.Tensor | None,
                      train: bool, active: torch.Tensor | None = None,
                      stored_rows: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``lookup`` of keys (u,) in fixed sizes: (slots (u,), values (u, dim)).

        ``active`` (u,) bool: only those keys (unique among themselves) take part; the
        others, which may repeat active ones, read as slot -1 and zero rows.
        ``stored_rows`` False leaves the rows of keys stored before the call out of
        ``values`` (``finish_rows``)."""
        from hashrec.table.ops.insert.finish import finish_rows  # Triton only

        if not train:
            slots, counted = self._find_active(keys, tags, active)
            self._count_in_place(counted, 0)
            values = finish_rows(self.storage, keys, tags, slots, self.dim,
                                 self._row_init(self._eval_initializer, keys, tags),
                                 active=active, stored_rows=stored_rows)
            return slots, values
        graphs = self._graphs_for()
        replayed = graphs.lookup(keys, tags, counts, given, active, stored_rows) \
            if graphs else None
        if replayed is not None:
            return replayed[:2]
        slots, values, counted, refused = self._train_fixed(keys, tags, counts, given, active,
                                                            stored_rows=stored_rows)
        self._add_device_counts(*self._mask_sums(counted))
        self._report_refused_fixed(refused)
        return slots, values

    def _find_or_insert_fixed(self, unique: FixedUnique, given: torch.Tensor | None
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``find_or_insert`` on the fixed-size path of a batch deduplicated by
        ``unique_pairs_fixed`` (``unique``: its ``FixedUnique``; ``given`` (n,) each unique
        key's score or None): the batch's (values (n, dim) float32, found (n,) bool,
        stored before the call). The training lookup's device work (reading back what it
        reads: growth's counts, the refused count), the stored rows read once, by the
        batch (``expand_rows``), the counters added to the device totals in one launch."""
        from hashrec.table.ops.insert.finish import expand_rows  # Triton only

        graphs = self._graphs_for()
        replayed = graphs.lookup(unique.keys, unique.tags, unique.counts, given, None,
                                 stored_rows=False, count=unique.count) if graphs else None
        if replayed is None:
            slots, values, counted, refused = self._train_fixed(
                unique.keys, unique.tags, unique.counts, given, None, stored_rows=False,
                count=unique.count, few_misses=False)
            self._report_refused_fixed(self._count_in_place(counted, refused))
            replayed = slots, values, counted["hits"]
        slots, values, hits = replayed
        values, found = expand_rows(self.storage, slots, hits, values, unique.inverse)
        # The counters above hold the unique keys; stats() counts every key of the batch.
        self._add_device_counts(("lookups", "hits"), torch.stack([
            unique.inverse.numel() - unique.count.reshape(()), found.sum() - hits.sum()]))
        return values, found

    def _assign_slots(self, keys: torch.Tensor, tags: torch.Tensor | None,
                      counts: torch.Tensor, given: torch.Tensor | None,
                      init_rows: bool, count: torch.Tensor | None = None) -> torch.Tensor:
        """The index part of ``insert_or_assign`` / ``load_state`` for unique keys (u,):
        their slots after the call (-1: refused), hits rescored, misses inserted without
        admission, new rows given the optimizer's initial state unless ``init_rows`` is
        False (their embedding columns are the caller's to write). On the fixed-size path,
        device work like the training lookup's (``count`` (1,) int64 on the device, when
        given: only the first ``count`` keys take part, ``unique_pairs_fixed``'s);
        elsewhere the reference upsert."""
        if not self._fixed_path():
            return self._upsert(keys, tags, counts, given, admit=False, init_rows=init_rows)[0]
        graphs = self._graphs_for() if init_rows and count is not None else None
        slots = graphs.assign(keys, tags, counts, given, count) if graphs else None
        if slots is None:
            slots, refused = self._assign_fixed(keys, tags, counts, given, init_rows, count)
            self._report_refused_fixed(refused)
        return slots

    def _assign_fixed(self, keys: torch.Tensor, tags: torch.Tensor | None,
                      counts: torch.Tensor, given: torch.Tensor | None, init_rows: bool,
                      count: torch.Tensor | None, clock: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | int | None]:
        """``_assign_slots``' device work on the fixed-size path: (slots, the refused
        count left to report). ``clock`` (1,) int64 on the device: the STEP / TIMESTAMP
        clock, read there (a captured call) instead of on the host."""
        from hashrec.table.ops.insert.finish import CONSTANT_ROWS, finish_rows
        from hashrec.table.ops.insert.train import found_masks

        slots = find_slots(self.storage, keys, tags)
        if count is not None:  # the padding past the count reads as slot -1, not pending
            slots, hit, pending, _, _ = found_masks(slots, None, count)
        else:
            hit = slots >= 0
            pending = ~hit
        slots, placed, refused, evicted, hit_scores = self._protect_and_insert(
            keys, tags, counts, given, slots, hit, pending, clock, None, few_misses=False)
        # The new rows' state and the hits' scores; no embedding read or written.
        finish_rows(self.storage, keys, tags, slots, self.dim, CONSTANT_ROWS,
                    new=CONSTANT_ROWS, placed=placed, hit=hit, hit_scores=hit_scores,
                    state=self._state_row if init_rows else None, stored_rows=False,
                    embeddings=False)
        if self._tag_counts is not None:
            self._count_by_tag(tags, None, pending > placed)
        counted = {"inserts": placed}
        if evicted is not None:
            counted["evictions"] = evicted
        return slots, self._count_in_place(counted, refused)

    def _write_assigned(self, slots: torch.Tensor, rows: torch.Tensor,
                        source: torch.Tensor | None, scores: torch.Tensor | None) -> None:
        """Writes rows (n, w) from column 0 of the stored ``slots`` (u,) (-1: refused):
        slot i gets row ``source[i]`` (None: row i) and, with ``scores`` (n,), its score.
        On the fixed-size path one kernel, nothing read back; elsewhere the row store's
        write of the stored slots alone."""
        if self._fixed_path():
            from hashrec.table.ops.insert.rows import assign_rows  # Triton only

            assign_rows(self.storage.values, slots, rows, source, scores,
                        self.storage.scores if scores is not None else None)
            return
        stored = torch.nonzero(slots >= 0).flatten()
        if source is None and stored.numel() == slots.numel():
            self._write_full(slots, rows, scores)
            return
        source = stored if source is None else source[stored]
        self._write_full(slots[stored], rows.index_select(0, source),
                         scores[source] if scores is not None else None)

    def _train_fixed(self, keys: torch.Tensor, tags: torch.Tensor | None,
                     counts: torch.Tensor, given: torch.Tensor | None,
                     active: torch.Tensor | None, seeds: torch.Tensor | None = None,
                     out_at: torch.Tensor | None = None, stored_rows: bool = True,
                     clock: torch.Tensor | None = None, count: torch.Tensor | None = None,
                     few_misses: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor],
                                torch.Tensor | int]:
        """The training lookup's device work: (slots, values, the counters' (u,) masks by
        name, refused count). ``seeds`` (2,) int64 on the device: the random
        initializers' seeds are read there (a captured lookup) instead of drawn.
        ``out_at``: the values go where it says (``finish_rows``); values is None.
        ``count`` (1,) int64 on the device: only the first ``count`` keys take part
        (with ``active``, those of them it marks); whether any key is pending insertion
        is then computed on the device, and without one the hits take their new scores
        at once instead of being protected and restored (``protect_hits``). ``clock``
        (1,) int64 on the device: the STEP / TIMESTAMP clock, read there (a captured
        lookup) instead of on the host. ``few_misses``: at max_capacity the misses are
        expected to be few (a warm table's training lookup; ``_insert_fixed``)."""
        from hashrec.table.ops.insert.finish import finish_rows
        from hashrec.table.ops.insert.train import found_masks

        any_pending = None
        if count is not None:  # one kernel splits the find into the masks
            found = found_masks(find_slots(self.storage, keys, tags), active, count)
            slots, hit, pending, active, any_pending = found
            counted = {"hits": hit, "lookups": active}
        else:
            slots, counted = self._find_active(keys, tags, active)
            hit = counted["hits"]
            pending = ~hit if active is None else active & ~hit
        totals = None  # the counter's counts, the new keys' LFU scores
        if self._counter is not None:
            admitted, totals, counter_evicted = self._counter.count_masked(keys, tags, counts,
                                                                           pending)
            counted["admission_rejected"] = pending > admitted  # pending and not admitted
            counted["counter_evictions"] = counter_evicted
            pending = admitted
            if any_pending is not None:  # the admission, not the find, tells what is pending
                any_pending = pending.any()
        slots, placed, refused, evicted, hit_scores = self._protect_and_insert(
            keys, tags, counts, given, slots, hit, pending, clock, any_pending, few_misses,
            totals)
        # Below max_capacity the table grew for every admitted key.
        if self._recounts_refused() and self.storage.num_buckets >= self._max_buckets:
            self._counter.recount_masked(keys, tags, totals, pending > placed)
        if self._tag_counts is not None:  # pending > placed: refused (none below max_capacity)
            self._count_by_tag(tags, counted.get("admission_rejected"), pending > placed)
        seed = self._kernel_seed if seeds is None else _no_seed
        values = finish_rows(
            self.storage, keys, tags, slots, self.dim,
            self._row_init(self._train_missing_args(), keys, tags, seed),
            new=self._row_init(self._initializer, keys, tags, seed), placed=placed, hit=hit,
            hit_scores=hit_scores, state=self._state_row, seeds=seeds, active=active,
            out_at=out_at, stored_rows=stored_rows, guard=any_pending)
        counted["inserts"] = placed
        if evicted is not None:
            counted["evictions"] = evicted
        return slots, values, counted, refused

    def _protect_and_insert(self, keys: torch.Tensor, tags: torch.Tensor | None,
                            counts: torch.Tensor, given: torch.Tensor | None,
                            slots: torch.Tensor, hit: torch.Tensor, pending: torch.Tensor,
                            clock: torch.Tensor | None, guard: torch.Tensor | None,
                            few_misses: bool, totals: torch.Tensor | None = None) -> tuple:
        """The write calls' middle: the ``hit`` keys protected, then the ``pending`` ones
        inserted (``_insert_fixed``), growing first where the table may. Returns
        (slots, placed, refused, evicted, the hits' scores after the call, for
        ``finish_rows``). ``clock`` as ``_train_fixed``'s; ``guard`` as ``protect_hits``';
        ``totals``: the admission counter's counts, the new keys' LFU scores (None:
        ``counts``)."""
        from hashrec.table.ops.insert.train import protect_hits

        mode, host_clock = self._hit_score_mode(given)
        # This call's hits are never evicted; they get their new scores at the end (at once
        # when ``guard`` says nothing is inserted).
        hit_scores = protect_hits(self.storage, slots, counts, given, mode,
                                  host_clock if clock is None else clock, guard=guard)
        if clock is not None:
            given = clock.expand(keys.numel())  # the new keys' scores
        if self._grow_fixed(pending, keys.numel()):  # re-inserts the (protected) hits first
            slots = torch.where(hit, find_slots(self.storage, keys, tags), -1)
        slots, placed, refused, evicted = self._insert_fixed(
            keys, tags, self._new_scores(counts if totals is None else totals, given), pending,
            slots, hit, few_misses)
        return slots, placed, refused, evicted, hit_scores

    def _find_active(self, keys: torch.Tensor, tags: torch.Tensor | None,
                     active: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """(slots (u,), -1 where absent or inactive; the counters' masks so far: hits,
        and lookups when only the active keys count)."""
        slots = find_slots(self.storage, keys, tags)
        if active is not None:
            slots = torch.where(active, slots, -1)
        counted = {"hits": slots >= 0}  # counters added from masks, all in one reduction
        if active is None:
            self._stats["lookups"] += slots.numel()
        else:
            counted["lookups"] = active
        return slots, counted

    def _graphs_for(self):
        """This table's captured lookups (``LookupGraphs``, which judge each lookup), or
        None where they are not used (not CUDA, or switched off) or the table may
        still grow."""
        from hashrec.table.lookup_graphs import LookupGraphs, graphs_enabled

        if self._lookup_graphs is None:
            self._lookup_graphs = LookupGraphs(self) if graphs_enabled(self.device) else False
        if not self._lookup_graphs or self.storage.num_buckets < self._max_buckets:
            return None
        return self._lookup_graphs

    @staticmethod
    def _mask_sums(masks: dict[str, torch.Tensor]) -> tuple[tuple[str, ...], torch.Tensor]:
        """(counter names, the (u,) bool masks' True counts): one stack and one sum."""
        return tuple(masks), torch.stack(list(masks.values())).sum(1)

    def _add_device_counts(self, names: tuple[str, ...], sums: torch.Tensor) -> None:
        """Adds ``sums`` to the counters ``names``, kept on the device until ``stats()``
        reads them."""
        if self._device_counts is None:
            self._device_counts = {}
        before = self._device_counts.get(names)
        self._device_counts[names] = sums if before is None else before + sums

    def _count_in_place(self, counted: dict[str, torch.Tensor],
                        refused: torch.Tensor | int) -> torch.Tensor | int | None:
        """Adds one lookup's counters (``_train_fixed``'s masks) to this table's device
        totals in place: what a captured lookup does, so that its replay leaves the host
        nothing to count. The refused count joins them, except under ``check_mode``
        ERROR, which reads it at every lookup.

        Returns the refused count the caller still reports (``_report_refused_fixed``):
        None when it is in the totals."""
        from hashrec.table.ops.insert.train import add_mask_counts  # Triton only

        names, masks, left, extra = tuple(counted), list(counted.values()), refused, None
        if isinstance(refused, torch.Tensor) and self.options.check_mode is not CheckMode.ERROR:
            names, left, extra = (*names, "refused"), None, refused
        totals = self._device_totals = self._device_totals or {}
        if names not in totals:  # allocated by the uncaptured run before any capture
            device = masks[0].device
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("device totals must exist before a lookup is captured")
            totals[names] = torch.zeros(len(names), dtype=torch.int64, device=device)
        add_mask_counts(totals[names], masks, extra)
        return left

    def _fold_device_counts(self) -> None:
        """Moves the device-side counts of ``_add_device_counts`` and the device totals
        into ``_stats`` (one read per set of counter names); zeroes the totals."""
        for names, sums in (self._device_counts or {}).items():
            for name, value in zip(names, sums.tolist()):
                self._stats[name] += value
        self._device_counts = None
        for names, totals in (self._device_totals or {}).items():
            values = totals.tolist()
            totals.zero_()
            for name, value in zip(names, values):
                self._stats[name] += value
            if names[-1] == "refused":
                self._refused_unannounced += values[-1]

    def _hit_score_mode(self, given: torch.Tensor | None) -> tuple[int, int]:
        """(protect_hits mode, clock) of this table's score strategy."""
        from hashrec.table.ops.insert.train import SCORE_CLOCK, SCORE_GIVEN, SCORE_LFU

        if given is not None:
            return SCORE_GIVEN, 0
        if self.options.score_strategy is ScoreStrategy.LFU:
            return SCORE_LFU, 0
        return SCORE_CLOCK, self._clock()

    def _row_init(self, args: InitializerArgs, keys: torch.Tensor, tags: torch.Tensor | None,
                  seed=None):
        """``finish_rows``' form of an initializer for this batch (random modes draw a
        fresh kernel seed from ``seed``, by default the table's seed sequence)."""
        from hashrec.table.ops.insert.finish import init_spec

        return init_spec(args, keys, tags, self.dim, seed or self._kernel_seed,
                         self._generator)

    def _kernel_seed(self) -> int:
        """Next seed of the in-kernel random initializers: a host-side sequence (no device
        read) started from ``options.seed``, or without one from a single draw of torch's
        global CPU generator."""
        if self._seed_sequence is None:
            start = self.options.seed
            if start is None:
                start = int(torch.randint(0, 2 ** 62, (1,)).item())
            self._seed_sequence = random.Random(start)
        return self._seed_sequence.randrange(2 ** 31 - 1)

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
                      hit: torch.Tensor, few_misses: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int,
                                 torch.Tensor | None]:
        """Inserts ``pending`` (u,) keys, doubling on a bucket overflow below max_capacity
        like ``_insert``. ``few_misses`` (a training lookup of a warm table): at
        max_capacity the upsert places the misses with a few persistent programs
        (``upsert_slots``'s ``few_misses``); the table's own find_or_insert and
        insert_or_assign, whose batches may be mostly new, take its lane form (on an
        H200 a 1M-key call of half new keys spent 0.42 ms in the persistent programs,
        where the lane form takes 0.13: ``benchmarks/results/table_api_gpu.md``).
        Returns (slots, placed (u,) bool, refused: a 0-d count, or 0 when the last
        round was below max_capacity and placed every key, evicted: (u,) bool over the
        insert's sorted order, or None when nothing could be evicted)."""
        from hashrec.table.ops.insert.upsert import upsert_slots  # Triton only

        placed = earlier = None  # earlier: placed before a growth, protected since
        while True:
            at_max = self.storage.num_buckets >= self._max_buckets
            allow = at_max and self.options.score_strategy is not ScoreStrategy.NO_EVICTION
            # At max_capacity the upsert keeps the other keys' slots and counts the refused
            # keys itself, where torch would take three launches after it.
            result = upsert_slots(self.storage, keys, tags, scores, allow, active=pending,
                                  given_slots=slots if at_max else None,
                                  few_misses=at_max and few_misses)
            placed = result.created if placed is None else placed | result.created
            if at_max:
                self._size_hint = None  # no growth from here on: the size is not needed
                self._unprotect(earlier, result.slots, scores)
                return (result.slots, placed, result.refused[0],
                        result.evicted if allow else None)
            slots = torch.where(pending, result.slots, slots)
            pending = pending > result.created  # pending and not created
            left, stored = torch.stack([pending.sum(), result.created.sum()]).tolist()
            self._size_hint += stored
            if left == 0:
                self._unprotect(earlier, slots, scores)
                return slots, placed, 0, None
            # The keys placed so far are not evicted by the growth or the rounds after it
            # (as the call's hits are not); a growth reads back on the host already.
            earlier = placed
            self.storage.scores[slots[earlier]] = PROTECTED
            self._rehash(self._next_bucket_count())
            slots = torch.where(hit | placed, find_slots(self.storage, keys, tags), slots)

    def _unprotect(self, earlier: torch.Tensor | None, slots: torch.Tensor,
                   scores: torch.Tensor) -> None:
        """The ``earlier`` (u,) keys (placed before a growth, None: none) at ``slots``
        get their ``scores`` back."""
        if earlier is not None:
            self.storage.scores[slots[earlier]] = scores[earlier]
