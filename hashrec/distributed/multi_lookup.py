"""Several row-wise sharded tables looked up and updated with shared exchanges.

:meth:`ShardedTable.lookup` exchanges sizes, keys and rows once per table; a
collection with S dynamic storages would pay 3 S collectives and S host syncs
per forward and S gradient exchanges per backward. The functions here run the
same per-table steps (route, serve on the owners, answer; the owners see exactly
the keys, counts and gradients they would see table by table) but share the
exchanges of all tables:

* at most one size exchange for all tables; when the callers know the sizes on
  the host (``TableRequest.send_counts``, counted by the collection's dedup one
  step ahead) it reads nothing from the device, and owners on the fixed-size path
  serve without a read either: the forward then never waits for the device; when
  they also know what each peer sends (``recv_counts``, which the collection's
  ranks share on the device with the dedup), there is no size exchange at all;
* one key exchange, one row exchange (forward) and one gradient exchange
  (backward), each a single all-to-all of a flat buffer that holds, for every
  peer, each table's rows for that peer in table order; the gradient exchange can
  carry more gradients that every rank sends to every rank and that come back
  summed (``apply_gradients_many(ride=...)``, ``hashrec.distributed.ride``).

Collective rule: every rank calls them with the same tables in the same order
(with possibly zero keys), like :meth:`ShardedTable.lookup`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hashrec.distributed.all_to_all import (
    Splits,
    all_to_all,
    exchange_host_splits,
    exchange_splits,
)
from hashrec.distributed.errors import DistributedError
from hashrec.distributed.ride import Ride, RideResult
from hashrec.distributed.sharded_graphs import PaddedState
from hashrec.distributed.sharded_lookup import (
    ExchangeState,
    ShardedLookupResult,
    ShardedTable,
    table_version,
)


@dataclass
class TableRequest:
    """One table's keys of a step.

    Attributes:
        keys: (n,) int64 unique per (key, tag) on this rank.
        tags: (n,) int32 or None.
        counts: (n,) int64 occurrences in this rank's batch, or None.
        lr: learning rate of the gradient step (None: the optimizer spec's).
        send_counts: the keys each rank owns (``owner_of``), when known on the host;
            if every request of a call has them, the size exchange reads nothing
            from the device.
        recv_counts: the keys each rank sends this one, when known on the host
            (shared ahead by every rank); if every request of a call has both, there
            is no size exchange at all.
        sorted_pairs: every rank's keys of this table are sorted by (tag, key) (as
            the collection's dedup leaves them); the owners then find repeats across
            senders without a sort.
        pair_max: the most keys any rank sends any rank, the same on every rank (shared
            ahead): when every table of a training lookup has it, each may take its
            padded, captured chain (``hashrec.distributed.sharded_graphs``).
    """

    keys: torch.Tensor
    tags: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    lr: float | None = None
    send_counts: list[int] | None = None
    recv_counts: list[int] | None = None
    sorted_pairs: bool = False
    pair_max: int | None = None


def exchange_packed(tensors: list[torch.Tensor], splits: list[Splits],
                    group=None, scale: float = 1.0) -> list[torch.Tensor]:
    """All-to-all of several 2-D tensors of one dtype in one collective.

    Args:
        tensors: per table, (splits[t].num_send, w_t) rows grouped by destination rank.
        splits: per table, the host-side sizes of its exchange.
        group: process group (default group when None).
        scale: factor applied to everything received (floating tensors; 1: none).

    Returns:
        Per table, (splits[t].num_recv, w_t) rows grouped by source rank, exactly
        what ``all_to_all(tensors[t], splits[t])`` returns (for a single table, that
        call itself: on one rank its input).
    """
    if len(tensors) == 1:  # nothing to pack
        received = all_to_all(tensors[0], splits[0], group)
        return [received * scale if scale != 1.0 else received]
    widths = [t.shape[1] for t in tensors]
    world = len(splits[0].send)
    chunks = [torch.split(t, list(s.send)) for t, s in zip(tensors, splits)]
    send = torch.cat([chunks[t][r].reshape(-1) for r in range(world)
                      for t in range(len(tensors))])
    packed = Splits(send=tuple(sum(s.send[r] * w for s, w in zip(splits, widths))
                               for r in range(world)),
                    recv=tuple(sum(s.recv[r] * w for s, w in zip(splits, widths))
                               for r in range(world)))
    received = all_to_all(send, packed, group)
    if scale != 1.0:
        received.mul_(scale)
    parts = torch.split(received, [s.recv[r] * w for r in range(world)
                                   for s, w in zip(splits, widths)])
    count = len(tensors)
    return [torch.cat([parts[r * count + t] for r in range(world)]).view(-1, widths[t])
            for t in range(count)]


def lookup_many(tables: list[ShardedTable], requests: list[TableRequest], train: bool,
                group=None) -> list[ShardedLookupResult]:
    """:meth:`ShardedTable.lookup` of every table, sharing the exchanges (a collective).

    Args:
        tables: sharded tables of one world size > 1, in the same order on every rank.
        requests: one per table.
        train: as in :meth:`ShardedTable.lookup`.
        group: process group of the exchanges (default group when None).

    Returns:
        One :class:`ShardedLookupResult` per table, as its own lookup returns it.
    """
    if not tables:
        return []
    for table, r in zip(tables, requests):
        table._check_input(r.keys, r.tags, r.counts, None)
    timer, world = tables[0].timer, tables[0].world_size
    if world == 1:
        return [table.lookup(r.keys, r.tags, train=train, counts=r.counts, lr=r.lr)
                for table, r in zip(tables, requests)]
    padded = _padded_lookups(tables, requests, train)
    if padded is not None:
        return padded
    known = all(r.send_counts is not None for r in requests)
    routed = [table._route(r.keys, r.tags, r.counts, None, send_counts=not known)
              for table, r in zip(tables, requests)]
    with timer.region():
        if all(r.send_counts is not None and r.recv_counts is not None for r in requests):
            splits = [Splits(send=tuple(r.send_counts), recv=tuple(r.recv_counts))
                      for r in requests]
        elif known:
            splits = exchange_host_splits([r.send_counts for r in requests],
                                          tables[0].ctx, group)
        else:
            sends = torch.stack([route.send_counts for route, _ in routed])
            splits = exchange_splits(sends, group, world)
        received = exchange_packed([columns for _, columns in routed], splits, group)
    served = [table._serve(recv, r.tags is not None, r.counts is not None, False, train,
                           list(split.recv) if r.sorted_pairs else None)
              for table, r, recv, split in zip(tables, requests, received, splits)]
    with timer.region():
        rows = exchange_packed([reply for reply, _, _ in served],
                               [s.reversed() for s in splits], group)
    return [ShardedTable._answer(answer, route, split, inverse, slots, train, r.lr,
                                 table_version(table.table))
            for answer, (route, _), split, (_, inverse, slots), r, table
            in zip(rows, routed, splits, served, requests, tables)]


def apply_gradients_many(tables: list[ShardedTable], states: list[ExchangeState],
                         grads: list[torch.Tensor], group=None, scale: float = 1.0,
                         ride: Ride | None = None) -> RideResult | None:
    """:meth:`ShardedTable.apply_gradients` of every table with one gradient exchange.

    Args:
        tables: the tables of one :func:`lookup_many`, in the same order.
        states: their exchange states.
        grads: per table, (n, dim) gradient per key, in the keys' order.
        scale: factor of every gradient (applied once, to all tables' received rows).
        ride: gradients every rank sends a copy of to every rank in the same exchange
            (``tables`` must not be empty): the small replicated tables' and the dense
            network's, which it saves collectives of their own.

    Returns:
        The ride's sums over ranks times ``scale``, in rank order (the same bits on
        every rank), or None without ``ride``.
    """
    if not tables:
        return None
    if isinstance(states[0], PaddedState):  # every table's, by construction
        carried = None
        for i, (table, state, grad) in enumerate(zip(tables, states, grads)):
            if grad.shape[0] != state.n:
                raise DistributedError(f"got gradients for {grad.shape[0]} keys but the "
                                       f"lookup had {state.n}")
            # The ride travels with the last table's exchange.
            carried = table.graphs().apply_gradients(
                state, grad, scale, ride if i == len(tables) - 1 else None)
        return carried
    sends = []
    for state, grad in zip(states, grads):
        if grad.shape[0] != state.order.shape[0]:
            raise DistributedError(f"got gradients for {grad.shape[0]} keys but the lookup had "
                             f"{state.order.shape[0]}")
        sends.append(grad[state.order].to(torch.float32))
    splits = [state.splits for state in states]
    if ride is not None:
        world = len(splits[0].send)
        sends.append(ride.pack().view(1, -1).expand(world, -1))
        splits.append(Splits(send=(1,) * world, recv=(1,) * world))
    with tables[0].timer.region():
        received = exchange_packed(sends, splits, group, scale)
    for table, state, recv in zip(tables, states, received):
        table._apply_received(state, recv)
    return ride.unpack(received[-1].sum(0)) if ride is not None else None


def _padded_lookups(tables: list[ShardedTable], requests: list[TableRequest],
                    train: bool) -> list[ShardedLookupResult] | None:
    """Every table's training lookup through its padded, captured chain, table after
    table, when it is enabled (``ShardedTable.graphs``) and every table's exchange
    capacity is known to every rank and fits; else None (the shared exchanges then
    serve them all). The conditions hold alike on every rank."""
    if not train:
        return None
    graphs = [table.graphs() for table in tables]
    if any(g is None or r.pair_max is None or r.counts is None or not g.fits(r.pair_max)
           for g, r in zip(graphs, requests)):
        return None
    return [g.lookup(r.keys, r.tags, r.counts, r.pair_max, r.lr)
            for g, r in zip(graphs, requests)]
