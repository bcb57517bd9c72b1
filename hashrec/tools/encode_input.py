"""Write raw input as a feature generation encodes it, for ``fg_mode: FG_NONE`` training.

Usage::

    python -m hashrec.tools.encode_input --pipeline_config_path P --output_dir D \\
        [--edit_config_json J] [--input_path I] [--reserved_columns a,b] [--no_labels] \\
        [--rows_per_file N] [--overwrite]

The config's features parse the input (its ``train_input_path`` unless ``--input_path``
names another), as training on raw input would, and each feature's output is written
as a parquet column named after the feature (``hashrec.features.encoded`` reads it
back): a sparse feature's ids as ``list<int64>`` (rows of its table, or keys of a dynamic
one), a weighted one's as ``list<string>`` of ``id:weight``, a dense raw feature's values
as ``float32`` (value_dim 1) or ``list<float32>``, a sequence raw feature's items as
``list<float32>``, an id sequence of value_dim 0 as ``list<list<int64>>`` (its items' ids).
The labels and the sample weights (but with ``--no_labels``, for
prediction input) are written as numbers, as training read them from the input (a CSV
file's text too): a class label of a task of several classes as ``int64``, the other
labels and the sample weights as ``float32``. ``--reserved_columns`` are copied as they
are.
Training on the output with ``data_config { fg_mode: FG_NONE dataset_type:
ParquetDataset }`` learns what training on the raw input does, without generating the
features every epoch. The features no feature group reads are not written.

A sequence raw feature is written with the items its sequence's id feature keeps; one
without an id feature in its sequence is refused. The output directory follows the data
generators' rules (``hashrec.tools.gen_output``): a new or empty directory, one an
earlier run wrote (replaced), or any with ``--overwrite``; a marker file lists the parts.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hashrec.config import apply_edit_config_json, load_pipeline_config
from hashrec.config.fg_mode import RAW, fg_input, fg_input_setting, fg_mode_conflict
from hashrec.embedding.specs import items_key
from hashrec.tools.gen_output import (
    GeneratorError,
    Progress,
    count,
    prepare_dir,
    stale_files,
    write_marker,
)

MARKER = "_encode_input.json"
NAME = "encode_input"


def _lists(values: np.ndarray | pa.Array, lengths: np.ndarray) -> pa.Array:
    """A list column of ``values`` cut into rows of ``lengths``."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    items = values if isinstance(values, pa.Array) else pa.array(values)
    return pa.ListArray.from_arrays(pa.array(offsets), items)


def _weighted(ids: np.ndarray, weights: np.ndarray) -> pa.Array:
    """``id:weight`` tokens; a float32 weight's text is its shortest round-trip form."""
    return pc.binary_join_element_wise(pa.array(ids).cast(pa.string()),
                                       pa.array(weights.astype(np.float32)).cast(pa.string()),
                                       ":")


def encoded_columns(batch, feature_set) -> dict[str, pa.Array]:
    """One parsed block as encoded columns, by feature name (see the module docstring).

    Raises:
        ValueError: a sequence raw feature without an id feature in its sequence.
    """
    columns: dict[str, pa.Array] = {}
    lengths_of_sequence: dict[str, np.ndarray] = {}
    sequences = feature_set.sequence_names()
    for name in batch.sparse.keys():
        if name not in feature_set.features:  # a multi-value sequence's item sizes
            continue
        jt = batch.sparse[name]
        ids, lengths = jt.values.numpy(), jt.lengths.numpy()
        weighted = feature_set.features[name].weighted  # the others' weights are ones
        items = _weighted(ids, jt.weights.numpy()) if weighted else ids
        if items_key(name) in batch.sparse.keys():  # value_dim 0: list<list<int64>>
            sizes = batch.sparse[items_key(name)]
            items, lengths = _lists(ids, sizes.values.numpy()), sizes.lengths.numpy()
        columns[name] = _lists(items, lengths)
        if name in sequences:
            lengths_of_sequence.setdefault(sequences[name], lengths)
    for name, values in batch.dense.items():
        array = values.numpy()
        columns[name] = pa.array(array[:, 0]) if array.shape[1] == 1 else \
            _lists(array.reshape(-1), np.full(len(array), array.shape[1]))
    for name, values in batch.sequence_dense.items():
        lengths = lengths_of_sequence.get(sequences[name])
        if lengths is None:
            raise ValueError(f"feature {name!r}: a sequence raw feature is written with the "
                             f"items its sequence's id feature keeps, and sequence "
                             f"{sequences[name]!r} has none; its padded values do not say "
                             f"how many items a row holds")
        array = values.numpy()[:, :, 0]
        keep = np.arange(array.shape[1])[None, :] < lengths[:, None]
        columns[name] = _lists(array[keep], lengths)
    return columns


