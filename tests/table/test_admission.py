import pytest
import torch

from hashrec.table.admission import AdmissionCounter


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_admitted_on_the_lookup_where_count_reaches_threshold(threshold):
    counter = AdmissionCounter(threshold, capacity=1024, bucket_capacity=64,
                               device=torch.device("cpu"))
    keys = torch.tensor([10, -3, 2**63 - 1])
    counts = torch.tensor([1, 2, 3])  # duplicates in one batch count
    admitted_at = {}
    for lookup in range(1, 8):
        admitted, totals = counter.count(keys, None, counts)
        assert totals.tolist() == [lookup * c for c in counts.tolist()]  # every batch counted
        for key, ok, per_batch in zip(keys.tolist(), admitted.tolist(), counts.tolist()):
            if ok:
                assert key not in admitted_at
                admitted_at[key] = lookup
                expected = -(-threshold // per_batch)  # ceil(threshold / per_batch)
                assert lookup == expected
        keys, counts = keys[~admitted], counts[~admitted]
        if keys.numel() == 0:
            break
    assert len(admitted_at) == 3


def test_counter_table_evicts_lowest_counts_when_full():
    counter = AdmissionCounter(100, capacity=8, bucket_capacity=8, device=torch.device("cpu"))
    high = torch.arange(8)
    counter.count(high, None, torch.full((8,), 5))
    counter.count(torch.tensor([100]), None, torch.tensor([1]))  # lower than all -> refused
    keys, _, counts = counter.state()
    assert sorted(keys.tolist()) == list(range(8))
    counter.count(torch.tensor([0]), None, torch.tensor([1]))
    counter.count(torch.tensor([200, 201]), None, torch.tensor([5, 9]))
    keys, _, counts = counter.state()
    state = dict(zip(keys.tolist(), counts.tolist()))
    assert counter.evictions == 2
    assert state[0] == 6 and state[201] == 9 and state[200] == 5
    assert len(state) == 8


def test_counter_keeps_tags_apart():
    counter = AdmissionCounter(2, capacity=64, bucket_capacity=16, device=torch.device("cpu"))
    keys = torch.tensor([5, 5])
    tags = torch.tensor([0, 1], dtype=torch.int32)
    assert counter.count(keys, tags, torch.tensor([1, 1]))[0].tolist() == [False, False]
    admitted, totals = counter.count(keys[:1], tags[:1], torch.tensor([1]))
    assert (admitted.tolist(), totals.tolist()) == ([True], [2])
    remaining, remaining_tags, _ = counter.state()
    assert remaining.tolist() == [5] and remaining_tags.tolist() == [1]


@pytest.mark.parametrize("capacity, bucket, buckets, slots, logged", [
    (500, 1024, 1, 512, True),     # a rank's share of 1000 over 2 ranks (was 1024)
    (2500, 1024, 3, 896, True),    # was 3 x 1024
    (4096, 1024, 4, 1024, False),  # exactly what was asked
    (48, 8, 6, 8, False),
    (100, 12, 9, 12, True)], ids=["half", "odd", "exact", "small", "grain4"])
def test_the_counter_holds_what_was_asked_as_closely_as_its_buckets_allow(
        capacity, bucket, buckets, slots, logged, caplog):
    """Fewest buckets of at most ``bucket`` slots, of one size, a multiple of
    gcd(bucket, 128): less than that multiple a bucket over, and one INFO line where the
    counter holds another number than asked."""
    import logging
    import math

    from hashrec.table import HashTable, TableOptions
    from hashrec.table.memory import estimate_table_bytes
    from hashrec.table.options import AdmissionOptions

    options = TableOptions(dim=4, max_capacity=64, bucket_capacity=16, name="user_id",
                           admission=AdmissionOptions(threshold=2, counter_capacity=capacity,
                                                      counter_bucket_capacity=bucket))
    with caplog.at_level(logging.INFO, logger="hashrec.table"):
        storage = HashTable(options)._counter.storage
    assert (storage.num_buckets, storage.bucket_capacity) == (buckets, slots)
    assert capacity <= storage.capacity < capacity + buckets * math.gcd(bucket, 128)
    said = (f"table 'user_id': its admission counter holds {buckets * slots} slots "
            f"({buckets} bucket")
    assert (said in caplog.text) == logged
    without = TableOptions(dim=4, max_capacity=64, bucket_capacity=16)
    counter_bytes = (estimate_table_bytes(options)["index"]
                     - estimate_table_bytes(without)["index"])
    assert counter_bytes == storage.capacity * (8 + 4 + 1 + 8)
