"""A tiny pipeline over generated parquet with a user id and a price: the loss tests'
models train on it in a few seconds."""

from __future__ import annotations

TEMPLATE = """
model_dir: "{root}/m"
train_input_path: "{root}/data/train.parquet"
eval_input_path: "{root}/data/eval.parquet"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: {epochs}
}}
data_config {{ batch_size: 64 dataset_type: ParquetDataset label_fields: {labels}
  num_workers: 0 }}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 4 dynamicemb {{ max_capacity: 256 }} }} }}
feature_configs {{ raw_feature {{ feature_name: "price" expression: "item:price" {price} }} }}
{features}
model_config {{
  feature_groups {{ group_name: "deep" feature_names: ["user_id", "price"] group_type: DEEP }}
  {model}
}}
"""
# A MultiTower over the group, for ``model``.
MULTI_TOWER = 'multi_tower { towers { input: "deep" mlp { hidden_units: [8] } } }'


def pipeline_text(root, labels: str, model: str, epochs: int = 8, features: str = "",
                  price: str = "") -> str:
    """The config text: ``labels`` the label_fields value (``"y"`` or ``["a", "b"]``),
    ``model`` the model_config after the feature group, ``features`` more feature_configs
    (read by no group unless ``model`` says so), ``price`` more options of the price
    raw_feature (e.g. its normalizer)."""
    return TEMPLATE.format(root=root, labels=labels, model=model, epochs=epochs,
                           features=features, price=price)


def train_tiny(root, make_table, labels: str, model: str, rows: tuple[int, int] = (1280, 320),
               **options):
    """Write ``make_table(rows, seed)`` as ``root/data``'s train (seed 0) and eval (seed 1)
    parquet files, then train the ``pipeline_text(root, labels, model, **options)`` config
    on them; returns (root, config, the last evaluation's result)."""
    import pyarrow.parquet as pq

    from hashrec.config import parse_pipeline_config
    from hashrec.train import train_and_evaluate

    (root / "data").mkdir()
    pq.write_table(make_table(rows[0], 0), root / "data" / "train.parquet")
    pq.write_table(make_table(rows[1], 1), root / "data" / "eval.parquet")
    config = parse_pipeline_config(pipeline_text(root, labels, model, **options))
    return root, config, train_and_evaluate(config)


def restored_session(root, config):
    """The session of ``config`` with the model of ``root``'s latest checkpoint, in eval
    mode."""
    import torch

    from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
    from hashrec.train.session import build_session

    session = build_session(config, device=torch.device("cpu"))
    restore_checkpoint(latest_checkpoint(str(root / "m")), session.model, None,
                       session.model.embedding.dynamic_tables())
    session.model.eval()
    return session


def restored_outputs(root, config):
    """(outputs, batch) of the model of ``root``'s latest checkpoint, in eval mode, on
    the rows of ``root/data/eval.parquet``."""
    import pyarrow.parquet as pq
    import torch

    session = restored_session(root, config)
    batch = session.feature_set.parse(pq.read_table(root / "data" / "eval.parquet"))
    with torch.no_grad():
        return session.model(batch), batch


def exported_predictions(root, config, out_dir, input_path=None, reserved=()):
    """The table ``predict`` writes with the export of ``root``'s latest checkpoint (into
    ``out_dir``) on ``input_path`` (default: the eval rows)."""
    import pyarrow.parquet as pq

    from hashrec.checkpoint import latest_checkpoint
    from hashrec.export.exporter import export_model
    from hashrec.predict import predict

    export_model(config, str(out_dir / "e"), latest_checkpoint(str(root / "m")))
    out = predict(str(out_dir / "e"), str(input_path or root / "data" / "eval.parquet"),
                  str(out_dir / "p.parquet"), reserved_columns=tuple(reserved))
    return pq.read_table(out["output"])
