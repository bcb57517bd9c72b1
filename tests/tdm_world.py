"""A planted TDM world for the TDM tests: 64 items of 8 categories (item ``i`` of
category ``i % 8``), their tree built by ``init_tree``, and users 0-47 who click items
of category ``user % 8`` after 3 clicks of that category; a TDM pipeline config over it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hashrec.tools.tdm.init_tree import main as init_tree

ITEMS, GROUPS, USERS = 64, 8, 48


def rows(count: int, seed: int) -> pa.Table:
    """``count`` clicks: user, clicked item (``adgroup_id``), its category, the user's 3
    earlier clicks (items and categories) and the label 1."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, USERS, count)
    group = users % GROUPS

    def items() -> np.ndarray:
        return rng.integers(0, ITEMS // GROUPS, count) * GROUPS + group

    history = np.stack([items() for _ in range(3)], axis=1)
    return pa.table({
        "user_id": users, "adgroup_id": items(), "cate_id": group,
        "click_seq__adgroup_id": ["|".join(map(str, h)) for h in history],
        "click_seq__cate_id": ["|".join(map(str, h % GROUPS)) for h in history],
        "clk": np.ones(count, dtype=np.int64)})


def build_tree(directory) -> str:
    """The items' tree (``init_tree``, 2 children a node: 7 levels) in ``directory/tree``;
    returns that directory."""
    pq.write_table(pa.table({"item_id": np.arange(ITEMS),
                             "cate_id": np.arange(ITEMS) % GROUPS}),
                   f"{directory}/items.parquet")
    tree = f"{directory}/tree"
    code = init_tree(["--item_input_path", f"{directory}/items.parquet",
                      "--item_id_field", "item_id", "--cate_id_field", "cate_id",
                      "--attr_fields", "cate_id", "--node_edge_output_file", tree])
    if code != 0:
        raise RuntimeError(f"init_tree exited with {code}")
    return tree


def _id_feature(name: str, dim: int = 8) -> str:
    return (f'id_feature {{ feature_name: "{name}" expression: "item:{name}" '
            f'embedding_dim: {dim} dynamicemb {{ max_capacity: 1024 '
            f'initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }}')


def config_text(directory, tree: str, num_epochs: int = 4) -> str:
    """A TDM over the world: train.parquet and eval.parquet in ``directory``, the model
    in ``directory/model``, the tree's tables in ``tree``."""
    return f"""
train_input_path: "{directory}/train.parquet"
eval_input_path: "{directory}/eval.parquet"
model_dir: "{directory}/model"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: {num_epochs}
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


def write_world(directory, train_rows: int = 1024, eval_rows: int = 256,
                num_epochs: int = 4) -> str:
    """The tree, train.parquet, eval.parquet and ``pipeline.config`` in ``directory``;
    returns the config's path."""
    return write_data(directory, build_tree(directory), train_rows, eval_rows, num_epochs)


def write_data(directory, tree: str, train_rows: int = 1024, eval_rows: int = 256,
               num_epochs: int = 4) -> str:
    """train.parquet, eval.parquet and ``pipeline.config`` (a TDM over the tree in
    ``tree``) in ``directory``; returns the config's path."""
    pq.write_table(rows(train_rows, 0), f"{directory}/train.parquet")
    pq.write_table(rows(eval_rows, 1), f"{directory}/eval.parquet")
    path = f"{directory}/pipeline.config"
    with open(path, "w", encoding="utf-8") as f:
        f.write(config_text(directory, tree, num_epochs))
    return path
