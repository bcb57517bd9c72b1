"""The table's calls check their arguments (on the CPU path; everywhere under
HASHREC_CHECK_INPUTS=1): slots, steps, learning rates, repeated keys, scores, tags and
admission counts are refused with one error naming the table and the field."""

import pytest
import torch

from hashrec.table import (
    AdmissionOptions,
    HashTable,
    SparseAdagrad,
    SparseSGD,
    TableError,
    TableOptions,
)


def test_apply_gradients_refuses_a_stored_row_twice_not_unstored_keys():
    table = HashTable(TableOptions(dim=2, max_capacity=64, optimizer=SparseSGD(lr=1.0),
                                   name="user_id"))
    slots = table.lookup(torch.tensor([5, 6])).slots
    with pytest.raises(ValueError, match=r"'user_id': slots must name each row once, got 1 "
                                         r"repeated \(slot \d+ 2 times\)"):
        table.apply_gradients(torch.stack([slots[0], slots[1], slots[0]]), torch.ones(3, 2))
    before = table.find(torch.tensor([5, 6]))[0]
    table.apply_gradients(torch.cat([slots, torch.tensor([-1, -1])]), torch.ones(4, 2))
    assert torch.equal(table.find(torch.tensor([5, 6]))[0], before - 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"slots": [1000]}, "slots must be < capacity"),
    ({"step": 0}, "step=0"),
    ({"step": -1}, "step=-1"),
    ({"step": 1.0}, "step=1.0"),
    ({"lr": -0.1}, "lr=-0.1"),
    ({"lr": float("nan")}, "lr=nan"),
], ids=["slot-past-capacity", "step-0", "step-negative", "step-float", "lr-negative", "lr-nan"])
def test_apply_gradients_checks_slots_step_and_lr(kwargs, match):
    from hashrec.table import SparseAdam

    table = HashTable(TableOptions(dim=2, max_capacity=64, optimizer=SparseAdam(),
                                   name="user_id"))
    slots = table.lookup(torch.tensor([5])).slots
    if "slots" in kwargs:
        slots = torch.tensor(kwargs.pop("slots"))
    with pytest.raises(ValueError, match=match) as info:
        table.apply_gradients(slots, torch.ones(1, 2), **kwargs)
    assert "user_id" in str(info.value)


def test_apply_gradients_refuses_slots_from_before_a_growth():
    table = HashTable(TableOptions(dim=2, max_capacity=1024, init_capacity=16,
                                   bucket_capacity=16, optimizer=SparseAdagrad()))
    result = table.lookup(torch.tensor([1]))
    table.apply_gradients(result.slots, torch.ones(1, 2), version=result.version)
    table.find_or_insert(torch.arange(100, 200))  # grows: every slot moves
    with pytest.raises(TableError, match="stale"):
        table.apply_gradients(result.slots, torch.ones(1, 2), version=result.version)
    fresh = table.lookup(torch.tensor([1]))
    table.apply_gradients(fresh.slots, torch.ones(1, 2), version=fresh.version)


def test_lookup_of_repeated_keys_is_refused():
    table = HashTable(TableOptions(dim=2, max_capacity=64))
    with pytest.raises(ValueError, match="2 repeated"):
        table.lookup(torch.tensor([7, 7, 7]))
    with pytest.raises(ValueError, match="repeated"):
        table.lookup(torch.tensor([7, 8, 7]), active=torch.tensor([True, True, True]))
    table.lookup(torch.tensor([7, 7, 8]), tags=torch.tensor([0, 1, 0], dtype=torch.int32))
    table.lookup(torch.tensor([7, 8, 7]), active=torch.tensor([True, True, False]))
    assert table.size() == 3


def test_lookup_checks_scores_before_the_active_mask():
    table = HashTable(TableOptions(dim=2, max_capacity=64, score_strategy="CUSTOMIZED",
                                   name="user_id"))
    with pytest.raises(ValueError, match="'user_id': scores must be"):
        table.lookup(torch.tensor([1, 2]), active=torch.tensor([True, False]),
                     scores=torch.tensor([1]))


def test_export_batch_checks_the_tag_and_skips_empty_batches():
    table = HashTable(TableOptions(dim=1, max_capacity=256, bucket_capacity=16, name="ns"))
    table.insert_or_assign(torch.arange(100), torch.zeros(100, 1),
                           tags=torch.full((100,), 3, dtype=torch.int32))
    table.insert_or_assign(torch.tensor([5]), torch.zeros(1, 1))
    batches = list(table.export_batch(16, tag=0))
    assert [b[0].tolist() for b in batches] == [[5]]
    assert sum(b[0].numel() for b in table.export_batch(16, tag=3)) == 100
    for tag, error in [(2**32, ValueError), (-(2**31) - 1, ValueError), (1.0, TypeError),
                       ("1", TypeError), (True, TypeError)]:
        with pytest.raises(error, match="'ns': tag="):
            list(table.export_batch(16, tag=tag))


@pytest.mark.parametrize("counts, keys, match", [
    ([1, 2], [4, 4], "repeated"), ([0, 1], [4, 5], ">= 1"), ([-2, 1], [4, 5], ">= 1")],
    ids=["repeated-key", "zero-count", "negative-count"])
def test_admission_counts_must_be_positive_and_keys_unique(counts, keys, match):
    table = HashTable(TableOptions(dim=2, max_capacity=64, name="adm",
                                   admission=AdmissionOptions(threshold=3)))
    with pytest.raises(ValueError, match=match) as info:
        table.load_admission_state(torch.tensor(keys), None, torch.tensor(counts))
    assert "'adm'" in str(info.value)
    if match == ">= 1":
        with pytest.raises(ValueError, match="counts must be >= 1"):
            table.lookup(torch.tensor(keys), counts=torch.tensor(counts))
    assert table.admission_state()[0].numel() == 0
