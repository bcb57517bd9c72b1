"""Captured training lookups: the fixed-size lookup at max_capacity as CUDA graphs.

A training lookup of a dynamic table is some fifty launches (find, protection of
the hits, the admission count and the counter's upsert, the table's upsert with
its sort, the rows), each issued from Python; a training step on one GPU is bound
by that host time. Once the table is at max_capacity it no longer grows, and the
lookup's work depends on its key count u alone. ``LookupGraphs`` pads u to a size
class, captures the lookup of that size once as a CUDA graph and replays it: the
keys, counts and a few scalars are copied into the graph's input buffers, one
replay writes the rows into a new tensor (its address is one of the scalars, read
by the row kernel when it runs), and the slots are copied out. The replay adds the
lookup's counters (hits, inserts, refusals, ...) to the table's device totals in
place, which ``stats()`` reads; only ``check_mode`` ERROR reads a count back per
lookup.

Two more forms serve the public calls at max_capacity. ``HashTable.find_or_insert``:
its batch, deduplicated in fixed sizes, leaves the unique count on the device, which is
copied into the graph's scalars; the size class is that of the batch; the misses are
placed as for a cold batch (the lane form); and the replay hands back which keys were
stored before, for the call's row expansion. ``HashTable.insert_or_assign``: the index
work alone (find, rescored hits, inserts, the new rows' optimizer state), its count
likewise on the device; the caller's rows are written after the replay.

The results equal the eager lookup's, bit for bit: a replay runs the same kernels
on the padded batch, whose extra keys are inactive (never found, counted nor
inserted, like ``lookup(active=...)``); the random initializers' seeds are drawn
on the host in the eager order and read by the kernel from the device; the clock
of STEP / TIMESTAMP scores is a device value; and a key's Philox offset depends on
its position, which padding keeps.

When: on CUDA (not under the interpreter), at max_capacity, with initial values
the kernel computes itself (CONSTANT, UNIFORM, NORMAL), from the second lookup of
a size class on, up to ``MAX_KEYS`` keys; at most ``MAX_GRAPHS`` size classes, the
least recently used dropped, and at most ``MAX_CAPTURES`` captures per storage. A
new storage (a growth, a restore) drops every graph. A failed capture is logged
once and later lookups stay eager. ``HASHREC_LOOKUP_GRAPHS=0`` turns graphs off.
"""

from __future__ import annotations

import collections
import logging
import os
import weakref

import torch

from hashrec.table.ops.copies import MOST_PAIRS, copy_into
from hashrec.table.ops.insert.finish import draws_seed, in_kernel
from hashrec.table.ops.launch import cdiv, next_pow2
from hashrec.table.options import ScoreStrategy
from hashrec.table.validation import input_checks_forced

logger = logging.getLogger("hashrec.table.hash_table")

# The forms of captured call (module docstring).
TRAIN, FIND_OR_INSERT, ASSIGN = "training lookup", "find_or_insert", "insert_or_assign"
MAX_GRAPHS = 4
# Captures per storage: a capture synchronizes the device, so size classes that keep
# displacing each other stop being captured once this many were.
MAX_CAPTURES = 16
# Larger lookups stay eager: their launches are a small part of their time, and a
# graph's buffers grow with the size (a few hundred bytes a key).
MAX_KEYS = 1 << 22
CAPTURE_AFTER = 2  # lookups of a size class before it is captured
# Size classes: u rounded up to a multiple of max(MIN_STEP, u's power of two / 16).
MIN_STEP = 1024


def graphs_enabled(device: torch.device) -> bool:
    """Whether training lookups on ``device`` may be captured (see the module docstring)."""
    return (device.type == "cuda" and os.environ.get("HASHREC_LOOKUP_GRAPHS", "1") != "0"
            and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
            and not input_checks_forced())


def padded_size(n: int) -> int:
    """The size class of a lookup of n keys: at most 1/16 (or MIN_STEP keys) more."""
    step = max(MIN_STEP, next_pow2(n) >> 4)
    return cdiv(n, step) * step


def _identity(part) -> tuple | None:
    """What tells a storage (or tensor) from its successor: its id and device addresses."""
    if part is None:
        return None
    if isinstance(part, torch.Tensor):
        return id(part), part.data_ptr()
    return id(part), part.keys.data_ptr(), part.values.data_ptr()


def capture_graph(device: torch.device, run) -> tuple:
    """(graph, ``run()``'s outputs): ``run`` captured on ``device`` as one CUDA graph, in
    the ``thread_local`` error mode (other threads, such as the loader's pin-memory
    thread, may call CUDA meanwhile). Nothing runs."""
    with torch.cuda.device(device):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = run()
    return graph, out


def table_identity(table) -> tuple:
    """What a table's captured graphs read and write: its storage, state row and
    admission counter (a new one of any of them, after a growth or a restore, makes the
    graphs stale)."""
    counter = table._counter
    return (_identity(table.storage), _identity(table._state_row),
            _identity(counter.storage if counter is not None else None))


