import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hashrec.tools import taobao_world
from hashrec.tools.gen_taobao_data import (
    COLUMNS,
    ITEM_ATTR_DELIMITER,
    ITEM_ATTR_FIELDS,
    generate,
    main,
)

SCALE = 0.002
SMALL_BUCKETS = {"cms_segid": 98, "cms_group_id": 14, "final_gender_code": 3, "age_level": 8,
                 "pvalue_level": 5, "shopping_level": 5, "occupation": 3,
                 "new_user_class_level": 6}
SEQ = ("click_50_seq__adgroup_id", "click_50_seq__cate_id", "click_50_seq__brand")


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    paths = generate(str(out), num_rows=60_000, num_files=3, seed=1, scale=SCALE,
                     eval_rows=20_000, row_group_size=8192, quiet=True)
    return {k: pq.read_table(v) for k, v in paths.items()}, paths


def _ids(strings: pa.ChunkedArray) -> list[list[int]]:
    return [[int(x) for x in s.split("|")] if s else [] for s in strings.to_pylist()]


def _auc(score: np.ndarray, label: np.ndarray) -> float:
    rank = np.argsort(np.argsort(score, kind="stable")) + 1
    pos = label.sum()
    return float((rank[label == 1].sum() - pos * (pos + 1) / 2) / (pos * (label.size - pos)))


def test_schema_is_exactly_the_taobao_columns(splits):
    tables, paths = splits
    assert [len(paths["train"]), len(paths["eval"])] == [3, 1]
    assert tables["train"].num_rows == 60_000 and tables["eval"].num_rows == 20_000
    schema = tables["train"].schema
    assert schema.names == list(COLUMNS)
    for name in COLUMNS:
        want = {"price": pa.float64()}.get(name, pa.string() if name == "pid"
                                           or name in SEQ else pa.int64())
        assert schema.field(name).type == want, name


def test_ids_fit_their_spaces(splits):
    table = pa.concat_tables(splits[0].values())
    spaces = taobao_world.space_sizes(SCALE)
    for name, size in spaces.items():
        col = table.column(name).to_numpy()
        assert col.min() >= 1 and col.max() < size, name
    for name, buckets in SMALL_BUCKETS.items():
        col = table.column(name).to_numpy()
        assert col.min() >= 0 and col.max() < buckets, name
    assert set(table.column("final_gender_code").to_pylist()) == {1, 2}
    assert set(table.column("pid").to_pylist()) == set(taobao_world.PIDS)
    assert set(table.column("clk").to_pylist()) == {0, 1}
    assert table.column("price").to_numpy().min() > 0


def test_each_adgroup_has_one_cate_campaign_customer_brand_and_price(splits):
    table = splits[0]["train"]
    ad = table.column("adgroup_id").to_numpy()
    for name in ("cate_id", "campaign_id", "customer", "brand", "price"):
        col = table.column(name).to_numpy()
        pairs = np.unique(np.stack([ad, col.view(np.int64)]), axis=1)
        assert pairs.shape[1] == np.unique(ad).size, name