def target_columns(batch, feature_set, targets) -> dict[str, pa.Array]:
    """The labels and sample weights ``targets`` of one parsed block, as the numbers
    training read (checked: a label in range, a weight finite and >= 0): a class label
    of a task of several classes and a PEPNet's domain index as int64, the others as
    float32."""
    ids = set(feature_set.class_labels)
    if feature_set.domain_label is not None:
        ids.add(feature_set.domain_label[0])
    columns = {}
    for name in targets:
        values = batch.labels[name].numpy()
        columns[name] = pa.array(values.astype(np.int64) if name in ids else values)
    return columns


def encode(config, input_path: str, output_dir: str, reserved: tuple[str, ...] = (),
           rows_per_file: int = 1_000_000, batch_size: int = 8192, overwrite: bool = False,
           quiet: bool = False, labels: bool = True) -> tuple[int, list[str]]:
    """Encode ``input_path`` into parquet parts in ``output_dir``; ``labels`` False: the
    input has no labels and sample weights (prediction input), none are read or written.

    Returns:
        (rows written, part file names).

    Raises:
        GeneratorError: the output directory is a file or holds files of its own.
        ValueError: the config reads encoded input already, a reserved column is named as
            a feature, or the input does not parse (ConfigError, DataError, FeatureError
            name the setting, file or row).
    """
    if fg_input(config.data_config) != RAW:
        raise ValueError(f"{fg_input_setting(config.data_config)}: the config reads input a "
                         f"feature generation encoded already; encode_input reads raw input "
                         f"(fg_mode FG_DAG, and fg_encoded false or unset)")
    conflict = fg_mode_conflict(config.data_config)
    if conflict:
        logging.getLogger("hashrec.config").warning("%s", conflict)
    log = Progress(NAME, quiet)
    stale = tuple(stale_files(output_dir, overwrite, MARKER))
    feature_set, keep, loader = _reader(config, input_path, reserved, labels, batch_size)
    targets = feature_set.target_columns if labels else []
    prepare_dir(output_dir, stale, log)
    names: list[str] = []
    writer, in_file, rows = None, 0, 0
    try:
        for batch in loader:
            table = pa.table({**encoded_columns(batch, feature_set),
                              **target_columns(batch, feature_set, targets),
                              **{c: batch.reserved[c] for c in keep}})
            start = 0
            while start < table.num_rows:
                if writer is None:
                    names.append(f"part-{len(names):05d}.parquet")
                    write_marker(output_dir, MARKER, names, rows, complete=False)
                    writer = pq.ParquetWriter(os.path.join(output_dir, names[-1]), table.schema)
                take = min(rows_per_file - in_file, table.num_rows - start)
                writer.write_table(table.slice(start, take))
                start, in_file, rows = start + take, in_file + take, rows + take
                if in_file == rows_per_file:
                    writer.close()
                    writer, in_file = None, 0
            log(f"{rows} rows encoded")
    finally:
        if writer is not None:
            writer.close()
    write_marker(output_dir, MARKER, names, rows, complete=True)
    return rows, names


