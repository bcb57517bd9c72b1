"""A storage's one-pass dedup sort at fixed sizes, captured as a CUDA graph.

The first half of a storage's dedup (``hashrec.embedding.batching._sort_storage``)
is a chain of some twenty short device operations: concatenate the features' ids,
tag them, check their range, sort, mark the unique ones, number them, summarise
them per logical table and per owning rank. Its sizes follow the batch's id count,
which changes from step to step, so each one is launched from Python: about 1.1 ms
of host time per step for the example's fused storage on an H200 host
(``benchmarks/results/host_split_gpu_x2_ride.rank0.md``), on a step the host
bounds.

Here the one-pass sort (ids of several logical tables, each ``tag << bits | id``)
runs on a buffer padded to a size class (``hashrec.table.lookup_graphs.padded_size``:
at most 1/16 more). A padding position gets the key ``num_tags << bits``: it sorts
after every real key, its tag is past the last table, so the per-table summary
leaves it out unchanged, and the owner counts are masked to real tags. The real
positions are the first ``n`` of the sorted arrays. With the size class fixed, the
whole chain is captured (after ``CAPTURE_AFTER`` uncaptured runs of that class,
which compile its kernels) and replayed: a small table of feature ends, tags and the
addresses of the features' ids is copied in (the keys kernel reads the ids where
they are; ids of other dtypes or layouts are first copied into one buffer), one
replay, and the outputs handed out as they are.

A replay overwrites its outputs, and a batch holds its dedup's outputs until its
backward is done, while the next batch's dedup runs ahead. So a size class keeps up
to ``BUFFERS`` captures of the chain, each with outputs of its own, and replays one
whose outputs nobody holds any more (no tensor uses their memory but the capture's
own; a sort runs after the work queued so far on the current stream, on that stream
or on the dedup stream, which waits for it first: ``batching.start_dedup``; so work
queued on them before is done before the replay writes). When every capture's outputs
are held and no more may be made, the chain runs uncaptured into new tensors. Sharded
storages, whose outputs may go to collectives on another stream, replay one capture and
copy its outputs out.

Inside the chain the keys are built in one kernel and the sorted keys split into ids,
tags and unique marks in another (``padded_keys`` and ``mark_sorted`` of
``hashrec.embedding.ops.dedup``), where torch operators take about twenty launches.

Each capture keeps its own outputs and sort workspace in GPU memory. Size classes are
kept up to ``MAX_GRAPHS``, or fewer where their sizes add up past ``KEEP_IDS`` (but
never fewer than ``MIN_GRAPHS``), the least recently used dropped: a batch whose id
count varies by a quarter either way spans some six classes, and with four kept the
example's training on an H200 dropped every class and captured it again in the
second epoch (``benchmarks/results/dedup_graphs_classes_demo.md``).

The padded key leaves one bit fewer for ids than the unpadded one-pass sort; an id
that does not fit is flagged as there (the smallest ids read -1) and the storage is
sorted again in two passes. On CPU, under ``TRITON_INTERPRET`` or with
``HASHREC_DEDUP_GRAPHS=0`` the unpadded sort runs as before.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os

import torch

from hashrec.distributed.ops.route import owner_counts
from hashrec.embedding.ops.dedup import mark_sorted, padded_keys, tag_summary

logger = logging.getLogger("hashrec.embedding")

ENV = "HASHREC_DEDUP_GRAPHS"
CAPTURE_AFTER = 2  # uncaptured runs of a size class before it is captured
MAX_GRAPHS = 16    # size classes kept at most, the least recently used dropped
MIN_GRAPHS = 4     # size classes kept at least, whatever their sizes
KEEP_IDS = 1 << 22  # padded ids of the kept size classes, summed, beyond MIN_GRAPHS
BUFFERS = 3        # captures of a size class, each with its own outputs


# How many tensors use a storage's memory; None where torch does not tell (the outputs
# of a capture are then copied out, as for sharded storages).
_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _use_count(tensor: torch.Tensor) -> int:
    """How many tensors use ``tensor``'s memory."""
    return _STORAGE_USE_COUNT(tensor.untyped_storage()._cdata)