def test_item_popularity_is_heavy_tailed(splits):
    counts = np.sort(np.bincount(splits[0]["train"].column("adgroup_id").to_numpy()))[::-1]
    top = counts[: counts.size // 100].sum()
    assert top > 0.2 * counts.sum()


def test_sequences_are_each_users_own_click_history(splits):
    table = pa.concat_tables([splits[0]["train"], splits[0]["eval"]])
    seqs = {name: _ids(table.column(name)) for name in SEQ}
    lengths = np.array([len(s) for s in seqs[SEQ[0]]])
    assert lengths.max() <= 50 and (lengths == 0).any() and (lengths > 5).any()
    ad = table.column("adgroup_id").to_numpy()
    item_of = {}
    for name in ("cate_id", "brand"):
        item_of[name] = dict(zip(ad.tolist(), table.column(name).to_pylist()))
    for row in range(0, table.num_rows, 97):  # history items map to their cate and brand
        for i, a in enumerate(seqs[SEQ[0]][row]):
            if a in item_of["cate_id"]:
                assert seqs[SEQ[1]][row][i] == item_of["cate_id"][a]
                assert seqs[SEQ[2]][row][i] == item_of["brand"][a]
    users, clk = table.column("user_id").to_pylist(), table.column("clk").to_pylist()
    latest_click, first_row, checked = {}, {}, 0
    for row, (user, click) in enumerate(zip(users, clk)):
        seq = seqs[SEQ[0]][row]
        if user in latest_click:  # the newest entry is the user's latest earlier click
            assert seq[0] == latest_click[user]
            checked += 1
        elif user in first_row:  # no click yet in the window: only the earlier history
            assert seq == seqs[SEQ[0]][first_row[user]]
        first_row.setdefault(user, row)
        if click:
            latest_click[user] = int(ad[row])
    assert checked > 100


def test_labels_carry_item_signal_that_hash_collisions_destroy(splits):
    train, evaluation = splits[0]["train"], splits[0]["eval"]
    y_train, y_eval = train.column("clk").to_numpy(), evaluation.column("clk").to_numpy()
    assert 0.02 < y_train.mean() < 0.2
    prior = y_train.mean()

    def item_ctr_auc(buckets: int) -> float:
        key = train.column("adgroup_id").to_numpy() % buckets
        clicks = np.bincount(key, y_train, buckets)
        shows = np.bincount(key, minlength=buckets)
        ctr = (clicks + 20 * prior) / (shows + 20)
        return _auc(ctr[evaluation.column("adgroup_id").to_numpy() % buckets], y_eval)

    full = item_ctr_auc(taobao_world.space_sizes(SCALE)["adgroup_id"])
    assert full > 0.6
    assert item_ctr_auc(16) < full - 0.05


def test_planted_model_separates_clicks():
    rng = np.random.default_rng(0)
    spaces = taobao_world.space_sizes(SCALE)
    catalog = taobao_world.build_catalog(rng, spaces)
    users = taobao_world.build_users(rng, spaces)
    imp = taobao_world.simulate(rng, users, catalog, 30_000)
    score = (catalog.bias[imp.rank] + users.bias[imp.user]
             + taobao_world.affinity(users, catalog, imp.user, imp.rank))
    assert _auc(score, imp.clk) > 0.75


def test_same_seed_same_files_other_seed_other_rows(tmp_path):
    def run(name, seed):
        generate(str(tmp_path / name), 3000, seed=seed, scale=SCALE, quiet=True)
        return pq.read_table(tmp_path / name)

    first = run("a", 5)
    assert first.equals(run("b", 5))
    assert not first.equals(run("c", 6))


def test_command_line_writes_files_and_replaces_its_own_earlier_output(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--output_dir", str(out), "--num_rows", "500", "--num_files", "3",
                 "--scale", "0.001"]) == 0
    err = capsys.readouterr().err
    assert "wrote" in err
    assert "built catalog and users; simulating 500 impressions\n" in err  # before it runs
    assert sorted(p.name for p in out.iterdir()) == [
        "_gen_taobao_data.json", "part-00000.parquet", "part-00001.parquet",
        "part-00002.parquet"]
    assert main(["--output_dir", str(out), "--num_rows", "500", "--scale", "0.001",
                 "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["_gen_taobao_data.json",
                                                     "part-00000.parquet"]
    assert pq.read_table(out).num_rows == 500


def _foreign_parts(directory) -> dict[str, bytes]:
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"x": [1, 2]}), directory / "part-00000.parquet")
    (directory / "keep.txt").write_text("mine")
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.mark.parametrize("eval_rows", ["0", "100"], ids=["one-dir", "train-eval"])
def test_directory_with_other_files_is_refused_unless_overwrite(tmp_path, capsys, eval_rows):
    out = tmp_path / "out"
    target = out / "train" if eval_rows != "0" else out
    before = _foreign_parts(target)
    args = ["--output_dir", str(out), "--num_rows", "500", "--eval_rows", eval_rows,
            "--scale", "0.001", "--quiet"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"{target} is not empty (it holds keep.txt, part-00000.parquet)" in err
    assert "--overwrite" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert not (out / "eval").exists()
    assert main(args + ["--overwrite"]) == 0
    assert (target / "keep.txt").read_text() == "mine"
    assert pq.read_table(target / "part-00000.parquet").num_rows == 500


def test_output_dir_that_is_a_file_is_one_error_line(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("mine")
    for extra in ([], ["--eval_rows", "10"]):
        assert main(["--output_dir", str(target), "--num_rows", "50", *extra]) == 1
        assert capsys.readouterr().err == (f"gen_taobao_data: error: {target} is a file; "
                                           f"--output_dir must name a directory\n")
    assert target.read_text() == "mine"


def test_row_counts_accept_whole_numbers_in_e_notation(tmp_path):
    assert main(["--output_dir", str(tmp_path / "o"), "--num_rows", "1e3", "--eval_rows",
                 "2E2", "--scale", "0.001", "--quiet"]) == 0
    assert pq.read_table(tmp_path / "o" / "train").num_rows == 1000
    assert pq.read_table(tmp_path / "o" / "eval").num_rows == 200


@pytest.mark.parametrize("args, message", [
    (["--num_rows", "0"], "--num_rows: must be >= 1, got 0"),
    (["--num_rows", "2.5"], "--num_rows: expected a whole number, got 2.5"),
    (["--num_rows", "many"], "--num_rows: expected a whole number such as 100000 or 1e5"),
    (["--num_rows", "5", "--scale", "-1"], "--scale: must be > 0, got -1"),
    (["--num_rows", "5", "--scale", "x"], "--scale: expected a number, got 'x'"),
    (["--num_rows", "5", "--eval_rows", "-2"], "--eval_rows: must be >= 0, got -2"),
    (["--num_rows", "5", "--seed", "-1"], "--seed: must be >= 0, got -1"),
    (["--num_rows", "5", "--item_table"], "--item_table needs --eval_rows"),
], ids=["zero-rows", "fractional-rows", "word-rows", "negative-scale", "word-scale",
        "negative-eval-rows", "negative-seed", "item-table-without-eval"])
def test_command_line_rejects_bad_arguments(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit):
        main(["--output_dir", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m hashrec.tools.gen_taobao_data ")
    assert message in err


def test_list_sequences_give_the_same_batches_as_joined_strings(tmp_path):
    import os

    from hashrec.config import load_pipeline_config
    from hashrec.data import create_dataloader
    from hashrec.features import build_feature_set

    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    pipeline = load_pipeline_config(os.path.join(examples, "multi_tower_din_taobao.config"))
    features = build_feature_set(pipeline)
    batches = {}
    for fmt in ("string", "list"):
        generate(str(tmp_path / fmt), num_rows=700, seed=3, scale=0.01, quiet=True,
                 sequence_format=fmt)
        schema = pq.read_schema(next((tmp_path / fmt).glob("*.parquet")))
        assert pa.types.is_list(schema.field("click_50_seq__brand").type) == (fmt == "list")
        loader = create_dataloader(pipeline.data_config, features, str(tmp_path / fmt),
                                   "train", batch_size=256, num_workers=0)
        batches[fmt] = [(b.sparse.values().tolist(), b.sparse.lengths().tolist())
                        for b in loader]
    assert batches["list"] == batches["string"]
    with pytest.raises(ValueError, match="sequence_format='csv'"):
        generate(str(tmp_path / "bad"), num_rows=10, quiet=True, sequence_format="csv")


def test_buy_converts_only_clicked_rows_more_for_cheap_items_and_keen_users(splits):
    table = pa.concat_tables(splits[0].values())
    clk, buy = table.column("clk").to_numpy(), table.column("buy").to_numpy()
    assert set(np.unique(buy).tolist()) == {0, 1} and not buy[clk == 0].any()
    clicked = clk == 1
    assert 0.04 < buy[clicked].mean() < 0.2
    cheap = -np.log1p(table.column("price").to_numpy()[clicked])
    keen = sum(table.column(name).to_numpy()[clicked]
               for name in ("shopping_level", "pvalue_level"))
    assert _auc(cheap, buy[clicked]) > 0.6
    assert _auc(keen, buy[clicked]) > 0.58


def test_adding_buy_left_the_other_columns_as_they_were(tmp_path):
    """The digest was taken from the generator before it wrote ``buy``: conversions come
    from a generator of their own, drawn after everything else."""
    import hashlib

    generate(str(tmp_path / "d"), 3000, seed=5, scale=SCALE, quiet=True)
    table = pq.read_table(tmp_path / "d")
    assert table.column_names[-1] == "buy"
    digest = hashlib.sha256()
    for name in table.column_names[:-1]:
        digest.update(repr(table.column(name).to_pylist()).encode())
    assert (table.column("clk").to_numpy().sum(), digest.hexdigest()[:16]) == (
        204, "896df3e2aefb0ffc")


def test_the_mmoe_example_learns_clicks_and_conversions(tmp_path):
    import json
    import os

    from hashrec import train_eval

    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                           "mmoe_taobao_dynamicemb.config")
    data = tmp_path / "data"
    generate(str(data), 40_000, seed=2, scale=SCALE, eval_rows=10_000, quiet=True)
    edits = {"data_config.batch_size": 1024, "data_config.num_workers": 0,
             "train_config.num_epochs": 2}
    assert train_eval.main([
        "--pipeline_config_path", example, "--model_dir", str(tmp_path / "model"),
        "--train_input_path", str(data / "train"), "--eval_input_path", str(data / "eval"),
        "--edit_config_json", json.dumps(edits)]) == 0
    with open(tmp_path / "model" / "eval_result.txt", encoding="utf-8") as f:
        result = json.loads(f.read().splitlines()[-1])
    assert result["num_examples"] == 10_000 and "auc" not in result
    assert result["auc_ctr"] > 0.6 and result["auc_cvr"] > 0.6


def test_the_mmoe_example_trains_conversions_on_clicked_rows(tmp_path):
    """The cvr tower in the click space (``task_space_indicator_label: "clk"``,
    ``out_task_space_weight: 0``): train_eval runs, and both tasks still learn (their
    AUCs over every evaluated row)."""
    import json
    import os

    from hashrec import train_eval

    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                           "mmoe_taobao_dynamicemb.config")
    data = tmp_path / "data"
    generate(str(data), 40_000, seed=2, scale=SCALE, eval_rows=10_000, quiet=True)
    cvr = "model_config.mmoe.task_towers[1]"
    edits = {"data_config.batch_size": 1024, "data_config.num_workers": 0,
             "train_config.num_epochs": 2, f"{cvr}.task_space_indicator_label": "clk",
             f"{cvr}.out_task_space_weight": 0}
    assert train_eval.main([
        "--pipeline_config_path", example, "--model_dir", str(tmp_path / "model"),
        "--train_input_path", str(data / "train"), "--eval_input_path", str(data / "eval"),
        "--edit_config_json", json.dumps(edits)]) == 0
    with open(tmp_path / "model" / "pipeline.config", encoding="utf-8") as f:
        assert 'task_space_indicator_label: "clk"' in f.read()
    with open(tmp_path / "model" / "eval_result.txt", encoding="utf-8") as f:
        result = json.loads(f.read().splitlines()[-1])
    assert result["num_examples"] == 10_000
    assert result["auc_ctr"] > 0.55 and result["auc_cvr"] > 0.6


def _sampler_config(input_path: str):
    from hashrec.config import data_pb2

    return data_pb2.NegativeSampler(input_path=input_path, num_sample=256,
                                    attr_fields=list(ITEM_ATTR_FIELDS),
                                    item_id_field="adgroup_id",
                                    attr_delimiter=ITEM_ATTR_DELIMITER)


def test_the_item_table_round_trips_through_the_negative_sampler(tmp_path):
    """Every ad group once, weighted by how often it is shown; the sampler's rows carry the
    item columns exactly as the impressions hold them."""
    from hashrec.data.sampler import NegativeSampler

    paths = generate(str(tmp_path / "d"), 6000, seed=3, scale=SCALE, eval_rows=500,
                     quiet=True, item_table=True)
    assert paths["items"] == [str(tmp_path / "d" / "items" / "part-00000.parquet")]
    items = pq.read_table(tmp_path / "d" / "items")
    assert items.column_names == ["id", "weight", "attrs", *ITEM_ATTR_FIELDS]
    assert items.num_rows == taobao_world.space_sizes(SCALE)["adgroup_id"] - 1
    assert len(set(items.column("id").to_pylist())) == items.num_rows
    assert items.column("weight").to_numpy().sum() == pytest.approx(1.0)
    train = pq.read_table(tmp_path / "d" / "train")
    seen = {row[0]: row for row in zip(*(train.column(f).to_pylist()
                                         for f in ITEM_ATTR_FIELDS))}
    assert set(seen) <= set(items.column("id").to_pylist())
    shown = np.bincount(train.column("adgroup_id").to_numpy())
    heaviest = items.column("id")[int(np.argmax(items.column("weight").to_numpy()))].as_py()
    assert heaviest == int(np.argmax(shown))

    sampler = NegativeSampler(_sampler_config(str(tmp_path / "d" / "items")))
    batch = train.slice(0, 64)
    negatives = sampler.sample(batch, np.random.default_rng(0))
    assert negatives.schema == batch.schema and negatives.num_rows == 256
    assert negatives.column("user_id").null_count == 256  # user side left empty
    by_id = {row[0]: row for row in zip(*(items.column(f).to_pylist()
                                          for f in ITEM_ATTR_FIELDS))}
    drawn = list(zip(*(negatives.column(f).to_pylist() for f in ITEM_ATTR_FIELDS)))
    assert all(row == by_id[row[0]] for row in drawn)
    assert sum(row[0] in seen for row in drawn) > 128  # mostly items the rows show
    assert [row for row in drawn if row[0] in seen] == \
        [seen[row[0]] for row in drawn if row[0] in seen]


def test_the_item_table_leaves_the_impressions_as_they_were(tmp_path):
    generate(str(tmp_path / "plain"), 2000, seed=6, scale=SCALE, eval_rows=300, quiet=True)
    generate(str(tmp_path / "items"), 2000, seed=6, scale=SCALE, eval_rows=300, quiet=True,
             item_table=True)
    for split in ("train", "eval"):
        assert pq.read_table(tmp_path / "items" / split).equals(
            pq.read_table(tmp_path / "plain" / split))
    assert not (tmp_path / "plain" / "items").exists()


def test_a_rerun_replaces_or_removes_the_earlier_item_table(tmp_path, capsys):
    out = tmp_path / "d"
    args = ["--output_dir", str(out), "--num_rows", "500", "--eval_rows", "100",
            "--scale", "0.001"]
    assert main([*args, "--item_table", "--seed", "1"]) == 0
    first = pq.read_table(out / "items")
    assert main([*args, "--item_table", "--seed", "2"]) == 0
    assert not pq.read_table(out / "items").equals(first)
    capsys.readouterr()
    assert main(args) == 0  # without --item_table: the earlier table no longer fits
    assert not (out / "items").exists()
    assert "removed the earlier run's item table" in capsys.readouterr().err
    assert main([*args, "--item_table"]) == 0
    # a run without --eval_rows writes into the directory itself: the item table goes too
    assert main(args[:4] + ["--scale", "0.001", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["_gen_taobao_data.json",
                                                     "part-00000.parquet"]


def test_an_item_folder_holding_other_files_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "d"
    before = _foreign_parts(out / "items")
    args = ["--output_dir", str(out), "--num_rows", "500", "--eval_rows", "100",
            "--scale", "0.001", "--quiet", "--item_table"]
    assert main(args) == 1
    assert f"{out / 'items'} is not empty" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (out / "items").iterdir()} == before
    assert not (out / "train").exists()
    assert main(args[:-1]) == 0  # without --item_table a folder of other files stays
    assert {p.name: p.read_bytes() for p in (out / "items").iterdir()} == before
    assert main(args + ["--overwrite"]) == 0
    assert (out / "items" / "keep.txt").read_text() == "mine"
