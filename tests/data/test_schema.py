import itertools

import pyarrow as pa
import pytest

from hashrec.data import DataError
from hashrec.data.schema import check_columns, common_schema, common_type

DICT8, DICT16 = pa.dictionary(pa.int8(), pa.string()), pa.dictionary(pa.int16(), pa.string())

COMMON = {
    "null-string": (pa.null(), pa.string(), pa.string()),
    "null-list": (pa.null(), pa.list_(pa.int64()), pa.list_(pa.int64())),
    "int8-int64": (pa.int8(), pa.int64(), pa.int64()),
    "int64-float32": (pa.int64(), pa.float32(), pa.float64()),
    "float32-float64": (pa.float32(), pa.float64(), pa.float64()),
    "string-large": (pa.string(), pa.large_string(), pa.large_string()),
    "dict8-dict16": (DICT8, DICT16, DICT16),
    "dict-string": (DICT8, pa.string(), pa.string()),
    "list-of-dict-list": (pa.list_(DICT8), pa.list_(pa.string()), pa.list_(pa.string())),
    "bool-int": (pa.bool_(), pa.int32(), pa.int32()),
    "fixed-list": (pa.list_(pa.float32(), 2), pa.list_(pa.float32()), pa.list_(pa.float32())),
    "list-widths": (pa.list_(pa.int32()), pa.list_(pa.int64()), pa.list_(pa.int64())),
    # an integer's text reads as the same id, value or label
    "int-string": (pa.int64(), pa.string(), pa.string()),
    "uint8-large-string": (pa.uint8(), pa.large_string(), pa.large_string()),
    "int-dict": (pa.int32(), DICT8, pa.string()),
    "int64-uint64": (pa.int64(), pa.uint64(), pa.string()),
    "int8-uint64": (pa.int8(), pa.uint64(), pa.string()),
    "list-int-list-string": (pa.list_(pa.int64()), pa.list_(pa.string()), pa.list_(pa.string())),
}


@pytest.mark.parametrize("case", COMMON)
def test_common_type_holds_both_types_in_either_order(case):
    a, b, want = COMMON[case]
    assert common_type(a, b) == want and common_type(b, a) == want


@pytest.mark.parametrize("a,b", [(pa.string(), pa.list_(pa.string())),
                                 (pa.float64(), pa.string()), (pa.bool_(), pa.string()),
                                 (pa.int64(), pa.list_(pa.string()))],
                         ids=["string-list", "float-string", "bool-string", "int-list"])
def test_types_without_a_common_type(a, b):
    assert common_type(a, b) is None and common_type(b, a) is None


def test_common_schema_is_the_same_in_any_file_order():
    schemas = [("a", pa.schema([("x", pa.null()), ("y", DICT8)])),
               ("b", pa.schema([("x", pa.int8()), ("y", DICT16)])),
               ("c", pa.schema([("x", pa.float32()), ("y", DICT8)]))]
    want = pa.schema([("x", pa.float32()), ("y", DICT16)])  # float32 holds any int8
    for order in itertools.permutations(schemas):
        assert common_schema(order).equals(want)


def test_a_conflict_names_both_files_the_column_and_the_next_step():
    schemas = [("a.parquet", pa.schema([("x", pa.null())])),
               ("b.parquet", pa.schema([("x", pa.string())])),
               ("c.parquet", pa.schema([("x", pa.list_(pa.string()))]))]
    with pytest.raises(DataError, match=r"^c\.parquet: column 'x' has type list<item: string>, "
                                        r"and b\.parquet has string: .*one type in every file"):
        common_schema(schemas)


def test_fixed_size_lists_are_supported_but_not_nested_lists():
    schema = pa.schema([("v", pa.list_(pa.float32(), 2)),
                        ("w", pa.list_(pa.list_(pa.float32()), 2))])
    assert check_columns("f", schema, ["v"]).field(0).type == pa.list_(pa.float32(), 2)
    with pytest.raises(DataError, match=r"^f: column 'w' has type fixed_size_list"):
        check_columns("f", schema, ["w"])


@pytest.mark.parametrize("wanted,hint", [("usr_id", "; did you mean 'user_id'?"),
                                         ("click", "; did you mean 'clk'?"),
                                         ("zzz", "")])
def test_a_missing_column_suggests_the_closest_name(wanted, hint):
    schema = pa.schema([("user_id", pa.int64()), ("clk", pa.int64()), ("price", pa.float64())])
    with pytest.raises(DataError) as err:
        check_columns("f.parquet", schema, ["price", wanted])
    assert str(err.value) == (f"f.parquet: column {wanted!r} is missing (the file has "
                              f"['user_id', 'clk', 'price']){hint}")


def test_a_column_named_twice_is_named_so_not_missing():
    # a CSV header (or a parquet file) naming a column twice was reported as missing it
    schema = pa.schema([("clk", pa.int64()), ("user_id", pa.int64()), ("clk", pa.string())])
    with pytest.raises(DataError) as err:
        check_columns("f.csv", schema, ["user_id", "clk"])
    assert str(err.value) == ("f.csv: column 'clk' appears 2 times (columns 1 and 3 of "
                              "['clk', 'user_id', 'clk']): name each column once")


def test_a_missing_column_with_a_note_says_the_note_instead_of_a_guess():
    schema = pa.schema([("user_id", pa.int64()), ("clk", pa.int64())])
    with pytest.raises(DataError) as err:
        check_columns("f.parquet", schema, ["uid"], {"uid": "feature 'uid' reads it"})
    assert str(err.value) == ("f.parquet: column 'uid' is missing (the file has "
                              "['user_id', 'clk']); feature 'uid' reads it")
