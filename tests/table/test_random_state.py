"""A table's random state on the Triton path (interpreted on CPU-only hosts): the seed
sequence of the in-kernel initializers travels with ``random_state``, so a table
rebuilt from an export and that state draws the initial values the original draws."""

from __future__ import annotations

import os

import pytest
import torch
from host_reads import forced_triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.table import HashTable, InitializerArgs, TableOptions  # noqa: E402

OPTIONS = TableOptions(dim=4, max_capacity=512, bucket_capacity=16,
                       initializer=InitializerArgs(mode="UNIFORM"))


@pytest.fixture
def triton_path():
    if torch.cuda.is_available():
        pytest.skip("runs the kernels interpreted on CPU tensors (CPU-only hosts)")
    with forced_triton():
        yield


def _rebuilt(table: HashTable) -> HashTable:
    copy = HashTable(OPTIONS)
    for keys, tags, rows, scores in table.export_state(1 << 16):
        copy.load_state(keys, tags, rows, scores)
    return copy


def test_the_kernel_seed_sequence_travels_with_the_random_state(triton_path):
    torch.manual_seed(0)
    table = HashTable(OPTIONS)
    assert table._fixed_path()
    table.lookup(torch.arange(40), train=True)
    cpu, state = torch.get_rng_state(), table.random_state()
    assert "kernel_seeds" in state and "generator" not in state
    copy, other = _rebuilt(table), _rebuilt(table)
    new = torch.arange(100, 140)
    want = table.lookup(new, train=True).values
    torch.set_rng_state(cpu)
    copy.set_random_state(state)
    assert torch.equal(copy.lookup(new, train=True).values, want)
    # Without it the copy starts a sequence of its own: other initial values.
    torch.set_rng_state(cpu)
    assert not torch.equal(other.lookup(new, train=True).values, want)
