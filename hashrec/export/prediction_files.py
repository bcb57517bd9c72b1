"""The output file of ``predict`` (and of the tools that write predictions like it).

``--predict_output_path`` ending in ``.parquet`` names the file; any other path is a
directory that receives ``part-00000.parquet`` (a new path ending in ``.csv``, ``.txt``
or another text format is refused: the output is parquet). An existing output file, or
a directory output that holds files, is refused unless ``--overwrite`` is given, and an
output that is one of the input files always is. The rows go to a hidden staging file
next to the output (``staging_file``), in parts, one per loader worker
(:class:`PartFiles`), joined into it once every row is written; the caller then moves
it into place, or on a failure removes it and the folders made for it
(``discard_staging``); ``staged`` does both for a writer of one file (the tools). A
failed write names the file, with a hint when the disk looks
full (``write_error``).
"""

from __future__ import annotations

import contextlib
import os

import pyarrow as pa
import pyarrow.parquet as pq

from hashrec.checkpoint.errors import disk_full_hint
from hashrec.export.errors import ExportError

PART_FILE = "part-00000.parquet"

# Output paths that ask for a text format, which predict does not write.
_TEXT_SUFFIXES = frozenset({".csv", ".tsv", ".txt", ".json", ".jsonl"})


def output_file(path: str, overwrite: bool) -> str:
    """The parquet file ``--predict_output_path`` names (checked, nothing created).

    Raises:
        ExportError: the path is of the other kind (file / directory), or the output
            exists and ``overwrite`` is False.
    """
    where = f"--predict_output_path {path!r}"
    if path.endswith(".parquet"):
        if os.path.isdir(path):
            raise ExportError(f"{where} is a directory; a path ending in .parquet names the "
                              f"output file")
        if os.path.exists(path) and not overwrite:
            raise ExportError(f"{where} exists; pass --overwrite to replace it, or choose "
                              f"another path")
        return path
    if os.path.exists(path) and not os.path.isdir(path):
        raise ExportError(f"{where} is a file; name a directory (for {PART_FILE}) or a "
                          f"file ending in .parquet")
    if not os.path.isdir(path) and os.path.splitext(path)[1].lower() in _TEXT_SUFFIXES:
        raise ExportError(f"{where}: predictions are written as parquet; name a file "
                          f"ending in .parquet, or a directory (for {PART_FILE})")
    # Hidden names (temporary files, markers) are not data to the readers.
    held = sorted(n for n in os.listdir(path) if not n.startswith((".", "_"))) \
        if os.path.isdir(path) else []
    if held and not overwrite:
        raise ExportError(f"{where} is not empty (it holds {', '.join(held[:5])}); pass "
                          f"--overwrite to replace {PART_FILE} there, or choose another "
                          f"directory")
    return os.path.join(path, PART_FILE)


def check_not_an_input(output: str, input_path: str) -> None:
    """Refuse an output file that is one of the input files, ``--overwrite`` or not: the
    predictions would replace the data they were made from.

    Raises:
        ExportError: naming the file.
    """
    from hashrec.data.paths import expand_input_path

    if not os.path.exists(output):
        return
    with contextlib.suppress(ValueError, OSError):  # unreadable inputs are reported later
        if any(os.path.samefile(output, f) for f in expand_input_path(input_path)):
            raise ExportError(f"--predict_output_path: {output} is one of the input files "
                              f"(--predict_input_path {input_path!r}); predictions never "
                              f"replace their input: choose another output path")


def staging_file(output: str, flag: str = "--predict_output_path"
                 ) -> tuple[str, str | None]:
    """A hidden sibling of ``output`` for the rows until all are written, and the
    outermost folder created for it (None: the output's directory existed).

    Raises:
        ExportError: the directory cannot be created (naming ``flag``).
    """
    directory = os.path.abspath(os.path.dirname(output) or ".")
    created = None
    parent = directory
    while not os.path.exists(parent):
        created, parent = parent, os.path.dirname(parent)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise ExportError(f"{flag}: cannot create {directory}: "
                          f"{err.strerror}") from None
    return os.path.join(os.path.dirname(output), f".{os.path.basename(output)}.tmp"), created


