"""The Triton rehash (growth) against the reference, slot for slot.

Without CUDA the kernel runs under ``TRITON_INTERPRET=1`` on CPU tensors with tiny
sizes; the ``gpu``-marked test repeats it at a large size on a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed")

from triton_table_helpers import DEVICE, clone, filled  # noqa: E402

from hashrec.table import hashing  # noqa: E402
from hashrec.table.ops.insert import reference as insert_ref  # noqa: E402
from hashrec.table.ops.rehash import reference as rehash_ref  # noqa: E402
from hashrec.table.ops.rehash import triton as rehash_tt  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402


def assert_same_storage(got: TableStorage, want: TableStorage) -> None:
    assert (got.num_buckets, got.bucket_capacity, got.tagged) == (
        want.num_buckets, want.bucket_capacity, want.tagged)
    assert torch.equal(got.digests, want.digests)
    occ = want.digests != 0
    for name in ("keys", "tags", "scores", "values"):
        assert torch.equal(getattr(got, name)[occ], getattr(want, name)[occ]), name


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
@pytest.mark.parametrize("cap,num_buckets,n,factor,row_dim", [
    pytest.param(*c, id="cap{}-buckets{}-keys{}-x{}-row{}".format(*c)) for c in [
        (8, 4, 40, 2, 4), (16, 3, 60, 4, 5), (128, 2, 300, 2, 0), (128, 3, 330, 1, 70),
        (16, 5, 90, 8, 1)]])
def test_rehash_matches_reference(cap, num_buckets, n, factor, row_dim, tagged):
    old, keys, _ = filled(num_buckets, cap, n, seed=cap + n, tagged=tagged, row_dim=row_dim)
    assert int((old.digests != 0).sum()) > num_buckets * cap // 2  # well filled
    want = rehash_ref.rehash(clone_with_flag(old), num_buckets * factor)
    got = rehash_tt.rehash(clone_with_flag(old), num_buckets * factor)
    assert_same_storage(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_rehash_moves_half_rows_bit_for_bit(dtype):
    old, _, _ = filled(3, 16, 60, seed=9, tagged=True, row_dim=5, dtype=dtype)
    want = rehash_ref.rehash(clone_with_flag(old), 12)
    got = rehash_tt.rehash(clone_with_flag(old), 12)
    assert got.values.dtype == want.values.dtype == dtype
    assert_same_storage(got, want)


def test_reference_moves_rows_in_chunks(monkeypatch):
    old, _, _ = filled(4, 16, 50, seed=5, tagged=True, row_dim=6)
    want = rehash_tt.rehash(clone_with_flag(old), 8)
    monkeypatch.setattr(rehash_ref, "ROW_CHUNK", 5)
    assert_same_storage(rehash_ref.rehash(clone_with_flag(old), 8), want)


def clone_with_flag(storage: TableStorage) -> TableStorage:
    copy = clone(storage)
    copy.tagged = storage.tagged
    return copy


def test_rehash_splits_buckets_keeping_the_old_order():
    # One old bucket: the same key under several tags, equal scores, edge keys.
    cap = 16
    old = TableStorage.empty(1, cap, 3, device=DEVICE)
    keys = torch.tensor([7, 7, 7, -3, 5, 5, 2 ** 62, -(2 ** 63), 0, 1], device=DEVICE)
    tags = torch.tensor([0, 1, 2, 0, 3, 0, 1, 0, 2, 2], dtype=torch.int32, device=DEVICE)
    scores = torch.tensor([4, 4, 4, 4, 9, 4, 0, 4, -1, 4], device=DEVICE)
    insert_ref.insert_keys(old, keys, tags, scores, allow_evict=False)
    old.values.copy_(torch.arange(old.values.numel(), dtype=torch.float32).view_as(old.values))
    occupied = torch.nonzero(old.digests).flatten()
    for factor in (1, 2, 4):
        want = rehash_ref.rehash(clone_with_flag(old), factor)
        assert_same_storage(rehash_tt.rehash(clone_with_flag(old), factor), want)
        # Each new bucket holds, from its first slot, its entries in their old order.
        buckets = hashing.bucket_of(hashing.mix_tagged(old.keys[occupied],
                                                       old.tags[occupied]), factor)
        for b in range(factor):
            mine = occupied[buckets == b]
            slots = torch.arange(mine.numel(), device=DEVICE) + b * cap
            assert torch.equal(want.keys[slots], old.keys[mine])
            assert torch.equal(want.tags[slots], old.tags[mine])
            assert torch.equal(want.values[slots], old.values[mine])
            assert int((want.digests[b * cap:(b + 1) * cap] != 0).sum()) == mine.numel()


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_rehash_of_an_empty_storage(tagged):
    old = TableStorage.empty(3, 16, 5, device=DEVICE)
    old.tagged = tagged
    for op in (rehash_ref.rehash, rehash_tt.rehash):
        grown = op(clone_with_flag(old), 12)
        assert (grown.num_buckets, grown.tagged) == (12, tagged)
        assert not bool(grown.digests.any()) and not bool(grown.values.any())


@pytest.mark.parametrize("op", [rehash_ref.rehash, rehash_tt.rehash], ids=["reference", "triton"])
def test_rehash_to_fewer_buckets_is_refused(op):
    old, _, _ = filled(4, 8, 12, seed=3)
    with pytest.raises(ValueError, match="needs at least the storage's 4"):
        op(old, 3)


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_rehash_to_a_count_that_is_not_a_multiple_equals_the_reference(tagged):
    old, _, _ = filled(4, 16, 40, seed=6, tagged=tagged, row_dim=3)
    assert_same_storage(rehash_tt.rehash(clone_with_flag(old), 7),
                        rehash_ref.rehash(clone_with_flag(old), 7))


def test_rehash_of_bucket_widths_the_tile_cannot_take_equals_the_reference():
    old, _, _ = filled(3, 6, 14, seed=4, tagged=True)
    assert_same_storage(rehash_tt.rehash(clone_with_flag(old), 6),
                        rehash_ref.rehash(clone_with_flag(old), 6))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_large_rehash_matches_reference_on_gpu(tagged):
    old, _, _ = filled(4096, 128, 300_000, seed=21, tagged=tagged, row_dim=36)
    want = rehash_ref.rehash(clone_with_flag(old), 4096 * 4)
    got = rehash_tt.rehash(clone_with_flag(old), 4096 * 4)
    assert_same_storage(got, want)
