"""Columns -> bags: separators, missing cells, empty tokens, slices and list columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hashrec.features.errors import FeatureError
from hashrec.features.tokens import (
    column_bags,
    first_values,
    list_lengths,
    missing_cells,
    sequence_items,
    string_offsets,
    truncate,
)


def reference_bags(cells: list, separator: str | None, default: str = "") -> list[list]:
    """Plain-Python statement of the rules: missing cells (null, "" or an empty list)
    take ``default`` (or are empty bags), string cells split on the separator, empty
    tokens are dropped."""
    bags = []
    for cell in cells:
        if cell is None or cell == "" or cell == []:
            cell = default or None
        if cell is None:
            bags.append([])
        elif isinstance(cell, list):
            bags.append([t for t in cell if t not in (None, "")])
        elif isinstance(cell, str) and separator:
            bags.append([t for t in cell.split(separator) if t])
        else:
            bags.append([cell])
    return bags


def as_lists(bags) -> list[list]:
    values, out, start = bags.values.to_pylist(), [], 0
    for n in bags.lengths.tolist():
        out.append(values[start:start + n])
        start += n
    return out


CELLS = ["12|7", "", None, "3", "4||5", "|6|", "8|"]


@pytest.mark.parametrize("default", ["", "0"], ids=["no-default", "default"])
@pytest.mark.parametrize("string_type", [pa.string(), pa.large_string()],
                         ids=["string", "large-string"])
def test_split_cells_match_the_reference(string_type, default):
    bags = column_bags(pa.array(CELLS, string_type), "f", "c", "|", default)
    assert as_lists(bags) == reference_bags(CELLS, "|", default)
    assert bags.lengths.dtype.name == "int64"


@pytest.mark.parametrize("start,stop", [(1, 7), (2, 5), (4, 4)], ids=["tail", "middle", "empty"])
def test_sliced_columns_read_only_their_rows(start, stop):
    array = pa.array(CELLS).slice(start, stop - start)
    bags = column_bags(array, "f", "c", "|")
    assert as_lists(bags) == reference_bags(CELLS[start:stop], "|")
    # offsets point into the shared data buffer; the cell sizes are the slice's own
    sizes = np.diff(string_offsets(array)).tolist()
    assert sizes == [len(c or "") for c in CELLS[start:stop]]


def test_cells_without_separator_are_single_tokens():
    cells = ["a", "", None, "b"]
    assert as_lists(column_bags(pa.array(cells), "f", "c", "|")) == [["a"], [], [], ["b"]]
    assert as_lists(column_bags(pa.array([5, None, 6]), "f", "c", None)) == [[5], [], [6]]


def test_list_columns_drop_nulls_and_empty_tokens():
    cells = [["1", "", "2"], None, [], ["3", None]]
    array = pa.array(cells, pa.list_(pa.string()))
    assert list_lengths(array).tolist() == [3, 0, 0, 2]
    assert as_lists(column_bags(array, "f", "c", None)) == reference_bags(cells, None)
    assert as_lists(column_bags(array.slice(2), "f", "c", None)) == [[], ["3"]]


def test_truncate_keeps_the_first_items_of_each_bag():
    bags = truncate(column_bags(pa.array(["1|2|3", "4", "5|6|7|8"]), "f", "c", "|"), 2)
    assert as_lists(bags) == [["1", "2"], ["4"], ["5", "6"]]


@pytest.mark.parametrize("default", ["", "0"], ids=["no-default", "default"])
def test_dictionary_columns_split_and_fill_like_plain_ones(default):
    # parquet files keep categorical string columns dictionary-encoded
    bags = column_bags(pa.array(CELLS).dictionary_encode(), "f", "c", "|", default)
    assert as_lists(bags) == reference_bags(CELLS, "|", default)
    cells = [["1", "", "2"], None, [], ["3", None]]
    items = pa.array([t for c in cells for t in (c or [])]).dictionary_encode()
    array = pa.ListArray.from_arrays(pa.array([0, 3, 3, 3, 5], pa.int32()), items,
                                     mask=pa.array([False, True, False, False]))
    assert as_lists(column_bags(array, "f", "c", None, default)) == \
        reference_bags(cells, None, default)


@pytest.mark.parametrize("list_type", [pa.list_(pa.float64()), pa.list_(pa.float64(), 2)],
                         ids=["list", "fixed-size-list"])
def test_list_column_default_is_split_on_the_separator(list_type):
    array = pa.array([[1.0, 2.0], None, [3.0, 4.0]], list_type)
    bags = column_bags(array, "f", "c", ",", "0,0.5")
    assert as_lists(bags) == [[1.0, 2.0], [0.0, 0.5], [3.0, 4.0]]


def test_list_column_default_that_does_not_fit_names_feature_and_column():
    array = pa.array([[1], None], pa.list_(pa.int64()))
    with pytest.raises(FeatureError, match=r"'f': default_value 'x' does not fit column 'c'"):
        column_bags(array, "f", "c", None, "x")


NULL_LISTS = {"list": pa.list_(pa.null()), "large-list": pa.large_list(pa.null()),
              "fixed-size-list": pa.list_(pa.null(), 2)}


@pytest.mark.parametrize("kind", NULL_LISTS)
@pytest.mark.parametrize("default", ["", "7"], ids=["no-default", "default"])
def test_lists_of_nulls_are_missing_cells(kind, default):
    # pyarrow infers list<null> for a column whose lists are all empty or null
    size = NULL_LISTS[kind].list_size if kind == "fixed-size-list" else 0
    array = pa.array([[None] * size, None, [None] * size], NULL_LISTS[kind])
    assert as_lists(column_bags(array, "f", "c", ",", default)) == \
        [[default] if default else []] * 3
    assert missing_cells(array).tolist() == [True] * 3
    items = sequence_items(array, "f", "c", "|", default)  # a missing cell: one default item
    assert items.values.to_pylist() == ([default] * 3 if default else [])
    assert items.lengths.tolist() == [1 if default else 0] * 3


@pytest.mark.parametrize("string_type", [pa.string(), pa.large_string()],
                         ids=["string", "large-string"])
def test_first_values_skip_empty_ones(string_type):
    items = pa.array(["x", "a,b", ",c,d", None, "", ",", "e,"], string_type)
    assert first_values(items, ",").to_pylist() == ["x", "a", "c", None, None, None, "e"]
    assert first_values(items.slice(2, 3), ",").to_pylist() == ["c", None, None]


def test_a_missing_item_takes_the_first_value_of_a_default_of_several():
    # "5\x036" is an item of two values, of which an id sequence reads the first: a missing
    # item reads it so too, as the missing cell does (before, it failed as one token)
    items = sequence_items(pa.array(["1;;2", None]), "f", "c", ";", "5\x036", "\x03")
    assert items.values.to_pylist() == ["1", "5", "2", "5"]
    assert items.lengths.tolist() == [3, 1]
