import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_fakes import FakeFeatureSet, data_config, input_field, row_ids, write_parquet

from hashrec.config import parse_pipeline_config
from hashrec.data import CsvFormat, DataError, create_dataloader, sources
from hashrec.data.sources import CsvSource, ParquetSource, Piece
from hashrec.features import build_feature_set

CSV_FIELDS = [input_field("row_id", "INT64"), input_field("clk", "INT32"),
              input_field("name", "STRING"), input_field("seq", "ARRAY_INT64")]


def _csv(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def _load(path, mode="train", **overrides):
    features = overrides.pop("features", FakeFeatureSet())
    world_size = overrides.pop("world_size", 1)
    reserved = overrides.pop("reserved_columns", ())
    cfg = data_config(**overrides)
    return [list(create_dataloader(cfg, features, path, mode, rank=r, world_size=world_size,
                                   reserved_columns=reserved))
            for r in range(world_size)]


def _reserved(batches, column):
    return [v for b in batches for v in b.reserved[column].to_pylist()]


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


def test_csv_with_header_and_no_input_fields_reads_every_column_as_text(tmp_path):
    path = _csv(tmp_path, "h.csv", ["clk,row_id,extra"] + [f"{i % 2},{i},x" for i in range(7)])
    (batches,) = _load(path, dataset_type="CsvDataset", with_header=True)
    assert row_ids(batches) == list(range(7))


@pytest.mark.parametrize("early", ["", "7"], ids=["empty-then-text", "digits-then-text"])
def test_csv_column_whose_text_starts_after_the_first_block_loads(tmp_path, early):
    # pyarrow guesses an untyped column's type from the first block (1 MiB) alone.
    rows = 200_000
    lines = [f"{i},{early if i < rows - 10 else 'abc'},{i % 2}" for i in range(rows)]
    path = _csv(tmp_path, "late.csv", ["row_id,o,clk"] + lines)
    (batches,) = _load(path, dataset_type="CsvDataset", with_header=True, batch_size=50_000,
                       reserved_columns=("o",))
    values = _reserved(batches, "o")
    assert row_ids(batches) == list(range(rows))
    want = early or None  # an empty cell is missing
    assert values[:rows - 10] == [want] * (rows - 10) and values[rows - 10:] == ["abc"] * 10


@pytest.mark.parametrize("other", ["1", "x"], ids=["beside-digits", "beside-text"])
def test_csv_cells_mean_the_same_whatever_the_other_rows_hold(tmp_path, other):
    # the null markers are missing in every column, NaN is text (a number where parsed)
    cells = [other, "NA", "null", "NaN", "", "N/A", "\\N", "nan"]
    path = _csv(tmp_path, "c.csv", ["row_id,clk,c"] + [f"{i},0,{c}" for i, c in enumerate(cells)])
    (batches,) = _load(path, dataset_type="CsvDataset", with_header=True,
                       reserved_columns=("c",))
    assert _reserved(batches, "c") == [other, None, None, "NaN", None, None, None, "nan"]


def test_csv_typed_columns_keep_their_types(tmp_path):
    path = _csv(tmp_path, "t.csv", ["1,0,n,1|2", "2,1,,3", "NULL,0,n,4"])
    (batches,) = _load(path, dataset_type="CsvDataset", input_fields=CSV_FIELDS,
                       reserved_columns=("row_id", "name", "seq"))
    assert batches[0].reserved["row_id"].type == pa.int64()
    assert _reserved(batches, "row_id") == [1, 2, None]
    assert _reserved(batches, "name") == ["n", None, "n"]
    assert _reserved(batches, "seq") == ["1|2", "3", "4"]


def test_csv_header_names_the_columns_and_input_fields_type_them_by_name(tmp_path):
    # as in TorchEasyRec: with with_header the header names the columns, in its order
    path = _csv(tmp_path, "h.csv", ["seq,clk,name,row_id"] + [f"1,{i % 2},n,{i}"
                                                               for i in range(5)])
    (batches,) = _load(path, dataset_type="CsvDataset", with_header=True,
                       input_fields=CSV_FIELDS, reserved_columns=("row_id",))
    assert row_ids(batches) == list(range(5))
    assert batches[0].reserved["row_id"].type == pa.int64()  # typed by input_fields
    assert [v for b in batches for v in b.labels["clk"].tolist()] == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_csv_rows_split_across_ranks_without_loss(tmp_path):
    paths = [_csv(tmp_path, f"{k}.csv", [f"{i},{i % 2},n,1" for i in range(k * 9, k * 9 + 9)])
             for k in range(2)]
    per_rank = _load(",".join(paths), dataset_type="CsvDataset", input_fields=CSV_FIELDS,
                     world_size=4)
    ids = [i for batches in per_rank for i in row_ids(batches)]
    assert sorted(ids) == list(range(18))


def _spans_rows(source, piece, spans):
    """(row_id values, the number of tables) that ``read_spans`` gives for ``spans``."""
    rows, tables = [], 0
    for start, table in source.read_spans(piece, spans, use_threads=False):
        ids = [int(v) for v in table.column("row_id").to_pylist()]
        assert ids[0] == piece.first_row + start  # row_id counts the file's rows
        rows.extend(ids)
        tables += 1
    return rows, tables


def test_csv_spans_read_across_blocks_in_one_pass(tmp_path):
    rows = 300_000  # several blocks of 1 MiB, as the reader parses them
    path = _csv(tmp_path, "s.csv", ["row_id,clk"] + [f"{i},{i % 2}" for i in range(rows)])
    source = CsvSource(["row_id", "clk"], CsvFormat(with_header=True))
    (piece,), _ = source.pieces(path)
    spans = [(0, 3), (10, 250_000), (250_001, 250_002), (rows - 5, rows)]
    got, tables = _spans_rows(source, piece, spans)
    assert got == [i for start, stop in spans for i in range(start, stop)]
    assert tables > len(spans)  # the long span came in several blocks
    with pytest.raises(DataError, match=r"s\.csv: the file has 300000 rows, expected 300001"):
        list(source.read_spans(Piece(path, 0, rows + 1), [(rows - 1, rows + 1)], False))


def test_parquet_spans_are_slices_of_their_row_group(tmp_path):
    write_parquet(str(tmp_path / "g.parquet"), 0, 17, row_group_size=7)
    source = ParquetSource(["row_id"])
    pieces, _ = source.pieces(str(tmp_path / "g.parquet"))
    assert _spans_rows(source, pieces[1], [(0, 2), (5, 7)]) == ([7, 8, 12, 13], 2)
    assert _spans_rows(source, pieces[1], []) == ([], 0)


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


@pytest.mark.parametrize("lines", [["row_id,clk"], [], [""]],
                         ids=["header-only", "zero-bytes", "blank-line"])
def test_empty_csv_file_is_an_error(tmp_path, lines):
    path = _csv(tmp_path, "empty.csv", lines)
    with pytest.raises(DataError, match=r"empty\.csv.*no rows"):
        _load(path, dataset_type="CsvDataset", with_header=True)


@pytest.mark.parametrize("layout", [dict(with_header=True),
                                    dict(input_fields=CSV_FIELDS[:2], with_header=True),
                                    dict(input_fields=CSV_FIELDS[:2])],
                         ids=["header", "header-and-fields", "fields"])
def test_zero_byte_csv_file_is_skipped(tmp_path, caplog, layout):
    header = ["row_id,clk"] if layout.get("with_header") else []
    _csv(tmp_path, "a.csv", header + ["1,0", "2,1"])
    (tmp_path / "b.csv").write_bytes(b"")
    _csv(tmp_path, "c.csv", header + ["3,1"])
    with caplog.at_level(logging.WARNING, logger="hashrec.data"):
        (batches,) = _load(str(tmp_path), dataset_type="CsvDataset", **layout)
    assert row_ids(batches) == [1, 2, 3]
    assert "skipping 1 of 3 input files that have no rows" in caplog.text


def test_csv_file_the_reader_refuses_is_an_error(tmp_path):
    path = _csv(tmp_path, "wide.csv", ["", "1,0,7"])
    with pytest.raises(DataError, match=r"wide\.csv: cannot read as CSV.*Expected 2 columns"):
        _load(path, dataset_type="CsvDataset", input_fields=CSV_FIELDS[:2])


@pytest.mark.parametrize("layout", [dict(with_header=True, input_fields=CSV_FIELDS[:2]),
                                    dict(input_fields=CSV_FIELDS[:2])],
                         ids=["header", "fields"])
def test_a_typed_csv_value_that_does_not_convert_names_its_column(tmp_path, layout):
    header = ["row_id,clk"] if layout.get("with_header") else []
    path = _csv(tmp_path, "typed.csv", header + ["1,0", "2,x7"])
    with pytest.raises(DataError, match=r"typed\.csv: .*CSV column #1.*'x7' \(column 'clk'\)"):
        _load(path, dataset_type="CsvDataset", **layout)


def test_csv_file_with_only_a_header_is_skipped(tmp_path):
    (tmp_path / "in").mkdir()
    _csv(tmp_path / "in", "a.csv", ["row_id,clk", "1,0", "2,1"])
    _csv(tmp_path / "in", "b.csv", ["row_id,clk"])
    _csv(tmp_path / "in", "c.csv", ["row_id,clk", "3,1"])
    (batches,) = _load(str(tmp_path / "in"), dataset_type="CsvDataset", with_header=True)
    assert row_ids(batches) == [1, 2, 3]


def _no_rows(tmp_path, kind: str) -> None:
    """A file without rows in ``tmp_path / "in"``, lacking the columns the others have."""
    if kind == "parquet-zero-bytes":
        (tmp_path / "in" / "b.parquet").write_bytes(b"")
    elif kind == "parquet-other-columns":
        pq.write_table(pa.table({"other": pa.array([], pa.string())}),
                       tmp_path / "in" / "b.parquet")
    else:
        _csv(tmp_path / "in", "b.csv", ["other"])


@pytest.mark.parametrize("kind", ["parquet-zero-bytes", "parquet-other-columns",
                                  "csv-header-of-other-columns"])
def test_a_file_without_rows_is_skipped_whatever_its_columns(tmp_path, caplog, kind):
    (tmp_path / "in").mkdir()
    layout = {}
    if kind.startswith("csv"):
        layout = dict(dataset_type="CsvDataset", with_header=True)
        _csv(tmp_path / "in", "a.csv", ["row_id,clk", "1,0", "2,1"])
        _csv(tmp_path / "in", "c.csv", ["row_id,clk", "3,1"])
    else:
        write_parquet(str(tmp_path / "in" / "a.parquet"), 1, 2)
        write_parquet(str(tmp_path / "in" / "c.parquet"), 3, 1)
    _no_rows(tmp_path, kind)
    with caplog.at_level(logging.WARNING, logger="hashrec.data"):
        (batches,) = _load(str(tmp_path / "in"), **layout)
    assert row_ids(batches) == [1, 2, 3]
    assert "skipping 1 of 3 input files that have no rows" in caplog.text


def test_a_row_group_read_in_part_is_decoded_up_to_the_span_alone(tmp_path, monkeypatch):
    rows = 3 * sources.PARQUET_BLOCK_ROWS
    path = str(tmp_path / "big.parquet")
    pq.write_table(pa.table({"row_id": np.arange(rows)}), path, row_group_size=rows)
    decoded = []

    class CountingFile(pq.ParquetFile):
        def read_row_group(self, *args, **kwargs):
            table = super().read_row_group(*args, **kwargs)
            decoded.append(table.num_rows)
            return table

        def iter_batches(self, *args, **kwargs):
            for batch in super().iter_batches(*args, **kwargs):
                decoded.append(batch.num_rows)
                yield batch

    monkeypatch.setattr(pq, "ParquetFile", CountingFile)
    source = ParquetSource(["row_id"])
    (piece,), _ = source.pieces(path)
    edge = sources.PARQUET_BLOCK_ROWS
    read = list(source.read_spans(piece, [(10, 20), (edge - 3, edge + 2)], False))
    assert [start for start, _ in read] == [10, edge - 3, edge]  # the second in two blocks
    ids = [i for _, table in read for i in table.column("row_id").to_pylist()]
    assert ids == [*range(10, 20), *range(edge - 3, edge + 2)]
    assert sum(decoded) == 2 * sources.PARQUET_BLOCK_ROWS  # not the third block
    decoded.clear()
    (whole,) = source.read_spans(piece, [(0, rows)], False)
    assert whole[1].num_rows == rows and decoded == [rows]


@pytest.mark.parametrize("world_size", [1, 3], ids=["ranks1", "ranks3"])
def test_readers_sharing_row_groups_read_every_row_once(tmp_path, monkeypatch, world_size):
    monkeypatch.setattr(sources, "PARQUET_BLOCK_ROWS", 3)  # spans cross decoding blocks
    write_parquet(str(tmp_path / "in" / "a.parquet"), 0, 40, row_group_size=17)
    write_parquet(str(tmp_path / "in" / "b.parquet"), 40, 9, row_group_size=17)
    per_rank = _load(str(tmp_path / "in"), world_size=world_size, batch_size=5)
    assert sorted(i for batches in per_rank for i in row_ids(batches)) == list(range(49))


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


def test_a_csv_file_read_as_parquet_and_a_parquet_file_read_as_csv_say_so(tmp_path):
    """The error names the dataset_type to set; a parquet file's bytes stay out of it."""
    csv = _csv(tmp_path, "data.csv", ["row_id,clk", "1,0"])
    with pytest.raises(DataError, match=r"data\.csv: not a readable parquet.*looks like text: "
                                        r"for CSV input set data_config\.dataset_type: "
                                        r"CsvDataset"):
        _load(csv)
    write_parquet(str(tmp_path / "p.parquet"), 0, 3)
    with pytest.raises(DataError) as err:
        _load(str(tmp_path / "p.parquet"), dataset_type="CsvDataset", with_header=True)
    assert str(err.value).endswith("p.parquet: a parquet file, read as CSV; for parquet "
                                   "input set data_config.dataset_type: ParquetDataset (the "
                                   "default)")
    (tmp_path / "c.parquet").write_bytes(bytes(range(256)))  # neither: no hint
    with pytest.raises(DataError, match=r"not a readable parquet file: [^;]*$"):
        _load(str(tmp_path / "c.parquet"))


def test_files_with_different_but_convertible_types_concatenate(tmp_path):
    write_parquet(str(tmp_path / "a.parquet"), 0, 3)
    pq.write_table(pa.table({"row_id": pa.array([3, 4], pa.int32()), "clk": [0, 1]}),
                   tmp_path / "b.parquet")
    (batches,) = _load(str(tmp_path))
    assert row_ids(batches) == [0, 1, 2, 3, 4]


def test_a_value_that_does_not_parse_names_the_files_of_its_batch(tmp_path):
    # integers and strings meet as strings; the strings here are no row ids
    write_parquet(str(tmp_path / "a.parquet"), 0, 3)
    pq.write_table(pa.table({"row_id": ["x", "y"], "clk": [0, 1]}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"a\.parquet, .*b\.parquet failed: .*'x'"):
        _load(str(tmp_path))


def _parquet_with(path, column):
    """A parquet file of len(column) rows: row_id 0.., clk, and ``column`` as v."""
    rows = len(column)
    pq.write_table(pa.table({"row_id": list(range(rows)), "clk": [0] * rows, "v": column}),
                   path)
    return str(path)


ORDER_CASES = {
    "null-then-string": (pa.array([None, None], pa.null()), pa.array(["x", "y"])),
    "dict8-then-dict16": (
        pa.array(["a", "b"]).dictionary_encode().cast(pa.dictionary(pa.int8(), pa.string())),
        pa.array([f"w{i}" for i in range(300)]).dictionary_encode().cast(
            pa.dictionary(pa.int16(), pa.string()))),
    "dict-then-string": (pa.array(["a", "b"]).dictionary_encode(), pa.array(["c"])),
    "int32-then-float": (pa.array([1, 2], pa.int32()), pa.array([2.5])),
    "string-then-large": (pa.array(["a"]), pa.array(["b", "c"], pa.large_string())),
    "bool-then-int": (pa.array([True, False]), pa.array([7], pa.int64())),
    "fixed-then-list": (pa.array([[1, 2]], pa.list_(pa.int64(), 2)),
                        pa.array([[3], [4, 5, 6]], pa.list_(pa.int64()))),
}


@pytest.mark.parametrize("case", ORDER_CASES)
@pytest.mark.parametrize("order", ["ab", "ba"])
def test_files_read_alike_whatever_their_order(tmp_path, case, order):
    columns = dict(zip("ab", ORDER_CASES[case]))
    paths = {k: _parquet_with(tmp_path / f"{k}.parquet", c) for k, c in columns.items()}
    (batches,) = _load(",".join(paths[k] for k in order), reserved_columns=("v",))
    want = [v for k in order for v in columns[k].to_pylist()]
    if case == "bool-then-int":
        want = [int(v) for v in want]
    assert _reserved(batches, "v") == want


@pytest.mark.parametrize("order", ["ab", "ba"])
def test_files_whose_types_have_no_common_type_name_a_file_and_the_column(tmp_path, order):
    paths = {"a": _parquet_with(tmp_path / "a.parquet", pa.array(["x"])),
             "b": _parquet_with(tmp_path / "b.parquet", pa.array([[1]]))}
    second = paths[order[1]]
    with pytest.raises(DataError, match=rf"^{second}: column 'v' has type .*, and "
                                        rf"{paths[order[0]]} has .*no common type"):
        _load(",".join(paths[k] for k in order), reserved_columns=("v",))


def test_fixed_size_list_column_feeds_a_raw_feature(tmp_path):
    config = parse_pipeline_config(
        'model_dir: "m" data_config { batch_size: 2 dataset_type: ParquetDataset '
        'label_fields: "clk" } feature_configs { raw_feature { feature_name: "v" '
        'expression: "item:v" value_dim: 2 } }')
    values = pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.float32(), 2))
    pq.write_table(pa.table({"v": values, "clk": [0, 1, 0]}), tmp_path / "f.parquet")
    (batches,) = _load(str(tmp_path / "f.parquet"), features=build_feature_set(config),
                       batch_size=2)
    assert [b.dense["v"].tolist() for b in batches] == [[[1, 2], [3, 4]], [[5, 6]]]


