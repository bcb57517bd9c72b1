"""Run an exported model on parquet or CSV files and write its predictions as parquet.

Usage::

    python -m hashrec.predict --scripted_model_path <export_dir> \\
        --predict_input_path <files, dirs or globs> --predict_output_path <out> \\
        [--reserved_columns a,b] [--output_columns c,d] [--batch_size N]
        [--device auto|cpu|cuda[:i]] [--overwrite]

The input is read and parsed with the exported pipeline config's data and feature
settings (``hashrec.export.loading``; parquet or CSV as the files' extensions, else their
first bytes, tell); the parsed tensors feed ``scripted_model.pt``. The output
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
writes its ``<tower>_tower_emb`` (HSTU match's item tower reads an item catalog, one item
a row, as ``hashrec.export.item_catalog`` says); MIND's ``user_tower_emb`` is a list of K
interests, each a list of D float32 (those beyond a user's count zero).
``--predict_output_path`` ending in ``.parquet`` names the file; any other path is a
directory that receives ``part-00000.parquet`` (a new path ending in ``.csv``, ``.txt``
or another text format is refused: the output is parquet). The rows go to hidden temporary
files next to the output (``hashrec.export.prediction_files``; one per loader worker, each
reading a contiguous slice of the input), joined into the output once every row is
written, so a failed or interrupted
run (Ctrl-C, or SIGTERM to the command) leaves no partial output, nor the folders it
made for it (and an output it was to replace is kept). An existing output file, or a
directory output that holds files, is refused unless ``--overwrite`` is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import pyarrow as pa
import torch

from hashrec.export.errors import ExportError
from hashrec.export.item_catalog import item_tower_input
from hashrec.export.loading import (
    DEVICES,
    device_arg,
    input_data_config,
    load_export,
    model_inputs,
    resolve_device,
)
from hashrec.export.output_lock import OutputLock
from hashrec.export.prediction_files import (
    PART_FILE,
    PartFiles,
    check_not_an_input,
    discard_staging,
    output_file,
    staging_file,
    write_error,
)
from hashrec.export.towers import check_tower_outputs, note_tower_columns

logger = logging.getLogger("hashrec.predict")


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
    data_config = input_data_config(config.data_config, input_path)
    if tower is not None and tower["tower"] == "item":  # hstu_match's reads an item catalog
        feature_set = item_tower_input(feature_set, config, data_config, input_path)
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
    loader = create_dataloader(data_config, feature_set, input_path, "predict",
                               batch_size=batch_size, reserved_columns=reserved_columns)
    staging, created = staging_file(output)
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
            raise write_error(output, err) from err
    except BaseException:  # Ctrl-C and, under the command line, SIGTERM included
        parts.remove()
        lock.release()
        discard_staging(staging, created)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.predict",
        description="Predict with an exported model; writes parquet with the prediction "
                    "columns (logits, probs; a regression model: logits, y; a model of "
                    "several classes: logits and probs as a list of floats a row, and "
                    "with two classes probs1; a multi-task model: each of these with the "
                    "suffix _<tower_name> (dlrm_hstu: with _<task_name>, each a list a row, "
                    "one value per candidate slot); a match model: user_tower_emb, item_tower_emb "
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
    parser.add_argument("--device", type=device_arg, default="auto",
                        help=f"{DEVICES} (default auto: cuda if present, else cpu)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output file (in a directory output: "
                             f"{PART_FILE}, other files there are kept), never one of the "
                             "input files; without it an existing output file or a non-empty "
                             "output directory is refused")
    return parser


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