def _reader(config, input_path: str, reserved: tuple[str, ...], labels: bool,
            batch_size: int):
    """The feature set, the columns copied and a loader of the input's blocks."""
    from hashrec.data import create_dataloader
    from hashrec.features import build_feature_set

    feature_set = build_feature_set(config)
    clash = [c for c in reserved if c in feature_set.features]
    if clash:
        raise ValueError(f"reserved column {clash[0]!r} is named as a feature, whose encoded "
                         f"column the output holds under that name: leave it out of "
                         f"--reserved_columns")
    targets = feature_set.target_columns if labels else []
    named = [c for c in targets if c in feature_set.features]
    if named:  # a PEPNet's domain label may be a feature's name (both read one column)
        raise ValueError(f"label column {named[0]!r} is named as a feature too, whose encoded "
                         f"column the output holds under that name: rename the feature "
                         f"(its expression still reads the column)")
    keep = tuple(c for c in dict.fromkeys(reserved) if c not in targets)
    loader = create_dataloader(config.data_config, feature_set, input_path,
                               "eval" if labels else "predict", batch_size=batch_size,
                               reserved_columns=keep, num_workers=0)
    return feature_set, keep, loader


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m hashrec.tools.{NAME}",
        description="Write raw input as a feature generation encodes it: one parquet column "
                    "per feature, named after it, for training with data_config { fg_mode: "
                    "FG_NONE }.")
    p.add_argument("--pipeline_config_path", required=True,
                   help="the pipeline config whose features encode the input (raw input: "
                        "fg_mode FG_DAG, FG_NORMAL or unset)")
    p.add_argument("--edit_config_json", default=None,
                   help="JSON object of dotted config overrides, as train_eval takes them, "
                        "e.g. '{\"data_config.dataset_type\": \"CsvDataset\"}'")
    p.add_argument("--input_path", default=None,
                   help="files, directories or glob patterns, comma-separated (default: the "
                        "config's train_input_path)")
    p.add_argument("--output_dir", required=True,
                   help="where the part-*.parquet files go: a new or empty directory, or one "
                        "an earlier run wrote (its files are replaced); see --overwrite")
    p.add_argument("--reserved_columns", default="",
                   help="input columns copied as they are, comma-separated (the labels and "
                        "sample weights are written always, as numbers)")
    p.add_argument("--no_labels", action="store_true",
                   help="the input has no label or sample weight columns (prediction "
                        "input): none are read or written")
    p.add_argument("--rows_per_file", type=count(), default=1_000_000,
                   help="rows of each output file (default 1000000)")
    p.add_argument("--batch_size", type=count(), default=8192,
                   help="rows parsed at a time (default 8192)")
    p.add_argument("--overwrite", action="store_true",
                   help="also write into a directory that holds files of its own (its "
                        "part-*.parquet files are deleted first)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = load_pipeline_config(args.pipeline_config_path)
        if args.edit_config_json:
            config = apply_edit_config_json(config, args.edit_config_json)
        input_path = args.input_path or config.train_input_path
        if not input_path:
            raise ValueError("no input: pass --input_path or set train_input_path")
        reserved = tuple(c for c in args.reserved_columns.split(",") if c)
        rows, names = encode(config, input_path, args.output_dir, reserved, args.rows_per_file,
                             args.batch_size, args.overwrite, args.quiet,
                             labels=not args.no_labels)
    except (GeneratorError, ValueError) as err:
        print(f"{NAME}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{NAME}: stopped; {args.output_dir} holds a partial output (its marker "
              f"{MARKER} says complete: false)", file=sys.stderr)
        return 130
    use = "predict on them with a model exported from a config of" if args.no_labels else \
        "train on them with"
    print(f"{NAME}: wrote {rows} rows in {len(names)} files to {args.output_dir}; {use} "
          f"data_config {{ fg_mode: FG_NONE dataset_type: ParquetDataset }}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