def enabled(device: torch.device) -> bool:
    """Whether dedup sorts on ``device`` run padded and captured (``HASHREC_DEDUP_GRAPHS``:
    default on for CUDA, ``0`` off)."""
    value = os.environ.get(ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}={value!r}: expected 0 or 1")
    return value != "0" and device.type == "cuda" and \
        os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def pad_bits(num_tags: int, compact: bool = False) -> int:
    """Id bits of a padded one-pass key: the tags 0 .. num_tags (padding) fit above, in
    an int64 (an int32 when ``compact``)."""
    return (31 if compact else 63) - num_tags.bit_length()


def sort_keys(keyed: torch.Tensor, compact: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable sort of one-pass keys (n,) int64: (sorted keys int64, order). ``compact``:
    every valid key fits 31 bits, so they sort as int32 (half the radix passes); keys
    of out-of-range ids then sort wrongly, and their batch is flagged for a resort."""
    if not compact:
        return torch.sort(keyed, stable=True)
    combined, order = torch.sort(keyed.to(torch.int32), stable=True)
    return combined.to(torch.int64), order


def padded_sort(ids: torch.Tensor, meta: torch.Tensor, num_tags: int, bits: int,
                clamp: bool, owners: int, owned: tuple[int, int] | None,
                features: int | None = None) -> tuple[torch.Tensor, ...]:
    """The one-pass sort of a padded batch.

    Args:
        ids: (N,) int64 ids of every feature, in the storage's emit order, then padding
            (any values).
        meta: (2 F,) int64: each feature's end in ``ids`` (the last is the real count
            n), then each feature's ``tag << bits``.
        num_tags: logical tables of the storage; padding gets tag ``num_tags``.
        bits: id bits below the tag (``pad_bits``); keys of at most 31 bits sort as
            int32 (half the radix passes).
        clamp: row ids of dense tables: out-of-range ids are clamped (and flagged).
        owners, owned: as ``_sort_storage``'s.
        features: F, when ``meta`` ends with the address of every feature's ids (3 F
            values) and the keys kernel reads them there (``ids`` then only sets N).

    Returns:
        sorted_ids (N,) int64, sorted_tags (N,) int32, order (N,) int64, group (N,)
        int64, summary (3 num_tags + owners,) int64: the real positions first, each
        array as the unpadded sort's followed by the padding.
    """
    compact = bits + num_tags.bit_length() <= 31
    keyed, bad = padded_keys(ids, meta, num_tags, bits, clamp, compact, features)
    combined, order = torch.sort(keyed, stable=True)
    sorted_ids, sorted_tags, new, group, starts = mark_sorted(combined, bits, num_tags)
    summary = tag_summary(sorted_tags, sorted_ids, group, num_tags, bad, starts).reshape(-1)
    if owners:
        low, high = owned if owned is not None else (0, num_tags)
        counted = new & (sorted_tags >= low) & (sorted_tags < high)
        summary = torch.cat([summary, owner_counts(sorted_ids, counted, owners)])
    return sorted_ids, sorted_tags, order, group, summary


class _Capture:
    """One capture of a size class's chain: its graph, its outputs and each output's use
    count while only the capture holds it."""

    __slots__ = ("graph", "out", "alone")

    def __init__(self, graph: torch.cuda.CUDAGraph, out: tuple) -> None:
        self.graph, self.out = graph, out
        self.alone = tuple(_use_count(t) for t in out)

    def free(self) -> bool:
        """Whether no tensor but the capture's own uses its outputs."""
        return all(_use_count(t) == alone for t, alone in zip(self.out, self.alone))


class _Class:
    """One size class's buffers and, once captured, its captures."""

    __slots__ = ("ids", "meta", "captures", "runs", "closed")

    def __init__(self, size: int, meta: int, device: torch.device) -> None:
        self.ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.meta = torch.zeros(meta, dtype=torch.int64, device=device)
        self.captures: list[_Capture] = []
        self.runs = 0
        self.closed = False  # a capture failed: no more are made


