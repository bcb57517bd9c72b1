"""Column types across files: which are supported, the one schema all files are read
as, and the cast of a file's rows to it.

Every file of a dataset is read as one common schema, whatever the file order: per
column, the type that holds every file's values. A column of nulls alone takes the
other files' type, integer widths widen, integers and floats meet as floats,
string and large_string as large_string, list items as their items do; dictionary
columns keep their dictionary where every file has one (the widest index) and
otherwise become their values' type; booleans meet numbers as those numbers. Integers
meet strings as strings, and uint64 meets signed integers as strings too (no integer
type holds both): an integer's decimal text reads as the same id, value or label as the integer
does (``integers_read_as_text`` names such columns, slower to parse). Types without a
common type (a string and a list, a string and a float) are a DataError naming a file
and the column.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

import pyarrow as pa

from hashrec.data.errors import DataError


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _supported(t: pa.DataType) -> bool:
    if _is_list(t):
        return _supported(t.value_type) and not _is_list(t.value_type)
    if pa.types.is_dictionary(t):
        return _supported(t.value_type)
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_boolean(t) or pa.types.is_null(t))


SUPPORTED_TYPES = ("integers, floats, booleans, strings and lists (list<>, large_list<>, "
                   "fixed_size_list<>) of those")


def check_columns(path: str, schema: pa.Schema, columns: Sequence[str],
                  notes: Mapping[str, str] | None = None) -> pa.Schema:
    """The schema of ``columns`` in ``schema``; DataError on a missing, repeated or unsupported
    column (a missing one's error says its ``notes`` entry, where it has one, else the
    closest name the file has)."""
    fields = []
    for name in columns:
        found = schema.get_all_field_indices(name)
        if len(found) > 1:
            where = " and ".join(str(i + 1) for i in found)
            raise DataError(f"{path}: column {name!r} appears {len(found)} times (columns "
                            f"{where} of {schema.names}): name each column once")
        if not found:
            close = difflib.get_close_matches(name, schema.names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if notes and name in notes:
                hint = f"; {notes[name]}"
            raise DataError(f"{path}: column {name!r} is missing (the file has "
                            f"{schema.names}){hint}")
        field = schema.field(found[0])
        if not _supported(field.type):
            raise DataError(f"{path}: column {name!r} has type {field.type}; supported are "
                            f"{SUPPORTED_TYPES}")
        fields.append(field)
    return pa.schema(fields)


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with dictionaries (of the column or of its list items) as their values' type."""
    if pa.types.is_dictionary(t):
        return t.value_type
    if _is_list(t) and pa.types.is_dictionary(t.value_type):
        return pa.list_(t.value_type.value_type)
    return t


def _number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _integer_text(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The text type integers of one of ``a`` / ``b`` and the other's values meet as: the
    other's string type where it is text, a string where the two are uint64 and a signed
    integer (lists of them likewise); None otherwise."""
    a, b = _plain(a), _plain(b)
    if _is_list(a) and _is_list(b):
        item = _integer_text(a.value_type, b.value_type)
        return None if item is None else pa.list_(item)
    for x, y in ((a, b), (b, a)):
        if pa.types.is_integer(x) and _is_text(y):
            return y
        if pa.types.is_uint64(x) and pa.types.is_signed_integer(y):
            return pa.string()
    return None


def common_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type that holds values of types ``a`` and ``b`` (see the module docstring);
    None when there is none."""
    if a == b:
        return a
    text = _integer_text(a, b)
    if text is not None:
        return text
    for x, y in ((a, b), (_plain(a), _plain(b))):
        try:
            unified = pa.unify_schemas([pa.schema([("c", x)]), pa.schema([("c", y)])],
                                       promote_options="permissive")
            return unified.field(0).type
        except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    if pa.types.is_boolean(a) and _number(b):
        return b
    if pa.types.is_boolean(b) and _number(a):
        return a
    return None


def _common_field(typed: Sequence[tuple[str, pa.Field]]) -> pa.Field:
    """The field all of (file, field) ``typed`` are read as; DataError on a conflict."""
    merged = typed[0][1]
    for path, field in typed[1:]:
        if field.equals(merged):
            continue
        common = common_type(merged.type, field.type)
        if common is None:
            other, clash = next(((p, f) for p, f in typed
                                 if common_type(f.type, field.type) is None), typed[0])
            raise DataError(
                f"{path}: column {field.name!r} has type {field.type}, and {other} has "
                f"{clash.type}: the types have no common type; write the column with one "
                f"type in every file")
        merged = pa.field(field.name, common)
    return merged


def common_schema(schemas: Sequence[tuple[str, pa.Schema]]) -> pa.Schema:
    """The schema every file is read as: per column, the common type of all files' types.

    Args:
        schemas: (file, schema) per file, at least one; the schemas name the same
            columns in the same order (those :func:`check_columns` returns).

    Raises:
        DataError: a column's types have no common type (naming two files, the column
            and their types).
    """
    return pa.schema([_common_field([(path, schema.field(i)) for path, schema in schemas])
                      for i in range(len(schemas[0][1]))])


def integers_read_as_text(schemas: Sequence[tuple[str, pa.Schema]], schema: pa.Schema
                          ) -> list[str]:
    """Per column that some file holds as integers and ``schema`` (their common schema)
    reads as text, a note naming it and a file of each type."""
    notes = []
    for i, field in enumerate(schema):
        if not _is_text(field.type) and not (_is_list(field.type)
                                             and _is_text(field.type.value_type)):
            continue
        kinds: dict[pa.DataType, str] = {}  # item type -> a file holding it
        for path, file_schema in schemas:
            t = _plain(file_schema.field(i).type)
            t = t.value_type if _is_list(t) else t
            if not pa.types.is_null(t):  # a file of nulls holds no values to read
                kinds.setdefault(t, path)
        integer = next((t for t in kinds if pa.types.is_integer(t)), None)
        if integer is not None and len(kinds) > 1:
            other = next(t for t in kinds if t != integer)
            notes.append(f"column {field.name!r} holds {integer} in {kinds[integer]} and "
                         f"{other} in {kinds[other]}: read as strings, which read as the "
                         f"same ids and values, parsed more slowly; write one type")
    return notes


def conform(table: pa.Table, schema: pa.Schema, path: str) -> pa.Table:
    """Cast ``table`` to ``schema`` (column order and types); DataError naming file and column."""
    if table.schema.equals(schema):
        return table
    arrays = []
    for field in schema:
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise DataError(
                    f"{path}: column {field.name!r} has type {column.type}, read as the "
                    f"files' common type {field.type}, and a value does not convert: {e}"
                ) from e
        arrays.append(column)
    return pa.table(arrays, schema=schema)
