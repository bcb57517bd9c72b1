import pytest
import torch

from hashrec.checkpoint import CheckpointError
from hashrec.table import HashTable, TableOptions
from hashrec.tools.dynamicemb.ckpt_writer import CheckpointBuilder


def _write(tmp_path, keys: int, score_strategy: str = "LFU") -> CheckpointBuilder:
    """A builder for 2 ranks of a 64-row storage, holding ``keys`` rows."""
    table = HashTable(TableOptions(dim=2, max_capacity=64, score_strategy=score_strategy))
    builder = CheckpointBuilder(str(tmp_path / score_strategy), 2, {"t": table})
    ids = torch.arange(keys)
    builder.write_rows("t", ids, torch.zeros(keys, dtype=torch.int32),
                       torch.zeros(keys, table.row_dim), torch.ones(keys, dtype=torch.int64))
    return builder


@pytest.mark.parametrize("keys, score_strategy, one_rank", [
    (64, "LFU", True),  # every row fits one rank: the way round is named
    (65, "LFU", False),  # more rows than max_capacity: only raising it helps
    (64, "NO_EVICTION", False),  # a restore on more ranks would refuse the rows
], ids=["fit-one-rank-lfu", "past-max-lfu", "fit-one-rank-no-eviction"])
def test_a_rank_over_its_share_names_the_way_out(tmp_path, keys, score_strategy, one_rank):
    builder = _write(tmp_path, keys, score_strategy)
    try:
        with pytest.raises(CheckpointError, match="a rank holds at most 32") as error:
            builder.check_capacity()
    finally:
        builder.abort()
    message = str(error.value)
    assert message.endswith("raise max_capacity") != one_rank
    if one_rank:
        assert ("or write the checkpoint for one rank (--world_size 1), which holds every row, "
                "and restore that on 2: a restore keeps each rank's highest-scored rows") in message


def test_every_storage_over_is_named_and_a_no_eviction_one_withholds_the_way_round(tmp_path):
    evicting = HashTable(TableOptions(dim=2, max_capacity=64, score_strategy="LFU"))
    kept = HashTable(TableOptions(dim=2, max_capacity=64, score_strategy="NO_EVICTION"))
    builder = CheckpointBuilder(str(tmp_path), 2, {"a": evicting, "b": kept})
    for name, table in (("a", evicting), ("b", kept)):
        builder.write_rows(name, torch.arange(64), torch.zeros(64, dtype=torch.int32),
                           torch.zeros(64, table.row_dim), torch.ones(64, dtype=torch.int64))
    try:
        with pytest.raises(CheckpointError) as error:
            builder.check_capacity()
    finally:
        builder.abort()
    assert "storage 'a': rank" in str(error.value) and "; storage 'b': rank" in str(error.value)
    assert str(error.value).endswith("; raise max_capacity")
