"""How the input's batches fall to the ranks."""

import pytest

from hashrec.train.batch_shares import empty_shares


@pytest.mark.parametrize("rows, workers, per_rank, drop, expected", [
    (1000, 2, [1, 0], False, "rank 1 of 2 got no batch, and every rank trains as many steps as "
     "the rank with the fewest. The shares are cut at whole batches: the 1000 rows make 1 full "
     "batch of data_config.batch_size 512 (plus 488 rows, a partial batch of rank 0) for 4 "
     "readers (2 ranks x 2 loader workers); lower data_config.batch_size to at most 250, or "
     "use fewer ranks or loader workers"),
    (2, 0, [0, 0, 0], True, "ranks 0, 1, 2 of 3 got no batch, and every rank trains as many "
     "steps as the rank with the fewest. The shares are cut at whole batches: the 2 rows make "
     "0 full batches of data_config.batch_size 512 (the 2 rows left over are dropped: "
     "drop_remainder) for 3 readers (3 ranks without loader workers); use fewer ranks"),
], ids=["workers", "fewer-rows-than-readers"])
def test_empty_shares_names_the_split_and_a_way_out(rows, workers, per_rank, drop, expected):
    assert empty_shares(rows, 512, workers, per_rank, drop) == expected
