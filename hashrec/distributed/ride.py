"""Gradients that ride along a step's sparse gradient exchange.

The backward of a collection with sharded dynamic storages ends with one all-to-all
of their gradients. Two more sums over ranks travel in it rather than in
collectives of their own: the small replicated dense tables' row gradients (every
row of each table, a last column of 1 where this rank touched the row) and the
dense network's gradients (``FlatGradients``' buffer). Every rank sends every rank
a copy; the sum over ranks comes back.

:class:`Ride` is one step's cargo. It packs into one float32 buffer for the eager
exchanges. :class:`RideBuffers` holds the same cargo in fixed-size buffers for the
padded exchange of ``hashrec.distributed.sharded_graphs``: the host copies in each
table's touched rows and their count; the packing, the exchange, the unpacking and
the network buffer's write-back then all run on the device and can be captured in
one CUDA graph with the exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hashrec.distributed.data_parallel import pack_row_gradients, unpack_row_gradients


@dataclass
class RideResult:
    """The sums over ranks of a ride.

    Attributes:
        tables: per table, (rows (num_rows,) int64 with -1 where no rank touched the
            row, summed gradients (num_rows, dim)).
        network: the network gradients' sum, (L,) float32, or None. From
            :class:`RideBuffers` it is the network buffer itself, written in place.
    """

    tables: list[tuple[torch.Tensor, torch.Tensor]]
    network: torch.Tensor | None


class Ride:
    """One step's cargo: ``tables`` (num_rows, slots (u,) int64 unique rows, grads (u,
    dim) float32) and ``network`` (the dense network's flat gradient buffer, or None).
    """

    def __init__(self, tables: list[tuple[int, torch.Tensor, torch.Tensor]],
                 network: torch.Tensor | None) -> None:
        self.tables = tables
        self.network = network

    def layout(self) -> tuple:
        """What fixes the packed buffer's shape (and which network buffer it reads)."""
        network = None if self.network is None else (self.network.numel(),
                                                     self.network.data_ptr())
        return tuple((n, grads.shape[1]) for n, _, grads in self.tables), network

    def pack(self) -> torch.Tensor:
        """The (L,) float32 buffer every rank sends every rank."""
        pieces = [pack_row_gradients(self.tables)] if self.tables else []
        pieces += [self.network] if self.network is not None else []
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    def unpack(self, total: torch.Tensor) -> RideResult:
        """The result of the packed buffers' sum over ranks ``total`` (L,)."""
        rows = [n for n, _, _ in self.tables]
        dims = [grads.shape[1] for _, _, grads in self.tables]
        head = sum(n * (d + 1) for n, d in zip(rows, dims))
        tables = unpack_row_gradients(total[:head], rows, dims) if self.tables else []
        return RideResult(tables, total[head:] if self.network is not None else None)


class RideBuffers:
    """A ride in fixed-size device buffers (one per :meth:`Ride.layout`), for a padded,
    capturable exchange. :meth:`load` copies a step's cargo in (host work: two copies
    per table and one of the row counts); :meth:`pack` and :meth:`unpack` then only
    run device work on these buffers."""

    def __init__(self, ride: Ride, device: torch.device) -> None:
        self.layout = [(n, grads.shape[1]) for n, _, grads in ride.tables]
        self.slots = [torch.zeros(n, dtype=torch.int64, device=device) for n, _ in self.layout]
        self.grads = [torch.zeros(n, d, dtype=torch.float32, device=device)
                      for n, d in self.layout]
        self.used = torch.zeros(max(len(self.layout), 1), dtype=torch.int64, device=device)
        # Made here, not while capturing: a graph's tensors hold values only once replayed.
        self.positions = [torch.arange(n, dtype=torch.int64, device=device)
                          for n, _ in self.layout]
        self.network = ride.network  # read and written in place (a stable buffer)

    def load(self, ride: Ride) -> None:
        """Copies ``ride``'s touched rows and gradients in (its layout is this one's)."""
        for slots, grads, (_, s, g) in zip(self.slots, self.grads, ride.tables):
            slots[:s.numel()].copy_(s)
            grads[:g.shape[0]].copy_(g)
        if self.layout:
            used = torch.tensor([s.numel() for _, s, _ in ride.tables], dtype=torch.int64)
            self.used.copy_(used, non_blocking=True)

    def pack(self) -> torch.Tensor:
        """:meth:`Ride.pack` of the loaded cargo, on the device only."""
        pieces = []
        for t, ((n, d), slots, grads) in enumerate(zip(self.layout, self.slots, self.grads)):
            # Rows past the loaded count go to a spare row n, dropped.
            rows = torch.where(self.positions[t] < self.used[t], slots, n)
            marked = torch.cat([grads, torch.ones(n, 1, dtype=torch.float32,
                                                  device=grads.device)], 1)
            block = torch.zeros(n + 1, d + 1, dtype=torch.float32, device=grads.device)
            pieces.append(block.index_copy_(0, rows, marked)[:n].reshape(-1))
        pieces += [self.network] if self.network is not None else []
        return torch.cat(pieces)

    def unpack(self, total: torch.Tensor) -> RideResult:
        """:meth:`Ride.unpack`, on the device only, with the network's sum written into
        its buffer."""
        tables, at = [], 0
        for (n, d), positions in zip(self.layout, self.positions):
            block = total[at:at + n * (d + 1)].view(n, d + 1)
            at += n * (d + 1)
            tables.append((torch.where(block[:, d] > 0, positions, -1), block[:, :d]))
        if self.network is not None:
            self.network.copy_(total[at:])
        return RideResult(tables, self.network)
