"""dlrm_hstu's label columns, a list a row (one value per candidate): text split on the
candidate sequence's delimiter or list cells, cut to its sequence_length, zeros after a
row's values, empty and null cells rows without candidates, a bad value an error naming
its row; the feature set reads them so for dlrm_hstu alone, without the [0, 1] check of
a binary loss (the values are action bitmasks)."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from hashrec.config import parse_pipeline_config
from hashrec.config.errors import ConfigError
from hashrec.features.errors import FeatureError
from hashrec.features.feature_set import build_feature_set
from hashrec.features.sequence_labels import SequenceLabel, read_sequence_label


def test_text_cells_are_split_cut_and_padded():
    array = pa.array(["1|3|0", "", None, "2|2|2|2", "7"])
    out = read_sequence_label(array, "act", SequenceLabel(3, "|"))
    assert out.dtype == torch.float32
    assert out.tolist() == [[1, 3, 0], [0, 0, 0], [0, 0, 0], [2, 2, 2], [7, 0, 0]]


def test_list_cells_are_read_as_they_are():
    array = pa.array([[0.5, 1.5], [], None, [3.0]], pa.list_(pa.float64()))
    out = read_sequence_label(array, "wt", SequenceLabel(2, "|"))
    assert out.tolist() == [[0.5, 1.5], [0, 0], [0, 0], [3.0, 0]]


def test_a_value_that_is_no_number_names_its_row():
    with pytest.raises(FeatureError, match=r"label column 'act'.*row 2.*'1\|x'"):
        read_sequence_label(pa.array(["1", "0|1", "1|x"]), "act", SequenceLabel(3, "|"))


CONFIG = """
model_dir: "m"
data_config { dataset_type: ParquetDataset label_fields: ["cand_seq__action_weight"] }
feature_configs { sequence_feature { sequence_name: "uih_seq" sequence_length: 6
  sequence_delim: "|" features { id_feature { feature_name: "video_id"
  expression: "item:video_id" embedding_dim: 4 num_buckets: 10 } } } }
feature_configs { sequence_feature { sequence_name: "cand_seq" sequence_length: 3
  sequence_delim: ";" features { id_feature { feature_name: "video_id"
  expression: "item:video_id" embedding_dim: 4 num_buckets: 10 } } } }
model_config {
  feature_groups { group_name: "uih" feature_names: "uih_seq__video_id"
                   group_type: JAGGED_SEQUENCE }
  feature_groups { group_name: "candidate" feature_names: "cand_seq__video_id"
                   group_type: JAGGED_SEQUENCE }
  dlrm_hstu { max_seq_len: 9
    hstu { stu { embedding_dim: 4 num_heads: 1 hidden_dim: 2 attention_dim: 2 }
           positional_encoder { num_position_buckets: 8 }
           input_preprocessor { contextual_preprocessor {
             content_encoder { slice_content_encoder {} }
             content_mlp { simple_mlp { hidden_dim: 4 } } } }
           output_postprocessor { layernorm_postprocessor {} } }
    fusion_mtl_tower { task_configs { task_name: "is_click"
                       label_name: "cand_seq__action_weight" task_bitmask: 1 } } }
}
"""


def test_the_feature_set_reads_dlrm_hstus_labels_as_the_candidates_lists():
    features = build_feature_set(parse_pipeline_config(CONFIG))
    table = pa.table({"uih_seq__video_id": ["1|2", "3"], "cand_seq__video_id": ["4;5", "6"],
                      "cand_seq__action_weight": ["3;2", "5"]})
    batch = features.parse(table)
    # action bitmasks (3, 5) are no binary labels: no [0, 1] check
    assert batch.labels["cand_seq__action_weight"].tolist() == [[3, 2, 0], [5, 0, 0]]


def test_a_dlrm_hstu_without_a_candidate_group_is_refused():
    text = CONFIG.replace('group_name: "candidate"', 'group_name: "cand"')
    with pytest.raises(ConfigError, match="feature group 'candidate', which is missing"):
        build_feature_set(parse_pipeline_config(text))


def test_the_shape_options_are_checked():
    with pytest.raises(ValueError, match="SequenceLabel.length=0"):
        SequenceLabel(0, "|")
    with pytest.raises(ValueError, match="SequenceLabel.delimiter is empty"):
        SequenceLabel(3, "")
