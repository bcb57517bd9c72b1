"""Export and predict of a TDM (``tdm_world``): the scripted model scores (user, tree node)
rows as the restored eager model does."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
from tdm_world import rows, write_world

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.config import load_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import train_and_evaluate
from hashrec.train.session import build_session

pytestmark = pytest.mark.slow


def _node_rows(tree: str, count: int) -> pa.Table:
    """``count`` clicks, each paired with a random tree node (its id and category in the
    item columns), as the retrieval scores them."""
    nodes = pacsv.read_csv(f"{tree}/node_table.txt",
                           parse_options=pacsv.ParseOptions(delimiter="\t"))
    feature = pc.split_pattern(nodes.column("feature:string"), ",")
    ids = pc.cast(pc.list_element(feature, 1), pa.int64()).to_numpy()
    cates = pc.cast(pc.list_element(feature, 2), pa.int64()).to_numpy()
    pick = np.random.default_rng(2).integers(1, len(ids), count)  # row 0: the root handle
    table = rows(count, 3)
    table = table.set_column(table.schema.get_field_index("adgroup_id"), "adgroup_id",
                             pa.array(ids[pick]))
    return table.set_column(table.schema.get_field_index("cate_id"), "cate_id",
                            pa.array(cates[pick]))


def _eager_probs(config, checkpoint: str, input_path: str) -> torch.Tensor:
    session = build_session(config, device=torch.device("cpu"))
    restore_checkpoint(checkpoint, session.model, None,
                       session.model.embedding.dynamic_tables(), restore_optimizer=False)
    session.model.eval()
    with torch.no_grad():
        return torch.cat([session.model(batch)["probs"]
                          for batch in session.loader(input_path, "predict")])


def test_exported_tdm_predicts_as_the_eager_model(tmp_path):
    config = load_pipeline_config(write_world(tmp_path, train_rows=256, eval_rows=64,
                                              num_epochs=1))
    train_and_evaluate(config)
    checkpoint = latest_checkpoint(str(tmp_path / "model"))
    export_model(config, str(tmp_path / "export"), checkpoint)
    pq.write_table(_node_rows(str(tmp_path / "tree"), 200), tmp_path / "pairs.parquet")
    predict(str(tmp_path / "export"), str(tmp_path / "pairs.parquet"),
            str(tmp_path / "pred.parquet"))

    written = pq.read_table(tmp_path / "pred.parquet")
    probs = torch.tensor(written["probs"].to_pylist())
    expected = _eager_probs(config, checkpoint, str(tmp_path / "pairs.parquet")).float()
    assert probs.shape == expected.shape == (200, 2)
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.from_numpy(written["probs1"].to_numpy()), expected[:, 1],
                               atol=1e-5, rtol=0)
    # the pairs are told apart: the scores are no constant
    assert float(expected[:, 1].std()) > 1e-3
