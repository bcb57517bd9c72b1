"""Run an exported model on parquet or CSV files and write its predictions as parquet.

Usage::

    python -m hashrec.predict --scripted_model_path <export_dir> \\
        --predict_input_path <files, dirs or globs> --predict_output_path <out> \\
        [--reserved_columns a,b] [--batch_size N] [--device cpu|cuda]

The input is read and parsed with the exported pipeline config's data and
feature settings; the parsed tensors feed ``scripted_model.pt``. The output
holds the reserved columns, then ``probs`` and ``logits`` (one row per input
row). ``--predict_output_path`` ending in ``.parquet`` names the file; any
other path is a directory that receives ``part-00000.parquet``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hashrec.export import meta
from hashrec.export.errors import ExportError

logger = logging.getLogger("hashrec.predict")

PREDICTION_COLUMNS = ("probs", "logits")


def model_inputs(batch, weighted: set[str]) -> tuple[dict, dict, dict, dict, dict]:
    """A parsed Batch as the scripted model's five inputs (values, lengths, weights,
    dense, sequence_dense)."""
    values, lengths, weights = {}, {}, {}
    for name, bags in batch.sparse.to_dict().items():
        values[name], lengths[name] = bags.values, bags.lengths
        if name in weighted and bags.weights is not None:
            weights[name] = bags.weights
    return values, lengths, weights, dict(batch.dense), dict(batch.sequence_dense)


def _output_file(path: str) -> str:
    if path.endswith(".parquet"):
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return path
    os.makedirs(path, exist_ok=True)
    return os.path.join(path, "part-00000.parquet")


def _load(export_dir: str, device: torch.device):
    model_path = os.path.join(export_dir, meta.SCRIPTED_MODEL_FILE)
    config_path = os.path.join(export_dir, meta.PIPELINE_CONFIG_FILE)
    for needed in (model_path, config_path):
        if not os.path.isfile(needed):
            raise ExportError(f"{needed} does not exist; --scripted_model_path must be a "
                              f"directory written by python -m hashrec.export")
    from hashrec.config import load_pipeline_config
    from hashrec.features import build_feature_set

    config = load_pipeline_config(config_path)
    return config, build_feature_set(config), torch.jit.load(model_path, map_location=device)


def _input_data_config(data_config, input_path: str):
    """The exported data_config, switched to the input's format when every input file
    says otherwise by its extension (.csv with a header row, or .parquet)."""
    from hashrec.config import data_pb2
    from hashrec.data.paths import expand_input_path

    suffixes = frozenset(os.path.splitext(f)[1].lower() for f in expand_input_path(input_path))
    kind = {frozenset({".csv"}): data_pb2.CsvDataset,
            frozenset({".parquet"}): data_pb2.ParquetDataset}.get(suffixes)
    if kind is None or kind == data_config.dataset_type:
        return data_config
    switched = type(data_config)()
    switched.CopyFrom(data_config)
    switched.dataset_type = kind
    if kind == data_pb2.CsvDataset:
        del switched.input_fields[:]  # column names and types come from the header row
        switched.with_header = True
    return switched


def _check_reserved(reserved: tuple[str, ...]) -> None:
    clash = [c for c in reserved if c in PREDICTION_COLUMNS]
    if clash:
        raise ExportError(f"--reserved_columns {clash} collide with the prediction columns "
                          f"{list(PREDICTION_COLUMNS)}")
    if len(set(reserved)) != len(reserved):
        raise ExportError(f"--reserved_columns lists a column twice: {list(reserved)}")


def predict(export_dir: str, input_path: str, output_path: str,
            reserved_columns: tuple[str, ...] = (), batch_size: int | None = None,
            device: str | None = None, log_every_s: float = 10.0) -> dict:
    """Predict every row of ``input_path``; returns {"rows", "seconds", "output"}.

    Raises:
        ExportError: not an export directory, or reserved columns that clash.
        DataError, FeatureError: unreadable input or missing columns (they name the file).
    """
    from hashrec.data import create_dataloader

    _check_reserved(reserved_columns)
    run_on = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config, feature_set, model = _load(export_dir, run_on)
    weighted = {f.name for f in feature_set.embedding_features() if f.weighted}
    loader = create_dataloader(_input_data_config(config.data_config, input_path), feature_set,
                               input_path, "predict", batch_size=batch_size,
                               reserved_columns=reserved_columns)
    output = _output_file(output_path)
    writer, rows, start, last_log = None, 0, time.perf_counter(), time.perf_counter()
    try:
        with torch.inference_mode():
            for batch in loader:
                out = model(*model_inputs(batch.to(run_on), weighted))
                columns = {name: batch.reserved[name] for name in reserved_columns}
                for name in PREDICTION_COLUMNS:
                    columns[name] = pa.array(out[name].float().cpu().numpy())
                table = pa.table(columns)
                if writer is None:
                    writer = pq.ParquetWriter(output, table.schema)
                writer.write_table(table)
                rows += table.num_rows
                if time.perf_counter() - last_log >= log_every_s:
                    last_log = time.perf_counter()
                    logger.info("predicted %d rows (%.0f rows/s)", rows,
                                rows / (last_log - start))
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ExportError(f"--predict_input_path {input_path!r} holds no rows")
    seconds = time.perf_counter() - start
    logger.info("predicted %d rows in %.1fs (%.0f rows/s) -> %s", rows, seconds,
                rows / max(seconds, 1e-9), output)
    return {"rows": rows, "seconds": seconds, "output": output}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.predict",
        description="Predict with an exported model; writes parquet with the reserved columns "
                    "and probs, logits.")
    parser.add_argument("--scripted_model_path", required=True,
                        help="export directory (scripted_model.pt and pipeline.config)")
    parser.add_argument("--predict_input_path", required=True,
                        help="comma-separated parquet/csv files, directories and globs; .csv files "
                             "of a parquet-trained model need a header row")
    parser.add_argument("--predict_output_path", required=True,
                        help="output .parquet file, or a directory for part-00000.parquet")
    parser.add_argument("--reserved_columns", default="",
                        help="comma-separated input columns copied to the output")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="rows per batch (default: data_config.eval_batch_size or "
                             "batch_size)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from hashrec.train.cli import run_main, setup_logging

    setup_logging(0)
    if args.batch_size is not None and args.batch_size < 1:
        logger.error("--batch_size must be >= 1, got %d", args.batch_size)
        return 1
    reserved = tuple(c.strip() for c in args.reserved_columns.split(",") if c.strip())
    return run_main(lambda: predict(args.scripted_model_path, args.predict_input_path,
                                    args.predict_output_path, reserved, args.batch_size,
                                    args.device))


if __name__ == "__main__":
    sys.exit(main())
