import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashrec.data.sharding import epoch_order, slot_batches, slot_ranges
from hashrec.data.sources import Piece


def _pieces(sizes):
    return [Piece(f"f{i // 3}", i % 3, n) for i, n in enumerate(sizes)]


def _rows(pieces, ranges):
    base, pos = {}, 0
    for p in pieces:
        base[p], pos = pos, pos + p.num_rows
    return [base[p] + r for p, start, stop in ranges for r in range(start, stop)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=12), st.integers(1, 17),
       st.integers(1, 9))
def test_slots_tile_every_row_exactly_once_in_whole_batches(sizes, num_slots, batch):
    pieces = _pieces(sizes)
    per_slot = [_rows(pieces, slot_ranges(pieces, s, num_slots, batch))
                for s in range(num_slots)]
    flat = [r for rows in per_slot for r in rows]
    assert flat == list(range(sum(sizes)))
    counts = [len(rows) for rows in per_slot]
    # Only slot 0 holds a partial batch; slots differ by at most one batch, partial
    # batches included.
    assert all(c % batch == 0 for c in counts[1:])
    assert (counts[0] - sum(sizes) % batch) % batch == 0
    batches = [-(-c // batch) for c in counts]
    assert max(batches) - min(batches) <= 1
    for drop in (False, True):
        assert [slot_batches(sum(sizes), s, num_slots, batch, drop)
                for s in range(num_slots)] == [c // batch if drop else -(-c // batch)
                                               for c in counts]


def test_one_row_batches_split_rows_evenly():
    pieces = _pieces([7, 5, 9])
    counts = [len(_rows(pieces, slot_ranges(pieces, s, 4))) for s in range(4)]
    assert counts == [5, 5, 5, 6]  # as T * s // S splits them


def test_slot_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="slot"):
        slot_ranges(_pieces([3]), 2, 2)


def test_epoch_order_is_a_seeded_permutation():
    pieces = _pieces(range(1, 30))
    assert epoch_order(pieces, False, 0, 5) == pieces
    first = epoch_order(pieces, True, 7, 0)
    assert sorted(first, key=pieces.index) == pieces
    assert first == epoch_order(pieces, True, 7, 0)
    assert first != epoch_order(pieces, True, 7, 1)
    assert first != epoch_order(pieces, True, 8, 0)