def discard_staging(staging: str, created: str | None) -> None:
    """Remove the staging file and the (empty) folders made for the output."""
    if os.path.exists(staging):
        os.remove(staging)
    folder = os.path.dirname(os.path.abspath(staging))
    while created is not None:
        try:
            os.rmdir(folder)
        except OSError:  # no longer empty: something else writes there
            return
        if folder == created:
            return
        folder = os.path.dirname(folder)


@contextlib.contextmanager
def staged(output: str, flag: str = "--predict_output_path"):
    """Yields the staging file (``staging_file``) to write ``output`` through: moved into
    place when the block completes; removed, with the folders made for it, when the block
    raises (Ctrl-C included), so that no partial output is left."""
    staging, created = staging_file(output, flag)
    try:
        yield staging
        os.replace(staging, output)
    except BaseException:
        discard_staging(staging, created)
        raise


def write_error(path: str, err: OSError) -> ExportError:
    """One line for a failed write of the predictions into ``path`` (a full disk says so)."""
    reason = os.strerror(err.errno) if err.errno else str(err)
    hint = disk_full_hint(err, "another --predict_output_path", "predict again")
    return ExportError(f"cannot write the predictions to {path}: {reason}{hint}")


class PartFiles:
    """Parquet parts of one output file, one per loader worker, joined in worker order.

    A failed write (a full disk, say) raises an ExportError naming the file; the caller
    removes the parts (``remove``).

    Args:
        path: the file the parts join into (the only part for one worker).
        count: number of parts.
    """

    def __init__(self, path: str, count: int) -> None:
        self.path = path
        self.paths = [path] if count == 1 else [f"{path}.{i}" for i in range(count)]
        self.rows = [0] * count
        self._writers: list[pq.ParquetWriter | None] = [None] * count

    def write(self, part: int | None, table: pa.Table) -> None:
        """Appends ``table`` to part ``part``.

        Raises:
            RuntimeError: ``part`` is None or out of range (more batches than expected).
        """
        if part is None or not 0 <= part < len(self.paths):
            raise RuntimeError(f"more batches than the loader's workers were to give "
                               f"(after {sum(self.rows)} rows); the output would be out of "
                               f"order")
        try:
            if self._writers[part] is None:
                self._writers[part] = pq.ParquetWriter(self.paths[part], table.schema)
            self._writers[part].write_table(table)
        except OSError as err:
            raise write_error(self.paths[part], err) from err
        self.rows[part] += table.num_rows

    def close(self) -> None:
        """Closes the parts' writers."""
        for i, writer in enumerate(self._writers):
            if writer is not None:
                try:
                    writer.close()  # writes the file's footer
                except OSError as err:
                    raise write_error(self.paths[i], err) from err
                self._writers[i] = None

    def join(self) -> None:
        """Writes the parts' row groups into ``path``, part 0's first, and removes the
        parts (nothing to do with one part)."""
        written = [p for p, n in zip(self.paths, self.rows) if n]
        if len(written) == 1:
            if written[0] != self.path:
                os.replace(written[0], self.path)
            return
        writer = None
        try:
            try:
                for part in written:
                    reader = pq.ParquetFile(part)
                    if writer is None:
                        writer = pq.ParquetWriter(self.path, reader.schema_arrow)
                    for group in range(reader.num_row_groups):
                        writer.write_table(reader.read_row_group(group))
            finally:
                if writer is not None:
                    writer.close()
        except OSError as err:
            raise write_error(self.path, err) from err
        for part in written:
            os.remove(part)

    def remove(self) -> None:
        """Closes and deletes every part (and ``path``)."""
        for writer in self._writers:
            if writer is not None:
                try:
                    writer.close()
                except Exception:  # noqa: BLE001 - the file is deleted below
                    pass
        self._writers = [None] * len(self.paths)
        for path in {*self.paths, self.path}:
            if os.path.exists(path):
                os.remove(path)
