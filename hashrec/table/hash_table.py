"""HashTable: a dynamic embedding table over a bucketed, scored hash index.

Scores: larger is more important; a full bucket evicts its smallest score unless
the incoming key's score is smaller still (then the insert is refused). STEP
scores are the table's step at the last access, TIMESTAMP the wall clock in
microseconds, LFU the access count, CUSTOMIZED the caller's score; NO_EVICTION
scores like STEP but refuses instead of evicting.

Capacity starts at ``init_capacity`` and grows (rehashing, losing nothing) when
the load factor would pass ``max_load_factor`` or a bucket overflows, up to
``max_capacity``; only then do inserts evict. Growth doubles the bucket count, the
last growth going to max_capacity's exactly (where that is no multiple of the count,
crowded buckets evict as inserts at max_capacity do: ``hashrec.table.capacity``). Rows are
``[embedding | optimizer state]``. Where rows live follows ``options.storage_mode`` (see
``hashrec.table.tiers``): HBM_ONLY keeps them on ``options.device``; HYBRID
splits them by bucket between the device and pinned host memory; CACHING keeps
all of them in host memory and the hot ones in a device cache. The index stays
on the device and decides admission, eviction and growth the same way in every
mode, so the modes give the same lookups, updates and exports.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import NamedTuple

import torch

from hashrec.table.admission import AdmissionCounter
from hashrec.table.capacity import initial_buckets
from hashrec.table.errors import TableError
from hashrec.table.fixed_lookup import FixedSizeLookup
from hashrec.table.initializers import initial_values
from hashrec.table.ops.erase import erase_slots
from hashrec.table.ops.find import find_slots
from hashrec.table.options import InitializerArgs, InitializerMode, ScoreStrategy, TableOptions
from hashrec.table.storage import PROTECTED as _PROTECTED
from hashrec.table.storage import TableStorage
from hashrec.table.table_growth import TableGrowth
from hashrec.table.table_growth import take as _take
from hashrec.table.table_refusals import TableRefusals
from hashrec.table.table_report import TableReport
from hashrec.table.table_state import TableState
from hashrec.table.tiers import index_row_dim, make_row_store
from hashrec.table.unique import unique_pairs
from hashrec.table.validation import (
    build_device,
    check_matrix,
    check_optional_vector,
    check_vector,
    checked_lr,
    checked_step,
    input_checks_forced,
)

logger = logging.getLogger(__name__)


class LookupResult(NamedTuple):
    """slots (u,) int64 (-1 = not stored), values (u, dim) float32, and the table's
    ``version`` after the lookup.

    The slots address rows until the table changes them: growth (a rehash, which bumps
    ``HashTable.version``) moves every entry; a later write call at max_capacity
    (``lookup(train=True)``, ``find_or_insert``, ``insert_or_assign``, ``load_state``)
    may evict a key and give its slot to another; ``erase`` frees slots. Pass
    ``version`` to ``apply_gradients`` to have slots from before a growth refused;
    eviction and erase are not detected (apply the gradients before the next write).
    """

    slots: torch.Tensor
    values: torch.Tensor
    version: int = -1


class HashTable(FixedSizeLookup, TableGrowth, TableState, TableRefusals, TableReport):
    """Dynamic embedding table (see the module docstring for scores and growth).

    Args:
        options: TableOptions of this table.
    """

    def __init__(self, options: TableOptions) -> None:
        if not isinstance(options, TableOptions):
            raise ValueError(f"options={options!r} is not valid; allowed: TableOptions")
        self.options = options
        self.dim = options.dim
        self.row_dim = options.row_dim
        self.device = build_device(options)
        self.step = 0
        initial, self._max_buckets = initial_buckets(options)
        self.version = 0  # bumped by growth, which moves every slot (LookupResult.version)
        self.storage = TableStorage.empty(initial, options.bucket_capacity,
                                          index_row_dim(options), options.dtype, self.device)
        self._rows = make_row_store(options, self.storage)
        self._initializer = self._resolve(options.initializer, "initializer")
        self._eval_initializer = self._resolve(options.eval_initializer, "eval_initializer")
        self._counter = None
        self._admission_initializer = None
        if options.admission is not None:
            adm = options.admission
            self._counter = AdmissionCounter(adm.threshold,
                                             adm.counter_capacity or options.max_capacity,
                                             adm.counter_bucket_capacity, self.device,
                                             options.name)
            self._admission_initializer = self._resolve(adm.initializer,
                                                        "admission.initializer")
        self._generator = None
        if options.seed is not None:
            self._generator = torch.Generator(self.device).manual_seed(options.seed)
        self._state_row = None
        if options.optimizer is not None:
            self._state_row = options.optimizer.initial_state(options.dim).to(
                device=self.device, dtype=options.dtype)
        self._stats: Counter[str] = Counter()  # ints, or 0-d device tensors (no host read)
        if options.tag_names:  # counted apart by tag (TableReport._tag_counts)
            self._tag_counts = torch.zeros(2, len(options.tag_names) + 1, dtype=torch.int64,
                                           device=self.device)
        # Input values are checked on the CPU reference path, or on every path
        # (``input_checks_forced``).
        self._check_everywhere = input_checks_forced()
        self._size_hint: int | None = None  # exact size kept by the fixed-size path

    def _checks_values(self, tensor: torch.Tensor) -> bool:
        """Whether an input's values are checked: on the CPU reference path, or
        everywhere under HASHREC_CHECK_INPUTS=1."""
        return self._check_everywhere or (tensor.device.type == "cpu"
                                          and not self._fixed_path())

    def _resolve(self, args: InitializerArgs, field_name: str) -> InitializerArgs:
        return args.resolved(self.dim, self.options.max_capacity,
                             f"table {self.options.name!r} {field_name}")

    # ----------------------------------------------------------------- sizes
    def size(self) -> int:
        """Stored entries."""
        return self.storage.size()

    def capacity(self) -> int:
        """Slots currently allocated."""
        return self.storage.capacity

    def load_factor(self) -> float:
        return self.size() / self.capacity()

    def advance_step(self) -> int:
        """Advances the STEP clock (call once per train step); returns the new step."""
        self.step += 1
        return self.step

    def prefetch(self, keys: torch.Tensor, tags: torch.Tensor | None = None) -> None:
        """Caches the stored rows of ``keys`` (n,) for the next lookup (CACHING; else a
        no-op). Read-only for the table: no admission, insert or score change."""
        keys, tags = self._keys(keys, tags)
        unique, utags, _, _ = unique_pairs(keys, tags)
        slots = find_slots(self.storage, unique, utags)
        self._rows.prefetch(slots[slots >= 0])

    # ------------------------------------------------------------ validation
    def _keys(self, keys: object, tags: object) -> tuple[torch.Tensor, torch.Tensor | None]:
        name = self.options.name
        keys = check_vector(name, "keys", keys, torch.int64, self.device)
        tags = check_optional_vector(name, "tags", tags, torch.int32, self.device, keys.numel())
        return keys, tags

    def _scores(self, scores: object, n: int) -> torch.Tensor | None:
        strategy = self.options.score_strategy
        if scores is None:
            if strategy is ScoreStrategy.CUSTOMIZED:
                raise ValueError(f"table {self.options.name!r}: scores=None is not valid with "
                                 f"score_strategy=CUSTOMIZED; pass (n,) int64 scores")
            return None
        if strategy is not ScoreStrategy.CUSTOMIZED:
            raise ValueError(f"table {self.options.name!r}: scores are only accepted with "
                             f"score_strategy=CUSTOMIZED, got {strategy.value}")
        scores = check_vector(self.options.name, "scores", scores, torch.int64, self.device, n)
        return scores.clamp(max=_PROTECTED - 1)

    # ---------------------------------------------------------------- scores
    def _clock(self) -> int:
        """The score clock: microseconds (TIMESTAMP) or the step."""
        if self.options.score_strategy is ScoreStrategy.TIMESTAMP:
            return time.time_ns() // 1000
        return self.step

    def _now(self, n: int) -> torch.Tensor:
        return torch.full((n,), self._clock(), dtype=torch.int64, device=self.device)

    def _hit_scores(self, slots: torch.Tensor, counts: torch.Tensor,
                    given: torch.Tensor | None) -> torch.Tensor:
        strategy = self.options.score_strategy
        if given is not None:
            return given
        if strategy is ScoreStrategy.LFU:
            return self.storage.scores[slots] + counts
        return self._now(slots.numel())

    def _recounts_refused(self) -> bool:
        """Whether admitted keys the table refuses get their counters back: under LFU,
        where the count is the new key's score (``AdmissionCounter.recount``)."""
        return (self._counter is not None
                and self.options.score_strategy is ScoreStrategy.LFU)

    def _new_scores(self, counts: torch.Tensor, given: torch.Tensor | None) -> torch.Tensor:
        if given is not None:
            return given
        if self.options.score_strategy is ScoreStrategy.LFU:
            return counts  # read only: the insert copies scores into the table
        return self._now(counts.numel())

    # ------------------------------------------------------------ core write
    def _upsert(self, keys: torch.Tensor, tags: torch.Tensor | None, counts: torch.Tensor,
                given: torch.Tensor | None, admit: bool,
                init_rows: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Touches unique keys: updates hits' scores, admits and inserts misses.

        With ``admit`` (the training path) misses go through admission and new rows
        get the initializer's embedding; otherwise the caller writes them. New rows
        get the optimizer's initial state unless ``init_rows`` is False (the caller
        then writes every column of every stored row).

        Returns (slots (u,) int64 with -1 for not stored, found (u,) bool: stored before).
        """
        self._size_hint = None
        slots = find_slots(self.storage, keys, tags)
        found = slots >= 0
        if admit:
            self._count_lookups(slots)
        hit = torch.nonzero(slots >= 0).flatten()
        hit_slots = slots[hit]
        hit_scores = self._hit_scores(hit_slots, counts[hit], _take(given, hit))
        miss = torch.nonzero(slots < 0).flatten()
        totals = counts[miss]  # the misses' counts: this batch's, or the counter's
        rejected = refused = None  # positions of the keys admission rejected, refused
        if admit and self._counter is not None and miss.numel():
            admitted, totals = self._counter.count(keys[miss], _take(tags, miss), totals)
            # Device-side sum: read on the host only by stats().
            self._stats["admission_rejected"] += miss.numel() - admitted.sum()
            rejected = miss[~admitted]
            miss, totals = miss[admitted], totals[admitted]
        stored = 0
        if miss.numel():
            self.storage.scores[hit_slots] = _PROTECTED  # same-call hits are never evicted
            new_slots, rehashed = self._insert(keys[miss], _take(tags, miss),
                                               self._new_scores(totals, _take(given, miss)))
            if rehashed:
                hit_slots = find_slots(self.storage, keys[hit], _take(tags, hit))
                slots[hit] = hit_slots
            slots[miss] = new_slots
            placed = torch.nonzero(new_slots >= 0).flatten()
            if init_rows:
                self._init_rows(new_slots[placed], keys[miss[placed]],
                                _take(tags, miss[placed]), admit)
            stored = placed.numel()
            self._stats["inserts"] += stored
            if stored < miss.numel():
                unplaced = torch.nonzero(new_slots < 0).flatten()
                refused = miss[unplaced]
                if admit and self._recounts_refused():
                    self._counter.recount(keys[refused], _take(tags, refused), totals[unplaced])
        self.storage.scores[hit_slots] = hit_scores
        self._count_by_tag_at(tags, keys.numel(), rejected, refused)
        self._report_refused(int(miss.numel()) - stored)
        return slots, found

    def _init_rows(self, slots: torch.Tensor, keys: torch.Tensor, tags: torch.Tensor | None,
                   embeddings: bool) -> None:
        rows = torch.empty(slots.numel(), self.row_dim, dtype=self.options.dtype,
                           device=self.device)
        if embeddings:
            rows[:, :self.dim] = initial_values(
                self._initializer, keys, tags, self.dim, self.options.dtype, self._generator)
        if self._state_row is not None:
            rows[:, self.dim:] = self._state_row
        if embeddings:
            self._rows.write(slots, rows, 0, admit=True)
        elif self._state_row is not None:
            self._rows.write(slots, rows[:, self.dim:], self.dim, admit=False)

    def _read(self, slots: torch.Tensor, keys: torch.Tensor, tags: torch.Tensor | None,
              missing_args: InitializerArgs, repeats: bool = False) -> torch.Tensor:
        """Embeddings (n, dim) float32 of slots; -1 reads as ``missing_args``. With
        ``repeats`` a slot may repeat: each stored row is read once (the rows' tiers take
        unique slots: a cache gave a repeated slot two cache rows)."""
        found = slots >= 0
        values = torch.empty(slots.numel(), self.dim, dtype=torch.float32, device=self.device)
        stored = slots[found]
        if repeats:
            stored, inverse = torch.unique(stored, return_inverse=True)
        rows = self._rows.read(stored, 0, self.dim, admit=True).to(torch.float32)
        values[found] = rows[inverse] if repeats else rows
        missing = torch.nonzero(~found).flatten()
        if missing.numel():
            values[missing] = initial_values(missing_args, keys[missing], _take(tags, missing),
                                             self.dim, torch.float32, self._generator)
        return values

    def _train_missing_args(self) -> InitializerArgs:
        return self._admission_initializer or self._eval_initializer

    # ------------------------------------------------------------ public API
    def lookup(self, keys: torch.Tensor, tags: torch.Tensor | None = None, train: bool = True,
               counts: torch.Tensor | None = None, scores: torch.Tensor | None = None,
               active: torch.Tensor | None = None, stored_rows: bool = True) -> LookupResult:
        """Looks up unique keys for a forward pass.

        Args:
            keys: (u,) int64 unique (key, tag) pairs: repeats raise ValueError on the
                CPU reference path (everywhere under HASHREC_CHECK_INPUTS=1); elsewhere
                they are not checked (that would sort the keys again and read the device
                back at every step) and the counters are then wrong.
            tags: (u,) int32 namespaces or None.
            train: True counts admission, inserts admitted keys (initialized rows),
                updates scores, grows and evicts; False is read-only and missing keys
                read as eval_initializer.
            counts: (u,) int64 occurrences of each key in the batch (LFU and admission
                count by multiplicity), >= 1 (checked as the keys are); None = 1 each.
            scores: (u,) int64 caller scores (CUSTOMIZED only).
            active: (u,) bool or None (all): only the active keys are looked up (they
                must be unique among themselves); the others may repeat them and read
                as slot -1 and a zero row. A fixed-size stand-in for ``keys[active]``,
                which would read the mask's count on the host.
            stored_rows: False (a caller that reads stored rows from ``storage.values``
                by slot itself): on the Triton path the values of keys stored before the
                call are left undefined instead of read, saving a copy of every row;
                the other rows (new, missing, inactive) are as always. Elsewhere it
                makes no difference.

        Returns:
            LookupResult(slots (u,) int64, -1 = not stored; values (u, dim) float32;
            version). The slots are valid until the table grows, evicts or erases (see
            ``LookupResult``).
        """
        keys, tags, counts, active = self._lookup_inputs(keys, tags, counts, scores, active)
        n = keys.numel()
        fixed = self._fixed_path()
        if active is not None and not fixed:  # the reference path: the active keys alone
            picked = active.nonzero().squeeze(1)
            part = self.lookup(keys[picked], None if tags is None else tags[picked], train,
                               counts[picked], None if scores is None else scores[picked])
            slots = torch.full((n,), -1, dtype=torch.int64, device=self.device)
            values = torch.zeros(n, self.dim, dtype=part.values.dtype, device=self.device)
            return LookupResult(slots.index_copy_(0, picked, part.slots),
                                values.index_copy_(0, picked, part.values), self.version)
        self._rows.begin_batch()
        if fixed:
            given = self._scores(scores, n) if train else None
            self._operation = "lookup"
            return LookupResult(*self._lookup_fixed(keys, tags, counts, given, train, active,
                                                    stored_rows), self.version)
        if not train:
            slots = find_slots(self.storage, keys, tags)
            self._count_lookups(slots)
            return LookupResult(slots, self._read(slots, keys, tags, self._eval_initializer),
                                self.version)
        self._operation = "lookup"
        slots, _ = self._upsert(keys, tags, counts, self._scores(scores, n), admit=True)
        return LookupResult(slots, self._read(slots, keys, tags, self._train_missing_args()),
                            self.version)

    def _lookup_inputs(self, keys: object, tags: object, counts: object, scores: object,
                       active: object) -> tuple:
        """``lookup``'s inputs checked: (keys, tags, counts, active). Values (counts >= 1,
        unique active keys) are checked on the CPU reference path only: on a GPU (host
        tiers take the reference path there too) the check would be a second sort of the
        keys and a device read in every training step's lookup, whose keys the embedding
        layer has deduplicated already; the Triton path reads nothing back."""
        name = self.options.name
        keys, tags = self._keys(keys, tags)
        n = keys.numel()
        if counts is None:
            counts = torch.ones(n, dtype=torch.int64, device=self.device)
        counts = check_vector(name, "counts", counts, torch.int64, self.device, n)
        if scores is not None:
            check_vector(name, "scores", scores, torch.int64, self.device, n)
        if active is not None:
            active = check_vector(name, "active", active, torch.bool, self.device, n)
        if n and self._checks_values(keys):
            picked = slice(None) if active is None else active
            if bool((counts[picked] < 1).any()):
                raise ValueError(f"table {name!r}: counts must be >= 1 (occurrences of each "
                                 f"key in the batch), got {int(counts[picked].min())}")
            unique = unique_pairs(keys[picked], _take(tags, picked))[0]
            if unique.numel() != keys[picked].numel():
                raise ValueError(
                    f"table {name!r}: lookup got {keys[picked].numel() - unique.numel()} "
                    f"repeated (key, tag) pairs; its keys must be unique (find_or_insert "
                    f"takes duplicates, or deduplicate with torch.unique and pass counts)")
        return keys, tags, counts, active

    def _count_lookups(self, slots: torch.Tensor) -> None:
        """Counts ``slots``' keys as looked up (stats: every key the caller passed)."""
        self._stats["lookups"] += slots.numel()
        self._stats["hits"] += (slots >= 0).sum()  # device-side: read by stats() only

    def find(self, keys: torch.Tensor,
             tags: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """keys (n,) int64 -> (values (n, dim) float32, founds (n,) bool). Read-only;
        missing keys read as eval_initializer, a key repeated in the batch as one value
        (as in ``find_or_insert``)."""
        keys, tags = self._keys(keys, tags)
        if keys.numel() and _draws_per_row(self._eval_initializer):
            # A random draw per row would give a repeated missing key several values.
            unique, utags, inverse, _ = unique_pairs(keys, tags)
            if unique.numel() < keys.numel():
                values, founds = self._find(unique, utags)
                self._stats["lookups"] += keys.numel() - unique.numel()  # device-side sums
                self._stats["hits"] += founds[inverse].sum() - founds.sum()
                return values[inverse], founds[inverse]
        return self._find(keys, tags)

    def _find(self, keys: torch.Tensor,
              tags: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        self._rows.begin_batch()
        if self._fixed_path():  # one kernel reads every row, nothing read back on the host
            slots, values = self._lookup_fixed(keys, tags, None, None, train=False)
            return values, slots >= 0
        slots = find_slots(self.storage, keys, tags)
        self._count_lookups(slots)
        return self._read(slots, keys, tags, self._eval_initializer, repeats=True), slots >= 0

    def find_or_insert(self, keys: torch.Tensor, scores: torch.Tensor | None = None,
                       tags: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """keys (n,) int64 (duplicates allowed) -> (values (n, dim) float32, founds (n,) bool).

        Missing keys are admitted (when admission is on), inserted and initialized;
        ``founds`` tells which keys were stored before the call. Duplicates count
        by multiplicity for LFU and admission; with CUSTOMIZED a key takes the
        largest of its scores (``insert_or_assign`` takes the last one, with its value).
        ``stats()`` counts every key of the batch, duplicates included, as ``find`` does.
        """
        keys, tags = self._keys(keys, tags)
        scores = self._scores(scores, keys.numel())
        self._rows.begin_batch()
        self._operation = "find_or_insert"
        if keys.numel() and self._fixed_path():  # fixed sizes: the unique count stays there
            from hashrec.table.ops.dedup import unique_pairs_fixed  # Triton only

            u = unique_pairs_fixed(keys, tags)
            return self._find_or_insert_fixed(u, _largest(scores, u.keys, u.inverse))
        unique, utags, inverse, counts = unique_pairs(keys, tags)
        slots, found = self._upsert(unique, utags, counts, _largest(scores, unique, inverse),
                                    admit=True)
        values = self._read(slots, unique, utags, self._train_missing_args())
        # The upsert counted the unique keys: the repeats count too (device-side sums).
        self._stats["lookups"] += keys.numel() - unique.numel()
        self._stats["hits"] += found[inverse].sum() - found.sum()
        return values[inverse], found[inverse]

    def insert_or_assign(self, keys: torch.Tensor, values: torch.Tensor,
                         scores: torch.Tensor | None = None,
                         tags: torch.Tensor | None = None) -> None:
        """Stores ``values`` (n, dim) for keys (n,) int64; the last duplicate wins, and
        with CUSTOMIZED its score too (``find_or_insert`` keeps a key's largest score).

        No admission; refused inserts are reported by check_mode. ``values`` are copied
        in (a tensor that requires grad is detached: the table is not part of autograd).
        """
        keys, tags = self._keys(keys, tags)
        values = check_matrix(self.options.name, "values", values, keys.numel(), self.dim,
                              self.device)
        self._operation = "insert_or_assign"
        self._assign(keys, tags, values, self._scores(scores, keys.numel()), exact=False)

    def _assign(self, keys: torch.Tensor, tags: torch.Tensor | None, rows: torch.Tensor,
                scores: torch.Tensor | None, exact: bool, assume_unique: bool = False) -> None:
        """Writes ``rows`` of keys (n,); the last duplicate wins. ``exact`` (full rows
        with their scores) stores ``scores`` as given; ``assume_unique`` skips the
        deduplication for callers whose keys are unique by construction. Under
        check_mode ERROR a refusal raises after the stored keys' rows are written."""
        self._defer_refusal, self._deferred_refusal = True, None
        try:
            self._assign_rows(keys, tags, rows, scores, exact, assume_unique)
        except BaseException:
            self._defer_refusal, self._deferred_refusal = False, None
            raise
        self._raise_deferred_refusal()

    def _assign_rows(self, keys: torch.Tensor, tags: torch.Tensor | None, rows: torch.Tensor,
                     scores: torch.Tensor | None, exact: bool, assume_unique: bool) -> None:
        self._rows.begin_batch()
        if assume_unique:
            counts = torch.ones_like(keys)
            slots = self._assign_slots(keys, tags, counts, scores, init_rows=not exact)
            self._write_assigned(slots, rows, None, scores if exact else None)
            return
        if keys.numel() and self._fixed_path():  # fixed sizes: nothing read back
            from hashrec.table.ops.dedup import unique_pairs_fixed  # Triton only

            u = unique_pairs_fixed(keys, tags)
            slots = self._assign_slots(u.keys, u.tags, u.counts, _take(scores, u.last),
                                       init_rows=not exact, count=u.count)
            self._write_assigned(slots, rows, u.last, scores if exact else None)
            return
        unique, utags, inverse, counts = unique_pairs(keys, tags)
        last = torch.zeros_like(unique).scatter_reduce_(
            0, inverse, torch.arange(keys.numel(), device=self.device), "amax")
        slots = self._assign_slots(unique, utags, counts, _take(scores, last),
                                   init_rows=not exact)
        self._write_assigned(slots, rows, last, scores if exact else None)

    def _write_full(self, slots: torch.Tensor, rows: torch.Tensor,
                    scores: torch.Tensor | None) -> None:
        """Writes rows (n, w) from column 0 of ``slots`` (n,) and, if given, their scores."""
        self._rows.write(slots, rows.to(self.options.dtype), 0, admit=False)
        if scores is not None:
            self.storage.scores.index_copy_(0, slots, scores)

    def erase(self, keys: torch.Tensor, tags: torch.Tensor | None = None) -> None:
        """Removes keys (absent keys are ignored); ``stats()["erased"]`` counts the keys
        removed (a key repeated in ``keys`` once)."""
        keys, tags = self._keys(keys, tags)
        self._size_hint = None
        slots = find_slots(self.storage, keys, tags)
        # Distinct stored slots, counted on the device (read by stats() only).
        ordered = torch.sort(slots).values
        first = torch.ones_like(ordered, dtype=torch.bool)
        first[1:] = ordered[1:] != ordered[:-1]
        self._stats["erased"] += ((ordered >= 0) & first).sum()
        # Absent keys' slots (-1) are skipped by the op itself: no boolean indexing
        # (a host read on a GPU).
        erase_slots(self.storage, slots)

    def contains(self, keys: torch.Tensor, tags: torch.Tensor | None = None) -> torch.Tensor:
        """keys (n,) int64 -> (n,) bool."""
        keys, tags = self._keys(keys, tags)
        return find_slots(self.storage, keys, tags) >= 0

    def apply_gradients(self, slots: torch.Tensor, grads: torch.Tensor,
                        lr: float | None = None, step: int | None = None,
                        version: int | None = None) -> None:
        """In-place optimizer update of rows ``slots`` (u,) unique with grads (u, dim).

        Negative slots (keys the lookup did not store) get no update. ``slots`` come
        from a lookup and stay valid only until the table grows, evicts or erases
        (``LookupResult``): a stale slot updates whichever key holds it now.

        Args:
            slots: (u,) int64 below capacity(), each stored row once (a row's gradients
                summed into one: a repeated slot would lose all but one of them; negative
                slots may repeat). Checked on the CPU reference path
                (everywhere under HASHREC_CHECK_INPUTS=1); elsewhere not (that would
                read the device back at every step), and a larger slot writes out of
                bounds.
            grads: (u, dim) float gradients (detached).
            lr: overrides the optimizer's lr; a finite number >= 0.
            step: 1-based step for Adam's bias correction (an int >= 1); None: the
                table's step (at least 1).
            version: the lookup's ``LookupResult.version``; when given, slots from
                before a growth are refused with a TableError.
        """
        spec = self.options.optimizer
        name = self.options.name
        if spec is None:
            raise TableError(f"table {name!r} has no optimizer; set "
                             f"TableOptions.optimizer to update rows")
        if version is not None and version != self.version:
            raise TableError(f"table {name!r}: slots from version {version} are stale, the "
                             f"table grew since (version {self.version}) and moved every "
                             f"entry; look the keys up again before applying gradients")
        slots = check_vector(name, "slots", slots, torch.int64, self.device)
        grads = check_matrix(name, "grads", grads, slots.numel(), self.dim, self.device)
        if slots.numel() and self._checks_values(slots):
            _check_slots(name, slots, self.capacity())
        self._rows.update(slots, grads, spec, checked_lr(name, spec.lr if lr is None else lr),
                          max(self.step, 1) if step is None else checked_step(name, step))


def _check_slots(table: str, slots: torch.Tensor, capacity: int) -> None:
    """Raises ValueError where ``slots`` hold one at or past ``capacity``, or a stored row
    (a slot >= 0) more than once."""
    if int(slots.max()) >= capacity:
        raise ValueError(f"table {table!r}: slots must be < capacity() ({capacity}), got "
                         f"{int(slots.max())}; pass the slots of this table's latest lookup")
    ordered = torch.sort(slots).values
    repeated = ordered[1:][(ordered[1:] == ordered[:-1]) & (ordered[1:] >= 0)]
    if repeated.numel():
        raise ValueError(f"table {table!r}: slots must name each row once, got "
                         f"{repeated.unique().numel()} repeated (slot {int(repeated[0])} "
                         f"{int((slots == repeated[0]).sum())} times); sum a row's gradients "
                         f"into one (the lookup's slots of unique keys are)")


def _draws_per_row(args: InitializerArgs) -> bool:
    """Whether ``args`` gives each row a random draw of its own (no ``key_seed``)."""
    return args.key_seed is None and args.mode in (
        InitializerMode.NORMAL, InitializerMode.TRUNCATED_NORMAL, InitializerMode.UNIFORM)


def _largest(scores: torch.Tensor | None, unique: torch.Tensor,
             inverse: torch.Tensor) -> torch.Tensor | None:
    """Each unique key's largest score of the batch's ``scores`` (None: None)."""
    if scores is None:
        return None
    return torch.full_like(unique, torch.iinfo(torch.int64).min).scatter_reduce_(
        0, inverse, scores, "amax")
