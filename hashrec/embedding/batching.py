"""From KeyedJaggedTensor bags to one deduplicated key set per storage.

Every feature that reads a storage (directly, through ``embedding_name``
sharing, or as a sequence sub-feature of a shared table) contributes its ids;
the ids of each logical table are deduplicated together, the unique keys of all
logical tables of a storage are concatenated with their tags, and each feature
keeps the ``inverse`` index from its ids to the unique rows. One lookup per
storage then serves all of them.

Deduplication sorts each storage's ids by (logical table, key) and reads the
sizes of every storage's result from the device in a single transfer per step,
however many storages and tables there are; the transfer can be started ahead
and read later (``start_dedup``; on a GPU of a single process the sorts then run on
a stream of their own, beside the step that the current stream runs). With several
logical tables the sort is one pass over ``tag << bits | id`` when the ids fit
(always for rows of dense tables; for other keys while every id seen was in
[0, 2 ** bits)), else a sort by key followed by a stable sort by tag.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from hashrec.distributed.ops.route import owner_counts
from hashrec.distributed.side_exchange import run_aside
from hashrec.embedding import dedup_graphs
from hashrec.embedding.errors import EmbeddingError
from hashrec.embedding.jagged import JaggedTensor
from hashrec.embedding.ops.dedup import tag_summary, unique_layout
from hashrec.embedding.specs import EmbeddingFeatureSpec


@dataclass
class FeatureIds:
    """The ids one feature reads this batch (sequences already truncated).

    Attributes:
        spec: the feature.
        values: (n,) int64 ids, bag-major.
        offsets: (B + 1,) int64 bag boundaries in ``values``.
        lengths: (B,) int64 bag sizes.
        weights: (n,) float32 per-id weights of weighted features, else None.
        inverse: (n,) int64 row of each id in the storage's unique keys (set by
            ``dedup_storage``).
        max_bag: the longest bag when the host knows it without reading the device,
            else None.
        item_rows: a multi-value sequence read as one bag per item
            (``hashrec.embedding.items``): the (B,) items of each row, else None.
    """

    spec: EmbeddingFeatureSpec
    values: torch.Tensor
    offsets: torch.Tensor
    lengths: torch.Tensor
    weights: torch.Tensor | None = None
    inverse: torch.Tensor | None = None
    max_bag: int | None = None
    item_rows: torch.Tensor | None = None


@dataclass
class StorageBatch:
    """Unique keys of one storage and the features they serve.

    Attributes:
        keys: (U,) int64 unique keys, logical table by logical table.
        tags: (U,) int32 tag of each key (fused storages), else None.
        features: the features' ids, each with its ``inverse`` set: bag features
            first, those of one pooling kind together (``pooling_kind``), then sequences
            by length.
        counts: (U,) int64 occurrences of each unique key in the batch.
        unique_per_table: number of unique keys of each logical table, by tag.
        inverse: (n,) int64 row in ``keys`` of every id of ``features``, concatenated
            in that order (each feature's ``inverse`` is its slice).
        order: (n,) int64 those positions grouped by unique key (stable).
        row_start: (U + 1,) int64; ``order[row_start[r]:row_start[r + 1]]`` are the
            positions of unique key ``r``.
        key_ranges: per logical table, its smallest and largest id of the batch
            (None for a table without ids).
        owner_counts: sharded storages: unique keys owned by each rank (what the
            lookup sends it), else None.
        recv_counts: sharded storages whose dedup every rank shared (``SummaryGather``):
            the keys each rank sends this one, else None.
        unique_per_rank: storages whose dedup every rank shared: every rank's number of
            unique keys (a replicated dense table's gradient rows), else None.
        pair_max: sharded storages whose dedup every rank shared: the most keys any rank
            sends any rank (every rank knows the same value), else None.
        unique_per_rank_table: the same per rank and logical table (what a join's
            members take their share from), else None.
        wide_ids: the batch was to sort in one pass (``narrow``) but an id did not
            fit; it was sorted again in two: the level of the failed sort (``COMPACT``:
            later batches should try ``NARROW`` keys; ``NARROW``: not try), else 0.
        member_rows: a join of several storages: each member's first unique row, then
            U (the gradient reduction sums each member's rows as it would alone),
            else None.
        sorted_rows: (n,) int64 row in ``keys`` of each position of ``order``
            (``inverse[order]``, which the dedup's sort yields), or None.
    """

    keys: torch.Tensor
    tags: torch.Tensor | None
    counts: torch.Tensor
    features: list[FeatureIds]
    unique_per_table: list[int]
    inverse: torch.Tensor
    order: torch.Tensor
    row_start: torch.Tensor
    key_ranges: list[tuple[int, int] | None] | None = None
    owner_counts: list[int] | None = None
    recv_counts: list[int] | None = None
    unique_per_rank: list[int] | None = None
    pair_max: int | None = None
    wide_ids: int = 0
    unique_per_rank_table: list[list[int]] | None = None
    member_rows: list[int] | None = None
    sorted_rows: torch.Tensor | None = None


def feature_ids(spec: EmbeddingFeatureSpec, bags: JaggedTensor) -> FeatureIds:
    """Collects one feature's ids; sequence features keep their first ``max_length`` ids.

    Raises:
        EmbeddingError: a weighted feature without weights, or ids that are not integers.
    """
    values, lengths, offsets = bags.values, bags.lengths, bags.offsets
    if values.dtype.is_floating_point or values.dtype == torch.bool:
        raise EmbeddingError(f"feature {spec.name!r}: ids must be integers, got {values.dtype}")
    values = values.to(torch.int64)
    weights, max_bag = None, bags.max_bag
    if spec.weighted and not spec.is_sequence:
        if bags.weights is None:
            raise EmbeddingError(
                f"feature {spec.name!r} is weighted but the KeyedJaggedTensor has no weights")
        weights = bags.weights.to(torch.float32)
    # Truncation needs a mask whose size only the device knows; skip it when the
    # host already knows that no bag is longer than max_length.
    if spec.is_sequence and (bags.max_bag is None or bags.max_bag > spec.max_length):
        kept = lengths.clamp(max=spec.max_length)
        position = torch.arange(values.numel(), device=values.device) - \
            offsets[:-1].repeat_interleave(lengths, output_size=values.numel())
        values = values[position < spec.max_length]
        lengths = kept
        offsets = torch.zeros_like(offsets)
        torch.cumsum(lengths, 0, out=offsets[1:])
        max_bag = None if max_bag is None else min(max_bag, spec.max_length)
    return FeatureIds(spec, values, offsets, lengths, weights, max_bag=max_bag)


class _Sorted(NamedTuple):
    """Device-side first half of a storage's dedup (sizes not yet on the host)."""

    features: list[FeatureIds]
    fused: bool
    sorted_ids: torch.Tensor
    sorted_tags: torch.Tensor | None
    order: torch.Tensor
    group: torch.Tensor
    summary: torch.Tensor  # (3 T + owners,): unique keys, smallest id, largest id per
    # tag, then the unique keys per owning rank (sharded storages)
    owners: int = 0
    source: tuple = ()  # _sort_storage's arguments when a narrow sort may need a redo
    narrow: int = 0  # the one-pass level of other keys tried (NARROW, COMPACT), else 0


# Row ids of dense tables (below 2 ** _ROW_BITS) sort with their tag above them.
_ROW_BITS = 40
# One-pass levels of other keys (``_sort_storage``'s ``narrow``): ``tag << bits | id`` in
# an int64, or in an int32 (COMPACT), which sorts in half the radix passes: on an H200 a
# stable sort of 1M keys took 0.108 ms as int32 and 0.208 as int64
# (benchmarks/results/sort_bits_gpu.md), and the layer forward of 10 tables, 1M ids, with
# the next dedup run ahead 0.94 ms against 1.00 (embedding_layer_gpu_compact_dedup_first.md
# against _before_compact_dedup.md, one call).
NARROW, COMPACT = 1, 2


def _narrow_bits(num_tags: int, level: int = NARROW) -> int:
    """Bits left to an id below its tag in a non-negative int64 (int32: COMPACT) sort key."""
    return (31 if level == COMPACT else 63) - max(1, (num_tags - 1).bit_length())


def _emit_order(features_by_tag: list[list[FeatureIds]]) -> list[tuple[int, FeatureIds]]:
    """(tag, feature) pairs in the order a storage lays out its ids: bag features first,
    those of one pooling kind next to each other (``emit_storage`` pools each such run
    in one launch), then sequences by length (one launch per length); otherwise in
    tag order."""
    tagged = [(tag, f) for tag, fs in enumerate(features_by_tag) for f in fs]
    return sorted(tagged, key=lambda pair: pooling_kind(pair[1]))


def pooling_kind(f: FeatureIds) -> tuple[bool, bool, bool, int]:
    """(sequence, mean, weighted, max_length) of a feature: bags of one kind pool (and
    sequences of one length pad) together."""
    sequence = f.spec.is_sequence
    return sequence, not sequence and f.spec.pooling == "mean", \
        not sequence and f.weights is not None, f.spec.max_length if sequence else 0


def _tag_of(tagged: list[tuple[int, FeatureIds]], n: int, device, shift: int = 0
            ) -> torch.Tensor:
    """(n,) int64 tag (``<< shift``) of every id, features in ``tagged`` order (read
    only: batches of the same layout up to ``_SHARED_TAGS`` ids, such as those of
    single-valued features, share one)."""
    pairs = tuple((tag << shift, f.values.numel()) for tag, f in tagged)
    if n <= _SHARED_TAGS:  # one per stream: the stream that made a tensor frees it
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        return _shared_tags(pairs, n, device, stream)
    return _tags_for(pairs, n, device)


_SHARED_TAGS = 1 << 20


@functools.lru_cache(maxsize=8)
def _shared_tags(pairs: tuple[tuple[int, int], ...], n: int, device, stream) -> torch.Tensor:
    return _tags_for(pairs, n, device)


def _tags_for(pairs: tuple[tuple[int, int], ...], n: int, device) -> torch.Tensor:
    """``_tag_of`` of (tag, ids) pairs: one small copy to the device and one repeat, not a
    fill per feature."""
    host = torch.tensor([p for pair in zip(*pairs) for p in pair], dtype=torch.int64,
                        pin_memory=device.type == "cuda")
    host = host.to(device, non_blocking=True)
    return torch.repeat_interleave(host[:len(pairs)], host[len(pairs):], output_size=n)


def _sort_storage(features_by_tag: list[list[FeatureIds]], fused: bool,
                  row_ids: bool = False, owners: int = 0, narrow: bool = False,
                  owned: tuple[int, int] | None = None) -> _Sorted:
    """Sorts a storage's ids by (tag, id) and marks the unique ones.

    ``owners`` > 1: the storage is sharded over that many ranks; the summary also
    counts the unique keys each rank owns (``owner_of``), what the lookup sends it:
    those of the tags in [``owned[0]``, ``owned[1]``) when given (a join whose other
    storages are not sharded), else of every tag.

    ``row_ids``: every id is a row of a dense table, in [0, 2 ** 40) when valid; one
    sort of ``tag << 40 | id`` then replaces sorting by id and stably by tag. With an
    id outside that range the smallest id of every tag reads as -1, so that the
    collection's range check finds it.

    ``narrow`` (other keys): the same one sort, of ``tag << bits | id`` with the
    bits an int64 leaves (``_narrow_bits``; ``COMPACT``: an int32, 27 id bits for up to
    16 tables); with an id outside [0, 2 ** bits) the lows read -1 and
    ``PendingDedup.result`` sorts the storage again in two passes (the result is the same
    either way).

    On CUDA the one-pass sort runs padded to a size class and replayed from a CUDA
    graph (``hashrec.embedding.dedup_graphs``; keys then have one id bit fewer).
    """
    tagged = _emit_order(features_by_tag)
    every = [f for _, f in tagged]
    device = every[0].values.device
    n, num_tags = sum(f.values.numel() for f in every), len(features_by_tag)
    used = [tag for tag, fs in enumerate(features_by_tag) if fs]
    if n == 0:
        ids = every[0].values
        zeros = torch.zeros(3 * num_tags + owners, dtype=torch.int64, device=device)
        return _Sorted(every, fused, ids, None, ids, ids, zeros, owners)
    one_pass = bool(row_ids or narrow) and len(used) > 1
    level = int(narrow) if one_pass and not row_ids else 0
    source = (features_by_tag, fused, row_ids, owners, False, owned) if level else ()
    if one_pass and dedup_graphs.enabled(device):
        bits = _ROW_BITS if row_ids else dedup_graphs.pad_bits(num_tags, level == COMPACT)
        sorted_ids, sorted_tags, order, group, summary = dedup_graphs.graphs_for(device).sort(
            [f.values for f in every], [tag for tag, _ in tagged], num_tags, bits, row_ids,
            owners, owned)
        return _Sorted(every, fused, sorted_ids, sorted_tags, order, group, summary, owners,
                       source, level)
    ids = torch.cat([f.values for f in every]) if len(every) > 1 else every[0].values
    sorted_ids, sorted_tags, order, new, bad, ends = _sort_ids(
        ids, tagged, num_tags, one_pass, row_ids, len(used) > 1, level)
    group = torch.cumsum(new, 0) - 1
    if sorted_tags is None:
        summary = torch.zeros(3, num_tags, dtype=torch.int64, device=device)
        summary[:, used[0]] = torch.cat([group[-1:] + 1, ends])
    else:
        summary = tag_summary(sorted_tags, sorted_ids, group, num_tags, bad)
    summary = summary.reshape(-1)
    if owners:
        counted = new
        if owned is not None and sorted_tags is not None:
            counted = new & (sorted_tags >= owned[0]) & (sorted_tags < owned[1])
        elif owned is not None and not owned[0] <= used[0] < owned[1]:
            counted = torch.zeros_like(new)  # the one tag read is not a sharded one
        summary = torch.cat([summary, owner_counts(sorted_ids, counted, owners)])
    return _Sorted(every, fused, sorted_ids, sorted_tags, order, group, summary, owners,
                   source, level)


def _sort_ids(ids: torch.Tensor, tagged: list[tuple[int, FeatureIds]], num_tags: int,
              one_pass: bool, row_ids: bool, tagged_sort: bool, level: int = NARROW) -> tuple:
    """``_sort_storage``'s sort at exact sizes: (sorted ids, sorted int32 tags or None,
    order, first-of-its-key flags, the out-of-range flag or None, the smallest and
    largest id or None). ``tagged_sort``: more than one tag is read; ``level``: the
    one-pass key of other keys (``NARROW`` or ``COMPACT``)."""
    n, device = ids.numel(), ids.device
    new = torch.ones(n, dtype=torch.bool, device=device)
    bad = ends = None
    if one_pass:
        # A position starts a new unique key where its (tag, key) differs from the previous.
        # A row id out of range is clamped into it (the batch stays consistent) and
        # flagged; narrow keys out of range are sorted again, so need no clamp.
        bits = _ROW_BITS if row_ids else _narrow_bits(num_tags, level)
        bad = (ids >> bits).any()
        keyed = (ids.clamp(0, (1 << bits) - 1) if row_ids else ids) + \
            _tag_of(tagged, n, device, bits)
        combined, order = dedup_graphs.sort_keys(keyed, not row_ids and level == COMPACT)
        torch.ne(combined[1:], combined[:-1], out=new[1:])
        return (combined & ((1 << bits) - 1), (combined >> bits).to(torch.int32), order, new,
                bad, ends)
    sorted_ids, order = torch.sort(ids, stable=True)
    ends = torch.cat([sorted_ids[:1], sorted_ids[-1:]])
    sorted_tags = None
    if tagged_sort:
        tag_of = _tag_of(tagged, n, device).to(torch.int32)
        sorted_tags, by_tag = torch.sort(tag_of[order], stable=True)
        order, sorted_ids = order[by_tag], sorted_ids[by_tag]
    torch.ne(sorted_ids[1:], sorted_ids[:-1], out=new[1:])
    if sorted_tags is not None:
        new[1:] |= sorted_tags[1:] != sorted_tags[:-1]
    return sorted_ids, sorted_tags, order, new, bad, ends


def _too_wide(s: _Sorted, summary: list[int], narrow: bool | None = None) -> bool:
    """Whether a narrow sort met an id outside its range (its lows read -1).

    ``narrow``: whether the sort that made ``summary`` was narrow (default: ``s``'s;
    a peer's summary comes with its own flag)."""
    if not (bool(s.source) if narrow is None else narrow):
        return False
    num_tags = (len(summary) - s.owners) // 3
    return -1 in summary[num_tags:2 * num_tags]


def _finish_storage(s: _Sorted, summary: list[int]) -> StorageBatch:
    owner_counts = summary[len(summary) - s.owners:] if s.owners else None
    summary = summary[:len(summary) - s.owners]
    num_tags = len(summary) // 3
    unique_per_table, lows, highs = (summary[i * num_tags:(i + 1) * num_tags] for i in range(3))
    u = sum(unique_per_table)
    keys, tags, inverse, row_start = unique_layout(
        s.group, s.order, s.sorted_ids, s.sorted_tags if s.fused else None, u)
    if s.fused and tags is None:
        tag = next((t for t in range(num_tags) if unique_per_table[t]), 0)
        tags = torch.full((u,), tag, dtype=torch.int32, device=keys.device)
    for f, part in zip(s.features, inverse.split([f.values.numel() for f in s.features])):
        f.inverse = part
    return StorageBatch(keys, tags, row_start[1:] - row_start[:-1], s.features,
                        unique_per_table, inverse, s.order, row_start,
                        [(lo, hi) if count else None
                         for count, lo, hi in zip(unique_per_table, lows, highs)],
                        owner_counts, sorted_rows=s.group)


class SummaryGather(NamedTuple):
    """How the ranks of a sharded collection share their dedup sizes.

    ``gather`` is a collective, ``(L,) int64 -> (world, L)``: every rank's summary of
    the same storages; ``rank`` is this rank's row.
    """

    rank: int
    gather: Callable[[torch.Tensor], torch.Tensor]


class PendingDedup:
    """Deduplication of several storages whose device work is queued and whose sizes
    are on their way to the host (``start_dedup``); ``result()`` finishes it.

    On CUDA the sizes travel by an asynchronous copy into pinned memory followed by
    an event, so ``result()`` waits for the sorts only, not for whatever the stream
    queued after them (a training step starts the next batch's dedup before its
    own dense network and backward, and reads the sizes at the next step). Work
    queued on the dedup stream (``aside``: ``start_dedup``) is joined by ``result()``
    and by ``drop()``: the current stream waits for it.

    With a ``SummaryGather`` the ranks exchange their sizes on the device before the
    copy, so every rank learns ahead what each peer will send it and how many rows
    each peer's dense-table gradients hold: the step's exchanges then need no size
    exchange of their own. If a peer's sizes are not final (an id too wide for the
    one-pass sort), every rank drops the shared sizes of that batch alike. On CUDA
    that exchange and its copy run on a side stream
    (``hashrec.distributed.side_exchange``): the training stream does not wait for the
    slowest rank to reach it.
    """

    def __init__(self, firsts: list[_Sorted], share: SummaryGather | None = None,
                 aside: bool = False) -> None:
        self._firsts = firsts
        self._event = None
        self._rank = None
        self._aside = aside and bool(firsts)  # queued on the dedup stream (``start_dedup``)
        if firsts and share is not None:
            # Each storage's narrow flag travels too: a peer's -1 lows mean "sort again"
            # only after a narrow sort.
            flags = _flags(tuple(bool(s.source) for s in firsts), firsts[0].summary.device)
            local = torch.cat([s.summary for s in firsts] + [flags])
            self._rank = share.rank
            if local.is_cuda:  # gathered and copied on a side stream: the step goes on
                self._host, self._event = run_aside(
                    local.device, lambda: _to_host(share.gather(local)), (local,))
                return
            summary = share.gather(local)
        else:
            summary = torch.cat([s.summary for s in firsts]) if firsts else None
        if summary is not None and summary.is_cuda:
            self._host = _to_host(summary)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = summary

    def result(self) -> list[StorageBatch]:
        """The storages' batches (sets each feature's ``inverse``)."""
        if not self._firsts:
            return []
        if self._event is not None:
            self._event.synchronize()
        if self._aside:
            self._join(record=True)
        flat = self._host.tolist()
        ranks = flat if self._rank is not None else [flat]
        widths = [s.summary.numel() for s in self._firsts]
        starts = [0, *itertools.accumulate(widths)][:-1]
        # rows[i][r]: storage i's summary on rank r; every rank judges every rank's alike.
        rows = [[r[at:at + w] for r in ranks] for at, w in zip(starts, widths)]
        shared = self._rank is not None and self._all_final(rows, ranks)
        out = []
        for s, per_rank in zip(self._firsts, rows):
            summary = per_rank[self._rank or 0]
            if _too_wide(s, summary):  # sort again by key, then by tag (reads the sizes)
                level = s.narrow
                s = _sort_storage(*s.source)
                batch = _finish_storage(s, s.summary.tolist())
                batch.wide_ids = level
            else:
                batch = _finish_storage(s, summary)
            if shared:
                _add_peer_sizes(batch, s, per_rank, self._rank)
            elif self._rank is not None:
                # Some rank's sizes are not final: every rank exchanges sizes in the lookup.
                batch.owner_counts = None
            out.append(batch)
        return out

    def drop(self) -> None:
        """Drops a dedup whose result is not wanted: the current stream waits for its
        sorts, which may still read ids whose memory that stream may reuse once freed."""
        if self._aside:
            self._join(record=False)

    def _join(self, record: bool) -> None:
        """The current stream waits for the sorts queued on the dedup stream; with
        ``record`` their outputs, made there, are marked as used by it too (the caching
        allocator then keeps their memory from the dedup stream until it is done)."""
        self._aside = False
        stream = torch.cuda.current_stream(self._firsts[0].summary.device)
        stream.wait_event(self._event)
        if record:
            for s in self._firsts:
                for tensor in (s.sorted_ids, s.sorted_tags, s.order, s.group, s.summary):
                    if tensor is not None:
                        tensor.record_stream(stream)

    def _all_final(self, rows: list[list[list[int]]], ranks: list[list[int]]) -> bool:
        """Whether every rank's sizes of every storage are final (no narrow sort of any
        rank met a too wide id); each rank's narrow flags end its gathered row."""
        count = len(self._firsts)
        narrow = [row[len(row) - count:] for row in ranks]
        return not any(_too_wide(s, per_rank[r], bool(narrow[r][i]))
                       for i, (s, per_rank) in enumerate(zip(self._firsts, rows))
                       for r in range(len(ranks)))


def _add_peer_sizes(batch: StorageBatch, s: _Sorted, per_rank: list[list[int]],
                    rank: int) -> None:
    """What the peers' summaries tell ``batch``: keys each sends this rank (sharded
    storages) and each one's number of unique keys."""
    num_tags = (len(per_rank[0]) - s.owners) // 3
    batch.unique_per_rank_table = [summary[:num_tags] for summary in per_rank]
    batch.unique_per_rank = [sum(summary[:num_tags]) for summary in per_rank]
    if s.owners:
        batch.recv_counts = [summary[3 * num_tags + rank] for summary in per_rank]
        batch.pair_max = max(max(summary[3 * num_tags:3 * num_tags + s.owners])
                             for summary in per_rank)


def _to_host(summary: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of ``summary``, queued on the current stream."""
    host = torch.empty(summary.shape, dtype=summary.dtype, pin_memory=True)
    host.copy_(summary, non_blocking=True)
    return host


@functools.lru_cache(maxsize=8)
def _flags(flags: tuple[bool, ...], device) -> torch.Tensor:
    """(len(flags),) int64 on ``device`` (read only; copied once per distinct tuple)."""
    host = torch.tensor(flags, dtype=torch.int64, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def start_dedup(storages: list[tuple], share: SummaryGather | None = None,
                aside: bool = True) -> PendingDedup:
    """Queues the device half of ``dedup_storages`` and sends the sizes to the host
    (shared by every rank first when ``share`` is given: a collective).

    On CUDA with ``aside`` and without ``share`` the sorts run on the device's dedup
    stream (``dedup_stream``), after the work queued so far on the current stream:
    they then overlap whatever the current stream runs next (a training step's lookups
    and pooling), and ``result()`` makes the stream that reads them wait for them. A
    process keeps to one of the two streams (the collection of a single process sorts
    aside, one of several ranks on the current stream): captured sorts share buffers
    (``dedup_graphs``) that only one stream's order keeps apart."""
    device = _device_of(storages)
    if share is not None or not aside or device is None or not aside_enabled(device):
        return PendingDedup([_sort_storage(*storage) for storage in storages], share)
    main, side = torch.cuda.current_stream(device), dedup_stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        return PendingDedup([_sort_storage(*storage) for storage in storages], aside=True)


ASIDE_ENV = "HASHREC_DEDUP_STREAM"
_dedup_streams: dict[int, torch.cuda.Stream] = {}


def aside_enabled(device: torch.device) -> bool:
    """Whether dedup sorts on ``device`` run on its dedup stream (``HASHREC_DEDUP_STREAM``:
    default on for CUDA, ``0`` off: on the current stream)."""
    value = os.environ.get(ASIDE_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{ASIDE_ENV}={value!r}: expected 0 or 1")
    return value != "0" and device.type == "cuda"


def dedup_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream the dedup sorts of ``device`` run on (one per device and process, so
    that the captured sorts' shared buffers are written in one stream's order)."""
    index = torch.cuda.current_device() if device.index is None else device.index
    stream = _dedup_streams.get(index)
    if stream is None:
        stream = _dedup_streams[index] = torch.cuda.Stream(index)
    return stream


def _device_of(storages: list[tuple]) -> torch.device | None:
    """The device of the first feature's ids of ``start_dedup``'s entries, if any."""
    for storage in storages:
        for fs in storage[0]:
            if fs:
                return fs[0].values.device
    return None


def dedup_storages(storages: list[tuple], aside: bool = True) -> list[StorageBatch]:
    """Deduplicates each storage's ids per logical table; sets each feature's ``inverse``.

    Args:
        storages: per storage, ``(features_by_tag, fused[, row_ids[, owners[,
            narrow[, owned]]]])``: for each logical table of the storage (index = tag)
            the features reading it this batch, whether tags are passed to the storage
            (False: one logical table, tag 0), whether the ids are rows of dense
            tables (a faster sort), the ranks a sharded storage spans, the one-pass
            sort of other keys to try (0 / False: none, ``NARROW`` / True: int64 keys,
            ``COMPACT``: int32 keys), and the tags whose keys are sharded (see
            ``_sort_storage``).

    Unique keys come tag by tag, ascending within a tag. All storages' sizes reach
    the host in one device read. ``aside``: as ``start_dedup``'s (a process sorts
    every batch on one stream or the other, as the captured sorts share buffers).
    """
    return start_dedup(storages, aside=aside).result()


def dedup_storage(features_by_tag: list[list[FeatureIds]], fused: bool) -> StorageBatch:
    """``dedup_storages`` of one storage."""
    return dedup_storages([(features_by_tag, fused)])[0]
