"""Run an exported model on parquet or CSV files and write its predictions as parquet.

Usage::

    python -m hashrec.predict --scripted_model_path <export_dir> \\
        --predict_input_path <files, dirs or globs> --predict_output_path <out> \\
        [--reserved_columns a,b] [--output_columns c,d] [--batch_size N]
        [--device auto|cpu|cuda[:i]] [--overwrite]

The input is read and parsed with the exported pipeline config's data and
feature settings (parquet or CSV as the files' extensions, else their first bytes, tell);
the parsed tensors feed ``scripted_model.pt``. The output
holds the model's prediction columns, then the reserved columns as read (a CSV column
whose type ``input_fields`` does not give, as its text), one row per input row, in input
order (files in the order the input path lists them, a directory's files sorted, rows as
stored), whatever ``data_config.num_workers``. As in TorchEasyRec, the prediction columns
are those ``--output_columns`` lists, in its order, or by default all of them sorted by
name: ``logits`` and ``probs`` (``y`` for a regression model, l2_loss); a multi-task
model's ``logits_<tower_name>`` and ``probs_<tower_name>`` (or ``y_<tower_name>``). A
model of C > 1 classes (softmax_cross_entropy, jrc_loss) writes its ``logits`` and
``probs`` as a list of C float32 a row (parquet ``list<float>``, as TorchEasyRec writes
them), and with two classes also ``probs1`` (probs[:, 1], one float32); a match model
(DSSM, DAT, MIND) writes ``user_tower_emb``, ``item_tower_emb`` and ``similarity``, and one
tower's export (``<export_dir>/user`` or ``/item``) reads that tower's columns only and
writes its ``<tower>_tower_emb``; MIND's ``user_tower_emb`` is a list of K interests, each
a list of D float32 (those beyond a user's count zero).
``--predict_output_path`` ending in ``.parquet`` names the file; any other path is a
directory that receives ``part-00000.parquet`` (a new path ending in ``.csv``, ``.txt``
or another text format is refused: the output is parquet). The rows go to hidden temporary files
next to the output (one per loader worker, each reading a contiguous slice of the input),
joined into the output once every row is written, so a failed or interrupted
run (Ctrl-C, or SIGTERM to the command) leaves no partial output, nor the folders it
made for it (and an output it was to replace is kept). An existing output file, or a
directory output that holds files, is refused unless ``--overwrite`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hashrec.checkpoint.errors import disk_full_hint
from hashrec.export import meta
from hashrec.export.errors import ExportError
from hashrec.export.output_lock import OutputLock
from hashrec.export.towers import (
    check_tower_outputs,
    note_tower_columns,
    read_tower_meta,
    tower_feature_set,
)

logger = logging.getLogger("hashrec.predict")

PART_FILE = "part-00000.parquet"
DEVICES = "auto, cpu, cuda or cuda:<index>"
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def model_inputs(batch, weighted: set[str]) -> tuple[dict, dict, dict, dict, dict]:
    """A parsed Batch as the scripted model's five inputs (values, lengths, weights,
    dense, sequence_dense)."""
    values, lengths, weights = {}, {}, {}
    for name, bags in batch.sparse.to_dict().items():
        values[name], lengths[name] = bags.values, bags.lengths
        if name in weighted and bags.weights is not None:
            weights[name] = bags.weights
    return values, lengths, weights, dict(batch.dense), dict(batch.sequence_dense)


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


def _staging_file(output: str) -> tuple[str, str | None]:
    """A hidden sibling of ``output`` for the rows until all are written, and the
    outermost folder created for it (None: the output's directory existed).

    Raises:
        ExportError: the directory cannot be created.
    """
    directory = os.path.abspath(os.path.dirname(output) or ".")
    created = None
    parent = directory
    while not os.path.exists(parent):
        created, parent = parent, os.path.dirname(parent)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise ExportError(f"--predict_output_path: cannot create {directory}: "
                          f"{err.strerror}") from None
    return os.path.join(os.path.dirname(output), f".{os.path.basename(output)}.tmp"), created


def _discard(staging: str, created: str | None) -> None:
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


def resolve_device(device: str | None) -> torch.device:
    """``device`` (auto, cpu, cuda or cuda:<index>; None: auto) as a torch.device.

    Raises:
        ExportError: another name, or CUDA asked for where it is not available.
    """
    name = device or "auto"
    if not _DEVICE.fullmatch(name):
        raise ExportError(f"--device {name!r} is not supported; allowed: {DEVICES}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run_on = torch.device(name)
    if run_on.type == "cuda":
        if not torch.cuda.is_available():
            raise ExportError(f"--device {name}: CUDA is not available on this machine; use "
                              f"--device cpu or auto")
        if run_on.index is not None and run_on.index >= torch.cuda.device_count():
            raise ExportError(f"--device {name}: this machine has {torch.cuda.device_count()} "
                              f"CUDA device(s)")
    return run_on


def load_export(export_dir: str, device: torch.device):
    """(pipeline config, FeatureSet, scripted model on ``device``, tower meta or None) of
    the export directory ``export_dir``.

    Raises:
        ExportError: not an export directory, or a scripted model that does not load.
    """
    model_path = os.path.join(export_dir, meta.SCRIPTED_MODEL_FILE)
    config_path = os.path.join(export_dir, meta.PIPELINE_CONFIG_FILE)
    for needed in (model_path, config_path):
        if not os.path.isfile(needed):
            raise ExportError(f"{needed} does not exist; --scripted_model_path must be a "
                              f"directory written by python -m hashrec.export")
    from hashrec.config import load_pipeline_config

    config = load_pipeline_config(config_path)
    try:
        model = torch.jit.load(model_path, map_location=device)
    except RuntimeError as err:  # a truncated or overwritten file: torch's reader fails
        # torch's first sentence says what failed; the rest is generic advice.
        reason = str(err).strip().split(". ")[0].splitlines()[0][:200] or "unreadable"
        raise ExportError(f"{model_path} cannot be loaded ({reason}); the file is damaged "
                          f"or incomplete: export the model again with python -m "
                          f"hashrec.export") from None
    tower = read_tower_meta(export_dir, model)
    return config, _feature_set(config, model, model_path, tower), model, tower


def _feature_set(config, model, model_path: str, tower: dict | None):
    """The exported config's FeatureSet (a tower's export: the tower's), with the features
    in no feature group that ``model`` still looks up (exports of versions that embedded
    such features)."""
    from hashrec.features import build_feature_set

    if tower is not None:
        return tower_feature_set(config, tower["tower"])
    feature_set = build_feature_set(config, metric_keys=False)
    looked_up = [n for n in model.embedding.feature_names if n in feature_set.left_out]
    if not looked_up:
        return feature_set
    logger.info("%s looks up features that no feature group names (it was exported by a "
                "version that embedded them): %s; they are read from the input for it",
                model_path, ", ".join(looked_up))
    return build_feature_set(config, keep=looked_up, metric_keys=False)


def input_data_config(data_config, input_path: str):
    """The exported data_config, switched to the input's format when every input file
    says otherwise by its extension (.csv with a header row, or .parquet) or, where the
    extensions tell nothing (.txt, .tsv, none), by its first bytes: parquet files start
    with ``PAR1``, and files that do not, given to a parquet-trained model, are read as
    CSV with a header row.

    Raises:
        DataError: the input holds both .csv and .parquet files.
    """
    from hashrec.config import data_pb2
    from hashrec.data import DataError
    from hashrec.data.paths import expand_input_path
    from hashrec.data.sources import is_parquet_file

    files = expand_input_path(input_path)
    suffixes = frozenset(os.path.splitext(f)[1].lower() for f in files)
    if {".csv", ".parquet"} <= suffixes:
        first = {suffix: next(f for f in files if f.lower().endswith(suffix))
                 for suffix in (".csv", ".parquet")}
        raise DataError(f"--predict_input_path {input_path!r} holds both .csv files (such as "
                        f"{first['.csv']}) and .parquet files (such as {first['.parquet']}); "
                        f"predict reads one format a run: predict the CSV and the parquet "
                        f"files apart")
    kind = {frozenset({".csv"}): data_pb2.CsvDataset,
            frozenset({".parquet"}): data_pb2.ParquetDataset}.get(suffixes)
    if kind is None and not suffixes & {".csv", ".parquet"}:
        parquet = {is_parquet_file(f) for f in files}
        kind = data_pb2.ParquetDataset if parquet == {True} else (
            data_pb2.CsvDataset if parquet == {False} else None)
    if kind is None or kind == data_config.dataset_type:
        return data_config
    switched = type(data_config)()
    switched.CopyFrom(data_config)
    switched.dataset_type = kind
    if kind == data_pb2.CsvDataset:
        del switched.input_fields[:]  # column names and types come from the header row
        switched.with_header = True
    return switched


def _output_columns(wanted: tuple[str, ...] | None, columns: tuple[str, ...]) -> tuple[str, ...]:
    """The prediction columns to write: ``wanted`` (``--output_columns``) checked against
    the model's ``columns``, or all of them sorted by name (TorchEasyRec's default).

    Raises:
        ExportError: a wanted column the model does not give, or one listed twice.
    """
    if not wanted:
        return tuple(sorted(columns))
    unknown = [c for c in wanted if c not in columns]
    if unknown:
        raise ExportError(f"--output_columns {unknown} are not columns of the model; it gives "
                          f"{', '.join(sorted(columns))}")
    if len(set(wanted)) != len(wanted):
        raise ExportError(f"--output_columns lists a column twice: {list(wanted)}")
    return tuple(wanted)


def _check_reserved(reserved: tuple[str, ...], columns: tuple[str, ...]) -> None:
    clash = [c for c in reserved if c in columns]
    if clash:
        raise ExportError(f"--reserved_columns {clash} collide with the prediction columns "
                          f"{list(columns)}")
    if len(set(reserved)) != len(reserved):
        raise ExportError(f"--reserved_columns lists a column twice: {list(reserved)}")


def _prediction_columns(config) -> tuple[str, ...]:
    """The columns the exported model of ``config`` gives, in output order: each task's
    prediction (``probs`` or ``y``, suffixed ``_<tower_name>`` in a multi-task model, and
    ``_<tower_name>_<k>`` for each domain of a PEPNet's towers per domain), then each
    task's logits."""
    from hashrec.models.tasks import model_tasks, output_tasks, prediction_columns, task_domains

    data = config.data_config
    tasks = model_tasks(config.model_config, data.label_fields, data.sample_weight_fields)
    return prediction_columns(output_tasks(tasks, task_domains(config.model_config)[1]))


def predict(export_dir: str, input_path: str, output_path: str,
            reserved_columns: tuple[str, ...] = (), batch_size: int | None = None,
            device: str | None = None, log_every_s: float = 10.0,
            overwrite: bool = False, output_columns: tuple[str, ...] | None = None) -> dict:
    """Predict every row of ``input_path``; returns {"rows", "seconds", "output"}.

    The output rows follow the input rows' order; each of the exported
    ``data_config.num_workers`` loader workers reads a contiguous slice of the input
    and writes its predictions to a part file of its own, and the parts are joined in
    order at the end. The output appears only when every row is predicted (see the
    module docstring). ``output_columns``: the prediction columns to write, in order
    (None or empty: all, sorted by name).

    Raises:
        ExportError: not an export directory, output columns the model does not give,
            reserved columns that clash with them, a bad device,
            an output path that exists (without ``overwrite``) or is of the wrong kind,
            another predict writing the same output (``hashrec.export.output_lock``), or
            a failed write of the output (named, with a hint when the disk looks full).
        DataError, FeatureError: unreadable input or missing columns (they name the file).
    """
    from hashrec.data import create_dataloader

    output = output_file(output_path, overwrite)
    check_not_an_input(output, input_path)
    run_on = resolve_device(device)
    config, feature_set, model, tower = load_export(export_dir, run_on)
    note_tower_columns(feature_set, config, export_dir, tower)
    if tower is not None:
        check_tower_outputs(output_columns, tower, export_dir)
        logger.info("%s is the %s tower of a %s model alone: it reads the columns %s and "
                    "writes %s", export_dir, tower["tower"], tower["model"],
                    ", ".join(feature_set.feature_columns), tower["output"])
    # The model's own columns: an input column named like another model's may be kept.
    columns = _output_columns(output_columns, (tower["output"],) if tower is not None
                              else _prediction_columns(config))
    _check_reserved(reserved_columns, columns)
    weighted = {f.input_key for f in feature_set.embedding_features() if f.weighted}
    loader = create_dataloader(input_data_config(config.data_config, input_path), feature_set,
                               input_path, "predict", batch_size=batch_size,
                               reserved_columns=reserved_columns)
    staging, created = _staging_file(output)
    lock = OutputLock(output)  # before anything is written or discarded
    parts = PartFiles(staging, max(loader.num_workers, 1))
    start = time.perf_counter()
    try:
        rows = _write_predictions(model, loader, weighted, run_on, reserved_columns, columns,
                                  parts, log_every_s)
        if rows == 0:
            raise ExportError(f"--predict_input_path {input_path!r} holds no rows")
        parts.join()
        try:
            os.replace(staging, output)
        except OSError as err:
            raise _write_error(output, err) from err
    except BaseException:  # Ctrl-C and, under the command line, SIGTERM included
        parts.remove()
        lock.release()
        _discard(staging, created)
        raise
    lock.release()
    seconds = time.perf_counter() - start
    logger.info("predicted %d rows in %.1fs (%.0f rows/s) -> %s", rows, seconds,
                rows / max(seconds, 1e-9), output)
    return {"rows": rows, "seconds": seconds, "output": output}


def _write_predictions(model, loader, weighted: set[str], run_on: torch.device,
                       reserved_columns: tuple[str, ...], names: tuple[str, ...],
                       parts: PartFiles, log_every_s: float) -> int:
    """Runs ``model`` on every batch of ``loader`` into ``parts`` (the prediction columns
    ``names``, then the reserved columns); returns the
    number of rows. Each loader worker reads a contiguous slice of the input, in file
    order, and its rows go to its own part.

    Raises:
        RuntimeError: a worker's rows differ from its slice (the loader did not take
            its workers' batches in turn).
    """
    from hashrec.train.progress import duration

    rows, start, last_log = 0, time.perf_counter(), time.perf_counter()
    total = int(loader.dataset.num_rows)
    readers = loader.reader_turns()
    with torch.inference_mode():
        for batch in loader:
            out = model(*model_inputs(batch.to(run_on), weighted))
            columns = {name: prediction_array(out[name]) for name in names}
            columns.update((name, batch.reserved[name]) for name in reserved_columns)
            parts.write(next(readers, None), pa.table(columns))
            rows += batch.batch_size
            if time.perf_counter() - last_log >= log_every_s:
                last_log = time.perf_counter()
                rate = rows / max(last_log - start, 1e-9)
                left = f", about {duration((total - rows) / rate)} left" if rows < total else ""
                logger.info("predicted %d of %d rows (%.0f rows/s%s)", rows, total, rate, left)
    parts.close()
    expected = loader.dataset.reader_rows(loader.dataset.options.rank, loader.num_workers)
    if parts.rows != expected:
        raise RuntimeError(f"the loader's workers gave {parts.rows} rows, their slices hold "
                           f"{expected}; the output would be out of order")
    return rows


def prediction_array(values: torch.Tensor) -> pa.Array:
    """One prediction column: (B,) -> float32; (B, C) (a multi-class model's logits and
    probs) -> a list of C float32 a row, as TorchEasyRec writes a tensor of two
    dimensions (a list per row); (B, K, D) (MIND's interests) -> a list of K lists of D
    float32 a row."""
    flat = values.detach().float().cpu()
    if flat.dim() == 1:
        return pa.array(flat.numpy())
    array, kind = pa.array(flat.reshape(-1).numpy()), pa.float32()
    for width in reversed(flat.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, width)
        kind = pa.list_(kind)
    return array.cast(kind)


def _write_error(path: str, err: OSError) -> ExportError:
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
            raise _write_error(self.paths[part], err) from err
        self.rows[part] += table.num_rows

    def close(self) -> None:
        """Closes the parts' writers."""
        for i, writer in enumerate(self._writers):
            if writer is not None:
                try:
                    writer.close()  # writes the file's footer
                except OSError as err:
                    raise _write_error(self.paths[i], err) from err
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
            raise _write_error(self.path, err) from err
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.predict",
        description="Predict with an exported model; writes parquet with the prediction "
                    "columns (logits, probs; a regression model: logits, y; a model of "
                    "several classes: logits and probs as a list of floats a row, and "
                    "with two classes probs1; a multi-task model: each of these with the "
                    "suffix _<tower_name>; a match model: user_tower_emb, item_tower_emb "
                    "and similarity (MIND's user_tower_emb: a list of max_k interests, each a "
                    "list of floats), the export of one of its towers (<export_dir>/user "
                    "or /item) that tower's embedding alone, from its columns alone; "
                    "sorted by name, or as --output_columns lists them), then the "
                    "reserved columns, one row per input row in input order.")
    parser.add_argument("--scripted_model_path", required=True,
                        help="export directory (scripted_model.pt and pipeline.config), "
                             "or a match model's tower export in it (user or item)")
    parser.add_argument("--predict_input_path", required=True,
                        help="comma-separated parquet/csv files, directories and globs, of "
                             "one format a run (told by the .csv / .parquet extensions, else "
                             "by the files' first bytes); CSV files of a parquet-trained model "
                             "need a header row")
    parser.add_argument("--predict_output_path", required=True,
                        help="output .parquet file, or a directory for part-00000.parquet; "
                             "written only when every row is predicted")
    parser.add_argument("--reserved_columns", default="",
                        help="comma-separated input columns copied to the output")
    parser.add_argument("--output_columns", default="",
                        help="comma-separated prediction columns to write, in this order "
                             "(default: all of them, sorted by name)")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="rows per batch (default: data_config.eval_batch_size or "
                             "batch_size)")
    parser.add_argument("--device", type=_device_arg, default="auto",
                        help=f"{DEVICES} (default auto: cuda if present, else cpu)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output file (in a directory output: "
                             f"{PART_FILE}, other files there are kept), never one of the "
                             "input files; without it an existing output file or a non-empty "
                             "output directory is refused")
    return parser


def _device_arg(text: str) -> str:
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected {DEVICES}, got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from hashrec.train.cli import run_main, setup_logging
    from hashrec.train.interrupt import terminate_raises

    setup_logging(0)
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world_size > 1:
        logger.error("hashrec.predict runs as one process (WORLD_SIZE is %d here): under "
                     "torchrun every rank would write the same output; run it once, or once "
                     "per share of the input with an output path each", world_size)
        return 1
    if args.batch_size is not None and args.batch_size < 1:
        logger.error("--batch_size must be >= 1, got %d", args.batch_size)
        return 1
    reserved = tuple(c.strip() for c in args.reserved_columns.split(",") if c.strip())
    outputs = tuple(c.strip() for c in args.output_columns.split(",") if c.strip())
    # SIGTERM (a scheduler's stop) cleans up as Ctrl-C does: no temporary file is left.
    with terminate_raises():
        return run_main(lambda: predict(args.scripted_model_path, args.predict_input_path,
                                        args.predict_output_path, reserved, args.batch_size,
                                        args.device, overwrite=args.overwrite,
                                        output_columns=outputs),
                        interrupted="no predictions written; an earlier output is kept")


if __name__ == "__main__":
    sys.exit(main())
