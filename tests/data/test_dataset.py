import collections
import logging
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
from data_fakes import FakeFeatureSet, data_config, input_field, row_ids, write_parquet

from hashrec.config import load_pipeline_config, parse_pipeline_config
from hashrec.data import DataError, create_dataloader
from hashrec.features import build_feature_set
from hashrec.tools.gen_taobao_data import generate

SIZES = (23, 5, 41, 1)  # rows per file; row groups of 7
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                       "multi_tower_din_taobao.config")


@pytest.fixture
def files(tmp_path):
    paths, first = [], 0
    for i, n in enumerate(SIZES):
        paths.append(write_parquet(str(tmp_path / "in" / f"part-{i}.parquet"), first, n))
        first += n
    return str(tmp_path / "in")


def _read(files, mode="train", world_size=1, workers=0, **kwargs):
    cfg_keys = {"shuffle", "drop_remainder", "batch_size", "eval_batch_size", "dataset_type",
                "with_header", "shuffle_buffer_size"}
    cfg = data_config(num_workers=workers, **{k: v for k, v in kwargs.items() if k in cfg_keys})
    rest = {k: v for k, v in kwargs.items() if k not in cfg_keys}
    features = rest.pop("features", FakeFeatureSet(bags=["tags"]))
    return [list(create_dataloader(cfg, features, files, mode, rank=r, world_size=world_size,
                                   **rest))
            for r in range(world_size)]


