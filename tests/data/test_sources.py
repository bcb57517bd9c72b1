import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_fakes import FakeFeatureSet, data_config, input_field, row_ids, write_parquet

from hashrec.data import CsvFormat, DataError, create_dataloader
from hashrec.data.sources import ParquetSource

CSV_FIELDS = [input_field("row_id", "INT64"), input_field("clk", "INT32"),
              input_field("name", "STRING"), input_field("seq", "ARRAY_INT64")]


def _csv(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def _load(path, mode="train", **overrides):
    features = overrides.pop("features", FakeFeatureSet())
    world_size = overrides.pop("world_size", 1)
    cfg = data_config(**overrides)
    return [list(create_dataloader(cfg, features, path, mode, rank=r, world_size=world_size))
            for r in range(world_size)]


@pytest.mark.parametrize("delimiter", [",", "\t", ";"], ids=["comma", "tab", "semicolon"])
def test_csv_with_input_fields_and_delimiter(tmp_path, delimiter):
    rows = [delimiter.join([str(i), str(i % 2), f"n{i}", "|".join(map(str, range(i % 3)))])
            for i in range(10)]
    path = _csv(tmp_path, "a.csv", rows)
    (batches,) = _load(path, dataset_type="CsvDataset", input_fields=CSV_FIELDS,
                       delimiter=delimiter, features=FakeFeatureSet(bags=["seq"]))
    assert row_ids(batches) == list(range(10))
    assert [n for b in batches for n in b.sparse["seq"].lengths.tolist()] == [
        i % 3 for i in range(10)]
    assert batches[0].labels["clk"].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_csv_with_header_and_no_input_fields_infers_types(tmp_path):
    path = _csv(tmp_path, "h.csv", ["clk,row_id,extra"] + [f"{i % 2},{i},x" for i in range(7)])
    (batches,) = _load(path, dataset_type="CsvDataset", with_header=True)
    assert row_ids(batches) == list(range(7))


def test_csv_header_is_skipped_when_input_fields_name_the_columns(tmp_path):
    path = _csv(tmp_path, "h.csv", ["a,b,c,d"] + [f"{i},{i % 2},n,1" for i in range(5)])
    (batches,) = _load(path, dataset_type="CsvDataset", with_header=True,
                       input_fields=CSV_FIELDS)
    assert row_ids(batches) == list(range(5))


def test_csv_rows_split_across_ranks_without_loss(tmp_path):
    paths = [_csv(tmp_path, f"{k}.csv", [f"{i},{i % 2},n,1" for i in range(k * 9, k * 9 + 9)])
             for k in range(2)]
    per_rank = _load(",".join(paths), dataset_type="CsvDataset", input_fields=CSV_FIELDS,
                     world_size=4)
    ids = [i for batches in per_rank for i in row_ids(batches)]
    assert sorted(ids) == list(range(18))


def test_csv_bad_value_names_the_file(tmp_path):
    path = _csv(tmp_path, "bad.csv", ["1,0,n,1", "oops,1,n,1"])
    with pytest.raises(DataError, match="bad.csv"):
        _load(path, dataset_type="CsvDataset", input_fields=CSV_FIELDS)


def test_csv_missing_column_names_file_and_column(tmp_path):
    path = _csv(tmp_path, "h.csv", ["row_id,other", "1,2"])
    with pytest.raises(DataError, match=r"h\.csv.*'clk'"):
        _load(path, dataset_type="CsvDataset", with_header=True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(delimiter="::", with_header=True), "delimiter"),
    (dict(), "input_fields"),
    (dict(input_fields=(("a", "DATE"),)), "input_type"),
], ids=["long-delimiter", "no-names", "bad-type"])
def test_csv_format_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CsvFormat(**kwargs)


def test_empty_csv_file_is_an_error(tmp_path):
    path = _csv(tmp_path, "empty.csv", ["row_id,clk"])
    with pytest.raises(DataError, match=r"empty\.csv.*no rows"):
        _load(path, dataset_type="CsvDataset", with_header=True)


def test_csv_file_with_only_a_header_is_skipped(tmp_path):
    (tmp_path / "in").mkdir()
    _csv(tmp_path / "in", "a.csv", ["row_id,clk", "1,0", "2,1"])
    _csv(tmp_path / "in", "b.csv", ["row_id,clk"])
    _csv(tmp_path / "in", "c.csv", ["row_id,clk", "3,1"])
    (batches,) = _load(str(tmp_path / "in"), dataset_type="CsvDataset", with_header=True)
    assert row_ids(batches) == [1, 2, 3]


def test_parquet_row_groups_know_their_first_row(tmp_path):
    write_parquet(str(tmp_path / "g.parquet"), 0, 17, row_group_size=7)
    pieces, _ = ParquetSource(["row_id"]).pieces(str(tmp_path / "g.parquet"))
    assert [(p.index, p.num_rows, p.first_row) for p in pieces] == [(0, 7, 0), (1, 7, 7),
                                                                   (2, 3, 14)]

def test_missing_parquet_column_names_file_and_column(tmp_path):
    pq.write_table(pa.table({"row_id": [1]}), tmp_path / "x.parquet")
    with pytest.raises(DataError, match=r"x\.parquet.*'clk' is missing"):
        _load(str(tmp_path / "x.parquet"))


def test_unsupported_parquet_type_names_file_and_column(tmp_path):
    table = pa.table({"row_id": pa.array([{"a": 1}]), "clk": [1]})
    pq.write_table(table, tmp_path / "s.parquet")
    with pytest.raises(DataError, match=r"s\.parquet.*'row_id' has type struct"):
        _load(str(tmp_path / "s.parquet"))


def test_empty_parquet_file_is_an_error(tmp_path):
    pq.write_table(pa.table({"row_id": pa.array([], pa.int64()), "clk": pa.array([], pa.int64())}),
                   tmp_path / "e.parquet")
    with pytest.raises(DataError, match=r"e\.parquet.*no rows"):
        _load(str(tmp_path / "e.parquet"))


def test_corrupt_parquet_file_is_an_error(tmp_path):
    (tmp_path / "c.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"c\.parquet.*not a readable parquet"):
        _load(str(tmp_path / "c.parquet"))


def test_files_with_different_but_convertible_types_concatenate(tmp_path):
    write_parquet(str(tmp_path / "a.parquet"), 0, 3)
    pq.write_table(pa.table({"row_id": pa.array([3, 4], pa.int32()), "clk": [0, 1]}),
                   tmp_path / "b.parquet")
    (batches,) = _load(str(tmp_path))
    assert row_ids(batches) == [0, 1, 2, 3, 4]


def test_files_with_inconvertible_types_name_the_file_and_column(tmp_path):
    write_parquet(str(tmp_path / "a.parquet"), 0, 3)
    pq.write_table(pa.table({"row_id": ["x", "y"], "clk": [0, 1]}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b\.parquet.*'row_id'"):
        _load(str(tmp_path))


def test_unsupported_dataset_type_is_named(tmp_path):
    write_parquet(str(tmp_path / "a.parquet"), 0, 3)
    with pytest.raises(DataError, match="OdpsDataset is not supported"):
        _load(str(tmp_path), dataset_type="OdpsDataset")
