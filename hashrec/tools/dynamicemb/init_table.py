"""Reading ``init_table`` files: (id, embedding) rows, validated and deduplicated.

An init table is a parquet or csv file set (comma-separated files, directories and
globs, like input paths). Its first column holds the ids (integers, or strings read
as a dynamic-embedding feature reads them: an integer's canonical decimal text parsed,
other strings hashed); its second column the embedding, as a list of floats or as a
string of floats joined by ``separator``. CSV files have a header row (a first line that reads
like a row is an error).

Rows are handled as follows (and counted in :class:`InitTableReport`):

* an embedding whose length is not the table's dim is an error naming the table,
  the file and the row;
* a null id, a null or unparseable embedding, or a NaN/inf value makes a *bad row*:
  skipped, counted and reported with its file and row (first few); the first
  unparseable embedding value is kept in the report to show what it looked like;
* an id seen before (in this or an earlier file, in path order) is a *duplicate*: the
  first occurrence is kept, later ones are counted and reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from hashrec.data.paths import expand_input_path
from hashrec.features.bucketize import raw_int64_ids
from hashrec.features.errors import FeatureError
from hashrec.features.tokens import Bags
from hashrec.tools.dynamicemb.errors import MigrationError

MAX_EXAMPLES = 5
_BATCH_ROWS = 1 << 16


@dataclass
class InitTableReport:
    """What reading one table's init_table found."""

    table: str
    rows_read: int = 0
    rows_kept: int = 0
    duplicates: int = 0
    bad_rows: int = 0
    examples: list[str] = field(default_factory=list)
    bad_value: str = ""  # the first unparseable embedding as read (at most 4096 characters)

    def note(self, what: str) -> None:
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(what)

    def as_dict(self) -> dict:
        return {"rows_read": self.rows_read, "rows_kept": self.rows_kept,
                "duplicates": self.duplicates, "bad_rows": self.bad_rows,
                "examples": list(self.examples)}


@dataclass(frozen=True)
class ParsedBlock:
    """Rows of one block of one file: ids (n,) int64, embeddings (n, dim) float32, and
    the positions (file row numbers) of both kept and bad rows."""

    file: str
    ids: np.ndarray
    embeddings: np.ndarray
    rows: np.ndarray
    bad: list[tuple[int, str]]
    bad_value: str = ""


def _csv_blocks(path: str, where: str, dim: int, separator: str
                ) -> Iterator[pa.RecordBatch]:
    """A csv file's blocks, the id and embedding columns read as strings (null where
    empty): inferred from the first block, ids would turn from integers to text past it
    (a conversion error) and a one-value embedding would read as a float column."""
    read = pcsv.ReadOptions(block_size=1 << 22)
    try:
        names = pcsv.open_csv(path, read_options=read).schema.names
    except pa.ArrowInvalid as err:
        raise MigrationError(f"{where}: cannot be read as csv ({err})") from None
    if _looks_like_row(names, dim, separator):
        raise MigrationError(
            f"{where}: the first line {','.join(names)!r} is a row, not a header; csv init "
            f"tables need a header line naming the id and embedding columns")
    convert = pcsv.ConvertOptions(column_types={n: pa.string() for n in names[:2]},
                                  strings_can_be_null=True)
    try:
        yield from pcsv.open_csv(path, read_options=read, convert_options=convert)
    except pa.ArrowInvalid as err:
        raise MigrationError(f"{where}: cannot be read as csv ({err})") from None


def _looks_like_row(names: list[str], dim: int, separator: str) -> bool:
    """Whether a csv header (id, embedding, ...) holds an integer and ``dim`` numbers."""
    if len(names) < 2 or not names[0].strip().lstrip("+-").isdigit():
        return False
    try:
        return len([float(v) for v in names[1].split(separator)]) == dim
    except ValueError:
        return False


