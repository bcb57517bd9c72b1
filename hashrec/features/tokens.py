"""Columns -> jagged tokens: the step every feature kind shares.

A column becomes *bags*: ``values`` (a flat pyarrow array of tokens, strings
or int64) and ``lengths`` (B,) int64. Nulls and empty strings are missing
values; a missing value becomes ``default`` when one is given, otherwise an
empty bag. String cells are split on the separator (multi-value features) or
on the sequence delimiter (sequences); ``list<>`` columns are used as they are.

A sequence's items keep their positions (``sequence_items``): a missing item
becomes its feature's ``default`` or stays a null, and the caller drops the null
positions from every sub-feature of the sequence at once (``keep_items``); a missing
cell is one ``default`` item, or has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hashrec.features.errors import FeatureError


@dataclass(frozen=True)
class Bags:
    """Jagged tokens of one column: ``values`` (n,) arrow array, ``lengths`` (B,) int64."""

    values: pa.Array
    lengths: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    def row_of(self, position: int) -> int:
        """Row (0-based) holding flat value ``position``."""
        return int(np.searchsorted(np.cumsum(self.lengths), position, side="right"))


def get_column(table: pa.Table | pa.RecordBatch, column: str, feature: str) -> pa.Array:
    """One column as a single arrow array; a missing column is a FeatureError."""
    if column not in table.schema.names:
        raise FeatureError(f"feature {feature!r}: input column {column!r} is missing "
                           f"(columns: {', '.join(table.schema.names)})")
    array = table.column(column)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def string_offsets(values: pa.Array) -> np.ndarray:
    """(n + 1,) offsets of a string array's cells in its data buffer (slices respected)."""
    width = np.dtype(np.int64 if pa.types.is_large_string(values.type) else np.int32)
    if len(values) == 0:
        return np.zeros(1, dtype=width)
    return np.frombuffer(values.buffers()[1], dtype=width, count=len(values) + 1,
                         offset=values.offset * width.itemsize)


def string_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets (n + 1,) int64 from 0, data (offsets[-1],) uint8): a string array's cells'
    bytes, read in place from its data buffer (slices respected)."""
    offsets = string_offsets(values).astype(np.int64)
    buffer = values.buffers()[2] if len(values) else None
    if buffer is None:
        return offsets - offsets[0], np.zeros(0, dtype=np.uint8)
    data = np.frombuffer(buffer, dtype=np.uint8)[offsets[0]:offsets[-1]]
    return offsets - offsets[0], data


def holds_byte(values: pa.Array, byte: int) -> bool:
    """Whether a cell of a string array holds the byte ``byte``: one scan of its bytes."""
    data = string_bytes(values)[1]
    return bool(len(data)) and bool((data == byte).any())


# An integer's canonical decimal text (no "+", no leading zero, no "-0") and a zero fraction.
_ZERO_FRACTION = r"^(0|-?[1-9][0-9]*)\.0+$"
# Any decimal integer text and a zero fraction (num_buckets reads "+7.0" and "007.0" as 7).
_ANY_ZERO_FRACTION = r"^([+-]?[0-9]+)\.0+$"


def integral_text(values: pa.Array, canonical: bool = True) -> pa.Array:
    """A string array with an integer's decimal text followed by a zero fraction read as
    that text (``"12.0"`` -> ``"12"``: pandas writes an integer id column with a missing
    value so, and the float 12.0 is the id 12 too); other tokens unchanged. ``canonical``:
    only the integer's canonical text (``"012.0"``, ``"+12.0"`` and ``"-0.0"`` stay as
    they are); else any (``"+7.0"`` -> ``"+7"``). One pass over the bytes finds whether any
    token holds a ``.`` before a regular expression runs."""
    if not holds_byte(values, ord(".")):
        return values
    return pc.replace_substring_regex(values, _ZERO_FRACTION if canonical else
                                      _ANY_ZERO_FRACTION, r"\1")


def token_text(values: pa.Array) -> pa.Array:
    """Tokens as strings, for hashing and vocabularies: text as it is but for a zero
    fraction (``integral_text``), integers in decimal, integral floats as the integer they
    hold (``98765432101.0`` -> ``"98765432101"``: an integer id column with a missing value
    reaches parquet as floats) and other floats in Arrow's text (``1.5``)."""
    if _is_string(values.type):
        return integral_text(values)
    text = values.cast(pa.string())
    if not pa.types.is_floating(values.type) or not len(values):
        return text
    ints, integral = integral_floats(values)
    if not integral.any():
        return text
    return pc.if_else(pa.array(integral), pa.array(ints).cast(pa.string()), text)


