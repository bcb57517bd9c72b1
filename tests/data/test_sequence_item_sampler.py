"""negative_sampler over hstu_match's candidates, as TorchEasyRec reads them: an
``item_id_field`` of a sequence's sub-feature (``cand_seq__video_id``) gives the batch's
ids from each row's sequence, and an attr field named as the bare sub-feature fills that
sequence's column, one item a sampled row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hashrec.config.data_pb2 import NegativeSampler as SamplerConfig
from hashrec.data.errors import DataError
from hashrec.data.sampler import NegativeSampler


def _sampler(tmp_path, num_sample: int = 6) -> NegativeSampler:
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"id": pa.array(range(6), pa.int64()), "weight": [1.0] * 6,
                             "attrs": [f"{i}" for i in range(6)]}), path)
    return NegativeSampler(SamplerConfig(input_path=str(path), num_sample=num_sample,
                                         attr_fields=["video_id"],
                                         item_id_field="cand_seq__video_id"))


@pytest.mark.parametrize("column", [pa.array(["0|1", "2", None, ""]),
                                    pa.array([[0, 1], [2], None, []], pa.list_(pa.int64()))],
                         ids=["text", "list"])
def test_the_batchs_ids_are_every_item_of_its_sequences(tmp_path, column):
    sampler = _sampler(tmp_path)
    batch = pa.table({"cand_seq__video_id": column})
    ids = sampler.batch_ids(batch, "cand_seq__video_id", "item_id_field")
    assert sorted(ids.tolist()) == [0, 1, 2]
    # every draw avoids them while it can (5 redraws of a table of 6 items, 3 in the batch)
    rows = sampler.draw(ids, np.random.default_rng(0))
    assert np.isin(rows, [3, 4, 5]).mean() > 0.9


def test_a_sampled_row_holds_its_item_in_the_sequence_column_of_the_attr(tmp_path):
    sampler = _sampler(tmp_path)
    batch = pa.table({"uih_seq__video_id": ["7|8"], "cand_seq__video_id": ["0|1"],
                      "video_id": pa.array([9], pa.int64())})
    rows = sampler.item_rows(batch, pa.array([4, 5], pa.int64()))
    assert rows["cand_seq__video_id"].to_pylist() == ["4", "5"]
    assert rows["video_id"].to_pylist() == [4, 5]  # a column of the bare name too
    assert rows["uih_seq__video_id"].to_pylist() == [None, None]


def test_text_that_is_no_ids_is_an_error_naming_the_field(tmp_path):
    sampler = _sampler(tmp_path)
    with pytest.raises(DataError, match=r"item_id_field 'cand_seq__video_id': the input "
                                        r"column holds string, not integer ids"):
        sampler.batch_ids(pa.table({"cand_seq__video_id": ["a|b"]}), "cand_seq__video_id",
                          "item_id_field")
