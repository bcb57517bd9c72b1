"""An initial TDM tree over an item table, laid out as TorchEasyRec's ``init_tree`` lays it.

The items are ordered by (category as text, item id) and cut recursively into
``n_cluster`` nearly equal consecutive parts: the part of ``i`` items from
``start`` gets child slot ``i`` of ``n_cluster``, whose code is
``n_cluster * code + n_cluster - i`` (so the first part takes the last child: the
tree reads the order backwards, as TorchEasyRec's does). A part of one item is a
leaf. Leaves above the last level are then pulled down through first children
(``code * n_cluster + 1``) until every leaf sits on level ``depth``, the least ``d``
with ``n_cluster ** d >= items``. A node exists where it is a leaf's ancestor.
(TorchEasyRec pulls down the leaves below code ``n_cluster ** depth - 1``, the first
code of the last level only for ``n_cluster`` 2; with more children its leaves end on
two levels. Here they are pulled to the last level's first code whatever
``n_cluster``: the same tree for 2.)

``tree_of_leaves`` builds the tree from the leaves' codes, however they were placed:
``build_tree`` places them by these cuts, ``cluster_tree`` by clustering embeddings
(``hashrec.tools.tdm.tree_cluster``).

A leaf's id is its item id; a node's is ``max(0, largest item id) + code + 1``.
A node's ``attr_fields`` values are the most common among its leaves' (text: the
most common non-empty value, ties to the first in item order; numbers: ties to the
smallest; none at all: missing), its ``raw_attr_fields`` the mean of its leaves'
(an integer column's mean truncated to an integer; none: missing).

Example::

    4 items, n_cluster 2 -> codes: root 0, level 1: 1, 2; leaves 3, 4, 5, 6
    items ordered a < b < c < d: a, b under code 2 (leaves 6, 5), c, d under 1 (4, 3)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Tree:
    """A built tree, its nodes in level order (by level, then by code).

    Attributes:
        n_cluster: children a node has at most.
        codes: (nodes,) int64 codes (root 0; the children of ``c`` are
            ``c * n_cluster + 1 ...``).
        ids: (nodes,) int64 node ids.
        levels: (nodes,) int64 levels (root 0, leaves ``depth``).
        attrs: per node, the texts of its attr then raw attr values ("" where missing
            for attrs, "0" for raw attrs, as TorchEasyRec writes them).
    """

    n_cluster: int
    codes: np.ndarray
    ids: np.ndarray
    levels: np.ndarray
    attrs: list[list[str]]

    @property
    def depth(self) -> int:
        """The leaves' level."""
        return int(self.levels[-1])

    def parent_index(self) -> np.ndarray:
        """(nodes,) index of each node's parent (-1 for the root)."""
        position = {int(c): i for i, c in enumerate(self.codes)}
        return np.array([-1 if c == 0 else position[(int(c) - 1) // self.n_cluster]
                         for c in self.codes], dtype=np.int64)


def tree_depth(items: int, n_cluster: int) -> int:
    """The least ``d`` with ``n_cluster ** d >= items`` (exact integer arithmetic)."""
    depth, width = 0, 1
    while width < items:
        depth, width = depth + 1, width * n_cluster
    return depth


def leaf_codes(count: int, n_cluster: int) -> np.ndarray:
    """(count,) codes of ``count`` ordered items' leaves as the cuts give them, before
    ``pull_to_last_level`` (see the module docstring)."""
    codes = np.zeros(count, dtype=np.int64)
    stack = [(0, count, 0)]
    while stack:
        start, end, code = stack.pop()
        if end - start == 1:
            codes[start] = code
            continue
        for i in range(n_cluster):
            left = int(start + i * (end - start) / n_cluster)
            right = int(start + (i + 1) * (end - start) / n_cluster)
            if right > left:
                stack.append((left, right, n_cluster * code + n_cluster - i))
    return codes


def pull_to_last_level(codes: np.ndarray, n_cluster: int) -> np.ndarray:
    """``codes`` (n,) of n leaves with every leaf above level ``tree_depth(n, n_cluster)``
    moved down through first children (``code * n_cluster + 1``) to that level.

    Raises:
        ValueError: a leaf below that level (the codes are not of a tree that deep).
    """
    depth = tree_depth(len(codes), n_cluster)
    # the first code of the last level: (n ** depth - 1) / (n - 1)
    first_leaf = (n_cluster ** depth - 1) // (n_cluster - 1)
    if len(codes) and int(codes.max()) >= first_leaf * n_cluster + 1:
        raise ValueError(f"leaf code {int(codes.max())} is below level {depth}, the last "
                         f"level of a tree of {len(codes)} items and {n_cluster} children "
                         f"a node")
    codes = codes.copy()
    for _ in range(depth + 1):
        low = codes < first_leaf
        if not low.any():
            break
        codes[low] = codes[low] * n_cluster + 1
    return codes


def check_items(item_ids: np.ndarray, n_cluster: int) -> None:
    """Raises ValueError for fewer than 2 items, repeated ids or ``n_cluster`` below 2."""
    if n_cluster < 2:
        raise ValueError(f"n_cluster={n_cluster}; allowed: 2 or more children a node")
    count = len(item_ids)
    if count < 2:
        raise ValueError(f"the item table has {count} items; a tree needs 2 or more")
    unique, counts = np.unique(item_ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"item id {int(unique[counts > 1][0])} appears "
                         f"{int(counts[counts > 1][0])} times; ids must be unique")


def build_tree(item_ids: np.ndarray, categories: pa.Array | None, attrs: list[pa.Array],
               raw_attrs: list[pa.Array], n_cluster: int) -> Tree:
    """The tree of the items ``item_ids`` (n,) int64 with their ``categories`` (None:
    ordered by id alone) and attribute columns (n,) each.

    Raises:
        ValueError: fewer than 2 items, repeated ids, or ``n_cluster`` below 2.
    """
    check_items(item_ids, n_cluster)
    count = len(item_ids)
    cates = (pc.cast(categories, pa.string()).fill_null("").to_pylist()
             if categories is not None else [""] * count)
    order = np.array(sorted(range(count), key=lambda i: (cates[i], int(item_ids[i]))),
                     dtype=np.int64)
    take = pa.array(order)
    return tree_of_leaves(item_ids[order], leaf_codes(count, n_cluster),
                          [a.take(take) for a in attrs], [a.take(take) for a in raw_attrs],
                          n_cluster)


def tree_of_leaves(ids: np.ndarray, codes: np.ndarray, attrs: list[pa.Array],
                   raw_attrs: list[pa.Array], n_cluster: int) -> Tree:
    """The tree whose leaves are the items ``ids`` (n,) at ``codes`` (n,), pulled to the
    last level (``pull_to_last_level``), with their attribute columns (n,) each: a node
    exists where it is a leaf's ancestor, with the ids and attrs of the module docstring
    (ties of text modes to the first in this item order).

    Raises:
        ValueError: a leaf below the last level, or two items at one code.
    """
    count = len(ids)
    depth = tree_depth(count, n_cluster)
    codes = pull_to_last_level(codes, n_cluster)
    if len(np.unique(codes)) < count:
        raise ValueError("two items share a leaf code")
    columns = [_texts_by_mode(a, codes, depth, n_cluster) for a in attrs]
    columns += [_texts_by_mean(a, codes, depth, n_cluster) for a in raw_attrs]
    all_codes = np.concatenate([_ancestor_codes(codes, level, n_cluster, depth)[0]
                                for level in range(depth)] + [codes])
    all_ids = np.concatenate([all_codes[:-count] + max(0, int(ids.max())) + 1, ids])
    node_attrs: dict[int, list[str]] = {}
    for column in columns:
        for code, text in column.items():
            node_attrs.setdefault(code, []).append(text)
    position = np.argsort(all_codes, kind="stable")
    sorted_codes = all_codes[position]
    return Tree(n_cluster, sorted_codes, all_ids[position], _levels(sorted_codes, n_cluster),
                [node_attrs.get(int(c), []) for c in sorted_codes])


def _levels(codes: np.ndarray, n_cluster: int) -> np.ndarray:
    levels = np.zeros(len(codes), dtype=np.int64)
    first = 0
    for level in range(64):
        first = first * n_cluster + 1  # the first code of level level + 1
        if not (codes >= first).any():
            break
        levels[codes >= first] = level + 1
    return levels


def _ancestor_codes(codes: np.ndarray, level: int, n_cluster: int, depth: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct codes of level ``level`` above the leaves ``codes``, each leaf's index
    into them)."""
    up = codes.copy()
    for _ in range(depth - level):
        up = (up - 1) // n_cluster
    return np.unique(up, return_inverse=True)


def _texts_by_mode(values: pa.Array, codes: np.ndarray, depth: int, n_cluster: int
                   ) -> dict[int, str]:
    """code -> text of the value of every node: a leaf's own, a node's most common."""
    text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    python = values.to_pylist()
    out = {int(c): _text(v) for c, v in zip(codes, python)}
    valid = np.array([v is not None and (not text or v != "") for v in python])
    if not valid.any():
        for level in range(depth):
            out.update((int(c), "") for c in _ancestor_codes(codes, level, n_cluster, depth)[0])
        return out
    kept = values.filter(pa.array(valid))
    distinct, value_index = np.unique(np.asarray(kept.to_pylist(), dtype=object),
                                      return_inverse=True) if not text else \
        _first_seen(kept.to_pylist())
    positions = np.flatnonzero(valid)
    for level in range(depth):
        nodes, node_of_leaf = _ancestor_codes(codes, level, n_cluster, depth)
        out.update((int(c), "") for c in nodes)
        pair = node_of_leaf[positions] * len(distinct) + value_index
        pairs, first, tally = np.unique(pair, return_index=True, return_counts=True)
        node, value = pairs // len(distinct), pairs % len(distinct)
        # most common first, then (text) first seen in item order or (number) smallest
        tie = positions[first] if text else value
        best = np.lexsort((tie, -tally, node))
        chosen = best[np.r_[True, node[best][1:] != node[best][:-1]]]
        out.update((int(nodes[node[i]]), _text(distinct[value[i]])) for i in chosen)
    return out


def _first_seen(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    index: dict[str, int] = {}
    inverse = np.array([index.setdefault(t, len(index)) for t in texts], dtype=np.int64)
    return np.array(list(index), dtype=object), inverse


def _texts_by_mean(values: pa.Array, codes: np.ndarray, depth: int, n_cluster: int
                   ) -> dict[int, str]:
    """code -> text of the value of every node: a leaf's own, a node's mean of its
    leaves' (missing: "0")."""
    integer = pa.types.is_integer(values.type)
    numbers = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
    valid = ~np.isnan(numbers) & ~pc.is_null(values).to_numpy(zero_copy_only=False)
    out = {int(c): (_text(v) if v is not None else "0")
           for c, v in zip(codes, values.to_pylist())}
    for level in range(depth):
        nodes, node_of_leaf = _ancestor_codes(codes, level, n_cluster, depth)
        sums = np.bincount(node_of_leaf[valid], numbers[valid], minlength=len(nodes))
        counts = np.bincount(node_of_leaf[valid], minlength=len(nodes))
        for c, total, n in zip(nodes, sums, counts):
            mean = total / n if n else None
            out[int(c)] = "0" if mean is None else _text(int(mean) if integer else mean)
    return out


def _text(value) -> str:
    return "" if value is None else str(value)
