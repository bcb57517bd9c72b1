"""The collection's lookups when it spans several ranks (world size > 1).

Dynamic storages are sharded row-wise: each rank holds a local ``HashTable``
with ``1 / world_size`` of the capacities (``per_rank_options``) and reaches
every key through :class:`~hashrec.distributed.ShardedTable` (deduplicate
locally, all-to-all to the owners, look up there, rows back). Dense tables are
replicated; their rows are read locally.

The dynamic storages of one forward share their exchanges (one size exchange,
one key and one row exchange; ``hashrec.distributed.multi_lookup``). All
storages of one forward go through one autograd node, so the backward
exchanges run in one fixed order (the storages' order) on every rank, whatever
order the autograd engine would pick for separate nodes. In backward each
storage's gradient is divided by the world size (every rank's loss is the mean
of its own batch, so the world-size-1 gradient of the global batch is the mean
over ranks), then:

* dynamic storage: gradients travel to the owners, which sum them per key and
  apply the fused optimizer (``ShardedTable.apply_gradients``);
* dense table: every rank's (row, gradient) pairs are summed over ranks - small
  tables packed into one dense buffer that travels with the dynamic storages'
  gradient exchange (every rank sums every rank's copy; one all-reduce when there is
  no dynamic storage), the others all-gathered in one exchange and summed per row in
  rank order - and every replica applies the same update.

Collective rule: every rank must look up every storage that has readers, in the
same order, on every step - with zero ids if its batch has none. The collection
does this by construction for each forward; a rank that has no batch while its
peers still evaluate calls :meth:`ShardedLookups.idle` instead of a forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hashrec.distributed import ShardedTable
from hashrec.distributed.data_parallel import (
    DENSE_REDUCE_MAX_ELEMENTS,
    all_reduce_row_gradients_many,
    gather_sparse_gradients_many,
)
from hashrec.distributed.multi_lookup import TableRequest, apply_gradients_many, lookup_many
from hashrec.distributed.ride import Ride
from hashrec.embedding.lookup import Storage


@dataclass
class Request:
    """One storage's unique keys of this step (``keys`` (U,), ``tags`` (U,) | None, ``counts``),
    sorted by (tag, key) as the dedup leaves them.

    Sizes the dedup knew on the host: ``send_counts``, the keys each rank owns;
    ``recv_counts``, the keys each rank sends this one; ``unique_per_rank``, every
    rank's U (the rows of a replicated dense table's gradient exchange); ``pair_max``,
    the most keys any rank sends any rank (the padded exchange's capacity). None where
    not known: the exchanges then share their sizes themselves.
    """

    storage: Storage
    keys: torch.Tensor
    tags: torch.Tensor | None
    counts: torch.Tensor
    send_counts: list[int] | None = None
    recv_counts: list[int] | None = None
    unique_per_rank: list[int] | None = None
    pair_max: int | None = None


class ShardedLookups:
    """Runs the lookups and sparse updates of a collection spread over ranks.

    Args:
        sharded: storage name -> ShardedTable of each dynamic storage.
        ctx: the worker's DistContext.
        group: process group of the exchanges (default group when None).
        timer: CommTimer of the exchanges.
    """

    def __init__(self, sharded: dict[str, ShardedTable], ctx, group, timer) -> None:
        self.sharded, self.ctx, self.group, self.timer = sharded, ctx, group, timer
        self.grad_scale = 1.0 / ctx.world_size
        # The dense network's FlatGradients when they ride along in the dynamic
        # storages' gradient exchange (set by the training loop), else None.
        self.network_gradients = None

    def lookup(self, requests: list[Request], train: bool
               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(rows (U, dim) float32, slots (U,) int64) per request; -1 slots are not stored.

        For dynamic storages ``slots`` only tells stored (0) from not stored (-1):
        the real slots live on the owners.
        """
        trainable = any(r.storage.plan.trainable for r in requests)
        if not (torch.is_grad_enabled() and trainable):
            return [(rows, slots) for rows, slots, _ in self._forward(requests, train)]
        anchor = torch.empty(0, device=requests[0].keys.device, requires_grad=True)
        outputs = _LookupAll.apply(anchor, self, requests, train)
        return [(outputs[2 * i], outputs[2 * i + 1]) for i in range(len(requests))]

    def idle(self, storages: list[Storage], fused: dict[str, bool]) -> None:
        """Serve the peers' eval lookups with no keys of this rank's own (read-only)."""
        names = [s.name for s in storages if s.name in self.sharded]
        requests = []
        for name in names:
            keys = torch.empty(0, dtype=torch.int64, device=self.ctx.device)
            tags = torch.empty(0, dtype=torch.int32, device=keys.device) if fused[name] else None
            requests.append(TableRequest(keys, tags, keys.clone(),
                                         send_counts=[0] * self.ctx.world_size))
        lookup_many([self.sharded[name] for name in names], requests, False, self.group)

    def _forward(self, requests: list[Request], train: bool) -> list[tuple]:
        dynamic = [r for r in requests if r.storage.name in self.sharded]
        # Frozen storages are read as in evaluation (``Storage.changes_in``): their
        # exchanges run after the others', in the storages' order on every rank.
        results = {}
        for mode in (train, False) if train else (False,):
            part = [r for r in dynamic if r.storage.changes_in(train) == mode]
            results.update(zip((r.storage.name for r in part), lookup_many(
                [self.sharded[r.storage.name] for r in part],
                [TableRequest(r.keys, r.tags, r.counts, r.storage.lr, r.send_counts,
                              r.recv_counts, sorted_pairs=True, pair_max=r.pair_max)
                 for r in part],
                mode, self.group)))
        out = []
        for r in requests:
            if r.storage.name not in self.sharded:  # a replicated dense table
                result = r.storage.table.lookup(r.keys, tags=r.tags,
                                                train=r.storage.changes_in(train),
                                                counts=r.counts)
                out.append((result.values.float(), result.slots, None))
                continue
            result = results[r.storage.name]
            slots = torch.where(result.stored, 0, -1).to(torch.int64)
            out.append((result.values.float(), slots, result.state))
        return out

    def backward(self, requests: list[Request], states: list, slots: list[torch.Tensor],
                 grads: list[torch.Tensor]) -> None:
        """Apply every trainable storage's update, in request order (collective).

        Without dynamic storages the small replicated dense tables' gradients take one
        all-reduce first. The large ones' travel next, all in one all-gather. Then the
        dynamic storages' gradients, all in one exchange, with the small dense tables'
        packed gradients riding along.

        When ``network_gradients`` is set, the dense network's gradients join the last
        of these exchanges that runs (the dynamic storages', else the small tables',
        else the large ones'), which saves their all-reduce a collective: autograd has
        accumulated them by now (its accumulation nodes run as soon as they are ready,
        and this node, the first of the forward, runs last).
        """
        small, large = [], []
        for r, local_slots, grad in zip(requests, slots, grads):
            if r.storage.plan.trainable and r.storage.name not in self.sharded:
                fits = _num_rows(r) * (grad.shape[1] + 1) <= DENSE_REDUCE_MAX_ELEMENTS
                (small if fits else large).append((r, local_slots, grad.float()))
        dynamic = [(r, state, grad) for r, state, grad in zip(requests, states, grads)
                   if r.storage.plan.trainable and r.storage.name in self.sharded]
        # Small dense tables ride along in the dynamic storages' gradient exchange when
        # there is one (every rank gets every rank's packed buffer and sums them), else
        # they take one all-reduce.
        ride = bool(small and dynamic)
        # The exchange that carries the dense network's gradients, if any.
        carrier = "dynamic" if dynamic else "small" if small else "large" if large else ""
        network = self.network_gradients.ready() \
            if carrier and self.network_gradients is not None else None
        if small and not ride:
            self._all_reduce_small(small, network if carrier == "small" else None)
        if large:
            self._gather_large(large, network if carrier == "large" else None)
        network = network if carrier == "dynamic" else None
        cargo = Ride([(_num_rows(r), s, g) for r, s, g in small] if ride else [], network) \
            if ride or network is not None else None
        carried = apply_gradients_many([self.sharded[r.storage.name] for r, _, _ in dynamic],
                                       [state for _, state, _ in dynamic],
                                       [grad for _, _, grad in dynamic], self.group,
                                       scale=self.grad_scale, ride=cargo)
        if network is not None:
            self.network_gradients.take_averaged(carried.network)
        if ride:
            _apply_dense(small, carried.tables)

    def _all_reduce_small(self, small: list[tuple], network: torch.Tensor | None) -> None:
        """The small dense tables' update from one all-reduce of their packed gradients,
        which ``network`` (the dense network's gradients) joins when given."""
        self._apply_summed(small, all_reduce_row_gradients_many(
            [(_num_rows(r), s, g * self.grad_scale) for r, s, g in small],
            self.ctx, self.group, self.timer, extra=network), network)

    def _gather_large(self, large: list[tuple], network: torch.Tensor | None) -> None:
        """The large dense tables' update from one all-gather of their (row, gradient)
        pairs (in the sizes the dedup shared, when known), which ``network`` joins."""
        known = [r.unique_per_rank for r, _, _ in large]
        sizes = [list(row) for row in zip(*known)] \
            if all(k is not None for k in known) else None
        self._apply_summed(large, gather_sparse_gradients_many(
            [(s, g * self.grad_scale) for _, s, g in large], self.ctx, self.group,
            self.timer, sizes, extra=network), network)

    def _apply_summed(self, entries: list[tuple], updates: list, network) -> None:
        """The dense tables' updates from an exchange's results; with ``network``, the
        last result is its sum over ranks, whose mean the network's gradients take."""
        if network is not None:
            updates, summed = updates[:-1], updates[-1]
            self.network_gradients.take_averaged(summed / self.ctx.world_size)
        _apply_dense(entries, updates)


def _num_rows(r: Request) -> int:
    """Rows of a replicated dense storage (a table or a group of them)."""
    return r.storage.table.rows.shape[0]


def _apply_dense(entries: list[tuple], updates: list[tuple[torch.Tensor, torch.Tensor]]
                 ) -> None:
    """Each dense storage's optimizer step from its (rows, summed gradients)."""
    for (r, _, _), (rows, summed) in zip(entries, updates):
        r.storage.apply_gradients(rows, summed)


class _LookupAll(torch.autograd.Function):
    """Every storage's lookup in forward; every storage's update, in order, in backward."""

    @staticmethod
    def forward(ctx, anchor, runner, requests, train):  # noqa: D102
        results = runner._forward(requests, train)
        ctx.runner, ctx.requests = runner, requests
        ctx.states = [state for _, _, state in results]
        ctx.slots = [slots for _, slots, _ in results]
        flat = []
        for rows, slots, _ in results:
            flat += [rows, slots]
        ctx.mark_non_differentiable(*ctx.slots)
        return tuple(flat)

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102
        with ctx.requests[0].storage.backward_region():
            ctx.runner.backward(ctx.requests, ctx.states, ctx.slots, list(grads[0::2]))
        return None, None, None, None
