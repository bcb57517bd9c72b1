"""The hitrate tool on the predictions of exported towers: a DSSM trained on the planted
world of ``test_dssm_learns`` retrieves its users' items far above chance, and a MIND
(``test_mind_learns``' world, briefly trained) is searched by the best of each user's
interests, as a direct computation over its exported embeddings says."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from test_dssm_learns import _config as dssm_config
from test_dssm_learns import _write_data as write_dssm_data
from test_mind_learns import CONFIG as MIND_CONFIG
from test_mind_learns import ITEMS as MIND_ITEMS
from test_mind_learns import _rows as mind_rows

from hashrec.checkpoint import latest_checkpoint
from hashrec.config import parse_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.tools.hitrate import main


def _export_and_embed(config, tmp_path, users: pa.Table, user_columns: tuple[str, ...],
                      items: int) -> None:
    """Exports the trained model; writes user.parquet (the user tower's predictions of
    ``users``) and item.parquet (the item tower's of items 0 to ``items`` - 1)."""
    export = tmp_path / "export"
    export_model(config, str(export), latest_checkpoint(str(tmp_path / "model")))
    pq.write_table(users, tmp_path / "users.parquet")
    predict(str(export / "user"), str(tmp_path / "users.parquet"),
            str(tmp_path / "user.parquet"), reserved_columns=user_columns)
    pq.write_table(pa.table({"adgroup_id": list(range(items))}), tmp_path / "items.parquet")
    predict(str(export / "item"), str(tmp_path / "items.parquet"),
            str(tmp_path / "item.parquet"), reserved_columns=("adgroup_id",))


def _hitrate(tmp_path, top_k: int, *flags: str) -> str:
    code = main(["--user_gt_input", str(tmp_path / "user.parquet"),
                 "--item_embedding_input", str(tmp_path / "item.parquet"),
                 "--item_id_field", "adgroup_id", "--top_k", str(top_k),
                 "--hitrate_details_output", str(tmp_path / "details.parquet"),
                 "--device", "cpu", *flags])
    assert code == 0
    return str(tmp_path / "details.parquet")


def test_dssm_towers_retrieve_the_planted_users_items_far_above_chance(tmp_path, capsys):
    write_dssm_data(tmp_path)
    config = parse_pipeline_config(dssm_config(tmp_path, "in_batch_negative: true", 6))
    from hashrec.train import train_and_evaluate
    train_and_evaluate(config)
    # one row a user: its evaluation clicks are its ground truth
    clicks = pq.read_table(tmp_path / "eval.parquet").group_by("user_id").aggregate(
        [("adgroup_id", "list")]).rename_columns(["user_id", "gt_items"])
    _export_and_embed(config, tmp_path, clicks, ("user_id", "gt_items"), 96)
    details = pq.read_table(_hitrate(tmp_path, 5, "--request_id_field", "user_id"))
    assert details.num_rows == clicks.num_rows
    assert details["user_id"].to_pylist() == clicks["user_id"].to_pylist()
    printed = re.search(r"hitrate@5: ([0-9.]+) \((\d+) of (\d+) ground-truth items",
                        capsys.readouterr().out)
    rate, hits, truth = float(printed[1]), int(printed[2]), int(printed[3])
    assert truth == sum(len(set(g)) for g in clicks["gt_items"].to_pylist())
    assert hits == sum(len(h) for h in details["hit_ids"].to_pylist())
    # Random top 5 of 96 items hit 5/96 (0.05) of the clicked items; a user's group holds
    # 12 items, so a model that learned the affinity hits about 5/12 of them.
    assert rate > 0.3, rate
    groups = [user % 8 for user in details["user_id"].to_pylist()]
    in_group = [all(i % 8 == g for i in ids) for ids, g in
                zip(details["topk_ids"].to_pylist(), groups, strict=True)]
    assert sum(in_group) > 0.8 * len(in_group)


def test_mind_towers_are_searched_by_the_best_of_each_users_interests(tmp_path, capsys):
    pq.write_table(mind_rows(256, 0), tmp_path / "train.parquet")
    pq.write_table(mind_rows(64, 1), tmp_path / "eval.parquet")
    config = parse_pipeline_config(MIND_CONFIG.format(tmp=tmp_path, items=MIND_ITEMS)
                                   .replace("num_epochs: 5", "num_epochs: 1"))
    from hashrec.train import train_and_evaluate
    train_and_evaluate(config)
    users = pq.read_table(tmp_path / "eval.parquet",
                          columns=["user_id", "click_seq__adgroup_id", "adgroup_id"])
    _export_and_embed(config, tmp_path, users, ("adgroup_id",), MIND_ITEMS)
    details = pq.read_table(_hitrate(tmp_path, 10, "--gt_items_field", "adgroup_id"))
    interests = torch.tensor(pq.read_table(tmp_path / "user.parquet")["user_tower_emb"]
                             .to_pylist())
    items = torch.tensor(pq.read_table(tmp_path / "item.parquet")["item_tower_emb"]
                         .to_pylist())
    assert interests.shape == (64, 3, 8) and items.shape == (MIND_ITEMS, 8)
    assert (interests.norm(dim=-1) == 0).any()  # users of fewer interests than 3
    scores = torch.einsum("bkd,nd->bkn", interests, items).masked_fill(
        (interests == 0).all(-1, keepdim=True), float("-inf")).amax(1)
    best = scores.topk(10, dim=1)
    # the item ids are the rows 0..95 of the item table
    assert details["topk_ids"].to_pylist() == best.indices.tolist()
    torch.testing.assert_close(torch.tensor(details["topk_dists"].to_pylist()), best.values)
    hits = (best.indices == torch.tensor(users["adgroup_id"].to_pylist())[:, None]).any(1)
    assert details["hitrate"].to_pylist() == hits.double().tolist()
    assert f"hitrate@10: {hits.double().mean():.4f} ({int(hits.sum())} of 64" \
        in capsys.readouterr().out