class DedupGraphs:
    """Padded, captured one-pass sorts, one graph per (size class, storage layout)."""

    def __init__(self) -> None:
        self._classes: collections.OrderedDict = collections.OrderedDict()
        self.sorts = 0
        self.replays = 0
        self.captures = 0
        self.uncaptured = 0  # sorts of a captured class run uncaptured (every output held)

    def sort(self, values: list[torch.Tensor], tags: list[int], num_tags: int, bits: int,
             clamp: bool, owners: int, owned: tuple[int, int] | None
             ) -> tuple[torch.Tensor, ...]:
        """``padded_sort`` of the features' ``values`` (emit order) with tags ``tags``;
        returns its outputs cut to the real positions (and their summary), valid after
        later calls. ``bits``: ``pad_bits(num_tags)`` for keys, or fewer."""
        from hashrec.table.lookup_graphs import padded_size  # imports Triton

        device = values[0].device
        ends = list(itertools.accumulate(v.numel() for v in values))
        n = ends[-1]
        self.sorts += 1
        # On CUDA the keys kernel reads every feature's ids where they are (their
        # addresses ride in the table of ends and tags), instead of a copy of them all.
        direct = device.type == "cuda" and all(
            v.dtype == torch.int64 and v.is_contiguous() for v in values)
        meta = ends + [t << bits for t in tags]
        if direct:
            meta += [v.data_ptr() for v in values]
        key = (padded_size(n), len(meta), num_tags, bits, clamp, owners, owned, device)
        entry = self._entry(key)
        if not direct:
            torch.cat(values, out=entry.ids[:n])
        host = torch.tensor(meta, dtype=torch.int64, pin_memory=device.type == "cuda")
        entry.meta.copy_(host, non_blocking=True)
        args = (entry.ids, entry.meta, num_tags, bits, clamp, owners, owned,
                len(values) if direct else None)
        copied = bool(owners) or _STORAGE_USE_COUNT is None
        capture = None
        if entry.runs >= CAPTURE_AFTER and device.type == "cuda":
            capture = self._capture_for(entry, args, copied)
        entry.runs += 1
        if capture is None:
            if entry.captures:
                self.uncaptured += 1
            out = padded_sort(*args)
            return (*(t[:n] for t in out[:4]), out[4])
        capture.graph.replay()
        self.replays += 1
        if copied:  # one capture, its outputs copied out
            return (*(t[:n].clone() for t in capture.out[:4]), capture.out[4].clone())
        return (*(t[:n] for t in capture.out[:4]), capture.out[4])

    def _capture_for(self, entry: _Class, args: tuple, copied: bool) -> _Capture | None:
        """A capture of ``entry`` to replay (a new one where every capture's outputs are
        held and fewer than ``BUFFERS`` exist; one alone when its outputs are
        ``copied``), or None: run uncaptured."""
        if copied and entry.captures:
            return entry.captures[0]
        for capture in entry.captures:
            if capture.free():
                return capture
        if entry.closed or len(entry.captures) >= BUFFERS:
            return None
        return self._capture(entry, args)

    def _entry(self, key: tuple) -> _Class:
        entry = self._classes.get(key)
        if entry is None:
            entry = self._classes[key] = _Class(key[0], key[1], key[-1])
            kept = sum(k[0] for k in self._classes)
            while len(self._classes) > MAX_GRAPHS or (len(self._classes) > MIN_GRAPHS
                                                      and kept > KEEP_IDS):
                kept -= self._classes.popitem(last=False)[0][0]
        else:
            self._classes.move_to_end(key)
        return entry

    def _capture(self, entry: _Class, args: tuple) -> _Capture | None:
        from hashrec.table.lookup_graphs import capture_graph  # imports Triton

        try:
            graph, out = capture_graph(entry.ids.device, lambda: padded_sort(*args))
        except RuntimeError as error:  # the uncaptured sort goes on working
            logger.warning("dedup sort of %d ids not captured (%s); it runs uncaptured",
                           entry.ids.numel(), error)
            entry.closed = True
            return None
        capture = _Capture(graph, out)
        entry.captures.append(capture)
        self.captures += 1
        logger.info("captured the dedup sort of up to %d ids as a CUDA graph (%d of its "
                    "size class)", entry.ids.numel(), len(entry.captures))
        return capture


_GRAPHS: dict = {}


def graphs_for(device: torch.device) -> DedupGraphs:
    """The process's padded sorts on ``device``."""
    key = (device.type, device.index)
    graphs = _GRAPHS.get(key)
    if graphs is None:
        graphs = _GRAPHS[key] = DedupGraphs()
    return graphs