@pytest.mark.parametrize("world_size,workers", [(1, 0), (2, 0), (3, 2), (1, 2)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_ranks_and_workers_read_every_row_exactly_once(files, world_size, workers, shuffle):
    per_rank = _read(files, world_size=world_size, workers=workers, shuffle=shuffle)
    ids = [i for batches in per_rank for i in row_ids(batches)]
    assert sorted(ids) == list(range(sum(SIZES)))
    # Ranks' shares are cut at whole batches (only one partial batch in all) and
    # differ by at most one batch.
    sizes = [b.batch_size for batches in per_rank for b in batches]
    assert sum(size < 4 for size in sizes) <= 1
    counts = [len(batches) for batches in per_rank]
    assert max(counts) - min(counts) <= 1


def test_ordered_single_reader_follows_file_order(files):
    (batches,) = _read(files)
    assert row_ids(batches) == list(range(sum(SIZES)))
    assert [b.batch_size for b in batches] == [4] * 17 + [2]


def test_batches_carry_labels_and_list_columns(files):
    (batches,) = _read(files, batch_size=5)
    b = batches[1]
    ids = b.sparse["row_id"].values.tolist()
    assert b.labels["clk"].tolist() == [float(i % 2) for i in ids]
    assert b.sparse["tags"].lengths.tolist() == [i % 3 for i in ids]


def test_shuffle_is_deterministic_per_seed_and_varies_by_epoch(files):
    run = lambda seed: row_ids(_read(files, shuffle=True, seed=seed, num_epochs=2)[0])  # noqa
    first = run(3)
    total = sum(SIZES)
    epoch0, epoch1 = first[:total], first[total:]
    assert sorted(epoch0) == sorted(epoch1) == list(range(total))
    assert epoch0 != list(range(total)) and epoch0 != epoch1
    assert first == run(3)
    assert first != run(4)


def test_shuffle_without_a_buffer_shuffles_row_groups_alone(files):
    """shuffle_buffer_size 0 (as in TorchEasyRec, no buffer): the row groups come in a new
    order each epoch, each one's rows in file order."""
    ids = row_ids(_read(files, shuffle=True, shuffle_buffer_size=0, seed=3, num_epochs=2)[0])
    total = sum(SIZES)
    epochs = [ids[:total], ids[total:]]
    starts = np.cumsum((0,) + SIZES[:-1])
    groups = [range(first + lo, first + min(lo + 7, n))  # row groups of 7 rows
              for first, n in zip(starts, SIZES) for lo in range(0, n, 7)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(total)) and epoch != list(range(total))
        at = {row: i for i, row in enumerate(epoch)}
        for group in groups:
            assert [at[row] for row in group] == list(range(at[group[0]],
                                                            at[group[0]] + len(group)))
    assert epochs[0] != epochs[1]


def test_shuffle_with_workers_is_deterministic(files):
    run = lambda: row_ids(_read(files, workers=2, shuffle=True, seed=5)[0])  # noqa: E731
    assert run() == run()


@pytest.mark.parametrize("world_size,workers", [(1, 0), (2, 2)], ids=str)
def test_drop_remainder_yields_only_full_batches(files, world_size, workers):
    per_rank = _read(files, world_size=world_size, workers=workers, drop_remainder=True)
    sizes = [b.batch_size for batches in per_rank for b in batches]
    assert sizes and set(sizes) == {4}
    ids = [i for batches in per_rank for i in row_ids(batches)]
    assert len(ids) == len(set(ids))
    # Each reader drops fewer than one batch.
    assert sum(SIZES) - len(ids) < 4 * world_size * max(workers, 1)


def test_eval_reads_everything_once_in_order_despite_train_settings(files):
    (batches,) = _read(files, mode="eval", shuffle=True, drop_remainder=True, batch_size=4,
                       eval_batch_size=10)
    assert row_ids(batches) == list(range(sum(SIZES)))
    assert [b.batch_size for b in batches] == [10] * 7


def _in_reader_order(loader) -> list:
    """The loader's batches of one pass, each reader's together, reader 0's first."""
    by_reader: dict[int, list] = {}
    for reader, batch in zip(loader.reader_turns(), loader, strict=True):
        by_reader.setdefault(reader, []).append(batch)
    return [b for reader in sorted(by_reader) for b in by_reader[reader]]


@pytest.mark.parametrize("world_size,workers", [(1, 0), (1, 2), (1, 3), (2, 2)], ids=str)
@pytest.mark.parametrize("batch_size", [3, 10, 63], ids=["batch3", "batch10", "batch63"])
def test_predict_readers_hold_the_rows_in_file_order(files, world_size, workers, batch_size):
    """Each reader (worker) reads a contiguous slice; the loader's batches taken by
    reader_turns and put in reader order are the rows in file order, rank 0's first."""
    cfg = data_config(num_workers=workers, eval_batch_size=batch_size)
    ids = []
    for rank in range(world_size):
        loader = create_dataloader(cfg, FakeFeatureSet(bags=["tags"]), files, "predict",
                                   rank=rank, world_size=world_size)
        batches = _in_reader_order(loader)
        ids += row_ids(batches)
        rows = loader.dataset.reader_rows(rank, workers)
        assert sum(rows) == sum(b.batch_size for b in batches)
        readers = loader.dataset.reader_batches(rank, workers)
        assert sum(readers) == len(batches) and max(readers) - min(readers) <= 1
    assert ids == list(range(sum(SIZES)))


def test_predict_in_file_order_reads_csv_like_parquet(files, tmp_path):
    for i, path in enumerate(sorted(os.listdir(files))):
        table = pq.read_table(os.path.join(files, path)).drop_columns(["tags"])
        pacsv.write_csv(table, tmp_path / f"part-{i}.csv")
    # Listed last file first: the listed order is the order.
    csv = ",".join(str(tmp_path / f"part-{i}.csv") for i in reversed(range(len(SIZES))))
    cfg = data_config(num_workers=2, eval_batch_size=3, dataset_type="CsvDataset",
                      with_header=True)
    loader = create_dataloader(cfg, FakeFeatureSet(), csv, "predict")
    starts = np.cumsum((0, *SIZES))
    assert row_ids(_in_reader_order(loader)) == [i for k in reversed(range(len(SIZES)))
                                                 for i in range(starts[k], starts[k + 1])]


def test_reader_turns_take_the_readers_in_turn_leaving_out_those_ended():
    from hashrec.data.loader import reader_turns

    assert list(reader_turns([2, 3, 1])) == [0, 1, 2, 0, 1, 1]
    assert list(reader_turns([0, 2, 0])) == [1, 1]
    assert list(reader_turns([])) == []


def test_eval_rejects_several_epochs(files):
    with pytest.raises(ValueError, match="num_epochs"):
        _read(files, mode="eval", num_epochs=2)


def test_num_epochs_repeats_every_row(files):
    (batches,) = _read(files, num_epochs=3)
    counts = collections.Counter(row_ids(batches))
    assert set(counts.values()) == {3} and len(counts) == sum(SIZES)


@pytest.mark.parametrize("world_size,workers", [(1, 0), (1, 3), (2, 2)], ids=lambda v: str(v))
@pytest.mark.parametrize("drop_remainder", [False, True], ids=["keep", "drop"])
def test_tagged_epochs_read_as_one_epoch_loaders(files, world_size, workers, drop_remainder):
    opts = dict(world_size=world_size, workers=workers, shuffle=True, batch_size=4,
                drop_remainder=drop_remainder)
    streams = _read(files, num_epochs=3, seed=5, tag_epochs=True, **opts)
    for rank, items in enumerate(streams):
        cfg = data_config(num_workers=workers, shuffle=True, batch_size=4,
                          drop_remainder=drop_remainder)
        loader = create_dataloader(cfg, FakeFeatureSet(bags=["tags"]), files, "train",
                                   rank=rank, world_size=world_size, seed=5, tag_epochs=True)
        readers = loader.dataset.reader_batches(rank, workers)
        per_epoch = max(readers) * max(workers, 1)
        assert [e for e, _ in items] == [e for e in (5, 6, 7) for _ in range(per_epoch)]
        for epoch in (5, 6, 7):
            got = [b for e, b in items if e == epoch and b is not None]
            want = _read(files, seed=epoch, **opts)[rank]
            assert row_ids(got) == row_ids(want) and len(got) == sum(readers)


def test_tagged_epochs_without_end(files):
    cfg = data_config(num_workers=0, batch_size=8)
    loader = create_dataloader(cfg, FakeFeatureSet(bags=["tags"]), files, "train",
                               num_epochs=None, tag_epochs=True)
    items = iter(loader)
    tags = [next(items)[0] for _ in range(40)]  # 9 batches per epoch
    assert tags == sorted(tags) and tags[-1] == 4


def test_untagged_reading_needs_a_number_of_epochs(files):
    with pytest.raises(ValueError, match="num_epochs"):
        _read(files, num_epochs=None)


@pytest.mark.parametrize("workers", [0, 1], ids=["main", "worker"])
def test_predict_passes_reserved_columns_through_without_labels(tmp_path, workers):
    table = pa.table({"row_id": [1, 2, 3], "request": ["a", "b", "c"]})
    pq.write_table(table, tmp_path / "p.parquet")
    (batches,) = _read(str(tmp_path / "p.parquet"), mode="predict", batch_size=2,
                       reserved_columns=("request", "row_id"), features=FakeFeatureSet(),
                       workers=workers)
    assert [b.labels for b in batches] == [{}, {}]
    assert [v for b in batches for v in b.reserved["request"].to_pylist()] == ["a", "b", "c"]
    assert batches[0].reserved["row_id"].to_pylist() == [1, 2]


def test_parse_error_in_worker_names_the_file(files):
    with pytest.raises(DataError, match="part-2.parquet"):
        _read(files, workers=2, features=FakeFeatureSet(poison=40))


def test_parse_error_in_main_process_names_the_file(files):
    with pytest.raises(DataError, match=r"part-2\.parquet.*poisoned"):
        _read(files, features=FakeFeatureSet(poison=40))


@pytest.mark.parametrize("workers", [0, 2], ids=["main", "workers2"])
def test_worker_errors_are_raised_as_in_the_main_process(files, workers):
    with pytest.raises(DataError) as raised:
        _read(files, workers=workers, features=FakeFeatureSet(poison=40))
    assert type(raised.value) is DataError
    assert str(raised.value) == (f"parsing a batch with rows from {files}/part-2.parquet "
                                 f"failed: ValueError: id 40 is poisoned")


@pytest.mark.parametrize("world_size,workers", [(1, 0), (2, 2)], ids=str)
def test_files_without_rows_are_skipped(tmp_path, caplog, world_size, workers):
    first = 0
    for i, n in enumerate((9, 0, 12, 0, 0, 6)):  # as Spark writes empty partitions
        write_parquet(str(tmp_path / "in" / f"part-{i}.parquet"), first, n)
        first += n
    with caplog.at_level(logging.WARNING, logger="hashrec.data"):
        per_rank = _read(str(tmp_path / "in"), world_size=world_size, workers=workers)
    assert sorted(i for batches in per_rank for i in row_ids(batches)) == list(range(27))
    # every rank lists the same input: one warning, not one per rank
    assert caplog.text.count("skipping 3 of 6 input files that have no rows") == 1
    cfg = data_config(num_workers=workers)
    for rank, batches in enumerate(per_rank):  # every rank counts the same rows
        loader = create_dataloader(cfg, FakeFeatureSet(), str(tmp_path / "in"), "train",
                                   rank=rank, world_size=world_size)
        assert loader.dataset.num_rows == 27
        assert sum(loader.dataset.reader_batches(rank, workers)) == len(batches)


def test_an_input_without_rows_is_an_error(tmp_path):
    for i in range(3):
        write_parquet(str(tmp_path / "in" / f"part-{i}.parquet"), 0, 0)
    with pytest.raises(DataError, match=r"part-0\.parquet and 2 other files: no rows in the "
                                        r"input"):
        _read(str(tmp_path / "in"))


@pytest.fixture(scope="module")
def taobao_table(tmp_path_factory):
    """Generated Taobao-like rows, and the example config's feature set."""
    out = tmp_path_factory.mktemp("taobao")
    (path,) = generate(str(out), num_rows=3000, seed=0, scale=0.01, quiet=True)["data"]
    return pq.read_table(path), build_feature_set(load_pipeline_config(EXAMPLE))


def _with_value(table, tmp_path, column: str, row: int, value) -> str:
    """``table`` with ``column[row] = value``, written in row groups of 700 rows."""
    values = table.column(column).to_pylist()
    values[row] = value
    changed = table.set_column(table.schema.get_field_index(column), column,
                               pa.array(values, table.schema.field(column).type))
    path = str(tmp_path / "bad.parquet")
    pq.write_table(changed, path, row_group_size=700)
    return path


def _taobao_read(path, features, workers, shuffle=False, **layout):
    cfg = data_config(num_workers=workers, batch_size=512, shuffle=shuffle, **layout)
    return list(create_dataloader(cfg, features, path, "train"))


def _csv_layout(table: pa.Table, typed: bool) -> dict:
    """data_config fields of a CSV file written from ``table`` with a header row; with
    ``typed``, input_fields give every column's type."""
    if not typed:
        return dict(dataset_type="CsvDataset", with_header=True)
    kinds = {pa.int64(): "INT64", pa.float64(): "DOUBLE", pa.string(): "STRING"}
    return dict(dataset_type="CsvDataset", with_header=True,
                input_fields=[input_field(f.name, kinds[f.type]) for f in table.schema])


@pytest.mark.parametrize("workers,shuffle", [(0, False), (2, False), (2, True)],
                         ids=["main", "workers2", "workers2-shuffled"])
def test_a_bad_value_names_its_row_in_the_file(taobao_table, tmp_path, workers, shuffle):
    # Row 2500: in the fifth batch of 512 rows and the fourth row group of 700.
    path = _with_value(taobao_table[0], tmp_path, "price", 2500, float("nan"))
    with pytest.raises(DataError) as raised:
        _taobao_read(path, taobao_table[1], workers, shuffle)
    assert str(raised.value) == (f"{path}: feature 'price': column 'price' row 2500: value "
                                 f"nan is not finite (NaN/inf are not allowed)")


@pytest.mark.parametrize("value", [2, -1], ids=["two", "minus-one"])
def test_a_label_outside_0_and_1_names_file_column_row_and_value(taobao_table, tmp_path,
                                                                  value):
    path = _with_value(taobao_table[0], tmp_path, "clk", 1234, value)
    with pytest.raises(DataError, match=rf"^{re.escape(path)}: label column 'clk' row 1234: "
                                        rf"value {value} is not in \[0, 1\]; binary_cross_entropy"):
        _taobao_read(path, taobao_table[1], workers=0)


@pytest.mark.parametrize("typed", [False, True], ids=["text-columns", "typed-columns"])
def test_nan_text_in_a_csv_raw_feature_names_its_row_as_in_parquet(taobao_table, tmp_path,
                                                                    typed):
    table, features = taobao_table
    prices = table.column("price").cast(pa.string()).to_pylist()
    prices[2500] = "NaN"
    path = str(tmp_path / "bad.csv")
    pacsv.write_csv(table.set_column(table.schema.get_field_index("price"), "price",
                                     pa.array(prices)), path)
    with pytest.raises(DataError) as raised:
        _taobao_read(path, features, 0, **_csv_layout(table, typed))
    assert str(raised.value) == (f"{path}: feature 'price': column 'price' row 2500: value "
                                 f"nan is not finite (NaN/inf are not allowed)")


def _assert_same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.sparse.keys() == b.sparse.keys() and a.batch_size == b.batch_size
        assert torch.equal(a.sparse.values(), b.sparse.values())
        assert torch.equal(a.sparse.lengths(), b.sparse.lengths())
        for part in ("dense", "sequence_dense", "labels"):
            x, y = getattr(a, part), getattr(b, part)
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), part


@pytest.mark.parametrize("typed", [False, True], ids=["text-columns", "typed-columns"])
def test_csv_reads_as_the_same_batches_as_parquet(taobao_table, tmp_path, typed):
    rng = np.random.default_rng(0)
    table = taobao_table[0].append_column("w", pa.array(rng.integers(0, 9, 3000) / 4))
    config = load_pipeline_config(EXAMPLE)
    config.data_config.sample_weight_fields.append("w")
    raw = config.feature_configs.add().raw_feature  # a dense raw feature too
    raw.feature_name, raw.expression = "price_raw", "item:price"
    features = build_feature_set(config, keep=["price_raw"])
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    pacsv.write_csv(table, tmp_path / "t.csv")
    want = _taobao_read(str(tmp_path / "t.parquet"), features, 0)
    got = _taobao_read(str(tmp_path / "t.csv"), features, 0, **_csv_layout(table, typed))
    assert set(want[0].labels) == {"clk", "w"} and set(want[0].dense) == {"price_raw"}
    _assert_same_batches(got, want)


def test_a_file_whose_list_column_is_all_empty_reads_as_missing_cells(tmp_path):
    # pyarrow writes such a column as list<null>; alone, or beside a file of list<int64>
    config = ('model_dir: "m"\ndata_config { label_fields: "clk" dataset_type: '
              'ParquetDataset }\nfeature_configs { id_feature { feature_name: "tags" '
              'expression: "user:tags" embedding_dim: 4 dynamicemb { max_capacity: 10 } } }')
    features = build_feature_set(parse_pipeline_config(config))
    (tmp_path / "in").mkdir()
    empty = pa.table({"tags": pa.array([[], None, []], pa.list_(pa.null())), "clk": [0, 1, 0]})
    pq.write_table(empty, tmp_path / "in" / "part-0.parquet")
    (batch,) = _read(str(tmp_path / "in"), features=features, batch_size=8)[0]
    assert batch.sparse["tags"].lengths.tolist() == [0, 0, 0]
    pq.write_table(pa.table({"tags": pa.array([[5, 6]], pa.list_(pa.int64())), "clk": [1]}),
                   tmp_path / "in" / "part-1.parquet")
    (batch,) = _read(str(tmp_path / "in"), features=features, batch_size=8)[0]
    assert batch.sparse["tags"].values.tolist() == [5, 6]
    assert batch.sparse["tags"].lengths.tolist() == [0, 0, 0, 2]
