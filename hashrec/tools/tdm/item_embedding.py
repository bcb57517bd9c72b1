"""Write each item's embedding from a trained TDM: the input of ``cluster_tree``.

Usage::

    python -m hashrec.tools.tdm.item_embedding --pipeline_config_path tdm.config \\
        [--checkpoint_path model_dir/checkpoint-N] --predict_input_path items.parquet \\
        --predict_output_path item_emb.parquet [--item_id_field adgroup_id] \\
        [--reserved_columns cate_id,brand] [--embedding_field item_emb] \\
        [--batch_size 1024] [--device auto|cpu|cuda[:i]] [--overwrite]

As TorchEasyRec's ``TDMEmbedding``, an item's embedding is the TDM's SEQUENCE group's
query (``TDM.item_embedding``): its query features (e.g. the candidate's item id,
category and brand) embedded and concatenated as the model scores a candidate. The model
is the config's with a checkpoint (the latest of its ``model_dir`` unless named)
restored. The item table (parquet: files, directories or globs, comma-separated) holds a
row per item with the query features' input columns; the user-side columns are not read.
The output (parquet: a ``.parquet`` path, or ``part-00000.parquet`` in a directory) holds
per input row, in input order, the ``--item_id_field`` (default: the config's
``tdm_sampler.item_id_field``), the ``--reserved_columns`` and ``--embedding_field``, a
list of float32.
"""

from __future__ import annotations

import argparse
import logging
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hashrec.checkpoint.errors import CheckpointError
from hashrec.data.errors import DataError
from hashrec.export.errors import ExportError
from hashrec.export.loading import resolve_device
from hashrec.export.prediction_files import check_not_an_input, output_file, staged
from hashrec.features.errors import FeatureError
from hashrec.models.tdm import TDM
from hashrec.tools.tdm.init_tree import read_item_table
from hashrec.tools.tdm.retrieval import RetrievalError, restored_session

logger = logging.getLogger("hashrec.tools.tdm.item_embedding")


def item_embeddings(args: argparse.Namespace) -> dict:
    """Runs the command line ``args``; returns {"rows", "dim", "output"}.

    Raises:
        RetrievalError, DataError, ExportError, FeatureError, CheckpointError: naming the
            flag, field or file at fault.
    """
    if args.batch_size < 1:
        raise RetrievalError(f"--batch_size {args.batch_size}; allowed: 1 or more")
    output = output_file(args.predict_output_path, args.overwrite)
    check_not_an_input(output, args.predict_input_path)
    config, session = restored_session(args.pipeline_config_path, args.checkpoint_path,
                                       resolve_device(args.device))
    model, feature_set = session.model, session.feature_set
    if not isinstance(model, TDM):
        raise RetrievalError(f"--pipeline_config_path {args.pipeline_config_path} is a "
                             f"{type(model).__name__}; item embeddings are a TDM's")
    group = model.groups[model.sequence_group]
    if not group.query:
        raise RetrievalError(f"feature group {group.name!r} has no query features: a TDM "
                             f"item's embedding is its query")
    item_id = args.item_id_field or config.data_config.tdm_sampler.item_id_field
    kept = list(dict.fromkeys([item_id, *args.reserved_columns]))
    if args.embedding_field in kept:
        raise RetrievalError(f"--embedding_field {args.embedding_field!r} is also the item "
                             f"id or a reserved column; name another output column")
    query = [c for f in group.query for c in feature_set.features[f.name].columns]
    where = f"--predict_input_path (the query features of feature group " \
            f"{model.sequence_group!r})"
    table = read_item_table(args.predict_input_path, {
        "--item_id_field": [item_id], "--reserved_columns": args.reserved_columns,
        where: query}, input_flag="--predict_input_path")
    _write(output, table, kept, args.embedding_field,
           lambda block: _embed(model, feature_set, block, set(query)), args.batch_size)
    return {"rows": table.num_rows, "dim": group.query_dim, "output": output}


def _embed(model: TDM, feature_set, block: pa.Table, query: set[str]) -> np.ndarray:
    """(rows, Dq) float32 embeddings of the item rows ``block``: every feature column but
    the query's reads as missing."""
    rows = block.num_rows
    columns = {c: block.column(c) if c in query else pa.nulls(rows)
               for c in feature_set.feature_columns}
    batch = feature_set.parse(pa.table(columns), with_labels=False)
    with torch.inference_mode():
        return model.item_embedding(batch.to(model.embedding.device)).float().cpu().numpy()


def _write(output: str, table: pa.Table, kept: list[str], field: str, embed,
           batch_size: int) -> None:
    """``output`` of ``kept`` columns and ``field`` (the embeddings of each block of
    ``batch_size`` rows), written through a hidden sibling file renamed once complete."""
    schema = pa.schema([*(table.schema.field(c) for c in kept),
                        pa.field(field, pa.list_(pa.float32()))])
    with staged(output) as staging, pq.ParquetWriter(staging, schema) as out:
        for start in range(0, table.num_rows, batch_size):
            block = table.slice(start, batch_size)
            vectors = embed(block)
            offsets = np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32)
            lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(vectors.ravel()))
            out.write_table(pa.Table.from_arrays(
                [*(block.column(c) for c in kept), lists], schema=schema))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hashrec.tools.tdm.item_embedding",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--pipeline_config_path", required=True,
                        help="pipeline config of the TDM")
    parser.add_argument("--checkpoint_path", default=None,
                        help="checkpoint to restore (default: model_dir's latest)")
    parser.add_argument("--predict_input_path", required=True,
                        help="parquet item table: files, directories or globs")
    parser.add_argument("--predict_output_path", required=True,
                        help="output parquet file (.parquet) or directory")
    parser.add_argument("--item_id_field", default=None,
                        help="column of the item ids (default: the config's "
                             "tdm_sampler.item_id_field)")
    parser.add_argument("--reserved_columns", default="",
                        type=lambda text: [c.strip() for c in text.split(",") if c.strip()],
                        help="comma-separated input columns copied to the output (e.g. "
                             "cluster_tree's attr fields)")
    parser.add_argument("--embedding_field", default="item_emb",
                        help="output column of the embeddings (default item_emb)")
    parser.add_argument("--batch_size", type=int, default=1024,
                        help="items embedded together (default 1024)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<index>")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = item_embeddings(args)
    except (RetrievalError, DataError, ExportError, FeatureError, CheckpointError) as err:
        print(f"item_embedding: {err}", file=sys.stderr)
        return 2
    print(f"item_embedding: {result['rows']} items, dim {result['dim']} -> "
          f"{result['output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
