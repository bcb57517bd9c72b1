"""gen_criteo_data: columns, splits, determinism, missing values, where it may write."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from hashrec.tools.gen_criteo_data import COLUMNS, MARKER, generate, main, vocab_sizes


def test_splits_columns_and_rates(tmp_path):
    paths = generate(str(tmp_path / "d"), 6000, num_files=2, eval_rows=2000, seed=1,
                     quiet=True)
    assert [len(paths["train"]), len(paths["eval"])] == [2, 1]
    train = pq.read_table(paths["train"])
    assert train.num_rows == 6000 and tuple(train.column_names) == COLUMNS
    assert pq.read_table(paths["eval"]).num_rows == 2000
    assert 0.15 < np.mean(train.column("label").to_numpy()) < 0.4
    assert train.column("C3").null_count > 0 and train.column("C1").null_count == 0
    values = train.column("C3").drop_null().to_pylist()
    assert all(len(v) == 8 and int(v, 16) >= 0 for v in values[:50])
    counts = np.unique(values, return_counts=True)[1]
    assert counts.max() > 20 * np.median(counts)  # a few frequent values, many rare ones
    assert sorted(p.name for p in (tmp_path / "d" / "train").iterdir()) == [
        MARKER, "part-00000.parquet", "part-00001.parquet"]


def test_the_label_depends_on_the_planted_columns(tmp_path):
    (path,) = generate(str(tmp_path / "d"), 40000, seed=2, quiet=True)["data"]
    table = pq.read_table(path)
    label = table.column("label").to_numpy()
    c9 = table.column("C9").to_numpy(zero_copy_only=False)  # no effect: rates alike
    c1 = table.column("C1").to_numpy(zero_copy_only=False)  # planted effects
    frequent = [v for v, n in zip(*np.unique(c1, return_counts=True)) if n > 400]
    c1_rates = [label[c1 == v].mean() for v in frequent]
    c9_rates = [label[c9 == v].mean() for v in np.unique(c9)]
    assert max(c1_rates) - min(c1_rates) > 2 * (max(c9_rates) - min(c9_rates))


def test_same_seed_same_rows(tmp_path):
    a = pq.read_table(generate(str(tmp_path / "a"), 500, seed=3, quiet=True)["data"][0])
    b = pq.read_table(generate(str(tmp_path / "b"), 500, seed=3, quiet=True)["data"][0])
    c = pq.read_table(generate(str(tmp_path / "c"), 500, seed=4, quiet=True)["data"][0])
    assert a.equals(b) and not a.equals(c)


def test_vocabularies_scale_their_large_columns():
    small, full = vocab_sizes(0.01), vocab_sizes(1.0)
    assert full[2] == 10_000_000 and small[2] == 100_000 and small[8] == full[8] == 3


def test_a_foreign_directory_is_refused(tmp_path, capsys):
    out = tmp_path / "d"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["--output_dir", str(out), "--num_rows", "10", "--quiet"]) == 1
    assert "is not empty (it holds notes.txt)" in capsys.readouterr().err
    assert main(["--output_dir", str(out), "--num_rows", "10", "--quiet", "--overwrite"]) == 0
    assert (out / "notes.txt").exists() and (out / "part-00000.parquet").exists()
    with pytest.raises(SystemExit):
        main(["--output_dir", str(out), "--num_rows", "0"])


def test_the_dlrm_example_learns_the_generated_data(tmp_path):
    from hashrec.config import apply_edit_config_json, load_pipeline_config
    from hashrec.train import train_and_evaluate

    generate(str(tmp_path / "d"), 30000, eval_rows=5000, seed=5, quiet=True)
    config = apply_edit_config_json(
        load_pipeline_config("examples/dlrm_criteo_dynamicemb.config"),
        {"train_input_path": str(tmp_path / "d" / "train"),
         "eval_input_path": str(tmp_path / "d" / "eval"), "model_dir": str(tmp_path / "m"),
         "data_config.batch_size": 1024, "data_config.num_workers": 0,
         "train_config.num_epochs": 2})
    result = train_and_evaluate(config)
    assert result["num_examples"] == 5000 and result["auc"] > 0.6


def test_a_negative_seed_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--output_dir", str(tmp_path / "d"), "--num_rows", "10", "--seed", "-1"])
    assert stop.value.code == 2
    assert "argument --seed: must be >= 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_each_file_is_announced_before_its_rows_are_drawn(tmp_path, capsys):
    assert main(["--output_dir", str(tmp_path / "d"), "--num_rows", "300",
                 "--num_files", "2"]) == 0
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    first = str(tmp_path / "d" / "part-00000.parquet")
    assert lines[0] == f"generating {first} (150 rows)"
    assert lines[1].startswith(f"wrote {first} (150 rows, click rate ")
