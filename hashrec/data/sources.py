"""File formats: list a file's independently readable pieces and read row ranges of them.

A *piece* is a parquet row group or a whole CSV file. Sources check, when the
pieces are listed, that every file with rows has the needed columns with
supported types; a file without rows (zero bytes, a parquet footer counting no rows, a
CSV header alone) has no pieces, whatever its columns. Later reads cast every piece to the
files' common schema (:mod:`hashrec.data.schema`) so that batches spanning files
concatenate.

CSV cells mean the same whatever the other rows hold: a column whose type
``input_fields`` does not give is read as text (the features, labels and sample
weights parse text), and a cell is missing when it is empty or one of the null markers
``CSV_NULL_TEXTS`` (``NA``, ``NULL``, ``null``, ``N/A``, Hive's ``\\N`` ...) in any
column; ``NaN`` is not one: in a numeric column it is the number NaN, which a raw
feature refuses naming the row, as it does parquet's NaN.
"""

from __future__ import annotations

import csv
import itertools
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from hashrec.data.errors import DataError
from hashrec.data.schema import check_columns


@dataclass(frozen=True)
class Piece:
    """Rows of one file that can be read on their own.

    Attributes:
        path: the file.
        index: row group (parquet) or 0 (CSV).
        num_rows: rows in the piece.
        first_row: rows of the file before the piece (to name a row in the file).
    """

    path: str
    index: int
    num_rows: int
    first_row: int = 0


class ParquetSource:
    """Parquet files; pieces are row groups.

    Args:
        columns: columns to read.
        notes: column -> why it is read, for the error of a file without it.
    """

    def __init__(self, columns: Sequence[str], notes: Mapping[str, str] | None = None) -> None:
        self.columns = list(columns)
        self.notes = dict(notes or {})

    def pieces(self, path: str) -> tuple[list[Piece], pa.Schema]:
        """Non-empty row groups of ``path`` and the schema of the needed columns; a file
        without rows (zero bytes, or a footer counting no rows, whatever its columns)
        has no pieces and an empty schema, as a CSV file without rows."""
        if _size(path) == 0:
            return [], pa.schema([])
        meta = _metadata(path)
        if meta.num_rows == 0:
            return [], pa.schema([])
        schema = check_columns(path, meta.schema.to_arrow_schema(), self.columns, self.notes)
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        starts = itertools.accumulate(sizes, initial=0)
        return [Piece(path, i, n, first) for i, (n, first) in enumerate(zip(sizes, starts))
                if n], schema

    @staticmethod
    def column_names(path: str) -> list[str]:
        """The columns ``path`` holds (none in a file of zero bytes)."""
        return [] if _size(path) == 0 else _metadata(path).schema.to_arrow_schema().names

    def read_spans(self, piece: Piece, spans: Sequence[tuple[int, int]], use_threads: bool
                   ) -> Iterator[tuple[int, pa.Table]]:
        """The rows of each of ``spans`` (ascending, disjoint [start, stop) row ranges of
        ``piece``) as (start, table) pairs. A row group read whole is decoded at once;
        one read in part (another reader has the rest) is decoded in blocks of
        ``PARQUET_BLOCK_ROWS`` up to the last span, so that readers sharing a large row
        group neither decode its rows past their own nor hold all of it in memory."""
        if not spans:
            return
        whole = spans[0][0] == 0 and spans[-1][1] == piece.num_rows
        try:
            file = pq.ParquetFile(piece.path)
            if whole:
                blocks = [file.read_row_group(piece.index, columns=self.columns,
                                              use_threads=use_threads)]
            else:
                blocks = file.iter_batches(PARQUET_BLOCK_ROWS, row_groups=[piece.index],
                                           columns=self.columns, use_threads=use_threads)
            yield from _cut_spans(blocks, spans)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{piece.path}: reading row group {piece.index} failed: {e}") from e
        except _Short as short:
            raise DataError(f"{piece.path}: row group {piece.index} has {short.rows} rows, "
                            f"expected {piece.num_rows} (the file changed while being "
                            f"read?)") from None


# Rows a parquet row group read in part is decoded in at a time (``read_spans``).
PARQUET_BLOCK_ROWS = 1 << 16


def _metadata(path: str) -> pq.FileMetaData:
    """The parquet footer of ``path``; DataError for a file that is not parquet."""
    try:
        return pq.read_metadata(path)
    except (OSError, pa.ArrowException) as e:
        hint = ("; it looks like text: for CSV input set data_config.dataset_type: "
                "CsvDataset (with input_fields or with_header)"
                if _looks_like_text(path) else "")
        raise DataError(f"{path}: not a readable parquet file: {e}{hint}") from e


