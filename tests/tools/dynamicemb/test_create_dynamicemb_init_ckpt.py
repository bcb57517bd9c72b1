"""create_dynamicemb_init_ckpt: init tables -> sharded checkpoint -> fine-tune start."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from migration_helpers import (
    DIM,
    batch_of,
    dynamicemb_block,
    session_of,
    write_config,
    write_data,
)

from hashrec.checkpoint import CheckpointError, restore_checkpoint
from hashrec.config import load_pipeline_config
from hashrec.features.bucketize import raw_int64_ids
from hashrec.features.tokens import Bags
from hashrec.tools.dynamicemb.create_dynamicemb_init_ckpt import create_init_checkpoint, main
from hashrec.tools.dynamicemb.errors import MigrationError
from hashrec.tools.dynamicemb.init_table import InitTableReport, read_init_table
from hashrec.train.checkpoints import restore_for_training

ITEMS = np.arange(5000, 5040, dtype=np.int64)


def _embeddings(n: int = len(ITEMS), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)


def _write_init(path: str, ids, embeddings, as_string: bool = False, sep: str = ",") -> str:
    column = [sep.join(f"{v:.9g}" for v in row) for row in embeddings] if as_string \
        else [list(map(float, row)) for row in embeddings]
    if path.endswith(".csv"):
        with open(path, "w", encoding="utf-8") as f:
            f.write("id,emb\n")
            for key, text in zip(ids, column):
                f.write(f'{key},"{text}"\n')
    else:
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "emb": column}), path)
    return path


def _lookup(config: str, checkpoint: str, items, feature: str = "item_id") -> torch.Tensor:
    session = session_of(config)
    restore_for_training(str(checkpoint) + "-unused", session.model, session.dense, False,
                         checkpoint)
    session.model.eval()
    batch = batch_of(session, [1000] * len(items), items)
    with torch.no_grad():
        return session.model.embedding(batch.sparse).pooled[feature]


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("fmt", ["parquet-list", "csv-string"])
def test_fine_tune_start_reads_init_table_rows(tmp_path, world_size, fmt):
    ext, as_string = (".csv", True) if fmt == "csv-string" else (".parquet", False)
    emb = _embeddings()
    init = _write_init(str(tmp_path / f"init{ext}"), ITEMS, emb, as_string)
    # user_id and item_id share a DEEP group and options: fused into one storage.
    config = write_config(str(tmp_path / "c.config"), dynamicemb_block(),
                          dynamicemb_block(init))
    path = str(tmp_path / "init")
    assert main(["--pipeline_config_path", config, "--world_size", str(world_size),
                 "--save_dir", path]) == 0
    ckpt = os.path.join(path, "model.ckpt-0")
    with open(os.path.join(ckpt, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    assert meta["world_size"] == world_size
    assert sorted(meta["tables"]) == ["deep"]
    assert len(meta["tables"]["deep"]["shards"]) == world_size
    assert meta["tables"]["deep"]["num_rows"] == len(ITEMS)
    looked_up = _lookup(config, ckpt, ITEMS)
    np.testing.assert_allclose(looked_up.numpy(), emb, rtol=1e-6)


def test_rows_are_written_in_the_tables_data_type(tmp_path):
    emb = _embeddings()
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, emb)
    config = write_config(str(tmp_path / "c.config"), dynamicemb_block(),
                          dynamicemb_block(init) + ' data_type: "FP16"')
    ckpt, _ = create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    with open(os.path.join(ckpt, "meta.json"), encoding="utf-8") as f:
        tables = json.load(f)["tables"]
    assert {name: t["dtype"] for name, t in tables.items()} == {
        "user_id": "float32", "item_id": "float16"}
    looked_up = _lookup(config, ckpt, ITEMS)
    assert torch.equal(looked_up, torch.from_numpy(emb).half().float())


def test_rows_hold_optimizer_initial_state_and_lfu_scores(tmp_path):
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, _embeddings())
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(init))
    ckpt, _ = create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    session = session_of(config)
    tables = session.model.embedding.dynamic_tables()
    restore_checkpoint(ckpt, session.model, None, tables)
    keys, _, rows, scores = next(tables["item_id"].export_state(1000))
    assert sorted(keys.tolist()) == ITEMS.tolist()
    assert torch.all(rows[:, DIM:] == 0)  # Adagrad accumulators start at 0
    assert torch.all(scores == 1)


UNREAD = "dynamicemb.init_table of feature 'item_id' is not read by training"


def test_training_from_the_init_checkpoint_moves_the_rows(tmp_path, caplog):
    emb = _embeddings()
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, emb)
    data = write_data(str(tmp_path / "data" / "train.parquet"), rows=128)
    config = write_config(str(tmp_path / "c.config"), dynamicemb_block(),
                          dynamicemb_block(init), str(tmp_path / "m"), os.path.dirname(data))
    ckpt, _ = create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    from hashrec.train import train_and_evaluate

    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        train_and_evaluate(load_pipeline_config(config), fine_tune_checkpoint=ckpt)
    assert UNREAD not in caplog.text  # the run starts from it
    trained = _lookup(config, str(tmp_path / "m"), ITEMS)
    seen = np.isin(ITEMS, pq.read_table(data).column("item_id").to_numpy())
    assert seen.any()
    assert not np.allclose(trained.numpy()[seen], emb[seen])
    np.testing.assert_allclose(trained.numpy()[~seen], emb[~seen], rtol=1e-6)


def test_training_without_the_init_checkpoint_says_how_to_use_init_table(tmp_path, caplog):
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, _embeddings())
    data = write_data(str(tmp_path / "data" / "train.parquet"), rows=64)
    config = write_config(str(tmp_path / "c.config"), dynamicemb_block(),
                          dynamicemb_block(init), str(tmp_path / "m"), os.path.dirname(data))
    from hashrec.train import train_and_evaluate

    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        train_and_evaluate(load_pipeline_config(config))
    warnings = [r.getMessage() for r in caplog.records if UNREAD in r.getMessage()]
    assert len(warnings) == 1
    assert "create_dynamicemb_init_ckpt" in warnings[0]
    assert "--fine_tune_checkpoint <dir>/model.ckpt-0" in warnings[0]


def test_duplicates_and_bad_rows_are_counted_and_reported(tmp_path, caplog):
    emb = _embeddings(6)
    ids = [7, 8, 7, 9, 10, 11]
    rows = [",".join(str(v) for v in r) for r in emb]
    rows[3] = "0.1,abc,0.3,0.4"
    rows[4] = "nan,0,0,0"
    table = pa.table({"id": pa.array(ids, pa.int64()), "emb": rows})
    table = table.set_column(0, "id", pa.array([7, 8, 7, 9, 10, None], pa.int64()))
    pq.write_table(table, tmp_path / "init.parquet")
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(str(tmp_path / "init.parquet")))
    _, reports = create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    report = reports["item_id"]
    assert (report.rows_read, report.rows_kept, report.duplicates, report.bad_rows) == \
        (6, 2, 1, 3)
    text = "\n".join(report.examples)
    assert "row 2: duplicate id 7" in text
    assert "row 3: null or unparseable embedding" in text
    assert "row 4: NaN or inf value" in text
    assert "row 5: null id" in text
    assert "3 bad rows skipped" in caplog.text
    with open(tmp_path / "s" / "model.ckpt-0" / "meta.json", encoding="utf-8") as f:
        assert json.load(f)["extra"]["init_tables"]["item_id"]["duplicates"] == 1
    looked_up = _lookup(config, str(tmp_path / "s" / "model.ckpt-0"), [7, 8])
    np.testing.assert_allclose(looked_up.numpy(), emb[:2], rtol=1e-6)


def test_wrong_dim_names_table_file_and_row(tmp_path):
    emb = _embeddings(3)
    path = _write_init(str(tmp_path / "init.parquet"), [1, 2, 3], emb)
    bad = pa.table({"id": pa.array([4, 5], pa.int64()), "emb": [[0.0] * DIM, [0.0] * (DIM + 1)]})
    pq.write_table(bad, tmp_path / "more.parquet")
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(f"{path},{tmp_path / 'more.parquet'}"))
    with pytest.raises(MigrationError, match=r"'item_id'.*more.parquet row 1: embedding has "
                                             r"5 values.*embedding_dim is 4"):
        create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    assert not os.path.exists(tmp_path / "s" / "model.ckpt-0")
    assert not os.path.exists(tmp_path / "s" / "model.ckpt-0.tmp")


def test_a_config_without_init_table_is_refused_before_the_model_is_built(tmp_path,
                                                                        monkeypatch):
    from hashrec.train import session

    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000", dynamicemb_block())
    monkeypatch.setattr(session, "build_session", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(MigrationError, match="no dynamicemb feature sets init_table"):
        create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))


def test_errors_without_init_table_existing_target_and_over_capacity(tmp_path):
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000", dynamicemb_block())
    with pytest.raises(MigrationError, match="no dynamicemb feature sets init_table"):
        create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, _embeddings())
    small = dynamicemb_block(init).replace("max_capacity: 1000", "max_capacity: 16")
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000", small)
    with pytest.raises(CheckpointError, match=r"at most 16 \(max_capacity 16 over 1 ranks"):
        create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    # max_capacity counts over all ranks: 4 ranks hold 4 rows each, not 16
    with pytest.raises(CheckpointError, match=r"at most 4 \(max_capacity 16 over 4 ranks"):
        create_init_checkpoint(load_pipeline_config(config), 4, str(tmp_path / "s"))
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(init).replace("max_capacity: 1000",
                                                         "max_capacity: 120"))
    create_init_checkpoint(load_pipeline_config(config), 4, str(tmp_path / "s"))
    with pytest.raises(CheckpointError, match="already exists"):
        create_init_checkpoint(load_pipeline_config(config), 4, str(tmp_path / "s"))


def test_embeddings_joined_by_another_separator_fail_and_name_it(tmp_path, capsys):
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, _embeddings(), True, sep=" ")
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(init))
    args = ["--pipeline_config_path", config, "--world_size", "1", "--save_dir",
            str(tmp_path / "s")]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: table 'item_id': init_table {init}: no row can be used: "
                          f"40 of its 40 rows are bad; an unparseable embedding reads '")
    assert err.endswith("it splits into 4 numbers on ' ': pass --separator ' '")
    assert os.listdir(tmp_path / "s") == []
    assert main(args + ["--separator", " "]) == 0
    assert os.path.isdir(tmp_path / "s" / "model.ckpt-0")


def test_a_config_that_is_not_utf8_is_one_error_naming_it(tmp_path, capsys):
    config = tmp_path / "c.config"
    config.write_bytes(b"\xff")
    assert main(["--pipeline_config_path", str(config), "--world_size", "1", "--save_dir",
                 str(tmp_path / "s")]) == 1
    assert capsys.readouterr().err == (f"error: cannot read pipeline config {config}: not "
                                       f"UTF-8 text (byte 0xff at offset 0); save it as UTF-8 "
                                       f"protobuf text format\n")
    assert not (tmp_path / "s").exists()


def test_mostly_bad_rows_warn_with_a_bad_value(tmp_path, caplog):
    emb = _embeddings(10)
    rows = [(";" if i < 6 else ",").join(f"{v:.3f}" for v in r) for i, r in enumerate(emb)]
    pq.write_table(pa.table({"id": pa.array(range(10), pa.int64()), "emb": rows}),
                   tmp_path / "init.parquet")
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(str(tmp_path / "init.parquet")))
    _, reports = create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    assert reports["item_id"].rows_kept == 4
    assert f"6 of its 10 rows are bad; an unparseable embedding reads {rows[0]!r}" in caplog.text
    assert "pass --separator ';'" in caplog.text


def test_empty_init_table_fails(tmp_path):
    pq.write_table(pa.table({"id": pa.array([], pa.int64()), "emb": pa.array([], pa.string())}),
                   tmp_path / "init.parquet")
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(str(tmp_path / "init.parquet")))
    with pytest.raises(MigrationError, match="init.parquet holds no rows"):
        create_init_checkpoint(load_pipeline_config(config), 1, str(tmp_path / "s"))
    assert not os.path.exists(tmp_path / "s" / "model.ckpt-0")


def test_save_dir_that_is_a_file_is_one_error_line(tmp_path, capsys):
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, _embeddings())
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(init))
    (tmp_path / "s").write_text("mine")
    assert main(["--pipeline_config_path", config, "--world_size", "1", "--save_dir",
                 str(tmp_path / "s")]) == 1
    assert capsys.readouterr().err == (f"error: --save_dir {str(tmp_path / 's')!r} is a file; "
                                       f"name a new or empty directory for the checkpoint\n")
    assert (tmp_path / "s").read_text() == "mine"


def test_tables_over_the_memory_budget_are_one_error_line(tmp_path, capsys, monkeypatch):
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, _embeddings())
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(init))
    monkeypatch.setenv("HASHREC_GPU_MEMORY_BYTES", "1000")
    monkeypatch.setenv("HASHREC_HOST_MEMORY_BYTES", "1000")
    assert main(["--pipeline_config_path", config, "--world_size", "1", "--save_dir",
                 str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: storage planning failed: PlannerError: the dynamic tables "
                          "do not fit") and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "s")


def test_a_start_under_torchrun_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, _embeddings())
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(init))
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc_per_node 2 sets it
    assert main(["--pipeline_config_path", config, "--world_size", "2", "--save_dir",
                 str(tmp_path / "s")]) == 2
    assert "started as 2 processes (WORLD_SIZE=2); run the tool as one process" in \
        capsys.readouterr().err
    assert not os.path.exists(tmp_path / "s")


@pytest.mark.parametrize("text,match", [
    ("", "cannot be read as csv"),
    ('id,emb\n1,"1,2,3,4"\n2,"1,2,3,4",9\n', "Expected 2 columns, got 3"),
    ('1,"1,2,3,4"\n2,"1,2,3,4"\n', "the first line '1,1,2,3,4' is a row, not a header"),
], ids=["empty-file", "extra-field", "no-header"])
def test_unreadable_csv_is_one_error_line_naming_table_and_file(tmp_path, capsys, text, match):
    good = _write_init(str(tmp_path / "a.csv"), ITEMS, _embeddings(), as_string=True)
    (tmp_path / "b.csv").write_text(text)
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(f"{good},{tmp_path / 'b.csv'}"))
    assert main(["--pipeline_config_path", config, "--world_size", "1", "--save_dir",
                 str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: table 'item_id': {tmp_path / 'b.csv'}: ")
    assert match in err and len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path / "s") == []


def test_csv_embeddings_of_one_value(tmp_path):
    path = tmp_path / "init.csv"
    path.write_text("id,emb\n3,0.5\n4,-2\n5,\n")
    report = InitTableReport("item_id")
    [(ids, embeddings, _)] = list(read_init_table(str(path), report, 1))
    assert ids.tolist() == [3, 4] and embeddings.tolist() == [[0.5], [-2.0]]
    assert (report.rows_read, report.bad_rows) == (3, 1)


def test_csv_ids_that_turn_to_text_past_the_first_block(tmp_path):
    # 600,000 integer ids (more than one 4 MiB block) then text ids: read as their keys
    path = tmp_path / "init.csv"
    with open(path, "w", encoding="utf-8") as f:
        f.write("id,emb\n" + "".join(f"{i},0.5\n" for i in range(600_000)) + "ab,1\n7x,2\n")
    report = InitTableReport("item_id")
    ids = np.concatenate([block[0] for block in read_init_table(str(path), report, 1)])
    text_ids = raw_int64_ids(Bags(pa.array(["ab", "7x"]), np.ones(2, dtype=np.int64)))
    assert ids[:600_000].tolist() == list(range(600_000))
    assert ids[600_000:].tolist() == text_ids.tolist()
    assert (report.rows_read, report.bad_rows) == (600_002, 0)


def test_init_tables_leave_out_the_table_of_a_feature_only_wide_groups_read(caplog):
    from hashrec.config import parse_pipeline_config
    from hashrec.features import build_feature_set
    from hashrec.tools.dynamicemb.create_dynamicemb_init_ckpt import init_tables_of

    features = "".join(
        f'feature_configs {{ id_feature {{ feature_name: "{name}" expression: "user:{name}" '
        f'embedding_dim: 8 dynamicemb {{ max_capacity: 64 init_table: "{name}.parquet" }} }} }}\n'
        for name in ("user_id", "item_id"))
    model = ('model_config { feature_groups { group_name: "wide" group_type: WIDE '
             'feature_names: ["user_id", "item_id"] } feature_groups { group_name: "deep" '
             'group_type: DEEP feature_names: ["user_id"] } '
             'wide_and_deep { deep { hidden_units: [4] } } }')
    feature_set = build_feature_set(parse_pipeline_config(f'model_dir: "m"\n{features}{model}'))
    # item_id has only its wide table (of another dimension than the init table's rows)
    with caplog.at_level("WARNING", logger="hashrec.tools"):
        assert init_tables_of(feature_set) == {"user_id": "user_id.parquet"}
    assert "table 'item_id': init_table item_id.parquet is not read" in caplog.text


def test_world_size_as_nnodes_times_nproc_is_multiplied(tmp_path, capsys):
    # The documented launch line passes $NNODES*$NPROC_PER_NODE, which a shell leaves as 2*2.
    init = _write_init(str(tmp_path / "init.parquet"), ITEMS, _embeddings())
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(init))
    args = ["--pipeline_config_path", config, "--save_dir", str(tmp_path / "s")]
    assert main(args + ["--world_size", "2*2"]) == 0
    with open(tmp_path / "s" / "model.ckpt-0" / "meta.json", encoding="utf-8") as f:
        assert json.load(f)["world_size"] == 4
    with pytest.raises(SystemExit) as info:
        main(args + ["--world_size", "2*x"])
    assert info.value.code == 2
    assert "invalid value '2*x'; allowed: an int, or a product of ints" in capsys.readouterr().err
