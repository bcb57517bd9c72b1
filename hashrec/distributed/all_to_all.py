"""All-to-all primitives for row-wise sharded tables.

A rank routes each key to its owner (``hashrec.table.hashing.owner_of``): it sorts
its keys by owner, tells every peer how many keys it will send (one fixed-size
all-to-all), then sends the keys themselves (one variable-split all-to-all).
Replies travel back with the splits swapped, so they arrive in the order the
keys left and the requester undoes its sort with one scatter.

The size exchange is the only host synchronization: the variable splits must be
known on the host to size the receive buffers. Both NCCL (CUDA tensors) and gloo
(CPU tensors) implement ``all_to_all_single`` with uneven splits, 1-D and 2-D.

Example::

    route = route_by_owner(keys, world_size)            # keys (n,) int64
    splits = exchange_splits(route.send_counts, group)  # sizes first
    owned = all_to_all(keys[route.order], splits)       # keys arrive at owners
    ...                                                 # owners compute rows (m, dim)
    rows = all_to_all(rows, splits.reversed())          # rows return, sorted by owner
    out = unsort(rows, route.order)                     # back in the caller's order
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from hashrec.distributed.errors import DistributedError
from hashrec.distributed.process_group import all_gather_ints
from hashrec.table.hashing import owner_of


@dataclass(frozen=True)
class Routing:
    """Where a rank's keys go.

    Attributes:
        order: (n,) int64 permutation that sorts the keys by owner (stable).
        send_counts: (world_size,) int64 keys sent to each rank, on the keys' device
            (None where the caller counted them on the host).
    """

    order: torch.Tensor
    send_counts: torch.Tensor | None


@dataclass(frozen=True)
class Splits:
    """Host-side split sizes of one variable all-to-all.

    Attributes:
        send: rows this rank sends to each peer.
        recv: rows this rank receives from each peer.
    """

    send: tuple[int, ...]
    recv: tuple[int, ...]

    def reversed(self) -> Splits:
        """Splits of the reply: what was received goes back where it came from."""
        return Splits(send=self.recv, recv=self.send)

    @property
    def num_send(self) -> int:
        return sum(self.send)

    @property
    def num_recv(self) -> int:
        return sum(self.recv)


def route_by_owner(keys: torch.Tensor, world_size: int) -> Routing:
    """Sort keys by owning rank: keys (n,) int64 -> Routing(order (n,), send_counts (ws,))."""
    owners = owner_of(keys, world_size)
    order = torch.sort(owners, stable=True).indices
    send_counts = torch.bincount(owners, minlength=world_size)
    return Routing(order=order, send_counts=send_counts)


def exchange_host_splits(send: list[list[int]], ctx, group: dist.ProcessGroup | None = None
                         ) -> list[Splits]:
    """:func:`exchange_splits` of counts known on the host: one all-gather, through the
    host-side gloo group under NCCL (``all_gather_ints``), so nothing waits for the
    device.

    Args:
        send: per exchange, the rows to send to each rank.
        ctx: the worker's DistContext.
        group: process group of the exchanges (default group when None; a custom
            group exchanges on itself).
    """
    table = all_gather_ints(send, ctx, group)  # [source][exchange][destination]
    world, rank = len(table), dist.get_rank(group)
    return [Splits(send=tuple(row), recv=tuple(table[source][t][rank]
                                              for source in range(world)))
            for t, row in enumerate(send)]


def exchange_splits(send_counts: torch.Tensor, group: dist.ProcessGroup | None = None,
                    world_size: int | None = None) -> list[Splits]:
    """Tell every peer how many rows it will receive, for one or several exchanges at once.

    Args:
        send_counts: (world_size,) or (num_exchanges, world_size) int64 rows to send
            per peer; several exchanges share one collective.
        group: process group (default group when None); ignored for world_size 1.
        world_size: group size; read from the group when None.

    Returns:
        One :class:`Splits` per exchange (a list of length 1 for a 1-D input).
    """
    counts = send_counts.reshape(-1, send_counts.shape[-1]).to(torch.int64)
    if world_size is None:
        world_size = dist.get_world_size(group) if dist.is_initialized() else 1
    if counts.shape[-1] != world_size:
        raise DistributedError(
            f"send_counts has {counts.shape[-1]} columns but the group has {world_size} ranks")
    if world_size == 1:
        recv = counts
    else:
        # Column j holds what goes to rank j; all-to-all splits along dim 0, so transpose.
        send_t = counts.t().contiguous()
        recv_t = torch.empty_like(send_t)
        dist.all_to_all_single(recv_t, send_t, group=group)
        recv = recv_t.t()
    both = torch.stack([counts, recv]).cpu().tolist()  # the one host sync of an exchange
    return [Splits(send=tuple(s), recv=tuple(r)) for s, r in zip(both[0], both[1])]


def all_to_all(tensor: torch.Tensor, splits: Splits,
               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Variable-split all-to-all along dim 0.

    Args:
        tensor: (splits.num_send, ...) rows grouped by destination rank (rank 0 first).
        splits: host-side sizes from :func:`exchange_splits`.
        group: process group (default group when None).

    Returns:
        (splits.num_recv, ...) rows grouped by source rank.
    """
    if tensor.shape[0] != splits.num_send:
        raise DistributedError(
            f"all_to_all got {tensor.shape[0]} rows but the splits send {splits.num_send}")
    if len(splits.send) == 1:
        return tensor
    out = tensor.new_empty((splits.num_recv, *tensor.shape[1:]))
    dist.all_to_all_single(out, tensor.contiguous(), output_split_sizes=list(splits.recv),
                           input_split_sizes=list(splits.send), group=group)
    return out


def unsort(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Undo a permutation: rows (n, ...) in ``order`` -> rows in the original order."""
    out = torch.empty_like(rows)
    out[order] = rows
    return out
