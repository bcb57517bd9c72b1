"""Learn a TDM tree from item embeddings: recursive balanced k-means, written as
``init_tree`` writes its tree.

Usage::

    python -m hashrec.tools.tdm.cluster_tree --item_input_path item_emb.parquet \\
        --item_id_field adgroup_id --embedding_field item_emb \\
        --attr_fields cate_id,brand --raw_attr_fields price \\
        --node_edge_output_file learnt_tree/ --n_cluster 2 [--seed 0] \\
        [--tree_output_dir serving/]

The item table is parquet (files, directories or globs, comma-separated), a row per item:
its id, its embedding (``--embedding_field``: a list of numbers, or a text of numbers
separated by commas, optionally in brackets; one length for every item), and the attr
columns; ``python -m hashrec.tools.tdm.item_embedding`` writes one from a trained TDM
(with the attrs as ``--reserved_columns``). The leaves are placed by
``hashrec.tools.tdm.tree_cluster`` (deterministic from ``--seed``) and pulled to the last
level; node ids and attrs are ``init_tree``'s (``hashrec.tools.tdm.tree_builder``), and
so are the files: ``node_table.txt``, ``edge_table.txt``, ``predict_edge_table.txt`` and
``serving_tree`` (see ``hashrec.tools.tdm.init_tree``), for ``data_config.tdm_sampler``
and the retrieval as they are.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hashrec.data.errors import DataError
from hashrec.tools.tdm.init_tree import (
    add_tree_flags,
    fields,
    item_ids,
    read_item_table,
    write_tree,
)
from hashrec.tools.tdm.tree_builder import Tree, check_items, tree_of_leaves
from hashrec.tools.tdm.tree_cluster import cluster_codes


def embedding_matrix(column: pa.ChunkedArray | pa.Array, field: str) -> np.ndarray:
    """(n, d) float64 embeddings of the column ``field`` (``--embedding_field``).

    Raises:
        DataError: missing or non-finite values, lengths that differ, a column of
            another type.
    """
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    where = f"--embedding_field: column {field!r}"
    if column.null_count:
        raise DataError(f"{where} has {column.null_count} missing embeddings")
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = pc.split_pattern(pc.utf8_trim(column, "[] "), ",")
    elif not (pa.types.is_list(kind) or pa.types.is_large_list(kind)
              or pa.types.is_fixed_size_list(kind)):
        raise DataError(f"{where} is {kind}; expected a list of numbers per item or a "
                        f"text of numbers separated by commas")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if len(lengths) and (lengths != lengths[0]).any():
        row = int(np.flatnonzero(lengths != lengths[0])[0])
        raise DataError(f"{where}: row {row} holds {lengths[row]} numbers, row 0 "
                        f"{lengths[0]}; every embedding has one length")
    values = pc.list_flatten(column)
    try:
        numbers = pc.cast(pc.utf8_trim_whitespace(values) if pa.types.is_string(values.type)
                          else values, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(f"{where} does not hold numbers: {err}") from None
    matrix = numbers.to_numpy(zero_copy_only=False).reshape(len(column), -1)
    if not np.isfinite(matrix).all():
        row = int(np.flatnonzero(~np.isfinite(matrix).all(axis=1))[0])
        raise DataError(f"{where}: row {row} holds a missing, NaN or infinite number")
    return matrix


def cluster_tree(args: argparse.Namespace) -> Tree:
    """The tree of the parsed command line ``args``.

    Raises:
        DataError: the item table (naming the flag); ValueError: a bad flag value.
    """
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed}; allowed: 0 or more")
    if args.n_cluster < 2:
        raise ValueError(f"--n_cluster {args.n_cluster}; allowed: 2 or more children a node")
    attrs, raw_attrs = fields(args.attr_fields), fields(args.raw_attr_fields)
    table = read_item_table(args.item_input_path, {
        "--item_id_field": [args.item_id_field], "--embedding_field": [args.embedding_field],
        "--attr_fields": attrs, "--raw_attr_fields": raw_attrs})
    ids = item_ids(table, args.item_id_field)
    try:
        check_items(ids, args.n_cluster)
    except ValueError as err:  # too few items or a repeated id
        raise DataError(f"--item_input_path {args.item_input_path}: {err}") from None
    embeddings = embedding_matrix(table.column(args.embedding_field), args.embedding_field)
    codes = cluster_codes(embeddings, args.n_cluster, seed=args.seed)
    return tree_of_leaves(ids, codes, [table.column(c).combine_chunks() for c in attrs],
                          [table.column(c).combine_chunks() for c in raw_attrs],
                          args.n_cluster)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hashrec.tools.tdm.cluster_tree",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--item_input_path", required=True,
                        help="parquet item table with the embeddings: files, directories "
                             "or globs, comma-separated")
    parser.add_argument("--item_id_field", required=True, help="column of the item ids")
    parser.add_argument("--embedding_field", default="item_emb",
                        help="column of the item embeddings (default item_emb)")
    add_tree_flags(parser)
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the k-means draws (default 0)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        tree = cluster_tree(args)
    except (DataError, ValueError) as err:
        print(f"cluster_tree: {err}", file=sys.stderr)
        return 2
    write_tree(tree, args, "cluster_tree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