def _blocks(path: str, table: str, dim: int, separator: str) -> Iterator[pa.RecordBatch]:
    where = f"table {table!r}: {path}"
    if path.endswith(".csv"):
        yield from _csv_blocks(path, where, dim, separator)
        return
    try:
        parquet = pq.ParquetFile(path)
    except pa.ArrowInvalid as err:
        raise MigrationError(f"{where}: not a parquet or .csv file ({err})") from None
    yield from parquet.iter_batches(batch_size=_BATCH_ROWS)


def _string_embeddings(column: pa.Array, separator: str
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A string column -> (flat float32 tokens, token counts, parsed (n,) bool)."""
    split = pc.split_pattern(pc.utf8_trim_whitespace(column), separator)
    parsed = pc.is_valid(split).to_numpy(zero_copy_only=False).copy()
    lengths = pc.fill_null(pc.list_value_length(split), 0).to_numpy().astype(np.int64)
    flat = pc.utf8_trim_whitespace(pc.list_flatten(split))
    try:
        return pc.cast(flat, pa.float32()).to_numpy(zero_copy_only=False), lengths, parsed
    except pa.ArrowInvalid:
        pass
    ok = pc.match_substring_regex(
        flat, r"^[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf|nan|Infinity|NaN)$")
    ok = ok.to_numpy(zero_copy_only=False)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    parsed[np.unique(owner[~ok])] = False
    values = pc.cast(pc.if_else(pa.array(ok), flat, "0"), pa.float32())
    return values.to_numpy(zero_copy_only=False), lengths, parsed


def _embedding_values(column: pa.Array, separator: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (flat float32 values, value counts (n,), parsed (n,) bool: not null, all numbers)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    t = column.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if pa.types.is_fixed_size_list(t):
            column = column.cast(pa.list_(t.value_type))
        parsed = pc.is_valid(column).to_numpy(zero_copy_only=False).copy()
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy().astype(np.int64)
        flat = pc.list_flatten(column)
        if flat.null_count:
            owner = np.repeat(np.arange(len(lengths)), lengths)
            parsed[np.unique(owner[pc.is_null(flat).to_numpy(zero_copy_only=False)])] = False
            flat = pc.fill_null(flat, 0)
        return flat.cast(pa.float32()).to_numpy(zero_copy_only=False), lengths, parsed
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _string_embeddings(column, separator)
    raise MigrationError(f"embedding column has type {t}; expected a list of floats or a "
                         f"string of floats joined by the separator")


def _ids(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """-> (ids (n,) int64 with 0 at nulls, valid (n,) bool)."""
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    if pa.types.is_floating(column.type):
        raise MigrationError(f"id column has type {column.type}; use integers or strings")
    filled = pc.fill_null(column, pa.scalar(0).cast(column.type)) if column.null_count \
        else column
    return raw_int64_ids(Bags(filled, np.ones(len(column), dtype=np.int64))), valid


def parse_block(batch: pa.RecordBatch, path: str, first_row: int, table: str, dim: int,
                separator: str) -> ParsedBlock:
    """Validates one block of rows (see the module docstring).

    Raises:
        MigrationError: fewer than two columns, unusable column types, or an embedding of
            the wrong length (naming table, file and row).
    """
    if batch.num_columns < 2:
        raise MigrationError(f"table {table!r}: {path}: init_table needs two columns (id, "
                             f"embedding), found {batch.schema.names}")
    try:
        ids, valid = _ids(batch.column(0))
        flat, lengths, parsed = _embedding_values(batch.column(1), separator)
    except (MigrationError, FeatureError) as err:
        raise MigrationError(f"table {table!r}: {path}: {err}") from None
    rows = np.arange(first_row, first_row + batch.num_rows)
    wrong = parsed & (lengths != dim) & valid
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise MigrationError(f"table {table!r}: {path} row {rows[i]}: embedding has "
                             f"{lengths[i]} values, the table's embedding_dim is {dim}")
    parsed &= lengths == dim
    matrix = np.zeros((batch.num_rows, dim), dtype=np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    take = offsets[:-1][parsed][:, None] + np.arange(dim)[None, :]
    matrix[parsed] = flat[take] if take.size else matrix[parsed]
    finite = np.isfinite(matrix).all(axis=1)
    reasons = np.where(~valid, "null id", np.where(
        ~parsed, "null or unparseable embedding", np.where(~finite, "NaN or inf value", "")))
    keep = reasons == ""
    bad = [(int(rows[i]), str(reasons[i])) for i in np.flatnonzero(~keep)]
    return ParsedBlock(path, ids[keep], matrix[keep], rows[keep], bad,
                       _first_value(batch.column(1), np.flatnonzero(valid & ~parsed)))


def _first_value(column: pa.Array, positions: np.ndarray, limit: int = 4096) -> str:
    """The first non-null value of ``column`` at ``positions``, as text of at most
    ``limit`` characters ("" if there is none)."""
    for i in positions[:MAX_EXAMPLES]:
        value = column[int(i)].as_py()
        if value is not None:
            text = value if isinstance(value, str) else repr(value)
            return text if len(text) <= limit else text[:limit - 3] + "..."
    return ""


def _parse_file(path: str, table: str, dim: int, separator: str) -> list[ParsedBlock]:
    blocks, first = [], 0
    for batch in _blocks(path, table, dim, separator):
        blocks.append(parse_block(batch, path, first, table, dim, separator))
        first += batch.num_rows
    return blocks


class _FirstSeen:
    """Keeps the first occurrence of every id across blocks (sorted array of seen ids)."""

    def __init__(self) -> None:
        self.seen = np.zeros(0, dtype=np.int64)

    def new_mask(self, ids: np.ndarray) -> np.ndarray:
        _, first = np.unique(ids, return_index=True)
        mask = np.zeros(ids.shape[0], dtype=bool)
        mask[first] = True
        if self.seen.size:
            pos = np.searchsorted(self.seen, ids).clip(max=self.seen.size - 1)
            mask &= self.seen[pos] != ids
        self.seen = np.union1d(self.seen, ids[mask])
        return mask


def read_init_table(init_table: str, report: InitTableReport, dim: int, separator: str = ",",
                    workers: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray, str]]:
    """Yields (ids (n,) int64, embeddings (n, dim) float32, file) of the rows to keep.

    Files are parsed ``workers`` at a time; rows are deduplicated in path order.
    Counts and examples go into ``report`` (whose ``table`` names the table).

    Raises:
        MigrationError: missing files or invalid rows (see the module docstring).
    """
    table = report.table
    try:
        files = expand_input_path(init_table)
    except ValueError as err:
        raise MigrationError(f"table {table!r}: init_table {init_table!r}: {err}") from None
    first_seen = _FirstSeen()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for start in range(0, len(files), max(1, workers)):
            window = files[start:start + max(1, workers)]
            for blocks in pool.map(lambda f: _parse_file(f, table, dim, separator), window):
                for block in blocks:
                    yield _accept(block, first_seen, report)


def _accept(block: ParsedBlock, first_seen: _FirstSeen, report: InitTableReport
            ) -> tuple[np.ndarray, np.ndarray, str]:
    report.rows_read += block.ids.shape[0] + len(block.bad)
    report.bad_rows += len(block.bad)
    report.bad_value = report.bad_value or block.bad_value
    for row, reason in block.bad:
        report.note(f"{block.file} row {row}: {reason} (skipped)")
    fresh = first_seen.new_mask(block.ids)
    duplicates = int((~fresh).sum())
    if duplicates:
        report.duplicates += duplicates
        for row, key in zip(block.rows[~fresh][:MAX_EXAMPLES], block.ids[~fresh]):
            report.note(f"{block.file} row {row}: duplicate id {key} (first kept)")
    report.rows_kept += int(fresh.sum())
    return block.ids[fresh], block.embeddings[fresh], block.file
