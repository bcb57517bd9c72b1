"""Build an initial TDM tree from an item table and write its node and edge tables.

Usage::

    python -m hashrec.tools.tdm.init_tree --item_input_path items.parquet \\
        --item_id_field item_id --cate_id_field cate_id --attr_fields cate_id,brand \\
        --raw_attr_fields price --node_edge_output_file tree/ --n_cluster 2 \\
        [--tree_output_dir serving/]

The item table is parquet (files, directories or globs, comma-separated), a row per
item. The tree is built as ``hashrec.tools.tdm.tree_builder`` describes, and written
in TorchEasyRec's text layout (tab-separated, a header line naming the columns):

* ``node_table.txt``: ``id:int64 weight:float feature:string``, a row per node in level
  order, weight 1.0, feature ``<level>,<id>,<attrs...>,<raw attrs...>`` joined by ``,``;
  first a row of id -1, level -1 and the root's id and attrs (GraphLearn reads the root
  through it). A ``tdm_sampler`` reads it with ``attr_fields: "tree_level"``, the item
  id field, then these attr and raw attr fields, in this order, and
  ``attr_delimiter: ","``.
* ``edge_table.txt``: ``src_id dst_id weight``: each leaf to each of its ancestors but
  the root, nearest first (the training sampler's positives).
* ``predict_edge_table.txt``: ``-1`` to the root, then every node to each child, in
  level order (the retrieval's beam search).
* ``serving_tree`` (with ``--tree_output_dir``): ``<levels> <n_cluster>``, then
  ``<code> <id>`` a node.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hashrec.data.errors import DataError
from hashrec.data.paths import expand_input_path
from hashrec.tools.tdm.tree_builder import Tree, build_tree


def fields(text: str | None) -> list[str]:
    """The comma-separated names of ``text`` (none: empty)."""
    return [f.strip() for f in text.split(",") if f.strip()] if text else []


def read_items(input_path: str, item_id_field: str, cate_id_field: str | None,
               attr_fields: list[str], raw_attr_fields: list[str]
               ) -> tuple[np.ndarray, pa.Array | None, list[pa.Array], list[pa.Array]]:
    """(ids, categories or None, attr columns, raw attr columns) of the item table.

    Raises:
        DataError: unreadable files, a missing column (naming the flag), missing ids.
    """
    table = read_item_table(input_path, {
        "--item_id_field": [item_id_field], "--attr_fields": attr_fields,
        "--raw_attr_fields": raw_attr_fields,
        "--cate_id_field": [cate_id_field] if cate_id_field else []})
    cates = table.column(cate_id_field).combine_chunks() if cate_id_field else None
    return (item_ids(table, item_id_field), cates,
            [table.column(c).combine_chunks() for c in attr_fields],
            [table.column(c).combine_chunks() for c in raw_attr_fields])


def read_item_table(input_path: str, wanted: dict[str, list[str]],
                    input_flag: str = "--item_input_path") -> pa.Table:
    """The columns ``wanted`` (flag -> the columns it names) of the parquet item table
    ``input_path`` (files, directories or globs, comma-separated; the flag
    ``input_flag``).

    Raises:
        DataError: unreadable files, a missing column (naming its flag).
    """
    columns = list(dict.fromkeys(c for names in wanted.values() for c in names))
    tables = []
    for path in expand_input_path(input_path):
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowInvalid) as err:
            raise DataError(f"{input_flag}: {path} is not a readable parquet file: "
                            f"{err}") from None
        for flag, names in wanted.items():
            missing = [n for n in names if n not in schema.names]
            if missing:
                raise DataError(f"{flag}: {path} has no column {', '.join(missing)} "
                                f"(columns: {', '.join(schema.names)})")
        tables.append(pq.read_table(path, columns=columns))
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks()


def item_ids(table: pa.Table, item_id_field: str) -> np.ndarray:
    """(n,) int64 ids of the column ``item_id_field`` (``--item_id_field``).

    Raises:
        DataError: missing ids, or not integers.
    """
    ids = table.column(item_id_field)
    if ids.null_count:
        raise DataError(f"--item_id_field: column {item_id_field!r} has "
                        f"{ids.null_count} missing ids")
    try:
        return pc.cast(ids, pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(f"--item_id_field: column {item_id_field!r} does not hold integer "
                        f"ids: {err}") from None


def write_tables(tree: Tree, output_dir: str) -> None:
    """``node_table.txt``, ``edge_table.txt`` and ``predict_edge_table.txt`` of ``tree``
    into ``output_dir`` (created where missing)."""
    os.makedirs(output_dir, exist_ok=True)
    parents = tree.parent_index()
    with open(os.path.join(output_dir, "node_table.txt"), "w") as f:
        f.write("id:int64\tweight:float\tfeature:string\n")
        root = ",".join([str(tree.ids[0]), *tree.attrs[0]])
        f.write(f"-1\t1.0\t-1,{root}\n")
        for node_id, level, attrs in zip(tree.ids, tree.levels, tree.attrs):
            feature = ",".join([str(level), str(node_id), *attrs])
            f.write(f"{node_id}\t1.0\t{feature}\n")
    with open(os.path.join(output_dir, "edge_table.txt"), "w") as f:
        f.write("src_id:int64\tdst_id:int64\tweight:float\n")
        for leaf in np.flatnonzero(tree.levels == tree.depth):
            node = parents[leaf]
            while node > 0:  # the root is left out
                f.write(f"{tree.ids[leaf]}\t{tree.ids[node]}\t1.0\n")
                node = parents[node]
    with open(os.path.join(output_dir, "predict_edge_table.txt"), "w") as f:
        f.write("src_id:int64\tdst_id:int64\tweight:float\n")
        f.write(f"-1\t{tree.ids[0]}\t1.0\n")
        for child in range(1, len(tree.ids)):
            f.write(f"{tree.ids[parents[child]]}\t{tree.ids[child]}\t1.0\n")


def write_serving_tree(tree: Tree, output_dir: str) -> None:
    """``serving_tree`` of ``tree`` into ``output_dir`` (created where missing)."""
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "serving_tree"), "w") as f:
        f.write(f"{tree.depth + 1} {tree.n_cluster}\n")
        for code, node_id in zip(tree.codes, tree.ids):
            f.write(f"{code} {node_id}\n")


def add_tree_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a tree's attrs and outputs, shared with ``cluster_tree``."""
    parser.add_argument("--attr_fields", default=None,
                        help="comma-separated columns a node holds the most common value of")
    parser.add_argument("--raw_attr_fields", default=None,
                        help="comma-separated numeric columns a node holds the mean of")
    parser.add_argument("--node_edge_output_file", required=True,
                        help="directory of node_table.txt, edge_table.txt and "
                             "predict_edge_table.txt")
    parser.add_argument("--tree_output_dir", default=None,
                        help="directory of serving_tree (not written without it)")
    parser.add_argument("--n_cluster", type=int, default=2,
                        help="children a node has at most (default 2)")