def first_not_converting(values: pa.Array, to: pa.DataType) -> int:
    """The position of the first value of ``values`` that does not cast to ``to``, given
    that the whole array does not: a bisection over slices (a cast per halving)."""
    lo, hi = 0, len(values)  # the first value that does not convert is in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(values.slice(lo, mid - lo), to)
            lo = mid
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
    return lo


def integral_floats(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A float array's (ints (n,) int64, integral (n,) bool): which values are whole
    numbers in the int64 range (nulls are not) and, there, the integer (0 elsewhere)."""
    x = values.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls read as NaN
    with np.errstate(invalid="ignore"):
        integral = np.isfinite(x) & (np.floor(x) == x) & (np.abs(x) < 2.0**63)
    return np.where(integral, x, 0).astype(np.int64), integral


def empty_as_null(strings: pa.Array) -> pa.Array:
    """A string array with its empty strings as nulls (itself where it holds none)."""
    if not len(strings):
        return strings
    empty = np.diff(string_offsets(strings)) == 0  # nulls too: they stay null
    if not empty.any():
        return strings
    return pc.if_else(pa.array(empty), pa.scalar(None, strings.type), strings)


def list_lengths(array: pa.Array) -> np.ndarray:
    """(B,) int64 sizes of a list array's cells; null cells have size 0."""
    if array.null_count:
        return pc.fill_null(pc.list_value_length(array), 0).to_numpy().astype(np.int64)
    return np.diff(array.offsets.to_numpy()).astype(np.int64, copy=False)


def _drop_empty(values: pa.Array, lengths: np.ndarray) -> Bags:
    """Remove null and empty-string tokens, keeping bag membership."""
    keep = present(values)
    if _is_string(values.type):
        filled = np.diff(string_offsets(values)) != 0
        keep = filled if keep is None else keep & filled
    return keep_items(Bags(values, lengths), keep)


def _fill_missing(array: pa.Array, default: str, separator: str | None, feature: str,
                  column: str) -> pa.Array:
    """Missing cells (null, empty string or empty list) -> ``default``; without one,
    cells are kept (they become empty bags later, when tokens are dropped). A list
    column's missing cells get the default's tokens (split on ``separator``)."""
    if not default:
        return array
    array = _missing_as_null(array)
    if array.null_count == 0:
        return array
    try:
        if _is_list(array.type):
            tokens = [t for t in default.split(separator) if t] if separator else [default]
            fill = pa.scalar(tokens, pa.list_(pa.string())).cast(array.type)
        else:
            fill = pa.scalar(default).cast(array.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise FeatureError(f"feature {feature!r}: default_value {default!r} does not fit "
                           f"column {column!r} of type {array.type}") from None
    return pc.fill_null(array, fill)


def _missing_as_null(array: pa.Array) -> pa.Array:
    """``array`` with its missing cells as nulls: empty strings, and empty lists (missing
    too, as in TorchEasyRec)."""
    if _is_string(array.type):
        return empty_as_null(array)
    if _is_list(array.type):
        empty = pc.equal(pc.list_value_length(array), 0)
        if pc.any(empty).as_py():
            return pc.if_else(empty, pa.scalar(None, type=array.type), array)
    return array


def missing_cells(array: pa.Array) -> np.ndarray:
    """(B,) bool: the cells of a column that ``default_value`` fills (``column_bags``):
    null, an empty string or an empty list."""
    missing = pc.is_null(_missing_as_null(_plain(array)))
    return missing.to_numpy(zero_copy_only=False)


def _plain(array: pa.Array) -> pa.Array:
    """A column as ``column_bags`` and ``sequence_items`` read it: an all-null column as
    strings, a list column of null items as all-missing string lists, dictionary cells
    decoded, fixed-size lists as lists."""
    if pa.types.is_null(array.type):  # an all-null column without a type
        array = array.cast(pa.string())
    elif _is_list(array.type) and pa.types.is_null(array.type.value_type):
        # pyarrow infers list<null> where every list of a file is empty or null: no cell
        # holds a value, so every cell is missing (it takes the default, if any)
        array = pa.nulls(len(array), pa.list_(pa.string()))
    array = _decode_dictionary(array)
    if pa.types.is_fixed_size_list(array.type):
        array = array.cast(pa.list_(array.type.value_type))
    return array


def _decode_dictionary(array: pa.Array) -> pa.Array:
    """Dictionary-encoded cells or list items (parquet keeps categorical columns so) as
    plain values, so that they are split, filled and dropped like any other."""
    t = array.type
    if pa.types.is_dictionary(t):
        return array.cast(t.value_type)
    if _is_list(t) and pa.types.is_dictionary(t.value_type):
        return array.cast(pa.list_(t.value_type.value_type))
    return array


def column_bags(array: pa.Array, feature: str, column: str, separator: str | None,
                default: str = "") -> Bags:
    """Split one column into bags of tokens.

    Args:
        array: the column.
        feature: feature name (for errors).
        column: column name (for errors).
        separator: split string cells on it (None: one token per cell).
        default: token for missing cells ("" -> empty bag).
    """
    array = _fill_missing(_plain(array), default, separator, feature, column)
    t = array.type
    if _is_list(t):
        return _drop_empty(pc.list_flatten(array), list_lengths(array))
    if _is_string(t) and separator:
        # Cells without the separator become one-token bags, as in the path below.
        split = pc.split_pattern(array, separator)
        return _drop_empty(pc.list_flatten(split), list_lengths(split))
    if not (_is_string(t) or pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise FeatureError(f"feature {feature!r}: column {column!r} has type {t}; expected "
                           f"integers, floats, strings or lists of them")
    if array.null_count == 0:
        return _drop_empty(array, np.ones(len(array), dtype=np.int64))
    valid = pc.is_valid(array)
    return _drop_empty(array.filter(valid),
                       valid.to_numpy(zero_copy_only=False).astype(np.int64))


def sequence_items(array: pa.Array, feature: str, column: str, delim: str,
                   default: str = "", separator: str | None = None,
                   several: str = "", multi: bool = False) -> Bags:
    """Split one sequence column into its items, keeping every position.

    A string cell is split on ``delim``; a ``list<>`` cell's entries are its items; any
    other cell is one item. A null or empty cell (an empty list too) is one ``default``
    item when a default is given (as in TorchEasyRec), else it has no items. With
    ``separator``, a string item holding several values (``"4\x1d5"``) is its first value
    (``"4"``: an id sequence's ``value_dim`` 1); with ``several`` (why such an item cannot
    be read), an item of several values is a FeatureError naming its row instead. An item
    of a ``list<list<>>`` cell is its list, read the same way. With ``multi`` (an id
    sequence's ``value_dim`` 0) every item is instead a list of all its values
    (``item_values``), and a missing item takes the default's values. An empty or null
    item inside
    a cell stays
    in place as a null, or as ``default`` when one is given, so that item i of every
    sub-feature of one sequence still describes the same item: dropping the missing ones
    is for the caller (``keep_items``), together across the sequence.
    """
    array = _missing_as_null(_plain(array))
    if default and array.null_count and _is_list(array.type):
        array = pc.fill_null(array, pa.scalar([None], array.type))  # one item, filled below
    t = array.type
    if _is_list(t):
        values, lengths = pc.list_flatten(array), list_lengths(array)
    elif _is_string(t):
        if default and array.null_count and delim not in default:
            array = pc.fill_null(array, pa.scalar(default, t))  # one item: the default
        elif default and array.null_count:
            array = pc.fill_null(array, pa.scalar("", t))  # one item, filled below
        split = pc.split_pattern(array, delim)  # a null cell has no items
        values, lengths = pc.list_flatten(split), list_lengths(split)
    elif pa.types.is_integer(t) or pa.types.is_floating(t):
        values, lengths = array, np.ones(len(array), dtype=np.int64)
    else:
        raise FeatureError(f"feature {feature!r}: column {column!r} has type {t}; expected "
                           f"integers, floats, strings or lists of them")
    if multi:
        return Bags(_default_values(item_values(values, separator), default, separator,
                                    feature, column), lengths)
    if several:
        _refuse_several(Bags(values, lengths), separator, feature, column, several)
    if _is_list(values.type):
        values = _first_of_lists(values)
    elif _is_string(values.type):
        values = empty_as_null(first_values(values, separator) if separator else values)
    if default and values.null_count:
        # a missing item takes the default's first value, as a cell's item would
        item = default.split(separator, 1)[0] if separator else default
        try:
            fill = pa.scalar(item).cast(values.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise FeatureError(f"feature {feature!r}: default_value {default!r} does not fit "
                               f"the items of column {column!r} ({values.type})") from None
        values = pc.fill_null(values, fill)
    return Bags(values, lengths)


def item_values(items: pa.Array, separator: str | None) -> pa.Array:
    """Each item's values as a ``list<>``: a ``list<>`` item's non-null entries, a string
    item's non-empty values on ``separator``, any other item itself; an item without any
    value is null (a missing item).

    Example::

        item_values(pa.array(["4\x1d5", "", "6"]), "\x1d")  # [["4", "5"], None, ["6"]]
    """
    if _is_list(items.type):
        flat = pc.list_flatten(items)
        owner = pc.list_parent_indices(items).to_numpy(zero_copy_only=False)
    elif _is_string(items.type) and separator:
        split = pc.split_pattern(items, separator)
        flat = pc.list_flatten(split)
        owner = pc.list_parent_indices(split).to_numpy(zero_copy_only=False)
    else:
        flat, owner = items, np.arange(len(items))
    keep = present(flat)
    if _is_string(flat.type):
        filled = np.diff(string_offsets(flat)) != 0
        keep = filled if keep is None else keep & filled
    if keep is not None:
        flat, owner = flat.filter(pa.array(keep)), owner[keep]
    counts = np.bincount(owner, minlength=len(items)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), flat, mask=pa.array(counts == 0))


def _default_values(items: pa.Array, default: str, separator: str | None, feature: str,
                    column: str) -> pa.Array:
    """``item_values``' lists with each missing item as the values of ``default`` (split on
    ``separator``); without a default, unchanged."""
    if not default or not items.null_count:
        return items
    tokens = [t for t in default.split(separator) if t] if separator else [default]
    try:
        fill = pa.scalar(tokens, pa.list_(pa.string())).cast(items.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise FeatureError(f"feature {feature!r}: default_value {default!r} does not fit "
                           f"the items of column {column!r} ({items.type})") from None
    return pc.fill_null(items, fill)


def _values_per_item(items: pa.Array, separator: str | None) -> np.ndarray:
    """(n,) int64: how many values each item holds (``list<>`` items: their non-null
    entries; string items: their non-empty values on ``separator``; others: one)."""
    if _is_list(items.type):
        flat = pc.list_flatten(items)
        owner = pc.list_parent_indices(items).to_numpy(zero_copy_only=False)
        keep = present(flat)
        return np.bincount(owner if keep is None else owner[keep], minlength=len(items))
    if not (_is_string(items.type) and separator and _holds(items, separator)):
        return np.ones(len(items), dtype=np.int64)
    split = pc.split_pattern(items, separator)
    filled = np.diff(string_offsets(pc.list_flatten(split))) != 0
    owner = np.repeat(np.arange(len(items)), list_lengths(split))
    return np.bincount(owner[filled], minlength=len(items))


def _refuse_several(items: Bags, separator: str | None, feature: str, column: str,
                    why: str) -> None:
    """FeatureError naming the row of the first item of ``items`` holding several values."""
    counts = _values_per_item(items.values, separator)
    several = np.flatnonzero(counts > 1)
    if len(several):
        pos = int(several[0])
        sep = f" (separated by {separator!r})" if separator and \
            not _is_list(items.values.type) else ""
        raise FeatureError(f"feature {feature!r}: column {column!r}", items.row_of(pos),
                           f"item {items.values[pos].as_py()!r} holds {counts[pos]} "
                           f"values{sep}; {why}")


def _first_of_lists(items: pa.Array) -> pa.Array:
    """Each ``list<>`` item's first non-null entry; an item without any is null."""
    flat = pc.list_flatten(items)
    owner = pc.list_parent_indices(items).to_numpy(zero_copy_only=False)
    keep = present(flat)
    at = np.arange(len(flat)) if keep is None else np.flatnonzero(keep)
    rows, first = np.unique(owner[at], return_index=True)
    index = np.full(len(items), -1, dtype=np.int64)
    index[rows] = at[first]
    return flat.take(pa.array(index, mask=index < 0))


def _holds(items: pa.Array, separator: str) -> bool:
    """Whether any string of ``items`` holds ``separator`` (a one-byte one by a scan of
    the bytes, much faster than a substring search per string)."""
    sep = separator.encode()
    if len(sep) == 1 and _is_string(items.type):
        return holds_byte(items, sep[0])
    return bool(pc.any(pc.match_substring(items, separator)).as_py())


def first_values(items: pa.Array, separator: str) -> pa.Array:
    """Each string item's first value on ``separator``, empty values skipped (``"a"`` of
    ``"a\x1db"`` and of ``"\x1da"``); an item without any is null."""
    if not _holds(items, separator):
        return items
    split = pc.split_pattern(items, separator)
    values, lengths = pc.list_flatten(split), list_lengths(split)
    filled = np.flatnonzero(np.diff(string_offsets(values)) != 0)
    owner = np.repeat(np.arange(len(items)), lengths)[filled]
    rows, at = np.unique(owner, return_index=True)  # each item's first filled value
    first = np.full(len(items), -1, dtype=np.int64)
    first[rows] = filled[at]
    return values.take(pa.array(first, mask=first < 0))


def keep_items(bags: Bags, keep: np.ndarray | None) -> Bags:
    """``bags`` with only the tokens where ``keep`` (n,) is true (None: all), each row's
    length counting its kept ones."""
    if keep is None or keep.all():
        return bags
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    bag_ends = np.concatenate([[0], np.cumsum(bags.lengths)])
    new_lengths = np.diff(kept_before[bag_ends]).astype(np.int64)
    return Bags(bags.values.filter(pa.array(keep)), new_lengths)


def present(values: pa.Array) -> np.ndarray | None:
    """(n,) bool: the tokens that are not null (None: all are)."""
    if not values.null_count:
        return None
    return pc.is_valid(values).to_numpy(zero_copy_only=False)


def truncate(bags: Bags, max_length: int) -> Bags:
    """Keep the first ``max_length`` tokens of every bag.

    Sequences are stored most recent first (as behaviour logs list them), so
    this keeps the ``max_length`` most recent items.
    """
    if max_length <= 0 or bags.lengths.size == 0 or int(bags.lengths.max()) <= max_length:
        return bags
    offsets = np.concatenate([[0], np.cumsum(bags.lengths)[:-1]])
    pos = np.arange(len(bags.values)) - np.repeat(offsets, bags.lengths)
    keep = pos < max_length
    return Bags(bags.values.filter(pa.array(keep)), np.minimum(bags.lengths, max_length))