class _Lookup:
    """One size class's input buffers, graph and outputs."""

    __slots__ = ("size", "keys", "tags", "counts", "given", "active", "clocked",
                 "stored_rows", "form", "scalars", "graph", "out")

    def __init__(self, size: int, device: torch.device, tagged: bool, given: bool,
                 active: bool, clocked: bool, stored_rows: bool, form: str) -> None:
        self.size = size
        self.stored_rows = stored_rows
        self.form = form  # TRAIN, FIND_OR_INSERT or ASSIGN (module docstring)
        self.keys = torch.zeros(size, dtype=torch.int64, device=device)
        self.tags = torch.zeros(size, dtype=torch.int32, device=device) if tagged else None
        self.counts = torch.ones(size, dtype=torch.int64, device=device)
        self.given = torch.zeros(size, dtype=torch.int64, device=device) if given else None
        self.active = torch.zeros(size, dtype=torch.bool, device=device) if active else None
        self.clocked = clocked
        # u, the address of the (u, dim) rows out, the missing and new rows' seeds, the
        # clock; u = 0 (all inactive, nothing written) until fed.
        self.scalars = torch.zeros(5, dtype=torch.int64, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple | None = None


class LookupGraphs:
    """The captured training lookups of one ``HashTable`` (module docstring).

    ``capture=False`` runs the padded lookup eagerly instead of replaying a graph
    (the same buffers and kernels; what the CPU tests check)."""

    def __init__(self, table, capture: bool = True, after: int = CAPTURE_AFTER) -> None:
        self._table = weakref.proxy(table)  # the table holds this object: no cycle
        self._capture = capture
        self._after = after
        self._lookups: collections.OrderedDict[tuple, _Lookup] = collections.OrderedDict()
        self._seen: collections.Counter[tuple] = collections.Counter()
        self._owner: tuple | None = None
        self._failed = False
        self.captures = 0  # size classes built since the storage was new
        self.replays = 0  # lookups served by this object (replayed, or padded when not capturing)

    def lookup(self, keys: torch.Tensor, tags: torch.Tensor | None, counts: torch.Tensor,
               given: torch.Tensor | None, active: torch.Tensor | None,
               stored_rows: bool = True, count: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``_lookup_fixed``'s training lookup (the table at max_capacity) replayed:
        (slots, values, hits: which keys were stored before), or None: look up eagerly
        (no keys, more than ``MAX_KEYS``, initial values computed outside the kernel, not
        yet captured). ``count`` (1,) int64 on the device: ``find_or_insert``'s form, whose
        deduplication leaves only the first ``count`` of the keys unique and valid (its
        misses placed for a cold batch); its slots and hits are then the graph's own
        buffers, to be read before the next replay."""
        table = self._table
        if not all(in_kernel(args, padded_size(keys.numel()), table.dim)
                   for args in (table._train_missing_args(), table._initializer)):
            return None
        form = TRAIN if count is None else FIND_OR_INSERT
        return self._serve(form, keys, tags, counts, given, active, stored_rows, count)

    def assign(self, keys: torch.Tensor, tags: torch.Tensor | None, counts: torch.Tensor,
               given: torch.Tensor | None, count: torch.Tensor) -> torch.Tensor | None:
        """``insert_or_assign``'s index work (``_assign_fixed``, new rows given the
        optimizer's initial state) replayed for keys deduplicated in fixed sizes (the
        first ``count`` unique): the slots, the graph's own buffer, to be read before the
        next replay; or None: run it eagerly."""
        replayed = self._serve(ASSIGN, keys, tags, counts, given, None, False, count)
        return None if replayed is None else replayed[0]

    def _serve(self, form: str, keys: torch.Tensor, tags: torch.Tensor | None,
               counts: torch.Tensor, given: torch.Tensor | None, active: torch.Tensor | None,
               stored_rows: bool, count: torch.Tensor | None) -> tuple | None:
        """A call of ``form`` replayed (``_replay``'s outputs), or None: run it eagerly."""
        if self._failed or (self._capture and torch.cuda.is_current_stream_capturing()):
            return None
        table, size = self._table, padded_size(keys.numel())
        if not keys.numel() or size > MAX_KEYS:
            return None
        self._check_owner()
        clocked = given is None and table.options.score_strategy not in (
            ScoreStrategy.LFU, ScoreStrategy.CUSTOMIZED)
        key = (size, tags is not None, given is not None, active is not None, clocked,
               stored_rows, form)
        entry = self._lookups.get(key)
        if entry is None:
            self._seen[key] += 1
            if self._seen[key] < self._after or self.captures >= MAX_CAPTURES:
                return None
            entry = self._build(key)
            if entry is None:
                return None
        self._lookups.move_to_end(key)
        return self._replay(entry, keys, tags, counts, given, active, count)

    def _check_owner(self) -> None:
        """Drops every graph when the table's storage (or counter, or state row) is new."""
        owner = table_identity(self._table)
        if owner != self._owner:
            self._lookups.clear()
            self._seen.clear()
            self._owner = owner
            self.captures = 0

    def _core(self, entry: _Lookup) -> tuple:
        """The lookup of a size class on its buffers: what a graph captures. Its
        counters go to the table's device totals in place, its rows to the tensor at the
        address in ``scalars``; returns (slots, the refused count left to report or
        None, hits)."""
        table = self._table
        # The keys past u (scalars[0]) are padding: inactive.
        clock = entry.scalars[4:] if entry.clocked else None
        if entry.form == ASSIGN:
            slots, refused = table._assign_fixed(entry.keys, entry.tags, entry.counts,
                                                 entry.given, True, entry.scalars[:1], clock)
            return slots, refused, None
        slots, _, counted, refused = table._train_fixed(
            entry.keys, entry.tags, entry.counts, entry.given, entry.active,
            seeds=entry.scalars[2:4], out_at=entry.scalars[:2], stored_rows=entry.stored_rows,
            clock=clock, count=entry.scalars[:1], few_misses=entry.form == TRAIN)
        return slots, table._count_in_place(counted, refused), counted["hits"]

    def _build(self, key: tuple) -> _Lookup | None:
        """A size class's buffers and, with ``capture``, its graph (None: the capture
        failed; logged once, later lookups stay eager)."""
        size, *flags = key
        entry = _Lookup(size, self._table.device, *flags)
        if self._capture:
            try:
                device = self._table.device
                with torch.cuda.device(device):  # the capture's streams on the table's GPU
                    current = torch.cuda.current_stream()
                    side = torch.cuda.Stream()
                    side.wait_stream(current)
                    with torch.cuda.stream(side):  # compiles the kernels; u = 0 writes nothing
                        self._core(entry)
                    current.wait_stream(side)
                entry.graph, entry.out = capture_graph(device, lambda: self._core(entry))
                logger.info("table %r: captured its %s of up to %d keys as a CUDA graph",
                            self._table.options.name, entry.form, entry.size)
            except Exception as error:  # noqa: BLE001 - any failure: stay eager
                self._failed = True
                logger.warning("table %r: capturing its %s as a CUDA graph failed (%s); "
                               "its lookups and calls run eagerly",
                               self._table.options.name, entry.form, error)
                return None
        self.captures += 1
        self._lookups[key] = entry
        while len(self._lookups) > MAX_GRAPHS:
            self._lookups.popitem(last=False)
        return entry

    def _replay(self, entry: _Lookup, keys: torch.Tensor, tags: torch.Tensor | None,
                counts: torch.Tensor, given: torch.Tensor | None, active: torch.Tensor | None,
                count: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        table, n = self._table, keys.numel()
        self.replays += 1
        # Only admission counting and LFU scores read the counts (the buffer keeps ones).
        if table._counter is None and table.options.score_strategy is not ScoreStrategy.LFU:
            counts = None
        pairs = [(buffer[:n], value) for buffer, value in (
            (entry.keys, keys), (entry.tags, tags), (entry.counts, counts),
            (entry.given, given), (entry.active, active))
            if buffer is not None and value is not None]
        if len(pairs) <= MOST_PAIRS and all(value.is_contiguous() and value.dtype == buffer.dtype
                                   for buffer, value in pairs):
            copy_into(pairs)  # one launch
        else:
            for buffer, value in pairs:
                buffer.copy_(value)
        # Seeds drawn as the eager lookup draws them: the missing rows', then the new
        # (an assign draws none: its new rows' embeddings are the caller's).
        seeds = [table._kernel_seed() if entry.form != ASSIGN and draws_seed(args, n, table.dim)
                 else 0 for args in (table._train_missing_args(), table._initializer)]
        clock = table._clock() if entry.clocked else 0
        values = None if entry.form == ASSIGN else torch.empty(
            n, table.dim, dtype=torch.float32, device=keys.device)
        address = 0 if values is None else values.data_ptr()
        entry.scalars.copy_(torch.tensor([n, address, *seeds, clock],
                                         pin_memory=keys.is_cuda), non_blocking=True)
        if count is not None:
            entry.scalars[:1].copy_(count)
        if self._capture:
            entry.graph.replay()
            slots, refused, hits = entry.out
        else:
            slots, refused, hits = self._core(entry)
        # A refused count left here (ERROR) is read at once; the slots and hits are the
        # graph's own buffers, rewritten by the next replay.
        table._report_refused_fixed(refused)
        slots, hits = slots[:n], None if hits is None else hits[:n]
        return (slots.clone() if entry.form == TRAIN else slots), values, hits
