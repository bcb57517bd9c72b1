"""Data parallelism of everything that is replicated: the dense network and dense tables.

Every rank holds a full copy of the dense network and of each dense embedding
table (``num_buckets``, ``hash_bucket_size``, vocab and boundary tables). Each
rank's loss is the mean over its own batch, so with equal per-rank batches the
world-size-1 gradient of the global batch is the *average* of the ranks'
gradients:

* dense network: :class:`FlatGradients` keeps every ``.grad`` as a view of one
  buffer and averages it before clipping and the optimizer step: in the embedding
  backward's last gradient exchange, which it joins, or else in one all-reduce after
  backward (:func:`all_reduce_gradients` does the same for gradients held apart);
* dense tables are updated in backward by the sparse optimizer from the rows a
  batch touched: :func:`gather_sparse_gradients` all-gathers every rank's
  (row, gradient) pairs, already divided by the world size, and sums them per
  row in rank order, so every replica applies the same update bit for bit
  (without a device read: the sizes are host values); small tables instead
  scatter their rows' gradients into a dense buffer that one all-reduce sums
  (:func:`all_reduce_row_gradients_many`: no sizes, no sort);
* :func:`broadcast_state` copies rank 0's parameters and buffers to every rank
  (start of training, after a restore);
* zero-collision (ZCH) tables: every rank remaps the ids of the whole global batch
  (:func:`all_gather_rows`), so their remappers make the same slot assignments and
  evictions, and the rows an eviction re-initializes are rank 0's
  (:func:`broadcast_rows`).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from hashrec.distributed.comm_timer import CommTimer
from hashrec.distributed.errors import DistributedError
from hashrec.distributed.process_group import DistContext, all_gather_ints


def all_reduce_gradients(parameters: list[nn.Parameter], ctx: DistContext,
                         group: dist.ProcessGroup | None = None) -> None:
    """Replace every parameter's ``.grad`` by its mean over ranks (missing grads count as 0).

    Args:
        parameters: the same parameters, in the same order, on every rank.
        ctx: the worker's context (no-op without a process group).
    """
    if not ctx.is_distributed or not parameters:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat /= ctx.world_size
    # One split makes every parameter's view; a cast only where the dtypes differ.
    for p, g, part in zip(parameters, grads, flat.split([g.numel() for g in grads])):
        part = part.view_as(p)
        p.grad = part if part.dtype == g.dtype else part.to(g.dtype)


# Dense-network gradients of at most this many float32 elements (4 MiB) join another
# exchange of the backward instead of an all-reduce of their own (FlatGradients.ready).
RIDE_MAX_ELEMENTS = 1 << 20


class FlatGradients:
    """The replicated parameters' ``.grad`` as views of one flat buffer, averaged in place.

    :func:`all_reduce_gradients` concatenates the gradients, all-reduces the copy and
    splits it back into new ``.grad`` tensors: a cat over every parameter and a Python
    loop that rebinds each gradient, on every step. Here every parameter's gradient is
    a view of one buffer that lives across steps: backward accumulates into the views
    (autograd adds in place into a gradient that exists), :meth:`zero` clears the
    buffer in one kernel before backward, and :meth:`all_reduce` averages it in place
    with one collective: the same values as :func:`all_reduce_gradients`.

    Under sharded dynamic tables the buffer rides along in their gradient exchange of
    the backward (:meth:`ready`, :meth:`take_averaged`; ``hashrec.embedding.sharded``),
    and :meth:`all_reduce` has no collective left to run.

    A gradient that something replaced (not a view of the buffer any more) is copied
    back in before the all-reduce, and its view bound again. Parameters of mixed
    dtypes or devices are not flattened: :meth:`all_reduce` then falls back to
    :func:`all_reduce_gradients`.

    Args:
        parameters: the same parameters, in the same order, on every rank (those that
            do not require grad are left alone).
        ctx: the worker's context.
        group: process group (default group when None).
    """

    def __init__(self, parameters: list[nn.Parameter], ctx: DistContext,
                 group: dist.ProcessGroup | None = None) -> None:
        # Frozen parameters keep no gradient (an optimizer skips them, decay included).
        self.parameters = [p for p in parameters if p.requires_grad]
        self.ctx, self.group = ctx, group
        kinds = {(p.dtype, p.device) for p in self.parameters}
        self.flat = None
        self.views: list[torch.Tensor] = []
        self._averaged = False  # take_averaged() ran since the last all_reduce()
        self._version = -1  # the buffer's version counter right after take_averaged()
        if len(kinds) == 1:
            dtype, device = kinds.pop()
            self.flat = torch.zeros(sum(p.numel() for p in self.parameters), dtype=dtype,
                                    device=device)
            self.views = [part.view_as(p) for p, part in
                          zip(self.parameters, self.flat.split([p.numel() for p in
                                                                self.parameters]))]

    def zero(self) -> None:
        """Clear every gradient before backward (the views stay bound)."""
        if self.flat is None:
            for p in self.parameters:
                p.grad = None
            return
        self.flat.zero_()
        self._averaged = False
        for p, view in zip(self.parameters, self.views):
            if p.grad is not view:
                p.grad = view

    def all_reduce(self) -> None:
        """Replace every gradient by its mean over ranks (a collective, unless another
        exchange of this step averaged the buffer already: :meth:`take_averaged`)."""
        if not self.ctx.is_distributed or not self.parameters:
            return
        if self.flat is None:
            all_reduce_gradients(self.parameters, self.ctx, self.group)
            return
        if self._averaged:
            self._averaged = False
            # A gradient replaced, or one accumulated into the buffer after the average (a
            # parameter used before the embedding lookup), would leave the ranks apart.
            if self.flat._version != self._version or \
                    any(p.grad is not view for p, view in zip(self.parameters, self.views)):
                raise DistributedError("a dense gradient changed after it was averaged in "
                                       "the embedding backward")
            return
        self._bind()
        dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, group=self.group)
        self.flat /= self.ctx.world_size

    @property
    def averaged(self) -> bool:
        """The buffer holds this step's mean already (:meth:`take_averaged` ran)."""
        return self._averaged

    def ready(self) -> torch.Tensor | None:
        """The buffer, every gradient in it, for an exchange of the backward that sums it
        over ranks (then :meth:`take_averaged`); None when it cannot travel that way
        (not flattened, not float32, or larger than ``RIDE_MAX_ELEMENTS``: the exchanges it
        would join send every rank a copy, more traffic than an all-reduce's beyond a few
        ranks)."""
        if self.flat is None or self.flat.dtype != torch.float32 or \
                not self.ctx.is_distributed or self.flat.numel() > RIDE_MAX_ELEMENTS:
            return None
        self._bind()
        return self.flat

    def take_averaged(self, averaged: torch.Tensor) -> None:
        """The buffer's mean over ranks, computed by another exchange (possibly into the
        buffer itself): :meth:`all_reduce` then has nothing left to do."""
        if averaged.data_ptr() != self.flat.data_ptr():
            self.flat.copy_(averaged)
        self._averaged = True
        self._version = self.flat._version

    def _bind(self) -> None:
        """Copies a gradient that something replaced since :meth:`zero` into the buffer
        and binds its view again."""
        for p, view in zip(self.parameters, self.views):
            if p.grad is not view:
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view


