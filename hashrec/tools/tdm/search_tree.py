"""The tree a TDM retrieval searches: the nodes of a ``tdm_sampler``'s node table
(``item_input_path``) and each node's children from its ``predict_edge_input_path``
(``python -m hashrec.tools.tdm.init_tree`` writes both).

The predict edge table holds ``src_id dst_id weight`` rows: a parent and one of its
children; a row from ``-1`` names the root (GraphLearn's handle), as in TorchEasyRec. Every
node but the root has one parent on the level above it, and every node above the last
level has children: the items are the nodes of the last level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from hashrec.data.errors import DataError
from hashrec.data.tdm_sampler import read_columns, read_tdm_nodes

_WHERE = "data_config.tdm_sampler.predict_edge_input_path"


@dataclass(frozen=True)
class SearchTree:
    """Nodes and their children, each node a row (the node table's order).

    Attributes:
        ids: (n,) int64 node ids.
        levels: (n,) int64 levels (root 0, the items ``num_levels - 1``).
        attrs: attr field (but ``tree_level``) -> (n,) texts of the nodes' values.
        children: (n, n_cluster) int64 rows of each node's children in edge order, -1
            after the last (the items' rows are all -1).
    """

    ids: np.ndarray
    levels: np.ndarray
    attrs: dict[str, pa.Array]
    children: np.ndarray

    @property
    def num_levels(self) -> int:
        return int(self.levels.max()) + 1

    @property
    def n_cluster(self) -> int:
        """Children a node has at most."""
        return int(self.children.shape[1])

    def level_rows(self, level: int) -> np.ndarray:
        """(count,) rows of the nodes of ``level``, in table order."""
        return np.flatnonzero(self.levels == level)


def build_search_tree(ids: np.ndarray, levels: np.ndarray, attrs: dict[str, pa.Array],
                      src: np.ndarray, dst: np.ndarray) -> SearchTree:
    """The tree of the nodes ``ids`` (n,) on ``levels`` (n,) with the parent-child edges
    ``src`` -> ``dst`` (e,) (``src`` -1: the root's handle, skipped).

    Raises:
        DataError: an edge of a node not in the table, a child not one level below its
            parent, a node with no or two parents, a node above the last level without
            children, repeated node ids.
    """
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    if len(sorted_ids) > 1 and (sorted_ids[1:] == sorted_ids[:-1]).any():
        twice = int(sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]][0])
        raise DataError(f"data_config.tdm_sampler.item_input_path: node {twice} is listed "
                        f"twice")

    def rows(edge_ids: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(sorted_ids, edge_ids), len(sorted_ids) - 1)
        missing = sorted_ids[at] != edge_ids
        if missing.any():
            raise DataError(f"{_WHERE}: node {int(edge_ids[missing][0])} is not in the node "
                            f"table (item_input_path)")
        return order[at]

    kept = src != -1
    parents, kids = rows(src[kept]), rows(dst[kept])
    below = levels[kids] != levels[parents] + 1
    if below.any():
        bad = int(np.flatnonzero(below)[0])
        raise DataError(f"{_WHERE}: edge {ids[parents[bad]]} -> {ids[kids[bad]]} goes from "
                        f"level {levels[parents[bad]]} to {levels[kids[bad]]}, not one level "
                        f"down")
    count = np.bincount(kids, minlength=len(ids))
    wrong = (count != (levels > 0)).nonzero()[0]
    if len(wrong):
        node = int(wrong[0])
        raise DataError(f"{_WHERE}: node {ids[node]} (level {levels[node]}) has {count[node]} "
                        f"parents; the root has none, every other node one")
    fanout = np.bincount(parents, minlength=len(ids))
    last = int(levels.max())
    bare = np.flatnonzero((fanout == 0) & (levels < last))
    if len(bare):
        raise DataError(f"{_WHERE}: node {ids[bare[0]]} of level {levels[bare[0]]} has no "
                        f"children; the retrieval reads trees whose items are all on the last "
                        f"level ({last}), as init_tree writes them")
    by_parent = np.argsort(parents, kind="stable")
    slot = np.arange(len(parents)) - np.repeat(np.cumsum(fanout) - fanout, fanout)
    children = np.full((len(ids), max(int(fanout.max()), 1)), -1, dtype=np.int64)
    children[parents[by_parent], slot] = kids[by_parent]
    return SearchTree(ids, levels, attrs, children)


def read_search_tree(config) -> SearchTree:
    """The tree of the ``TDMSampler`` message ``config``: its node table
    (``hashrec.data.tdm_sampler.read_tdm_nodes``) and ``predict_edge_input_path``.

    Raises:
        DataError: a malformed table, naming the field.
    """
    nodes = read_tdm_nodes(config)
    delimiter = config.field_delimiter if config.HasField("field_delimiter") else "\t"
    src, dst = read_columns("predict_edge_input_path", config.predict_edge_input_path,
                            delimiter, [pa.int64(), pa.int64()])
    return build_search_tree(nodes.ids, nodes.levels, nodes.attrs, src.to_numpy(),
                             dst.to_numpy())
