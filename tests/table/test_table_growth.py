import logging

import torch

from hashrec.table import HashTable, TableOptions


def test_each_growth_on_inserts_logs_one_line_naming_the_capacities(caplog):
    table = HashTable(TableOptions(dim=2, max_capacity=1024, init_capacity=128,
                                   bucket_capacity=64, name="user_id"))
    with caplog.at_level(logging.INFO, logger="hashrec.table.hash_table"):
        for start in range(0, 700, 100):
            table.find_or_insert(torch.arange(start, start + 100))
    lines = [r.getMessage() for r in caplog.records if "grew" in r.getMessage()]
    assert lines == [f"table 'user_id' grew from {a} to {b} slots (max_capacity 1024)"
                     for a, b in ((128, 256), (256, 512), (512, 1024))]
    assert table.stats()["growths"] == 3
    shard = HashTable(TableOptions(dim=2, max_capacity=128, init_capacity=64,
                                   bucket_capacity=64, name="deep", whole_max_capacity=256))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hashrec.table.hash_table"):
        shard.find_or_insert(torch.arange(60))
    assert caplog.messages == ["table 'deep' grew from 64 to 128 slots (max_capacity 128 on "
                               "this rank, 256 over all ranks)"]


def test_a_restore_growing_to_the_saved_size_logs_no_growth(caplog):
    table = HashTable(TableOptions(dim=2, max_capacity=1024, init_capacity=128,
                                   bucket_capacity=64))
    with caplog.at_level(logging.INFO, logger="hashrec.table.hash_table"):
        assert table.grow_to(8)  # what a restore does before loading rows
        table.grow_past_max_capacity()  # an export keeping every row (logs its own line)
    assert table.capacity() == 2048 and caplog.messages == []