def _cut_spans(blocks: Iterable[pa.Table | pa.RecordBatch], spans: Sequence[tuple[int, int]]
               ) -> Iterator[tuple[int, pa.Table]]:
    """The rows of each of ``spans`` (ascending, disjoint [start, stop) ranges of the rows
    of ``blocks`` laid end to end) as (start, table) pairs, a span in one or more tables;
    ``blocks`` is read up to the last span's end. Raises _Short when the blocks end
    first."""
    at, seen = 0, 0  # the next span, rows before the block
    for block in blocks:
        end = seen + block.num_rows
        while at < len(spans) and spans[at][0] < end:
            start, stop = spans[at]
            lo, hi = max(start, seen), min(stop, end)
            part = block.slice(lo - seen, hi - lo)
            yield lo, part if isinstance(part, pa.Table) else pa.Table.from_batches([part])
            if stop > end:  # the span goes on in the next block
                break
            at += 1
        seen = end
        if at == len(spans):
            return
    raise _Short(seen)


class _Short(Exception):
    """Blocks ended before the last span: ``rows`` rows were read."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


# The texts a CSV cell is missing as, in every column: pyarrow's null markers but for its
# spellings of NaN (a raw feature's NaN is an error naming the row, as in parquet, not its
# default value), and Hive's \N.
CSV_NULL_TEXTS = ("", "#N/A", "#N/A N/A", "#NA", "N/A", "n/a", "NA", "NULL", "null", "\\N")

_CSV_TYPES = {
    "INT32": pa.int32(), "INT64": pa.int64(), "STRING": pa.string(), "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    # Array fields are separator-joined strings in CSV; the features split them.
    "ARRAY_INT32": pa.string(), "ARRAY_INT64": pa.string(), "ARRAY_STRING": pa.string(),
    "ARRAY_FLOAT": pa.string(), "ARRAY_DOUBLE": pa.string(),
}


@dataclass(frozen=True)
class CsvFormat:
    """How CSV files are laid out.

    Attributes:
        input_fields: (name, type name) per column in file order; type names are
            the DataConfig FieldType names (INT64, STRING, ...) or None to read the
            column as text. Empty: names come from the header row and every column
            is read as text.
        delimiter: one-character field delimiter.
        with_header: the first line holds column names; they name the columns (as in
            TorchEasyRec), and ``input_fields`` then only gives types, by name.
    """

    input_fields: tuple[tuple[str, str | None], ...] = ()
    delimiter: str = ","
    with_header: bool = False

    def __post_init__(self) -> None:
        if len(self.delimiter) != 1:
            raise ValueError(f"delimiter must be one character, got {self.delimiter!r}")
        if not self.input_fields and not self.with_header:
            raise ValueError("CSV input needs input_fields or with_header=true to name columns")
        for name, kind in self.input_fields:
            if kind is not None and kind not in _CSV_TYPES:
                raise ValueError(f"input_fields {name!r}: input_type {kind!r} is not one of "
                                 f"{sorted(_CSV_TYPES)}")


def _head(path: str, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` as stored (b"" when unreadable)."""
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