def broadcast_state(module: nn.Module, ctx: DistContext, src: int = 0,
                    group: dist.ProcessGroup | None = None) -> None:
    """Copy rank ``src``'s parameters and buffers (``state_dict`` tensors) to every rank."""
    if not ctx.is_distributed:
        return
    with torch.no_grad():
        for tensor in module.state_dict().values():
            if isinstance(tensor, torch.Tensor):
                dist.broadcast(tensor, src=src, group=group)


def all_gather_rows(tensor: torch.Tensor, ctx: DistContext,
                    group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (rows of any count, equal trailing shape), by rank.

    The counts travel as host values (``all_gather_ints``), then the rows in one
    all-gather: nothing is read back from the device.
    """
    counts = [int(n) for n in all_gather_ints(int(tensor.shape[0]), ctx, group)]
    return _gather_padded(tensor, counts, group)


def broadcast_rows(rows: torch.Tensor, index: torch.Tensor, ctx: DistContext,
                   group: dist.ProcessGroup | None = None) -> None:
    """Copies rank 0's ``rows[index]`` over every rank's; ``index`` (k,) must hold the
    same rows on every rank (its length is read on the host)."""
    if not ctx.is_distributed or index.numel() == 0:
        return
    block = rows.index_select(0, index).contiguous()
    src = 0 if group is None else dist.get_global_rank(group, 0)
    dist.broadcast(block, src=src, group=group)
    rows.index_copy_(0, index, block)


def _gather_padded(tensor: torch.Tensor, counts: list[int],
                   group: dist.ProcessGroup | None) -> list[torch.Tensor]:
    """All-gather rows of unequal counts (gloo and NCCL need equal sizes: pad to the max)."""
    longest = max(*counts, 1)
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[:tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group)
    return [part[:n] for part, n in zip(parts, counts)]


def gather_sparse_gradients(slots: torch.Tensor, grads: torch.Tensor, ctx: DistContext,
                            group: dist.ProcessGroup | None = None,
                            timer: CommTimer | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Union of every rank's row gradients of a replicated table, summed per row.

    Args:
        slots: (u,) int64 unique rows this rank touched.
        grads: (u, dim) float32 their gradients (already scaled by the caller).
        ctx: the worker's context.
        group: process group (default group when None).
        timer: optional timer of the exchange.

    Returns:
        (rows (n,) int64: the distinct rows ascending, then -1 fill; grads (n, dim)
        float32), identical on every rank (see :func:`gather_sparse_gradients_many`).
    """
    return gather_sparse_gradients_many([(slots, grads)], ctx, group, timer)[0]


def gather_sparse_gradients_many(tables: list[tuple[torch.Tensor, torch.Tensor]],
                                 ctx: DistContext, group: dist.ProcessGroup | None = None,
                                 timer: CommTimer | None = None,
                                 sizes: list[list[int]] | None = None,
                                 extra: torch.Tensor | None = None) -> list:
    """:func:`gather_sparse_gradients` of several replicated tables in two collectives.

    One all-gather tells every rank each peer's row count per table; the counts
    are host values, and under NCCL they travel through the host-side gloo group
    (``all_gather_ints``), so the step does not wait for the device. One all-gather moves
    every table's rows and gradients packed in one float32 buffer (the int64 rows
    travel bit for bit as pairs of float32 words). Each table is then summed as
    :func:`gather_sparse_gradients` does, in sizes known on the host: nothing is
    read back from the device.

    Args:
        tables: per table, (slots (u,) int64 unique rows, grads (u, dim) float32).
        ctx: the worker's context.
        group: process group (default group when None).
        timer: optional timer of the exchange.
        sizes: ``sizes[rank][table]``, every rank's row count per table when the
            caller knows them (shared ahead): the count exchange is skipped.
        extra: (L,) float32 that travels in the same all-gather and comes back summed
            over ranks in rank order (the dense network's gradients), or None.

    Returns:
        Per table, (rows (n,) int64, grads (n, dim) float32) with n the rows all
        ranks sent: the distinct rows ascending, then -1 (no row: the optimizer
        skips it) with zero gradients; identical on every rank. Then, with ``extra``,
        its (L,) sum.
    """
    extras = [extra] if extra is not None else []
    if not ctx.is_distributed or not (tables or extras):
        return list(tables) + extras
    extra_n = extra.numel() if extra is not None else 0
    timer = timer or CommTimer(enabled=False)
    slots = [s.contiguous() for s, _ in tables]
    grads = [g.float().contiguous() for _, g in tables]
    dims = [g.shape[1] for g in grads]
    local = [s.shape[0] for s in slots]
    if sizes is not None and list(sizes[dist.get_rank(group)]) != local:
        raise DistributedError(f"dense-table gradient rows {local} differ from the sizes "
                               f"shared ahead {list(sizes[dist.get_rank(group)])}")
    with timer.region():
        if sizes is None:
            sizes = all_gather_ints(local, ctx, group)  # [rank][table]
        if not any(any(row) for row in sizes) and extra is None:
            return list(tables)
        # Rows first (even float offsets, so int64 views stay aligned), gradients, extra.
        packed = torch.cat([s.view(torch.float32) for s in slots] +
                           [g.reshape(-1) for g in grads] + extras)
        lengths = [sum(n * (2 + d) for n, d in zip(row, dims)) + extra_n for row in sizes]
        parts = _gather_padded(packed, lengths, group)
    # Each rank's copy of ``extra`` ends its part: summed in rank order.
    summed = [sum(part[n - extra_n:n] for part, n in zip(parts, lengths))] if extras else []
    return _sum_tables(slots, grads, parts, sizes, dims) + summed


def _sum_tables(slots: list[torch.Tensor], grads: list[torch.Tensor], parts: list,
                sizes: list[list[int]], dims: list[int]) -> list[tuple]:
    """Every table's gathered (row, gradient) pairs summed per row (``_sum_per_row``); a
    table no rank sent rows of stays as it is."""
    out = []
    for t, (local_slots, local_grads) in enumerate(zip(slots, grads)):
        per_rank = [row[t] for row in sizes]
        if sum(per_rank) == 0:
            out.append((local_slots, local_grads))
            continue
        all_slots, all_grads = zip(*(_unpack(part, row, dims, t)
                                     for part, row in zip(parts, sizes)))
        out.append(_sum_per_row(list(all_slots), list(all_grads), per_rank, dims[t]))
    return out


# Replicated tables of at most this many rows x (dim + 1) gradient elements (4 MiB of
# float32) sum their gradients with a dense all-reduce instead of a sparse gather.
DENSE_REDUCE_MAX_ELEMENTS = 1 << 20


def all_reduce_row_gradients_many(tables: list[tuple[int, torch.Tensor, torch.Tensor]],
                                  ctx: DistContext, group: dist.ProcessGroup | None = None,
                                  timer: CommTimer | None = None,
                                  extra: torch.Tensor | None = None) -> list:
    """Every rank's row gradients of several small replicated tables, summed, in one
    all-reduce.

    Each rank writes its rows' gradients, and a 1 in an extra column, into a zero
    buffer of every row of every table; one all-reduce sums the buffers. A row whose
    extra column is positive was touched by some rank. Nothing depends on sizes known
    per rank, and every rank gets the same bits.

    Args:
        tables: per table, (num_rows, slots (u,) int64 unique rows, grads (u, dim)
            float32, already scaled by the caller).
        extra: (L,) float32 summed over ranks in the same all-reduce (the dense
            network's gradients), or None.

    Returns:
        Per table, (rows (num_rows,) int64: r where some rank touched row r, else -1
        (the optimizer skips it); grads (num_rows, dim) float32 summed over ranks);
        then, with ``extra``, its (L,) sum over ranks.
    """
    if not ctx.is_distributed or not tables:
        return [(slots, grads) for _, slots, grads in tables] + \
            ([extra] if extra is not None else [])
    timer = timer or CommTimer(enabled=False)
    flat = pack_row_gradients(tables)
    head = flat.numel()
    if extra is not None:
        flat = torch.cat([flat, extra])
    with timer.region():
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    out = unpack_row_gradients(flat[:head], [num_rows for num_rows, _, _ in tables],
                               [grads.shape[1] for _, _, grads in tables])
    return out + [flat[head:]] if extra is not None else out


def _blocks(flat: torch.Tensor, num_rows: list[int], dims: list[int]) -> list[torch.Tensor]:
    """The (num_rows, dim + 1) block of every table in a packed buffer."""
    sizes = [n * (d + 1) for n, d in zip(num_rows, dims)]
    return [part.view(n, d + 1) for part, n, d in zip(flat.split(sizes), num_rows, dims)]


def pack_row_gradients(tables: list[tuple[int, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One rank's part of :func:`all_reduce_row_gradients_many`: a flat float32 buffer
    holding, for every table, all its rows x (dim + 1): the rank's gradient and a 1
    in the last column at the rows it touched, zeros elsewhere. Negative slots (ids a
    ZCH remapper gave no row) are left out."""
    num_rows = [n for n, _, _ in tables]
    dims = [grads.shape[1] for _, _, grads in tables]
    flat = tables[0][2].new_zeros(sum(n * (d + 1) for n, d in zip(num_rows, dims)),
                                  dtype=torch.float32)
    for block, (_, slots, grads) in zip(_blocks(flat, num_rows, dims), tables):
        marked = torch.cat([grads.float(), grads.new_ones((grads.shape[0], 1),
                                                          dtype=torch.float32)], 1)
        # Slots are unique, so adding into zeros copies; a negative slot adds zeros to
        # row 0, which leaves it as it is (x + 0 is x whatever the order).
        marked = torch.where((slots >= 0).unsqueeze(1), marked, 0.0)
        block.index_add_(0, slots.clamp(min=0), marked)
    return flat


def unpack_row_gradients(flat: torch.Tensor, num_rows: list[int], dims: list[int]
                         ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per table, (rows, grads) of a packed buffer summed over ranks (see
    :func:`all_reduce_row_gradients_many`'s result)."""
    out = []
    for block, n in zip(_blocks(flat, num_rows, dims), num_rows):
        rows = torch.where(block[:, -1] > 0, _row_ids(n, flat.device), -1)
        out.append((rows, block[:, :-1]))
    return out


@functools.lru_cache(maxsize=16)
def _row_ids(num_rows: int, device: torch.device) -> torch.Tensor:
    """arange(num_rows) int64 on ``device`` (read only, shared)."""
    return torch.arange(num_rows, dtype=torch.int64, device=device)


def _unpack(part: torch.Tensor, sizes: list[int], dims: list[int], t: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Table ``t``'s (slots, grads) out of one rank's packed buffer."""
    start = 2 * sum(sizes[:t])
    slots = part[start:start + 2 * sizes[t]].view(torch.int64)
    start = 2 * sum(sizes) + sum(n * d for n, d in zip(sizes[:t], dims[:t]))
    grads = part[start:start + sizes[t] * dims[t]].view(sizes[t], dims[t])
    return slots, grads


def _sum_per_row(all_slots: list[torch.Tensor], all_grads: list[torch.Tensor],
                 sizes: list[int], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums the ranks' gradients per row in n = sum(sizes) slots without reading a
    size back: slot g holds the g-th distinct row (ascending), the rest -1."""
    slots = torch.cat(all_slots)
    n = slots.numel()
    ordered, order = torch.sort(slots)
    new = torch.ones(n, dtype=torch.bool, device=slots.device)
    torch.ne(ordered[1:], ordered[:-1], out=new[1:])
    group = torch.cumsum(new, 0) - 1
    inverse = torch.empty_like(group).scatter_(0, order, group)
    # Every member of a group writes the same row: the result does not depend on order.
    rows = torch.full((n,), -1, dtype=torch.int64, device=slots.device).scatter_(
        0, group, ordered)
    summed = all_grads[0].new_zeros((n, dim), dtype=torch.float32)
    start = 0
    # Rank by rank: each part has unique rows, so every add is free of races and the
    # sum has the same order (and bits) on every rank.
    for part, n in zip(all_grads, sizes):
        summed.index_add_(0, inverse[start:start + n], part)
        start += n
    return rows, summed
