"""ZchRemapper (hashrec/embedding/zch.py): slots, pending ids, eviction policies, state."""

from __future__ import annotations

import pytest
import torch

from hashrec.embedding import EmbeddingCollection, EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.embedding.zch import ZchOptions, ZchRemapper
from hashrec.table import SparseSGD


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_new_ids_take_free_slots_and_keep_them():
    remapper = ZchRemapper(ZchOptions(zch_size=4, eviction_interval=100))
    slots, reset = remapper.remap(ids(-7, 10**15, -7, 3), train=True)
    assert reset.numel() == 0
    assert slots[0] == slots[2] and len(set(slots.tolist())) == 3 and bool((slots >= 0).all())
    again, _ = remapper.remap(ids(3, 10**15, -7), train=True)
    assert again.tolist() == [slots[3].item(), slots[1].item(), slots[0].item()]
    keys, _, counts, last = remapper.assigned()
    assert dict(zip(keys.tolist(), counts.tolist())) == {-7: 3, 10**15: 2, 3: 2}
    assert set(last.tolist()) == {2}


def test_ids_without_a_slot_wait_and_read_minus_one():
    remapper = ZchRemapper(ZchOptions(zch_size=2, eviction_interval=100))
    slots, _ = remapper.remap(ids(1, 1, 2, 3), train=True)  # 1 and 2 (most frequent first)
    assert slots.tolist()[:3] == [slots[0].item()] * 2 + [slots[2].item()]
    assert slots[3] == -1
    assert int(remapper.pending_size) == 1
    eval_slots, reset = remapper.remap(ids(3, 4, 1), train=False)
    assert eval_slots[:2].tolist() == [-1, -1] and eval_slots[2] >= 0 and reset.numel() == 0
    assert int(remapper.step) == 1  # eval does not advance the step


@pytest.mark.parametrize("policy, survivor", [("LFU", 1), ("LRU", 2), ("DISTANCE_LFU", 1)],
                         ids=["lfu", "lru", "distance-lfu"])
def test_eviction_replaces_the_lowest_scoring_slot(policy, survivor):
    remapper = ZchRemapper(ZchOptions(zch_size=2, eviction_interval=3, policy=policy))
    remapper.remap(ids(1, 1, 1, 1, 2), train=True)  # step 1: 1 (count 4) and 2 (count 1)
    remapper.remap(ids(2), train=True)               # step 2: 2 is used last (count 2)
    slots, reset = remapper.remap(ids(9, 9, 9), train=True)  # step 3: 9 waits, then evicts
    keys = set(remapper.assigned()[0].tolist())
    assert keys == {survivor, 9}
    assert reset.numel() == 1 and slots.tolist() == [reset.item()] * 3
    assert int(remapper.pending_size) == 0


def test_weak_candidates_do_not_evict():
    remapper = ZchRemapper(ZchOptions(zch_size=2, eviction_interval=2, policy="LFU"))
    remapper.remap(ids(1, 1, 2, 2), train=True)
    _, reset = remapper.remap(ids(5), train=True)  # count 1 < 2: refused, pending cleared
    assert reset.numel() == 0 and set(remapper.assigned()[0].tolist()) == {1, 2}
    assert int(remapper.pending_size) == 0


def test_state_dict_round_trip_keeps_the_mapping():
    options = ZchOptions(zch_size=3, eviction_interval=2, policy="LRU")
    remapper = ZchRemapper(options)
    for batch in (ids(4, 5, 6, 7), ids(7, 8), ids(4, 9)):
        remapper.remap(batch, train=True)
    copy = ZchRemapper(options)
    copy.load_state_dict(remapper.state_dict())
    probe = ids(4, 5, 6, 7, 8, 9, 10)
    assert torch.equal(copy.remap(probe, False)[0], remapper.remap(probe, False)[0])
    assert torch.equal(copy.remap(ids(10, 11), True)[0], remapper.remap(ids(10, 11), True)[0])


@pytest.mark.parametrize("kwargs, field", [
    ({"zch_size": 0}, "zch_size"), ({"eviction_interval": 0}, "eviction_interval"),
    ({"policy": "MRU"}, "policy"), ({"decay_exponent": -1.0}, "decay_exponent"),
], ids=["size", "interval", "policy", "decay"])
def test_options_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ZchOptions(**kwargs)


def test_collection_reads_zeros_without_a_slot_and_resets_evicted_rows():
    zch = ZchOptions(zch_size=2, eviction_interval=2)
    collection = EmbeddingCollection(
        [EmbeddingTableSpec("u", 3, num_rows=2, zch=zch)],
        [EmbeddingFeatureSpec("u", "u")], SparseSGD(lr=1.0))
    table = collection.dense_tables["u"]

    def step(values):
        kjt = KeyedJaggedTensor.from_lengths(["u"], ids(*values), torch.ones(len(values),
                                                                               dtype=torch.int64))
        out = collection(kjt).pooled["u"]
        out.sum().backward()
        return out.detach()

    before = table.rows.clone()
    first = step([10, 11, 12])  # 12 waits: zeros, no update
    assert torch.all(first[2] == 0) and not torch.all(first[0] == 0)
    slot_11 = collection.zch_remappers["u"].find(ids(11)).item()
    assert torch.allclose(table.rows[slot_11], before[slot_11] - 1.0)  # SGD, grad 1
    second = step([12, 12, 12, 10])  # step 2: 12 (count 4) evicts 11 (count 1)
    assert collection.zch_remappers["u"].find(ids(12)).item() == slot_11
    assert not torch.allclose(second[0], first[1])  # re-initialized, not 11's trained row
    collection.eval()
    with torch.no_grad():
        kjt = KeyedJaggedTensor.from_lengths(["u"], ids(11), torch.ones(1, dtype=torch.int64))
        assert torch.all(collection(kjt).pooled["u"] == 0)
    assert "zch_remappers.u.slot_keys" in collection.state_dict()


def test_progress_counters_count_assignments_evictions_and_ids_without_a_row():
    """Step 1: 5 (twice), 1, 2, 3 take the four free rows, 4 and 6 wait; step 2 (an
    eviction round): 4 and 6 outscore the rows of 1 and 2 and take them. Evaluation and
    the state_dict leave the counters alone."""
    from hashrec.train.progress import format_tables, zch_counters

    remapper = ZchRemapper(ZchOptions(zch_size=4, eviction_interval=2), "item_id")
    remapper.remap(ids(1, 2, 3, 4, 5, 5, 6), train=True)
    counted = remapper.counters()
    assert (counted["assigned"], counted["without_row"], counted["hits"],
            counted["lookups"], counted["evictions"]) == (4, 2, 0, 6, 0)
    remapper.remap(ids(5, 5, 5, 4, 4, 4, 6), train=True)
    remapper.remap(ids(7, 8), train=False)
    assert remapper.counters() == {"size": 4.0, "capacity": 4.0, "load_factor": 1.0,
                                   "assigned": 6.0, "evictions": 2.0, "without_row": 2.0,
                                   "hits": 1.0, "lookups": 9.0}
    assert set(remapper.state_dict()) == {  # the remapper's state, not its counters
        "slot_keys", "slot_used", "slot_counts", "slot_last_step", "pending_keys",
        "pending_counts", "pending_last_step", "pending_size", "step"}
    counters = zch_counters({"item_id": remapper})
    assert format_tables(counters) == "item_id size 4 load 1.00 assigned 6 evict 2 no_row 2"