def write_tree(tree: Tree, args: argparse.Namespace, prog: str) -> None:
    """The tables (and ``serving_tree`` where asked) of ``tree`` where the flags of
    ``add_tree_flags`` say; prints what was written."""
    write_tables(tree, args.node_edge_output_file)
    if args.tree_output_dir:
        write_serving_tree(tree, args.tree_output_dir)
    print(f"{prog}: {len(tree.ids)} nodes, {tree.depth + 1} levels, "
          f"{int((tree.levels == tree.depth).sum())} leaves -> "
          f"{args.node_edge_output_file}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hashrec.tools.tdm.init_tree",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--item_input_path", required=True,
                        help="parquet item table: files, directories or globs, comma-separated")
    parser.add_argument("--item_id_field", required=True, help="column of the item ids")
    parser.add_argument("--cate_id_field", default=None,
                        help="column of the item categories (ordered as text); without it "
                             "the items are ordered by id")
    add_tree_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        items = read_items(args.item_input_path, args.item_id_field, args.cate_id_field,
                           fields(args.attr_fields), fields(args.raw_attr_fields))
        tree = build_tree(*items, n_cluster=args.n_cluster)
    except (DataError, ValueError) as err:
        print(f"init_tree: {err}", file=sys.stderr)
        return 2
    write_tree(tree, args, "init_tree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
