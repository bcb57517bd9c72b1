"""Row-wise sharded lookup and sparse update of one dynamic table.

Every rank holds the rows of the keys it owns (``owner_of(key, world_size)``) in a
local :class:`~hashrec.table.HashTable`. One training step of one storage runs:

forward (:meth:`ShardedTable.lookup`)
    the rank's unique keys go to their owners (sizes first, then keys and tags);
    each owner deduplicates across senders and calls ``table.lookup`` once; the
    rows travel back and are put in the caller's key order.
backward (:meth:`ShardedTable.apply_gradients`)
    the gradient of each unique key travels to its owner with the same splits;
    the owner sums the contributions per key and calls ``table.apply_gradients``.

A world of N ranks therefore gives every key exactly the update a single table
would give it if fed the union of the N batches: one lookup per step, the sum of
all ranks' gradients, one optimizer step. Both calls are collectives: every rank
calls them for every storage in the same order, with possibly zero keys. Between
a lookup and its gradient step the owner's table must not be looked up again
(the slots of the first lookup are reused), so callers merge all features that
share a storage into one lookup per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from hashrec.distributed.all_to_all import Routing, Splits, all_to_all, exchange_splits
from hashrec.distributed.comm_timer import CommTimer
from hashrec.distributed.errors import DistributedError
from hashrec.distributed.ops.merge import first_in_runs
from hashrec.distributed.ops.merge.reference import first_occurrences, pair_runs
from hashrec.distributed.ops.reply import pack_reply, unpack_reply
from hashrec.distributed.ops.route import route_columns
from hashrec.distributed.process_group import DistContext


@dataclass(frozen=True)
class ExchangeState:
    """What one lookup leaves for its gradient step.

    Attributes:
        order: (n,) int64 permutation that sorted the caller's keys by owner.
        splits: sizes of the key exchange (gradients reuse them).
        inverse: (m,) int64 position of each received key among the owner's unique keys.
        slots: (u,) int64 owner-side slots of the unique keys (-1 = not stored).
        lr: learning rate for the gradient step (None: the optimizer spec's).
        version: the owner's table version after the lookup (``LookupResult.version``;
            None where the table has none): its gradient step refuses the slots if the
            table grew since.
    """

    order: torch.Tensor
    splits: Splits
    inverse: torch.Tensor
    slots: torch.Tensor
    lr: float | None = None
    version: int | None = None


def table_version(table) -> int | None:
    """A dynamic table's version (bumped by growth, which moves every slot); None for
    tables without one."""
    return getattr(table, "version", None)


@dataclass(frozen=True)
class ShardedLookupResult:
    """Rows of the caller's keys.

    Attributes:
        values: (n, dim) float32 rows, in the order of the keys passed in.
        state: exchange state for :meth:`ShardedTable.apply_gradients` (training only).
        stored: (n,) bool, True where the owner holds the key (False: admission
            pending, refused, or an eval miss); None when not computed.
    """

    values: torch.Tensor
    state: ExchangeState | None
    stored: torch.Tensor | None = None


def unique_pairs(keys: torch.Tensor,
                 tags: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Deduplicate (key, tag) identities.

    Args:
        keys: (m,) int64.
        tags: (m,) int32 or None (all tags 0).

    Returns:
        unique keys (u,), their tags (u,) or None, inverse (m,) int64 such that
        ``keys == unique_keys[inverse]``.
    """
    if tags is None:
        unique_keys, inverse = torch.unique(keys, return_inverse=True)
        return unique_keys, None, inverse
    order, starts = pair_runs(keys, tags)
    group = torch.cumsum(starts.to(torch.int64), 0) - 1
    inverse = torch.empty_like(group)
    inverse[order] = group
    return keys[order][starts], tags[order][starts], inverse


