"""``data_config.tdm_sampler``: a TDM's (user, tree node) training rows.

The tree comes as TorchEasyRec's tables (``python -m hashrec.tools.tdm.init_tree``
writes them): the node table (``item_input_path``; columns id, weight and the
``attr_fields``' values joined by ``attr_delimiter``, the first of which is
``tree_level``; a row of level -1, GraphLearn's handle of the root, is skipped) and the
edge table (``edge_input_path``; src_id, dst_id, weight: each leaf to each of its
ancestors but the root). Both are local files: parquet (``.parquet``; the columns taken
by position) or delimited text whose first line names the columns
(``field_delimiter``, default tab). The levels are 0 (the root) to
``len(layer_num_sample) - 1`` (the leaves).

Each input row's ``item_id_field`` is a leaf. A block of B rows becomes, as
TorchEasyRec's sampler and dataset make it:

* the B rows themselves, their labels as they are;
* per row, its ancestors on the kept levels between the root and the leaves, nearest
  the root first (label 1);
* per row, for each kept level and then the leaves' level ``l``, ``layer_num_sample[l]``
  other nodes of level ``l`` (label 0), each drawn with probability proportional to its
  weight, never the row's own node of that level.

A sampled row takes its node's attrs as the input columns named by ``attr_fields``
(text cast to the column's type, as ``negative_sampler``'s), every other column from its
input row (the user's features, repeated), and labels 1 or 0 in every label column.
Every level between the root and the leaves is kept with ``remain_ratio`` 1; below it,
``round(remain_ratio * (levels - 2))`` of them, drawn without replacement each block
with odds ``probability_type``: ``UNIFORM`` (equal), ``ARITHMETIC`` (level ``l``'s odds
proportional to ``l``) or ``RECIPROCAL`` (to ``1 / (levels - 1 - l)``).

A row's negatives of one level are distinct (GraphLearn's ``samplewise_unique``) where
the level has enough nodes of weight above 0 and at most ``EXACT_DRAW_CELLS`` (rows x
nodes); in a larger level they are drawn independently, a draw of the row's own node
drawn again (up to ``REDRAWS`` times). The draws come from the generator the caller
passes: the same seed gives the same rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from hashrec.data.errors import DataError
from hashrec.data.paths import expand_input_path
from hashrec.data.sampler import REDRAWS, as_input_type

logger = logging.getLogger(__name__)

_WHERE = "data_config.tdm_sampler"
# The most rows x level nodes whose negatives are drawn distinct per row at once.
EXACT_DRAW_CELLS = 1 << 22
PROBABILITY_TYPES = ("UNIFORM", "ARITHMETIC", "RECIPROCAL")


@dataclass(frozen=True)
class TDMTree:
    """The tree of a ``tdm_sampler``, read and checked once (``read_tdm_tree``).

    Attributes:
        source: what it was read with (item_input_path, edge_input_path, attr_fields,
            attr_delimiter, field_delimiter, layer count).
        ids: (n,) int64 node ids; levels (n,) int64; weights (n,) float64.
        attrs: attr field (but ``tree_level``) -> (n,) texts of the nodes' values.
        leaf_ids: (m,) int64 sorted ids of the leaves.
        ancestors: (m, levels - 2) int64 rows (into ``ids``) of each leaf's ancestor on
            levels 1 .. levels - 2.
        leaf_rows: (m,) int64 row of each leaf.
    """

    source: tuple
    ids: np.ndarray
    levels: np.ndarray
    weights: np.ndarray
    attrs: dict[str, pa.Array]
    leaf_ids: np.ndarray
    ancestors: np.ndarray
    leaf_rows: np.ndarray

    @property
    def num_levels(self) -> int:
        return int(self.source[-1])


def _source(config) -> tuple:
    delimiter = config.field_delimiter if config.HasField("field_delimiter") else "\t"
    return (config.item_input_path, config.edge_input_path, tuple(config.attr_fields),
            config.attr_delimiter, delimiter, len(config.layer_num_sample))


def read_columns(path_field: str, input_path: str, delimiter: str, types: list
                 ) -> list[pa.Array]:
    """The first ``len(types)`` columns of the files of ``input_path`` (the
    ``tdm_sampler`` field ``path_field``), cast to ``types``.

    Raises:
        DataError: no files, an unreadable file or too few columns (naming the field).
    """
    if not input_path:
        raise DataError(f"{_WHERE}.{path_field} is empty; name the table's files")
    try:
        files = expand_input_path(input_path)
    except (OSError, ValueError) as err:
        raise DataError(f"{_WHERE}.{path_field} {input_path!r}: {err}") from None
    parts: list[list[pa.Array]] = [[] for _ in types]
    for path in files:
        try:
            if path.endswith(".parquet"):
                table = pq.read_table(path)
            else:
                with open(path, encoding="utf-8") as f:
                    names = [n.split(":")[0] for n in f.readline().rstrip("\r\n")
                             .split(delimiter)]
                table = pacsv.read_csv(
                    path, read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
                    parse_options=pacsv.ParseOptions(delimiter=delimiter, quote_char=False),
                    convert_options=pacsv.ConvertOptions(
                        column_types={n: pa.string() for n in names},
                        strings_can_be_null=False, quoted_strings_can_be_null=False))
            if table.num_columns < len(types):
                raise DataError(f"{_WHERE}.{path_field} {path}: {table.num_columns} columns, "
                                f"expected {len(types)} or more")
            for i, kind in enumerate(types):
                parts[i].append(pc.cast(table.column(i), kind).combine_chunks())
        except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise DataError(f"{_WHERE}.{path_field} {path}: cannot be read: {err}") from None
    return [pa.concat_arrays(p) for p in parts]


@dataclass(frozen=True)
class TDMNodes:
    """The node table of a ``tdm_sampler`` (GraphLearn's root handle left out).

    Attributes:
        ids: (n,) int64 node ids; levels (n,) int64; weights (n,) float64.
        attrs: attr field (but ``tree_level``) -> (n,) texts of the nodes' values.
    """

    ids: np.ndarray
    levels: np.ndarray
    weights: np.ndarray
    attrs: dict[str, pa.Array]


def read_tdm_nodes(config) -> TDMNodes:
    """The node table (``item_input_path``) of the ``TDMSampler`` message ``config``,
    checked against its ``attr_fields`` and ``layer_num_sample``.

    Raises:
        DataError: a setting out of range or a malformed table (naming the field).
    """
    fields = list(config.attr_fields)
    if not fields or fields[0] != "tree_level":
        raise DataError(f"{_WHERE}.attr_fields {fields}: the first must be \"tree_level\" "
                        f"(the node table's level), then the item columns in the table's "
                        f"order")
    levels = len(config.layer_num_sample)
    if levels < 3 or config.layer_num_sample[0] != 0:
        raise DataError(f"{_WHERE}.layer_num_sample {list(config.layer_num_sample)}: one "
                        f"entry a tree level (3 or more), the root's first and 0")
    ids, weights, features = read_columns("item_input_path", config.item_input_path,
                                          _source(config)[4],
                                          [pa.int64(), pa.float64(), pa.string()])
    parts = pc.split_pattern(features, config.attr_delimiter)
    counts = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    if (counts != len(fields)).any():
        row = int(np.flatnonzero(counts != len(fields))[0])
        raise DataError(f"{_WHERE}.item_input_path node {ids[row].as_py()}: feature "
                        f"{features[row].as_py()!r} holds {counts[row]} values split on "
                        f"{config.attr_delimiter!r}; attr_fields lists {len(fields)}")
    level = pc.cast(pc.list_element(parts, 0), pa.int64()).to_numpy()
    kept = level >= 0  # GraphLearn's root handle (level -1) is not a node
    node_ids, level = ids.to_numpy()[kept], level[kept]
    if sorted(set(level.tolist())) != list(range(levels)):
        raise DataError(f"{_WHERE}.layer_num_sample has {levels} entries; the node table's "
                        f"levels are {sorted(set(level.tolist()))}: give one a level")
    attrs = {name: pc.list_element(parts, i).filter(pa.array(kept))
             for i, name in enumerate(fields) if i}
    return TDMNodes(node_ids, level, weights.to_numpy()[kept], attrs)


def read_tdm_tree(config) -> TDMTree:
    """The tree of the ``TDMSampler`` message ``config``, read and checked.

    Raises:
        DataError: a setting out of range or a malformed table (naming the field).
    """
    nodes = read_tdm_nodes(config)
    source = _source(config)
    leaf_ids, ancestors, leaf_rows = _ancestors(config, source, nodes.ids, nodes.levels)
    return TDMTree(source, nodes.ids, nodes.levels, nodes.weights, nodes.attrs, leaf_ids,
                   ancestors, leaf_rows)


def _ancestors(config, source: tuple, node_ids: np.ndarray, level: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted leaf ids, (leaves, levels - 2) ancestor rows, leaf rows) of the edges."""
    src, dst = read_columns("edge_input_path", config.edge_input_path, source[4],
                            [pa.int64(), pa.int64()])
    src, dst = src.to_numpy(), dst.to_numpy()
    order = np.argsort(node_ids, kind="stable")
    sorted_ids = node_ids[order]

    def rows(ids: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
        missing = sorted_ids[at] != ids
        if missing.any():
            raise DataError(f"{_WHERE}.edge_input_path: node {int(ids[missing][0])} is not "
                            f"in the node table (item_input_path)")
        return order[at]

    levels = source[-1]
    src_rows, dst_rows = rows(src), rows(dst)
    leaf_ids, leaf_index = np.unique(src, return_inverse=True)
    ancestors = np.full((len(leaf_ids), levels - 2), -1, dtype=np.int64)
    dst_level = level[dst_rows]
    ok = (dst_level >= 1) & (dst_level <= levels - 2) & (level[src_rows] == levels - 1)
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise DataError(f"{_WHERE}.edge_input_path: edge {src[bad]} -> {dst[bad]} is not "
                        f"from a leaf (level {levels - 1}) to an ancestor of level 1 .. "
                        f"{levels - 2}")
    ancestors[leaf_index, dst_level - 1] = dst_rows
    if (ancestors < 0).any():
        leaf = int(np.flatnonzero((ancestors < 0).any(axis=1))[0])
        raise DataError(f"{_WHERE}.edge_input_path: leaf {leaf_ids[leaf]} has no ancestor "
                        f"of level {int(np.flatnonzero(ancestors[leaf] < 0)[0]) + 1}")
    return leaf_ids, ancestors, rows(leaf_ids)


def keep_odds(probability_type: str, levels: int) -> np.ndarray:
    """(levels - 2,) odds of levels 1 .. levels - 2 to be kept (see the module docstring).

    Raises:
        DataError: an unknown ``probability_type``.
    """
    middle = np.arange(1, levels - 1, dtype=np.float64)
    if probability_type == "UNIFORM":
        odds = np.ones_like(middle)
    elif probability_type == "ARITHMETIC":
        odds = middle
    elif probability_type == "RECIPROCAL":
        odds = 1.0 / (levels - 1 - middle)
    else:
        raise DataError(f"{_WHERE}.probability_type {probability_type!r}; allowed: "
                        f"{', '.join(PROBABILITY_TYPES)}")
    return odds / odds.sum()


class TDMSampler:
    """Expands blocks of input rows into TDM rows (see the module docstring).

    Args:
        config: the ``TDMSampler`` message.
        label_fields: the label columns (set to 1 or 0 in the sampled rows).
        tree: the tree ``read_tdm_tree(config)`` gave; None reads it.

    Raises:
        DataError: a setting out of range (naming the field) or a malformed tree.
    """

    # The dataset parses ``expand``'s rows in place of the block's.
    expands_rows = True

    def __init__(self, config, label_fields, tree: TDMTree | None = None) -> None:
        if not config.item_id_field:
            raise DataError(f"{_WHERE}.item_id_field is empty; name the input column of the "
                            f"item id (a leaf of the tree)")
        if not 0.0 < config.remain_ratio <= 1.0:
            raise DataError(f"{_WHERE}.remain_ratio={config.remain_ratio}; allowed: above 0 "
                            f"and at most 1")
        if tree is None:
            tree = read_tdm_tree(config)
        elif tree.source != _source(config):
            raise ValueError(f"tree read from {tree.source}, not from {_source(config)}")
        self.tree = tree
        self.item_id_field = config.item_id_field
        self.label_fields = tuple(label_fields)
        self.num_sample = [int(n) for n in config.layer_num_sample]
        levels = tree.num_levels
        self.keep = round(config.remain_ratio * (levels - 2))
        self.odds = keep_odds(config.probability_type, levels)
        self.level_rows = [np.flatnonzero(tree.levels == lv) for lv in range(levels)]
        for lv in range(1, levels):
            drawable = int((tree.weights[self.level_rows[lv]] > 0).sum())
            if self.num_sample[lv] and drawable < 2:
                raise DataError(f"{_WHERE}.layer_num_sample[{lv}]={self.num_sample[lv]}, but "
                                f"level {lv} has {drawable} node(s) of weight above 0: no "
                                f"other node to draw; set it to 0")
        self._warned = False

    def kept_levels(self, rng: np.random.Generator) -> np.ndarray:
        """The ascending levels between the root and the leaves a block trains on."""
        levels = self.tree.num_levels
        if self.keep >= levels - 2:
            return np.arange(1, levels - 1)
        return np.sort(rng.choice(np.arange(1, levels - 1), self.keep, replace=False,
                                  p=self.odds))

    def expand(self, table: pa.Table, rng: np.random.Generator) -> pa.Table:
        """``table``'s rows, then its sampled positive and negative rows.

        Raises:
            DataError: ``table`` lacks ``item_id_field``, an id is not a leaf, or an attr
                does not convert to its column's type.
        """
        leaves = self._leaf_index(table)
        count = len(leaves)
        kept = self.kept_levels(rng)
        positives = self.tree.ancestors[leaves][:, kept - 1]  # (B, kept)
        levels = self.tree.num_levels
        own = np.concatenate([positives, self.tree.leaf_rows[leaves][:, None]], axis=1)
        negatives = [self._draw(lv, own[:, i], rng)
                     for i, lv in enumerate([*kept.tolist(), levels - 1])]
        negatives = np.concatenate(negatives, axis=1) if negatives else \
            np.zeros((count, 0), dtype=np.int64)
        nodes = np.concatenate([positives.reshape(-1), negatives.reshape(-1)])
        users = np.concatenate([np.repeat(np.arange(count), positives.shape[1]),
                                np.repeat(np.arange(count), negatives.shape[1])])
        labels = np.concatenate([np.ones(positives.size, dtype=np.int64),
                                 np.zeros(negatives.size, dtype=np.int64)])
        return self._rows(table, nodes, users, labels)

    def _leaf_index(self, table: pa.Table) -> np.ndarray:
        if self.item_id_field not in table.column_names:
            raise DataError(f"{_WHERE}.item_id_field {self.item_id_field!r} is not a column "
                            f"of the input (columns: {', '.join(table.column_names)})")
        column = table.column(self.item_id_field)
        try:
            ids = pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise DataError(f"{_WHERE}.item_id_field {self.item_id_field!r}: the input column "
                            f"holds {column.type}, not integer ids ({err})") from None
        leaf_ids = self.tree.leaf_ids
        at = np.minimum(np.searchsorted(leaf_ids, ids), len(leaf_ids) - 1)
        missing = (leaf_ids[at] != ids) | pc.is_null(column).to_numpy(zero_copy_only=False)
        if missing.any():
            raise DataError(f"{_WHERE}.item_id_field {self.item_id_field!r}: item "
                            f"{column[int(np.flatnonzero(missing)[0])].as_py()} is not a leaf "
                            f"of the tree (edge_input_path)")
        return at

    def _draw(self, level: int, own: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """(B, layer_num_sample[level]) rows of level ``level``, never ``own`` (B,)."""
        count, wanted = len(own), self.num_sample[level]
        candidates = self.level_rows[level]
        if not wanted:
            return np.zeros((count, 0), dtype=np.int64)
        weights = self.tree.weights[candidates]
        if wanted < int((weights > 0).sum()) and count * len(candidates) <= EXACT_DRAW_CELLS:
            # Gumbel top-k: distinct draws by weight, without replacement
            with np.errstate(divide="ignore"):  # weight 0: key -inf, never drawn
                keys = np.log(weights)[None, :] - np.log(-np.log(
                    rng.random((count, len(candidates)))))
            keys[candidates[None, :] == own[:, None]] = -np.inf
            top = np.argpartition(-keys, wanted - 1, axis=1)[:, :wanted]
            return candidates[top]
        cumulative = np.cumsum(weights)

        def by_weight(size) -> np.ndarray:
            at = np.searchsorted(cumulative, rng.random(size) * cumulative[-1], side="right")
            return candidates[np.minimum(at, len(candidates) - 1)]

        drawn = by_weight((count, wanted))
        for _ in range(REDRAWS):
            again = drawn == own[:, None]
            if not again.any():
                break
            drawn[again] = by_weight(int(again.sum()))
        return drawn

    def _rows(self, table: pa.Table, nodes: np.ndarray, users: np.ndarray,
              labels: np.ndarray) -> pa.Table:
        taken_nodes, taken_users = pa.array(nodes), pa.array(users)
        columns = []
        for field in table.schema:
            column = table.column(field.name).combine_chunks()
            if field.name in self.label_fields:
                added = pa.array(labels).cast(field.type)
            elif field.name in self.tree.attrs:
                added = as_input_type(self.tree.attrs[field.name].take(taken_nodes), field,
                                      _WHERE)
            else:
                added = column.take(taken_users)
            columns.append(pa.concat_arrays([column, added]))
        unused = [f for f in self.tree.attrs if f not in table.column_names]
        if unused and not self._warned:
            self._warned = True
            logger.warning("%s.attr_fields %s are not input columns of the model's features; "
                           "they are left out", _WHERE, unused)
        return pa.Table.from_arrays(columns, schema=table.schema)
