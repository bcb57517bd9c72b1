"""TDM's tree learning end to end on the planted world (``tdm_world``): a TDM trained on
init_tree's tree, its item embeddings written by ``item_embedding`` (the queries the model
scores candidates with), a tree clustered from them by ``cluster_tree`` (each category
under one node), and a TDM retrained on that tree whose retrieval finds the user's
items far above chance."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tdm_world import GROUPS, ITEMS, write_data, write_world

from hashrec.config import load_pipeline_config, validate_pipeline_config
from hashrec.tools.tdm.cluster_tree import main as cluster_tree
from hashrec.tools.tdm.item_embedding import main as item_embedding
from hashrec.tools.tdm.retrieval import main as retrieval
from hashrec.tools.tdm.retrieval import restored_session
from hashrec.train import train_and_evaluate

EVAL_ROWS = 256


def _train(config_path) -> dict:
    config = load_pipeline_config(config_path)
    validate_pipeline_config(config)
    return train_and_evaluate(config)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The world trained on init_tree's tree; its items' table (the feature columns)."""
    directory = tmp_path_factory.mktemp("tdm_learnt")
    config_path = write_world(directory, eval_rows=EVAL_ROWS)
    _train(config_path)
    # items in an order of their own: the output keeps it
    order = np.random.default_rng(0).permutation(ITEMS)
    pq.write_table(pa.table({"adgroup_id": order, "cate_id": order % GROUPS,
                             "brand": [f"b{i}" for i in order]}),
                   directory / "item_features.parquet")
    return directory, config_path


@pytest.fixture(scope="module")
def embeddings(world):
    directory, config_path = world
    assert item_embedding(["--pipeline_config_path", config_path, "--predict_input_path",
                           str(directory / "item_features.parquet"), "--predict_output_path",
                           str(directory / "item_emb.parquet"), "--reserved_columns",
                           "cate_id,brand", "--batch_size", "24", "--device", "cpu"]) == 0
    return pq.read_table(directory / "item_emb.parquet")


def test_item_embeddings_are_the_queries_the_model_scores(world, embeddings):
    directory, config_path = world
    items = pq.read_table(directory / "item_features.parquet")
    assert embeddings.column_names == ["adgroup_id", "cate_id", "brand", "item_emb"]
    assert embeddings["adgroup_id"].to_pylist() == items["adgroup_id"].to_pylist()
    assert embeddings["brand"].to_pylist() == items["brand"].to_pylist()
    by_item = dict(zip(embeddings["adgroup_id"].to_pylist(),
                       np.array(embeddings["item_emb"].to_pylist(), dtype=np.float32)))
    assert len({v.shape for v in by_item.values()}) == 1
    assert next(iter(by_item.values())).shape == (16,)  # adgroup_id 8 + cate_id 8
    # the eval rows (users with histories) as the model scores them: the query of each
    # row's candidate is the item's written embedding
    _, session = restored_session(config_path, None, torch.device("cpu"))
    rows = pq.read_table(directory / "eval.parquet")
    batch = session.feature_set.parse(rows, with_labels=False)
    with torch.inference_mode():
        query = session.model.dense_inputs(session.model.embed(batch), batch)[0].numpy()
    written = np.stack([by_item[i] for i in rows["adgroup_id"].to_pylist()])
    np.testing.assert_allclose(written, query, rtol=0, atol=1e-6)
    assert len(np.unique(np.stack(list(by_item.values())), axis=0)) == ITEMS


@pytest.fixture(scope="module")
def learnt_tree(world, embeddings):
    directory, _ = world
    tree = directory / "learnt_tree"
    assert cluster_tree(["--item_input_path", str(directory / "item_emb.parquet"),
                         "--item_id_field", "adgroup_id", "--embedding_field", "item_emb",
                         "--attr_fields", "cate_id", "--node_edge_output_file",
                         str(tree)]) == 0
    return tree


def test_the_learnt_tree_puts_each_category_under_one_node(learnt_tree):
    ancestors: dict[int, list[int]] = {}
    for line in (learnt_tree / "edge_table.txt").read_text().splitlines()[1:]:
        src, dst, _ = line.split("\t")
        ancestors.setdefault(int(src), []).append(int(dst))
    assert sorted(ancestors) == list(range(ITEMS))
    # 8 items a category: a subtree of 3 levels, its head 3 above the leaves
    heads = {c: {ancestors[i][2] for i in range(c, ITEMS, GROUPS)} for c in range(GROUPS)}
    assert all(len(h) == 1 for h in heads.values()), heads
    assert len(set.union(*heads.values())) == GROUPS


def test_a_tdm_retrained_on_the_learnt_tree_retrieves_the_users_items(
        tmp_path_factory, learnt_tree):
    directory = tmp_path_factory.mktemp("tdm_retrained")
    config_path = write_data(directory, str(learnt_tree), eval_rows=EVAL_ROWS)
    result = _train(config_path)
    assert result["auc"] > 0.9, result
    output = directory / "recall.parquet"
    assert retrieval(["--pipeline_config_path", config_path, "--predict_input_path",
                      str(directory / "eval.parquet"), "--predict_output_path", str(output),
                      "--recall_num", "8", "--beam_size", "8", "--device", "cpu"]) == 0
    clicked = pq.read_table(directory / "eval.parquet")["adgroup_id"].to_pylist()
    retrieved = pq.read_table(output)["recall_ids"].to_pylist()
    hits = sum(c in r for c, r in zip(clicked, retrieved))
    # chance: 8 of 64 items hold the clicked one with odds 0.125
    assert hits / EVAL_ROWS > 0.75, hits


@pytest.mark.parametrize("flags,message", [
    (["--predict_input_path", "{d}/eval.parquet", "--reserved_columns", "price"],
     "--reserved_columns: .* has no column price"),
    (["--predict_input_path", "{d}/ids.parquet"],
     r"--predict_input_path \(the query features of feature group 'seq'\): .* has no "
     r"column cate_id"),
    (["--predict_input_path", "{d}/item_features.parquet", "--embedding_field", "brand",
      "--reserved_columns", "brand"], "--embedding_field 'brand' is also"),
    (["--predict_input_path", "{d}/item_features.parquet", "--checkpoint_path",
      "{d}/none"], "none"),
], ids=["reserved", "query-column", "embedding-field", "checkpoint"])
def test_item_embedding_errors_name_the_flag(world, capsys, flags, message):
    directory, config_path = world
    pq.write_table(pa.table({"adgroup_id": [1, 2]}), directory / "ids.parquet")
    output = directory / "bad.parquet"
    code = item_embedding(["--pipeline_config_path", config_path, "--predict_output_path",
                           str(output), "--device", "cpu",
                           *(f.format(d=directory) for f in flags)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("item_embedding: ") and re.search(message, err), err
    assert not output.exists()


def test_retrieval_names_a_missing_checkpoint(world, capsys):
    directory, config_path = world
    assert retrieval(["--pipeline_config_path", config_path, "--checkpoint_path",
                      str(directory / "none"), "--predict_input_path",
                      str(directory / "eval.parquet"), "--predict_output_path",
                      str(directory / "none.parquet"), "--device", "cpu"]) == 2
    assert re.search(r"^retrieval: .*none: checkpoint directory does not exist",
                     capsys.readouterr().err)