@pytest.mark.parametrize("ints", [pa.int64(), pa.uint64()], ids=["int64", "uint64"])
def test_integer_and_string_ids_in_two_files_read_as_the_same_ids(tmp_path, caplog, ints):
    # one day's export wrote the ids as integers, another's as strings (or int64 as uint64)
    config = parse_pipeline_config(
        'model_dir: "m" data_config { batch_size: 8 dataset_type: ParquetDataset '
        'label_fields: "clk" } feature_configs { id_feature { feature_name: "u" '
        'expression: "user:u" embedding_dim: 4 dynamicemb { max_capacity: 64 } } } '
        'feature_configs { id_feature { feature_name: "h" expression: "user:u" '
        'embedding_dim: 4 hash_bucket_size: 1000 } }')
    features = build_feature_set(config)
    ids = [7, 2**40, 3]
    other = pa.array(ids, pa.int64()) if ints == pa.uint64() else pa.array(map(str, ids))
    pq.write_table(pa.table({"u": pa.array(ids, ints), "clk": [0, 1, 0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"u": other, "clk": [1, 0, 1]}), tmp_path / "b.parquet")
    with caplog.at_level("WARNING", logger="hashrec.data"):
        (batches,) = _load(str(tmp_path), features=features, batch_size=8)
    (batch,) = batches
    assert batch.sparse["u"].values.tolist() == ids + ids
    hashed = batch.sparse["h"].values.tolist()
    assert hashed[:3] == hashed[3:]
    assert "column 'u' holds " in caplog.text and "read as strings" in caplog.text


def test_unsupported_dataset_type_is_named(tmp_path):
    write_parquet(str(tmp_path / "a.parquet"), 0, 3)
    with pytest.raises(DataError, match="OdpsDataset is not supported"):
        _load(str(tmp_path), dataset_type="OdpsDataset")
