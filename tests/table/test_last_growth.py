"""A table's last growth, to a max_capacity whose bucket count is no multiple of the
count before: entries go to their new buckets afresh, a crowded bucket keeps its
highest scores (evictions), and entries an insert holds are never dropped."""

from __future__ import annotations

import logging

import pytest
import torch

from hashrec.table import HashTable, TableOptions
from hashrec.table.hashing import bucket_of, mix_tagged
from hashrec.table.ops.find import find_slots
from hashrec.table.ops.insert import reference as insert_ref
from hashrec.table.ops.rehash import reference as rehash_ref
from hashrec.table.storage import PROTECTED, TableStorage


def keys_in(buckets: int, wanted: set[int], count: int) -> torch.Tensor:
    """The first ``count`` keys (in ascending order) whose bucket among ``buckets`` is in
    ``wanted``."""
    keys = torch.arange(1, 20_000, dtype=torch.int64)
    chosen = keys[torch.isin(bucket_of(mix_tagged(keys), buckets), torch.tensor(list(wanted)))]
    return chosen[:count]


def storage_with(keys: torch.Tensor, scores: torch.Tensor, num_buckets: int,
                 cap: int) -> TableStorage:
    storage = TableStorage.empty(num_buckets, cap, 2)
    slots = insert_ref.insert_keys(storage, keys, None, scores, allow_evict=False).slots
    assert bool((slots >= 0).all())
    storage.values[slots] = keys.to(torch.float32)[:, None].expand(-1, 2)
    return storage


def test_a_last_growth_with_room_keeps_every_entry_row_and_score():
    keys = torch.arange(1, 41, dtype=torch.int64)
    scores = torch.arange(40, dtype=torch.int64) % 7
    old = storage_with(keys, scores, 4, 16)
    grown = rehash_ref.rehash(old, 7)  # 7 buckets: no multiple of 4
    slots = find_slots(grown, keys, None)
    assert bool((slots >= 0).all())
    assert torch.equal(grown.scores[slots], scores)
    assert torch.equal(grown.values[slots, 0], keys.to(torch.float32))
    assert torch.equal(slots // 16, bucket_of(mix_tagged(keys), 7))


def test_a_crowded_bucket_keeps_its_highest_scores():
    # 8 keys, 4 in each of 2 buckets of 4 slots, all in bucket 0 of 3.
    keys = torch.cat([keys_in(6, {0}, 4), keys_in(6, {3}, 4)])
    scores = torch.tensor([5, 1, 7, 3, 2, 8, 6, 4])
    grown = rehash_ref.rehash(storage_with(keys, scores, 2, 4), 3)
    found = find_slots(grown, keys, None) >= 0
    assert found.tolist() == [True, False, True, False, False, True, True, False]
    assert int((grown.digests != 0).sum()) == 4


def test_entries_an_insert_holds_are_never_dropped():
    keys = torch.cat([keys_in(6, {0}, 4), keys_in(6, {3}, 4)])
    scores = torch.tensor([PROTECTED] * 5 + [1, 2, 3])
    with pytest.raises(rehash_ref.RehashOverflow, match="5 entries an insert holds"):
        rehash_ref.rehash(storage_with(keys, scores, 2, 4), 3)
    scores[4] = 9  # four protected fit: they stay, with the highest other score
    grown = rehash_ref.rehash(storage_with(keys, scores, 2, 4), 3)
    kept = find_slots(grown, keys, None) >= 0
    assert kept.tolist() == [True] * 4 + [False] * 4


def _crowded_table() -> tuple[HashTable, torch.Tensor]:
    """A table of 2 buckets of 4 slots (max_capacity 3 buckets) holding 6 keys that all
    go to bucket 0 of 3, and a seventh key of bucket 1 of 3."""
    table = HashTable(TableOptions(dim=2, max_capacity=12, init_capacity=8,
                                   bucket_capacity=4, name="tiny"))
    crowd = torch.cat([keys_in(6, {0}, 3), keys_in(6, {3}, 3)])
    table.find_or_insert(crowd)
    assert table.capacity() == 8 and table.size() == 6
    return table, crowd


def test_a_last_growth_into_crowded_buckets_counts_and_logs_its_evictions(caplog):
    table, crowd = _crowded_table()
    newcomer = keys_in(6, {1}, 1)
    with caplog.at_level(logging.INFO, logger="hashrec.table.hash_table"):
        table.find_or_insert(newcomer)
    assert table.capacity() == 12
    assert table.stats()["evictions"] == 2 and table.size() == 5
    assert bool(table.find(newcomer)[1].all())
    assert int(table.find(crowd)[1].sum()) == 4
    assert caplog.messages == ["table 'tiny' grew from 8 to 12 slots (max_capacity 12); 2 "
                               "lowest-scored entries evicted: their new buckets of 4 slots "
                               "got more entries than slots"]


def test_a_last_growth_that_would_drop_a_lookups_hits_leaves_the_table_at_its_size(caplog):
    table, crowd = _crowded_table()
    batch = torch.cat([crowd, keys_in(6, {1}, 1)])  # six hits held by the lookup, one new
    with caplog.at_level(logging.WARNING, logger="hashrec.table.hash_table"):
        _, found = table.find_or_insert(batch)
    assert table.capacity() == 8 and table.size() == 7
    assert bool(table.find(batch)[1].all()) and table.stats()["evictions"] == 0
    assert caplog.messages == ["table 'tiny' stays at 8 slots (max_capacity 12): its buckets "
                               "of 4 slots cannot take the entries this lookup holds at 3 "
                               "buckets; a larger bucket_capacity spreads them"]


def test_growing_past_max_capacity_from_a_smaller_count_splits():
    table = HashTable(TableOptions(dim=2, max_capacity=12 * 16, init_capacity=4 * 16,
                                   bucket_capacity=16))
    keys = torch.arange(40)
    table.insert_or_assign(keys, torch.ones(40, 2))
    assert table.capacity() == 4 * 16
    assert table.grow_past_max_capacity() == 24 * 16  # 24 buckets: a multiple of 4
    assert bool(table.find(keys)[1].all())