class ShardedTable:
    """One rank's shard of a row-wise sharded dynamic table.

    Args:
        table: the local HashTable holding the keys this rank owns.
        ctx: the worker's :class:`DistContext`.
        group: process group of the shards (default group when None).
        timer: optional :class:`~hashrec.distributed.comm_timer.CommTimer` that
            times every exchange (forward and backward).
    """

    def __init__(self, table, ctx: DistContext, group: dist.ProcessGroup | None = None,
                 timer: CommTimer | None = None) -> None:
        self.table = table
        self.ctx = ctx
        self.group = group
        self.world_size = ctx.world_size if ctx.is_distributed else 1
        self.timer = timer or CommTimer(enabled=False)
        self._graphs = None  # ShardedGraphs, made on first use when enabled

    def graphs(self):
        """This table's padded, captured training lookup
        (:class:`~hashrec.distributed.sharded_graphs.ShardedGraphs`) when the world size
        is above 1 and ``sharded_graphs_enabled`` (where it can be captured, by default),
        else None."""
        if self._graphs is None:
            from hashrec.distributed.sharded_graphs import ShardedGraphs, sharded_graphs_enabled

            self._graphs = ShardedGraphs(self) \
                if self.world_size > 1 and sharded_graphs_enabled(self.table) else False
        return self._graphs or None

    def lookup(self, keys: torch.Tensor, tags: torch.Tensor | None = None, train: bool = True,
               counts: torch.Tensor | None = None, scores: torch.Tensor | None = None,
               lr: float | None = None) -> ShardedLookupResult:
        """Rows of this rank's unique keys, wherever they are stored.

        Args:
            keys: (n,) int64, unique per (key, tag) on this rank.
            tags: (n,) int32 namespaces (table fusion) or None.
            train: True counts admission, inserts and updates scores on the owners;
                False is read-only (missing keys read as the eval initializer).
            counts: (n,) int64 occurrences of each key in this rank's batch; owners
                add them up over ranks (admission and LFU count by multiplicity).
            scores: (n,) int64 caller scores (CUSTOMIZED); owners keep the largest.
            lr: learning rate the gradient step will use (None: the spec's).

        Returns:
            values (n, dim) in key order, and the exchange state when training.
        """
        self._check_input(keys, tags, counts, scores)
        if self.world_size == 1:
            return self._lookup_local(keys, tags, train, counts, scores, lr)
        route, columns = self._route(keys, tags, counts, scores)
        with self.timer.region():
            splits = exchange_splits(route.send_counts, self.group, self.world_size)[0]
            received = all_to_all(columns, splits, self.group)
        reply, inverse, slots = self._serve(received, tags is not None, counts is not None,
                                            scores is not None, train)
        with self.timer.region():
            rows = all_to_all(reply, splits.reversed(), self.group)
        return self._answer(rows, route, splits, inverse, slots, train, lr,
                            table_version(self.table))

    def _route(self, keys: torch.Tensor, tags: torch.Tensor | None,
               counts: torch.Tensor | None, scores: torch.Tensor | None,
               send_counts: bool = True):
        """(Routing, (n, w) int64 columns sorted by owner): what the key exchange sends.

        Keys and their per-key integers travel together as columns of one int64 matrix.
        ``send_counts`` False: the caller knows them on the host (the Routing's are None).
        """
        extras = [c for c in (tags, counts, scores) if c is not None]
        order, columns, sends = route_columns(keys, extras, self.world_size, send_counts)
        return Routing(order=order, send_counts=sends), columns

    def _serve(self, received: torch.Tensor, has_tags: bool, has_counts: bool,
               has_scores: bool, train: bool, runs: list[int] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Owner side: received (m, w) columns -> (reply (m, dim + 1), inverse (m,), slots (u,)).

        Received keys are deduplicated across senders and looked up once; the reply's
        extra column tells the requester whether the owner stores the key. ``runs``:
        the keys per sender when every sender's keys are sorted by (tag, key) (the
        collection's dedup sorts them): repeats are then found without a sort.
        """
        fields = iter(received.unbind(1)[1:])
        recv_tags = next(fields).to(torch.int32) if has_tags else None
        recv_counts = next(fields) if has_counts else None
        recv_scores = next(fields) if has_scores else None
        if self.table._fixed_path():
            return self._serve_fixed(received[:, 0].contiguous(), recv_tags, recv_counts,
                                     recv_scores, train, runs)
        unique_keys, unique_tags, inverse = unique_pairs(received[:, 0].contiguous(), recv_tags)
        u = unique_keys.shape[0]
        if recv_counts is not None:
            recv_counts = recv_counts.new_zeros(u).index_add_(0, inverse, recv_counts)
        if recv_scores is not None:
            recv_scores = recv_scores.new_full((u,), torch.iinfo(torch.int64).min).scatter_reduce_(
                0, inverse, recv_scores, reduce="amax")
        result = self.table.lookup(unique_keys, unique_tags, train=train,
                                   **_optional(counts=recv_counts, scores=recv_scores))
        return pack_reply(result.values, result.slots, inverse), inverse, result.slots

    def _serve_fixed(self, keys: torch.Tensor, tags: torch.Tensor | None,
                     counts: torch.Tensor | None, scores: torch.Tensor | None, train: bool,
                     runs: list[int] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_serve`` without reading a size back: the received keys keep their m
        positions, repeats (the same key from several senders) inactive, their counts
        summed and their scores maxed into the first occurrence; ``slots`` (m,) is -1
        where inactive, so the gradient sums land on the first occurrences."""
        rep, active = first_occurrences(keys, tags) if runs is None else \
            first_in_runs(keys, tags, runs)
        if counts is not None:
            counts = counts.new_zeros(keys.numel()).index_add_(0, rep, counts)
        if scores is not None:
            scores = scores.new_full((keys.numel(),), torch.iinfo(torch.int64).min
                                     ).scatter_reduce_(0, rep, scores, reduce="amax")
        result = self.table.lookup(keys, tags, train=train, active=active,
                                   **_optional(counts=counts, scores=scores))
        return pack_reply(result.values, result.slots, rep), rep, result.slots

    @staticmethod
    def _answer(rows: torch.Tensor, route, splits: Splits, inverse: torch.Tensor,
                slots: torch.Tensor, train: bool, lr: float | None,
                version: int | None = None) -> ShardedLookupResult:
        """Requester side: replies sorted by owner -> rows in the caller's key order."""
        values, stored = unpack_reply(rows, route.order)
        state = None
        if train:
            state = ExchangeState(order=route.order, splits=splits, inverse=inverse,
                                  slots=slots, lr=lr, version=version)
        return ShardedLookupResult(values=values, state=state, stored=stored)

    def _lookup_local(self, keys: torch.Tensor, tags: torch.Tensor | None, train: bool,
                      counts: torch.Tensor | None, scores: torch.Tensor | None,
                      lr: float | None) -> ShardedLookupResult:
        """World size 1: the caller's unique keys go straight to the table."""
        result = self.table.lookup(keys, tags, train=train,
                                   **_optional(counts=counts, scores=scores))
        state = None
        if train:
            identity = torch.arange(keys.shape[0], device=keys.device)
            n = (keys.shape[0],)
            state = ExchangeState(order=identity, splits=Splits(send=n, recv=n),
                                  inverse=identity, slots=result.slots, lr=lr,
                                  version=table_version(self.table))
        return ShardedLookupResult(values=result.values, state=state, stored=result.slots >= 0)

    def apply_gradients(self, state: ExchangeState, grads: torch.Tensor) -> None:
        """Send each key's gradient to its owner and apply the optimizer there.

        Args:
            state: the exchange state of this step's :meth:`lookup`.
            grads: (n, dim) float32 gradient per key, in the order the keys were passed.
        """
        if grads.shape[0] != state.order.shape[0]:
            raise DistributedError(
                f"got gradients for {grads.shape[0]} keys but the lookup had "
                f"{state.order.shape[0]}")
        with self.timer.region():
            recv = all_to_all(grads[state.order].to(torch.float32), state.splits, self.group)
        self._apply_received(state, recv)

    def _apply_received(self, state: ExchangeState, recv: torch.Tensor) -> None:
        """Owner side: sum the received gradients (m, dim) per key and apply them."""
        summed = recv.new_zeros((state.slots.shape[0], recv.shape[1]))
        summed.index_add_(0, state.inverse, recv)
        # Keys the owner does not store (slot -1) are the table's to skip: selecting the
        # stored ones here would size a tensor by a mask, a host read per step.
        extra = {} if state.version is None else {"version": state.version}
        self.table.apply_gradients(state.slots, summed, lr=state.lr, **extra)

    def embed(self, keys: torch.Tensor, tags: torch.Tensor | None = None,
              counts: torch.Tensor | None = None, lr: float | None = None) -> torch.Tensor:
        """Training lookup whose backward applies the sparse update (autograd-aware).

        Args:
            keys: (n,) int64 unique per rank; tags: (n,) int32 or None.
            counts: (n,) int64 occurrences per key (admission, LFU) or None.
            lr: learning rate of the fused update (None: the optimizer spec's).

        Returns:
            (n, dim) float32 rows that require grad; backpropagating through them
            runs :meth:`apply_gradients` (a collective: every rank must backprop).
        """
        anchor = torch.empty(0, device=keys.device, requires_grad=True)
        return _ShardedEmbed.apply(anchor, self, keys, tags, counts, lr)

    def _check_input(self, keys: torch.Tensor, tags: torch.Tensor | None,
                     counts: torch.Tensor | None, scores: torch.Tensor | None) -> None:
        if keys.dim() != 1 or keys.dtype != torch.int64:
            raise DistributedError(
                f"keys must be a 1-D int64 tensor, got {keys.dim()}-D {keys.dtype}")
        for name, value, dtype in (("tags", tags, torch.int32), ("counts", counts, torch.int64),
                                   ("scores", scores, torch.int64)):
            if value is not None and (value.shape != keys.shape or value.dtype != dtype):
                raise DistributedError(
                    f"{name} must be {dtype} with the keys' shape {tuple(keys.shape)}, got "
                    f"{value.dtype} {tuple(value.shape)}")


def _optional(**kwargs) -> dict:
    """Only the keyword arguments that were given (the table's defaults stand otherwise)."""
    return {name: value for name, value in kwargs.items() if value is not None}


class _ShardedEmbed(torch.autograd.Function):
    """Lookup in forward, exchange + fused optimizer step in backward."""

    @staticmethod
    def forward(ctx, anchor, sharded, keys, tags, counts, lr):
        result = sharded.lookup(keys, tags, train=True, counts=counts, lr=lr)
        ctx.sharded = sharded
        ctx.state = result.state
        return result.values

    @staticmethod
    def backward(ctx, grad):
        ctx.sharded.apply_gradients(ctx.state, grad)
        return None, None, None, None, None, None
