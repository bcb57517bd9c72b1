"""Entries written back into their saved slots: exact where valid, inserted elsewhere."""

from __future__ import annotations

import pytest
import torch

from hashrec.table import HashTable, TableOptions
from hashrec.table.hashing import bucket_of, mix_tagged
from hashrec.table.placement import place_at


def _table(**overrides) -> HashTable:
    return HashTable(TableOptions(**{"dim": 2, "max_capacity": 64, "bucket_capacity": 16,
                                     "score_strategy": "STEP", **overrides}))


def test_only_empty_slots_of_the_entrys_bucket_named_once_are_taken():
    table = _table()
    keys = torch.arange(100, 112)
    bucket = bucket_of(mix_tagged(keys), table.storage.num_buckets)
    slots = bucket * 16 + torch.arange(12) % 16
    slots[1] = (bucket[1] + 1) % 4 * 16  # another bucket's slot
    slots[2] = -5  # outside the table
    slots[3] = 64
    twin = int(torch.nonzero(bucket == bucket[4]).flatten()[1])  # another key of its bucket
    slots[twin] = slots[4]  # one slot named twice: neither takes it
    table.storage.digests[slots[5]] = 7  # occupied
    placed = place_at(table.storage, keys, None, torch.ones(12, dtype=torch.int64), slots)
    refused = {1, 2, 3, 4, twin, 5}
    assert placed.tolist() == [i not in refused for i in range(12)]
    assert torch.equal(table.storage.keys[slots[placed]], keys[placed])


@pytest.mark.parametrize("tagged", [False, True])
def test_load_state_at_slots_equals_the_exported_layout_and_finds_every_key(tagged):
    source = _table(init_capacity=None)
    keys = torch.arange(-20, 20)
    tags = (keys.abs() % 3).to(torch.int32) if tagged else None
    source.insert_or_assign(keys, torch.randn(40, 2), tags=tags)
    source.erase(keys[:5], None if tags is None else tags[:5])  # holes
    target = _table()
    target.insert_or_assign(keys[5:7], torch.zeros(2, 2),
                            tags=None if tags is None else tags[5:7])
    for k, t, rows, scores, slots in source.export_state(13, slots=True):
        target.load_state(k, t if tagged else None, rows, scores, assume_unique=True,
                          slots=slots)
    assert target.size() == source.size() == 35  # the two present keys were assigned
    got = target.lookup(keys[5:], None if tags is None else tags[5:], train=False).values
    want = source.lookup(keys[5:], None if tags is None else tags[5:], train=False).values
    assert torch.equal(got, want)
    moved = set(keys[5:7].tolist())
    same = [int(k) not in moved for k in source.storage.keys[source.storage.digests > 0]]
    at = source.storage.digests > 0
    assert torch.equal(target.storage.keys[at][torch.tensor(same)],
                       source.storage.keys[at][torch.tensor(same)])
    with pytest.raises(ValueError, match="only with assume_unique=True"):
        target.load_state(keys[:1], None, torch.zeros(1, 2), torch.ones(1, dtype=torch.int64),
                          slots=torch.zeros(1, dtype=torch.int64))
