"""Joins of storages (``hashrec.embedding.joint``): which storages join, each member's
share of a join's dedup, the setting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hashrec.embedding import joint


def _storage(name: str, dim: int, tables: int, fused: bool = True):
    plan = SimpleNamespace(tables=(None,) * tables, fused=fused)
    return SimpleNamespace(name=name, table=SimpleNamespace(dim=dim), plan=plan)


def test_joins_group_storages_by_row_width():
    storages = [_storage("a", 16, 2), _storage("b", 8, 1), _storage("c", 16, 1),
                _storage("z", 16, 1), _storage("d", 8, 3)]
    assert joint.make_joins(storages, alone={"z"}) == [(0, 2), (1, 4), (3,)]
    assert joint.joint_name([storages[0], storages[2]]) == "a+c"


def _joint_batch(per_rank=None):
    return SimpleNamespace(keys=torch.tensor([1, 5, 2, 7, 7, 9, 3]),
                           tags=torch.tensor([0, 0, 1, 2, 3, 3, 4], dtype=torch.int32),
                           counts=torch.arange(7), unique_per_table=[2, 1, 1, 2, 1],
                           key_ranges=[(1, 5), (2, 2), (7, 7), (7, 9), (3, 3)],
                           owner_counts=[2, 1], recv_counts=[2, 2], pair_max=2,
                           unique_per_rank_table=per_rank)


def test_split_join_gives_each_member_its_keys_and_own_tags():
    members = [_storage("a", 16, 2), _storage("b", 16, 1, fused=False),
               _storage("c", 16, 2)]
    a, b, c = joint.split_join(_joint_batch(), members)
    assert a.keys.tolist() == [1, 5, 2] and a.tags.tolist() == [0, 0, 1]
    assert a.unique_per_table == [2, 1] and a.key_ranges == [(1, 5), (2, 2)]
    assert b.keys.tolist() == [7] and b.tags is None and b.counts.tolist() == [3]
    assert c.keys.tolist() == [7, 9, 3] and c.tags.tolist() == [0, 0, 1]
    assert c.tags.dtype == torch.int32 and c.key_ranges == [(7, 9), (3, 3)]
    assert all(p.owner_counts is None and p.unique_per_rank is None for p in (a, b, c))


def test_split_join_gives_every_member_keys_that_start_16_byte_aligned():
    """Members start 3 and 4 keys into the join's: their int64 keys, int32 tags and
    int64 counts start aligned all the same (copies where the slices do not), so a
    kernel compiles no variant for a batch's offsets."""
    members = [_storage("a", 16, 2), _storage("b", 16, 1, fused=False),
               _storage("c", 16, 2)]
    batch = _joint_batch()
    a, b, c = joint.split_join(batch, members)
    for part in (a, b, c):
        for tensor in (part.keys, part.counts, part.tags):
            assert tensor is None or tensor.data_ptr() % 16 == 0
    assert b.keys.tolist() == [7] and b.counts.tolist() == [3]
    assert c.keys.tolist() == [7, 9, 3] and c.counts.tolist() == [4, 5, 6]
    assert a.keys.data_ptr() == batch.keys.data_ptr()  # aligned already: a view


def test_split_join_of_a_sharded_member():
    """The sharded member takes the exchange sizes; every member its rows per rank."""
    members = [_storage("a", 16, 2), _storage("b", 16, 1, fused=False),
               _storage("c", 16, 2)]
    per_rank = [[2, 1, 1, 2, 1], [0, 3, 4, 1, 0]]
    a, b, c = joint.split_join(_joint_batch(per_rank), members, frozenset({"c"}))
    assert c.owner_counts == [2, 1] and c.recv_counts == [2, 2] and c.pair_max == 2
    assert a.owner_counts is None and b.recv_counts is None and a.pair_max is None
    assert (a.unique_per_rank, b.unique_per_rank, c.unique_per_rank) == ([3, 3], [1, 4],
                                                                          [3, 1])
    assert joint.owned_tags(members, frozenset({"c"})) == (3, 5)
    assert joint.owned_tags(members, frozenset({"b"})) == (2, 3)
    assert joint.owned_tags(members, frozenset()) is None


def test_a_join_takes_one_sharded_storage():
    storages = [_storage("s1", 16, 2), _storage("d", 16, 1), _storage("s2", 16, 1),
                _storage("s3", 8, 1)]
    assert joint.make_joins(storages, set(), frozenset({"s1", "s2", "s3"})) == \
        [(0, 1), (2,), (3,)]


@pytest.mark.parametrize(("value", "enabled"), [("", True), ("1", True), ("0", False)])
def test_joins_setting(monkeypatch, value, enabled):
    monkeypatch.setenv(joint.ENV, value)
    assert joint.joins_enabled() == enabled


def test_joins_setting_is_checked(monkeypatch):
    monkeypatch.setenv(joint.ENV, "no")
    with pytest.raises(ValueError, match="expected 0 or 1"):
        joint.joins_enabled()
