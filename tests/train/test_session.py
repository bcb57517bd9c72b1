"""build_session: which features get tables."""

from __future__ import annotations

import torch

from hashrec.config import load_pipeline_config
from hashrec.table import StorageMode
from hashrec.train.session import build_session

CONFIG = """
model_dir: "unused"
train_config {
  sparse_optimizer { adagrad_optimizer { lr: 0.1 } constant_learning_rate {} }
  dense_optimizer { adam_optimizer { lr: 0.01 } constant_learning_rate {} }
  num_epochs: 1
}
data_config { batch_size: 8 dataset_type: ParquetDataset label_fields: "clk" }
feature_configs { id_feature { feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 4 zch { zch_size: 16 eviction_interval: 2 lfu {} } } }
model_config {
  feature_groups { group_name: "deep" feature_names: ["user_id"] group_type: DEEP }
  multi_tower_din { towers { input: "deep" mlp { hidden_units: [4] } } final { hidden_units: [2] } }
}
"""


LEFT_OUT = """
feature_configs { id_feature { feature_name: "brand" expression: "item:brand"
  embedding_dim: 4 dynamicemb { max_capacity: 1024 } } }
feature_configs { id_feature { feature_name: "age_level" expression: "user:age_level"
  embedding_dim: 4 num_buckets: 8 } }
feature_configs { id_feature { feature_name: "pid" expression: "context:pid"
  embedding_dim: 4 zch { zch_size: 16 eviction_interval: 2 lfu {} } } }
"""


def test_features_in_no_group_get_no_table(tmp_path):
    path = tmp_path / "left_out.config"
    path.write_text(CONFIG.replace("model_config {", LEFT_OUT + "model_config {"))
    session = build_session(load_pipeline_config(str(path)), device=torch.device("cpu"))
    embedding = session.model.embedding
    assert list(embedding.table_locations()) == ["user_id"]
    assert embedding.dynamic_tables() == {}
    assert embedding.feature_names == ["user_id"]
    assert not [k for k in session.model.state_dict() if "age_level" in k or "pid" in k]
    assert session.feature_set.left_out == ("brand", "age_level", "pid")
    assert session.feature_set.input_columns == ["user_id", "clk"]


def test_the_tables_keep_the_storage_their_config_sets(tmp_path, monkeypatch):
    # Unconstrained, the planner prices CACHING below HYBRID at a factor of 0.5.
    monkeypatch.setenv("HASHREC_GPU_MEMORY_BYTES", str(1 << 40))
    monkeypatch.setenv("HASHREC_HOST_MEMORY_BYTES", str(1 << 40))
    feature = ('feature_configs { id_feature { feature_name: "brand" expression: "item:brand" '
               'embedding_dim: 4 dynamicemb { max_capacity: 1024 %s } } }\n')
    modes = {}
    for name, storage in (("free", "cache_load_factor: 0.5"),
                          ("hybrid", "cache_load_factor: 0.5 caching: false")):
        path = tmp_path / f"{name}.config"
        path.write_text(CONFIG.replace("model_config {", feature % storage + "model_config {")
                        .replace('feature_names: ["user_id"]', 'feature_names: ["user_id", '
                                                                 '"brand"]'))
        session = build_session(load_pipeline_config(str(path)), device=torch.device("cpu"))
        modes[name] = session.model.embedding.dynamic_tables()["brand"].options.storage_mode
    assert modes == {"free": StorageMode.CACHING, "hybrid": StorageMode.HYBRID}


def test_a_fresh_run_warns_of_its_empty_frozen_dynamic_tables(tmp_path, caplog):
    """A frozen dynamic table starts empty and training inserts nothing into it: a fresh
    run says so; a resumed one, whose checkpoint holds the table, does not."""
    from small_din import generate_data, small_config

    from hashrec.train.run import train_and_evaluate

    generate_data(tmp_path / "data", seed=0)
    config = small_config(tmp_path / "model", {
        "train_input_path": str(tmp_path / "data"),
        "feature_configs[feature_name=user_id].id_feature.trainable": False})
    with caplog.at_level("WARNING", logger="hashrec.train"):
        train_and_evaluate(config)
    warned = [m for m in caplog.messages if "frozen table" in m]
    assert len(warned) == 1 and "'user_id'" in warned[0]
    caplog.clear()
    config.train_config.num_steps = 6
    with caplog.at_level("WARNING", logger="hashrec.train"):
        train_and_evaluate(config, continue_train=True)
    assert not [m for m in caplog.messages if "frozen table" in m]


def test_the_warning_names_frozen_zch_tables_too(caplog):
    from types import SimpleNamespace

    from hashrec.embedding import EmbeddingTableSpec
    from hashrec.embedding.zch import ZchOptions
    from hashrec.train.checkpoints import note_empty_frozen_tables

    tables = [EmbeddingTableSpec("z", 4, num_rows=8, zch=ZchOptions(8, 1, "LFU", 1.0),
                                 trainable=False),
              EmbeddingTableSpec("d", 4, num_rows=8, trainable=False),  # dense: keeps rows
              EmbeddingTableSpec("t", 4, num_rows=8)]
    with caplog.at_level("WARNING", logger="hashrec.train"):
        note_empty_frozen_tables(SimpleNamespace(embedding_tables=lambda: tables))
    (message,) = caplog.messages
    assert message.startswith("frozen table 'z' (trainable: false) starts empty")
    assert "'z' (ZCH) reads zeros" in message and "make it trainable" in message
    assert "'d'" not in message and "'t'" not in message
    tables.append(EmbeddingTableSpec("y", 4, num_rows=8, trainable=False,
                                     zch=ZchOptions(8, 1, "LFU", 1.0)))
    caplog.clear()
    with caplog.at_level("WARNING", logger="hashrec.train"):
        note_empty_frozen_tables(SimpleNamespace(embedding_tables=lambda: tables))
    (message,) = caplog.messages
    assert message.startswith("frozen tables 'z', 'y' (trainable: false) start empty")
    assert "'z', 'y' (ZCH) read zeros" in message and "make them trainable" in message


def test_an_eval_input_the_model_cannot_read_fails_before_training(tmp_path):
    """A column the evaluation needs (here the sample weight) missing from the eval input
    is an error at the start, not after the first checkpoint."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pytest
    from small_din import generate_data, small_config

    from hashrec.data import DataError
    from hashrec.train.run import train_and_evaluate

    generate_data(tmp_path / "data", seed=0)
    (part,) = (tmp_path / "data").glob("*.parquet")
    table = pq.read_table(part)
    (tmp_path / "train").mkdir()
    pq.write_table(table.append_column("w", pa.array([1.0] * table.num_rows)),
                   tmp_path / "train" / "part-00000.parquet")
    config = small_config(tmp_path / "model", {
        "train_input_path": str(tmp_path / "train"), "eval_input_path": str(tmp_path / "data"),
        "data_config.sample_weight_fields": ["w"]})
    with pytest.raises(DataError, match=r"part-00000\.parquet.*column 'w' is missing"):
        train_and_evaluate(config)
    assert not list((tmp_path / "model").glob("model.ckpt-*"))