def _size(path: str) -> int | None:
    """Bytes in ``path`` (None when it cannot be read)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def is_parquet_file(path: str) -> bool:
    """Whether ``path`` starts as parquet files do (magic ``PAR1``)."""
    return _head(path, 4) == b"PAR1"


def _looks_like_text(path: str) -> bool:
    """Whether the start of ``path`` is printable UTF-8 text (a CSV file, for one)."""
    head = _head(path, 4096)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:  # a character cut at the end of the sample is fine
        if e.start < len(head) - 3:
            return False
        text = head[:e.start].decode("utf-8")
    return bool(text) and all(c.isprintable() or c in "\t\r\n" for c in text)


def _blank(path: str) -> bool:
    """Whether ``path`` holds (once decompressed, as the CSV reader does) no more than
    line breaks."""
    try:
        with pa.input_stream(path, compression="detect") as stream:
            while chunk := stream.read(1 << 16):
                if chunk.strip(b"\r\n"):
                    return False
    except (OSError, pa.ArrowException):
        return False
    return True


def _reads_like_row(names: Sequence[str]) -> bool:
    """Whether a CSV header is rather a row of data: half or more of its names are numbers
    (column names rarely are; a row of ids, counts and prices mostly is)."""
    def number(name: str) -> bool:
        try:
            float(name)
        except ValueError:
            return False
        return True
    return bool(names) and 2 * sum(map(number, names)) >= len(names)


class CsvSource:
    """CSV files; each file is one piece (its rows are counted when listed).

    Args:
        columns: columns to read.
        fmt: the CSV layout.
        notes: column -> why it is read, for the error of a file without it.
    """

    def __init__(self, columns: Sequence[str], fmt: CsvFormat,
                 notes: Mapping[str, str] | None = None) -> None:
        self.columns = list(columns)
        self.notes = dict(notes or {})
        self.fmt = fmt

    def _open(self, path: str, columns: Sequence[str], use_threads: bool = True):
        names = [n for n, _ in self.fmt.input_fields]
        types = {n: _CSV_TYPES[k] for n, k in self.fmt.input_fields if k is not None}
        # Untyped columns are text: pyarrow would guess their types from the first block
        # alone, and a later cell that does not fit the guess would fail the read.
        types.update({n: pa.string() for n in self.columns if n not in types})
        read = pacsv.ReadOptions(column_names=None if self.fmt.with_header else names,
                                 use_threads=use_threads)
        convert = pacsv.ConvertOptions(column_types=types, include_columns=list(columns),
                                       null_values=list(CSV_NULL_TEXTS), strings_can_be_null=True)
        parse = pacsv.ParseOptions(delimiter=self.fmt.delimiter)
        if is_parquet_file(path):
            raise DataError(f"{path}: a parquet file, read as CSV; for parquet input set "
                            f"data_config.dataset_type: ParquetDataset (the default)")
        try:
            return pacsv.open_csv(path, read_options=read, parse_options=parse,
                                  convert_options=convert)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: cannot read as CSV: {self._named(path, e)}") from e

    def _batches(self, path: str, columns: Sequence[str], use_threads: bool = True
                 ) -> Iterator[pa.RecordBatch]:
        reader = self._open(path, columns, use_threads)
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowException as e:
                raise DataError(f"{path}: CSV parse error (columns {self.columns}): "
                                f"{self._named(path, e)}") from e
            yield batch

    def _named(self, path: str, error: Exception) -> str:
        """``error``'s text, with the name of the column pyarrow gives by its position
        (``In CSV column #3: ...``) where the header line or input_fields name it."""
        found = re.search(r"CSV column #(\d+)", str(error))
        if found is None:
            return str(error)
        if self.fmt.with_header:
            with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
                names = next(csv.reader(f, delimiter=self.fmt.delimiter), [])
        else:
            names = [name for name, _ in self.fmt.input_fields]
        position = int(found.group(1))
        if position >= len(names):
            return str(error)
        return f"{error} (column {names[position]!r})"

    def column_names(self, path: str) -> list[str]:
        """The columns ``path`` holds: those its header line names, or input_fields' for
        a file without one (none in a file without a line)."""
        try:
            return self._open(path, []).schema.names
        except DataError:
            if _blank(path):  # pyarrow refuses a file without a line
                return []
            raise

    def pieces(self, path: str) -> tuple[list[Piece], pa.Schema]:
        """The file as one piece (rows counted by parsing its first needed column); no
        piece and an empty schema when the file has no rows, whatever its columns."""
        try:
            reader = self._open(path, [])
        except DataError:
            if _blank(path):  # pyarrow refuses a file without a line
                return [], pa.schema([])
            raise
        try:
            schema = check_columns(path, reader.schema, self.columns, self.notes)
        except DataError as e:
            # A file without rows (a header alone) is skipped whatever its columns.
            if reader.schema.names and not self._count(path, reader.schema.names[:1]):
                return [], pa.schema([])
            if self.fmt.with_header and _reads_like_row(reader.schema.names):
                raise DataError(
                    f"{e}; its first line reads like a row, not a header: give the file a "
                    f"header line naming the columns (a CsvDataset config can name them in "
                    f"data_config.input_fields instead, with with_header: false)") from None
            raise
        rows = self._count(path, self.columns[:1])
        return ([Piece(path, 0, rows)] if rows else []), schema

    def _count(self, path: str, columns: Sequence[str]) -> int:
        """Rows of ``path``, parsing ``columns`` alone."""
        return sum(b.num_rows for b in self._batches(path, columns))

    def read_spans(self, piece: Piece, spans: Sequence[tuple[int, int]], use_threads: bool
                   ) -> Iterator[tuple[int, pa.Table]]:
        """The rows of each of ``spans`` (ascending, disjoint [start, stop) row ranges of
        the file) as (start, table) pairs, a span in one or more tables, in one pass over
        the file up to the last span (rows outside the spans are parsed and skipped)."""
        if not spans:
            return
        try:
            yield from _cut_spans(self._batches(piece.path, self.columns, use_threads), spans)
        except _Short as short:
            raise DataError(f"{piece.path}: the file has {short.rows} rows, expected "
                            f"{piece.num_rows} (it changed while being read?)") from None
