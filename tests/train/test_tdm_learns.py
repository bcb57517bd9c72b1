"""TDM end to end on a planted affinity: a tree built by init_tree over 64 items of 8
categories, users who click items of one category (their history too), trained through
train_eval on tdm_sampler's (user, tree node) rows; the evaluation's rows are told apart
(AUC far above chance) only by relating the node to the user's history."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.tools.tdm.init_tree import main as init_tree
from hashrec.train import train_and_evaluate

ITEMS, GROUPS = 64, 8


def _rows(count: int, seed: int) -> pa.Table:
    """Users 0-47 click items of category user % 8, after 3 clicks of that category."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 48, count)
    group = users % GROUPS

    def items() -> np.ndarray:
        return rng.integers(0, ITEMS // GROUPS, count) * GROUPS + group

    history = np.stack([items() for _ in range(3)], axis=1)
    return pa.table({
        "user_id": users, "adgroup_id": items(), "cate_id": group,
        "click_seq__adgroup_id": ["|".join(map(str, h)) for h in history],
        "click_seq__cate_id": ["|".join(map(str, h % GROUPS)) for h in history],
        "clk": np.ones(count, dtype=np.int64)})


def _id_feature(name: str, dim: int = 8) -> str:
    return (f'id_feature {{ feature_name: "{name}" expression: "item:{name}" '
            f'embedding_dim: {dim} dynamicemb {{ max_capacity: 1024 '
            f'initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }}')


def _config(tmp_path, tree: str) -> str:
    return f"""
train_input_path: "{tmp_path}/train.parquet"
eval_input_path: "{tmp_path}/eval.parquet"
model_dir: "{tmp_path}/model"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: 4
}}
data_config {{ batch_size: 32 dataset_type: ParquetDataset label_fields: "clk" num_workers: 0
  tdm_sampler {{ item_input_path: "{tree}/node_table.txt"
    edge_input_path: "{tree}/edge_table.txt"
    predict_edge_input_path: "{tree}/predict_edge_table.txt"
    attr_fields: ["tree_level", "adgroup_id", "cate_id"] item_id_field: "adgroup_id"
    layer_num_sample: [0, 1, 1, 2, 2, 3, 4] attr_delimiter: "," }} }}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 8 dynamicemb {{ max_capacity: 1024
  initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }} }}
feature_configs {{ {_id_feature("adgroup_id")} }}
feature_configs {{ {_id_feature("cate_id")} }}
feature_configs {{ sequence_feature {{ sequence_name: "click_seq" sequence_length: 3
  sequence_delim: "|" features {{ {_id_feature("adgroup_id")} }}
  features {{ {_id_feature("cate_id")} }} }} }}
model_config {{
  feature_groups {{ group_name: "seq" group_type: SEQUENCE
    feature_names: ["adgroup_id", "cate_id", "click_seq__adgroup_id", "click_seq__cate_id"] }}
  feature_groups {{ group_name: "user" group_type: DEEP feature_names: "user_id" }}
  tdm {{ multiwindow_din {{ windows_len: [1, 2] attn_mlp {{ hidden_units: [8] }} }}
         final {{ hidden_units: [16, 8] }} }}
  num_class: 2
  metrics {{ auc {{}} }}
  losses {{ softmax_cross_entropy {{}} }}
}}
"""


def test_tdm_learns_which_tree_nodes_lead_to_the_users_items(tmp_path):
    pq.write_table(pa.table({"item_id": np.arange(ITEMS), "cate_id": np.arange(ITEMS) % GROUPS}),
                   tmp_path / "items.parquet")
    tree = str(tmp_path / "tree")
    assert init_tree(["--item_input_path", str(tmp_path / "items.parquet"),
                      "--item_id_field", "item_id", "--cate_id_field", "cate_id",
                      "--attr_fields", "cate_id", "--node_edge_output_file", tree]) == 0
    pq.write_table(_rows(1024, 0), tmp_path / "train.parquet")
    pq.write_table(_rows(256, 1), tmp_path / "eval.parquet")
    config = parse_pipeline_config(_config(tmp_path, tree))
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    # 256 rows, each with 5 ancestors and 1 + 1 + 2 + 2 + 3 + 4 negatives
    assert result["num_examples"] == 256 * (1 + 5 + 13), result
    # a category's 8 leaves fill one subtree of level 3: below it every positive shares
    # the history's category and no negative does; above it the node ids must be learned
    assert result["auc"] > 0.9, result
