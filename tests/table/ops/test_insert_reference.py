import pytest
import torch

from hashrec.table.hashing import bucket_of, mix_tagged
from hashrec.table.ops.erase.reference import erase_slots
from hashrec.table.ops.export.reference import occupied_slots
from hashrec.table.ops.find.reference import find_slots
from hashrec.table.ops.insert.reference import insert_keys
from hashrec.table.storage import TableStorage


def _one_bucket(capacity):
    return TableStorage.empty(1, capacity, 0)


def test_incoming_keys_take_empty_slots_in_score_then_key_order():
    storage = _one_bucket(4)
    result = insert_keys(storage, torch.tensor([30, 10, 20]), None,
                         torch.tensor([1, 5, 5]), allow_evict=True)
    assert result.slots.tolist() == [2, 0, 1]  # (score desc, key asc): 10, 20, 30
    assert occupied_slots(storage, 0, 4).tolist() == [0, 1, 2]


def test_eviction_pairs_ith_incoming_with_ith_lowest_existing():
    storage = _one_bucket(4)
    insert_keys(storage, torch.tensor([1, 2, 3, 4]), None, torch.tensor([10, 20, 30, 40]), True)
    result = insert_keys(storage, torch.tensor([7, 8, 9]), None, torch.tensor([25, 15, 50]),
                         allow_evict=True)
    # first call placed 4, 3, 2, 1 (score desc) in slots 0..3.
    # order: 9 (50) vs 1 (10) evicts; 7 (25) vs 2 (20) evicts; 8 (15) vs 3 (30) refused.
    assert result.slots.tolist() == [2, -1, 3]
    assert sorted(result.evicted_keys.tolist()) == [1, 2]
    assert sorted(result.evicted_scores.tolist()) == [10, 20]
    assert find_slots(storage, torch.tensor([3, 4, 7, 9, 8])).tolist() == [1, 0, 2, 3, -1]


def test_equal_score_evicts_and_no_evict_refuses():
    storage = _one_bucket(2)
    insert_keys(storage, torch.tensor([1, 2]), None, torch.tensor([5, 5]), True)
    refused = insert_keys(storage, torch.tensor([3]), None, torch.tensor([9]), False)
    assert refused.slots.tolist() == [-1] and refused.evicted_keys.numel() == 0
    result = insert_keys(storage, torch.tensor([3]), None, torch.tensor([5]), True)
    # ties keep key order, so key 1 sits in slot 0, the lowest (score, slot)
    assert result.slots.tolist() == [0] and result.evicted_keys.tolist() == [1]
    erase_slots(storage, result.slots)
    assert occupied_slots(storage, 0, 2).tolist() == [1]


@pytest.mark.parametrize("num_buckets", [1, 3, 8], ids=lambda n: f"buckets{n}")
def test_keys_land_in_their_bucket_and_are_found(num_buckets):
    storage = TableStorage.empty(num_buckets, 8, 2)
    keys = torch.tensor([0, -1, 2**63 - 1, -(2**63), 5, 6, 7, 8, 9])
    tags = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 3], dtype=torch.int32)
    result = insert_keys(storage, keys, tags, torch.zeros(9, dtype=torch.int64), False)
    placed = result.slots >= 0
    expected_bucket = bucket_of(mix_tagged(keys, tags), num_buckets)
    assert torch.equal(result.slots[placed] // 8, expected_bucket[placed])
    assert torch.equal(find_slots(storage, keys, tags), result.slots)
    assert bool((find_slots(storage, keys, tags + 7) == -1).all())
    assert insert_keys(storage, keys[:0], None, keys[:0], True).slots.numel() == 0
