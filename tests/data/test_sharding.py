import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashrec.data.sharding import epoch_order, slot_batches, slot_ranges, turn_ranges
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


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=12), st.integers(1, 3),
       st.integers(1, 5), st.integers(1, 9))
def test_turns_take_a_rank_s_batches_in_turn(sizes, world_size, turns, batch):
    pieces = _pieces(sizes)
    for rank in range(world_size):
        rank_ranges = slot_ranges(pieces, rank, world_size, batch)
        rows = _rows(pieces, rank_ranges)
        batches = [rows[i:i + batch] for i in range(0, len(rows), batch)]
        for turn in range(turns):
            taken = turn_ranges(rank_ranges, turn, turns, batch)
            want = [r for j in range(turn, len(batches), turns) for r in batches[j]]
            assert _rows(pieces, taken) == want
            # A piece's consecutive rows come as one range.
            assert all(a[0] != b[0] or a[2] < b[1] for a, b in zip(taken, taken[1:]))
        assert turn_ranges(rank_ranges, 0, 1, batch) == rank_ranges


def test_turn_ranges_as_the_docstring_shows():
    p0, p1 = Piece("a", 0, 5), Piece("a", 1, 4, 5)
    ranges = [(p0, 0, 5), (p1, 0, 4)]
    assert turn_ranges(ranges, 0, 2, 2) == [(p0, 0, 2), (p0, 4, 5), (p1, 0, 1), (p1, 3, 4)]
    assert turn_ranges(ranges, 1, 2, 2) == [(p0, 2, 4), (p1, 1, 3)]
    # A range that starts inside its piece: rows are counted from the range's start.
    assert turn_ranges([(p0, 3, 5), (p1, 0, 4)], 1, 2, 2) == [(p1, 0, 2)]
    with pytest.raises(ValueError, match="turn"):
        turn_ranges(ranges, 2, 2, 2)
