"""Ride and RideBuffers: the gradients riding a sparse gradient exchange pack and unpack
alike, eagerly and in fixed-size buffers (what a captured exchange runs)."""

from __future__ import annotations

import pytest
import torch

from hashrec.distributed.data_parallel import pack_row_gradients
from hashrec.distributed.ride import Ride, RideBuffers


def _table(num_rows: int, touched: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_rows, generator=g)[:touched]
    return num_rows, slots, torch.randn(touched, dim, generator=g)


def _ride(touched: tuple[int, ...], network: int, seed: int = 0) -> Ride:
    tables = [_table(n, u, d, seed + i)
              for i, (n, u, d) in enumerate(zip((7, 20, 1), touched, (3, 4, 5)))]
    return Ride(tables, torch.randn(network) if network else None)


@pytest.mark.parametrize("touched,network", [((3, 20, 1), 6), ((0, 5, 1), 0), ((7, 0, 0), 9)],
                         ids=["some-network", "empty-table", "empty-tables-network"])
def test_buffers_pack_what_the_ride_packs(touched, network):
    ride = _ride(touched, network)
    buffers = RideBuffers(ride, torch.device("cpu"))
    buffers.load(_ride((7, 20, 1), network, seed=5))  # a fuller step first: stale rows
    buffers.load(ride)
    assert torch.equal(buffers.pack(), ride.pack())
    head = pack_row_gradients(ride.tables).numel()
    assert ride.pack().numel() == head + network


def test_buffers_unpack_what_the_ride_unpacks_and_write_the_network_back():
    ride = _ride((3, 11, 1), 6)
    buffers = RideBuffers(ride, torch.device("cpu"))
    buffers.load(ride)
    total = ride.pack() * 2  # two ranks that sent the same
    eager, fixed = ride.unpack(total), buffers.unpack(total)
    for (rows, grads), (rows_b, grads_b) in zip(eager.tables, fixed.tables):
        assert torch.equal(rows, rows_b) and torch.equal(grads, grads_b)
    assert fixed.network is ride.network and torch.equal(ride.network, eager.network)
    # Every touched row, and only those, comes back with twice its gradient.
    for (_, slots, grads), (rows, summed) in zip(ride.tables, eager.tables):
        assert sorted(rows[rows >= 0].tolist()) == sorted(slots.tolist())
        assert torch.equal(summed[slots], 2 * grads)


def test_the_layout_names_the_network_buffer():
    ride = _ride((1, 1, 1), 4)
    other = Ride(ride.tables, ride.network.clone())
    assert ride.layout()[0] == other.layout()[0] and ride.layout() != other.layout()
    assert Ride(ride.tables, None).layout()[1] is None
