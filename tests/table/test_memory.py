import pytest
import torch

from hashrec.table import AdmissionOptions, HashTable, SparseAdam, TableOptions
from hashrec.table.memory import estimate_table_bytes


def test_hbm_only_counts_values_and_index():
    opts = TableOptions(dim=10, max_capacity=1000, bucket_capacity=128)
    est = estimate_table_bytes(opts)
    rows, buckets = 1024, 8
    assert est["values"] == rows * 48  # 40 bytes rounded up to 48
    assert est["index"] == rows * (8 + 8 + 1 + 4) + buckets * 4
    assert est["gpu"] == est["values"] + est["index"] and est["host"] == 0
    assert est["mode"] == "HBM_ONLY"


@pytest.mark.parametrize("caching", [False, True], ids=["hybrid", "caching"])
def test_split_modes(caching):
    opts = TableOptions(dim=16, max_capacity=4096, optimizer=SparseAdam(),
                        cache_load_factor=0.25, caching=caching,
                        admission=AdmissionOptions(threshold=2, counter_capacity=1024))
    est = estimate_table_bytes(opts)
    values = 4096 * 16 * 3 * 4
    assert est["values"] == values
    assert est["gpu"] == values // 4 + est["index"]
    assert est["host"] == (values if caching else values - values // 4)
    counters = 1024 * (8 + 4 + 1 + 8)
    assert est["index"] == 4096 * 21 + 32 * 4 + counters


def test_allocated_bytes_match_tensors():
    table = HashTable(TableOptions(dim=4, max_capacity=256, dtype=torch.float16))
    assert table.memory_bytes() == {"gpu": 0, "host": 256 * (8 + 4 + 1 + 8 + 4 * 2)}
