"""Leaf codes of a TDM tree learnt from item embeddings: recursive balanced k-means.

As TorchEasyRec's ``cluster_tree``, the items of a node (the root: all of them) are split
into ``n_cluster`` parts by k-means over their embeddings, part ``i`` becoming child code
``n_cluster * code + i + 1``, and each part of two or more items is split again; a node of
at most ``n_cluster`` items gets each as a child. The parts are balanced: a node of ``m``
items splits into parts of ``m // n_cluster`` items, ``m % n_cluster`` of them one more
(those of the k-means clusters nearest the most items), so every leaf lies within
``tree_depth(items, n_cluster)`` levels and the least deep leaves are pulled down as
``init_tree``'s (``tree_builder.tree_of_leaves``).

A split runs k-means with squared Euclidean distances: k-means++ seeding, then rounds of
a balanced assignment and the centroids' update, until the assignment repeats (at most
``iterations`` rounds); of ``restarts`` runs it keeps the one of least total squared
distance (the first of equal ones). The balanced assignment sends every item to its
nearest centroid with room; a cluster with more candidates than room keeps the nearest
ones and the others try again among the clusters left with room. The parts are ordered by
their first item in input order. A node's random draws come from ``(seed, code)`` alone:
the same embeddings and seed give the same tree, whether the nodes of a level are split
together (``cluster_codes``, ``level_kmeans``) or one by one (``cluster_codes_by_node``,
``balanced_split``).

Example::

    8 items of 4 tight pairs, n_cluster 2 -> the root splits 4 / 4 (two pairs each),
    each half 2 / 2 (a pair each), each pair 1 / 1: a pair shares its level-2 parent
"""

from __future__ import annotations

import numpy as np

from hashrec.tools.tdm.level_kmeans import split_nodes

ITERATIONS = 20
RESTARTS = 3
# Nodes of more items are split one at a time: stacked, a few large nodes ran no faster.
ONE_BY_ONE = 256


def cluster_codes(embeddings: np.ndarray, n_cluster: int, seed: int = 0,
                  iterations: int = ITERATIONS, restarts: int = RESTARTS) -> np.ndarray:
    """(n,) leaf codes of the items whose embeddings are ``embeddings`` (n, d), before
    ``tree_builder.pull_to_last_level`` (see the module docstring).

    A level's nodes of one item count (up to ``ONE_BY_ONE``) are split at once
    (``level_kmeans.split_nodes``), to the same codes as ``cluster_codes_by_node``.

    Raises:
        ValueError: ``n_cluster`` below 2, a negative ``seed``, ``iterations`` or
            ``restarts`` below 1.
    """
    points = _checked(embeddings, n_cluster, seed, iterations, restarts)
    codes = np.zeros(len(points), dtype=np.int64)
    level = [(0, np.arange(len(points)))]
    while level:
        by_size: dict[int, list[tuple[int, np.ndarray]]] = {}
        for code, index in level:
            if len(index) == 1:
                codes[index] = code
            elif len(index) <= n_cluster:
                codes[index] = n_cluster * code + 1 + np.arange(len(index))
            else:
                by_size.setdefault(len(index), []).append((code, index))
        level = []
        for size, nodes in by_size.items():
            step = 1 if size > ONE_BY_ONE else len(nodes)
            for begin in range(0, len(nodes), step):
                level += _split_stack(points, nodes[begin:begin + step], n_cluster, seed,
                                      iterations, restarts)
    return codes


def _split_stack(points: np.ndarray, nodes: list[tuple[int, np.ndarray]], k: int,
                 seed: int, iterations: int, restarts: int
                 ) -> list[tuple[int, np.ndarray]]:
    """The children (code, item rows) of the ``nodes`` (code, item rows) of one size."""
    rngs = [np.random.default_rng([seed, code]) for code, _ in nodes]
    labels = split_nodes(points[np.stack([index for _, index in nodes])], k, rngs,
                         iterations, restarts)
    return [(k * code + i + 1, index[part]) for (code, index), node_labels in
            zip(nodes, labels) for i, part in enumerate(_parts(node_labels, k))]


def cluster_codes_by_node(embeddings: np.ndarray, n_cluster: int, seed: int = 0,
                          iterations: int = ITERATIONS, restarts: int = RESTARTS
                          ) -> np.ndarray:
    """``cluster_codes`` splitting one node at a time (``balanced_split``): the
    reference it is tested against."""
    points = _checked(embeddings, n_cluster, seed, iterations, restarts)
    codes = np.zeros(len(points), dtype=np.int64)
    stack = [(0, np.arange(len(points)))]
    while stack:
        code, index = stack.pop()
        if len(index) == 1:
            codes[index] = code
            continue
        if len(index) <= n_cluster:
            codes[index] = n_cluster * code + 1 + np.arange(len(index))
            continue
        rng = np.random.default_rng([seed, code])
        parts = balanced_split(points[index], n_cluster, rng, iterations, restarts)
        for i, part in enumerate(parts):
            stack.append((n_cluster * code + i + 1, index[part]))
    return codes


def _checked(embeddings: np.ndarray, n_cluster: int, seed: int, iterations: int,
             restarts: int) -> np.ndarray:
    """The embeddings as float64 (ValueError for the arguments ``cluster_codes`` refuses)."""
    if n_cluster < 2:
        raise ValueError(f"n_cluster={n_cluster}; allowed: 2 or more children a node")
    if seed < 0 or iterations < 1 or restarts < 1:
        raise ValueError(f"seed={seed}, iterations={iterations}, restarts={restarts}; "
                         f"allowed: a seed of 0 or more, 1 or more of the others")
    return np.asarray(embeddings, dtype=np.float64)


def _parts(labels: np.ndarray, k: int) -> list[np.ndarray]:
    """The sorted rows of each of the k clusters of ``labels``, ordered by their first."""
    parts = [np.flatnonzero(labels == c) for c in range(k)]
    return sorted(parts, key=lambda part: int(part[0]))


def balanced_split(points: np.ndarray, k: int, rng: np.random.Generator,
                   iterations: int = ITERATIONS, restarts: int = RESTARTS
                   ) -> list[np.ndarray]:
    """``points`` (m, d), m > k, split into k parts of ``m // k`` or one more: the parts'
    sorted row indices, ordered by their first."""
    best_labels, best_cost = None, np.inf
    for _ in range(restarts):
        labels, cost = _balanced_kmeans(points, k, rng, iterations)
        if cost < best_cost:
            best_labels, best_cost = labels, cost
    return _parts(best_labels, k)


def _balanced_kmeans(points: np.ndarray, k: int, rng: np.random.Generator,
                     iterations: int) -> tuple[np.ndarray, float]:
    """(labels (m,), total squared distance to their centroids) of one run."""
    centers = _seed_centers(points, k, rng)
    labels = None
    for _ in range(iterations):
        new = balanced_assignment(_squared_distances(points, centers))
        if labels is not None and (new == labels).all():
            break
        labels = new
        centers = np.stack([points[labels == c].mean(axis=0) for c in range(k)])
    cost = _squared_distances(points, centers)[np.arange(len(points)), labels].sum()
    return labels, float(cost)


def balanced_assignment(distances: np.ndarray) -> np.ndarray:
    """(m,) cluster of each row of ``distances`` (m, k) with ``m // k`` or ``m // k + 1``
    rows a cluster: each row goes to its nearest cluster with room; a cluster with more
    candidates than room keeps the nearest (ties: the first rows), the others try again.
    The ``m % k`` clusters nearest the most rows (ties: the first) take one more."""
    m, k = distances.shape
    nearest = np.bincount(distances.argmin(axis=1), minlength=k)
    room = np.full(k, m // k, dtype=np.int64)
    room[np.argsort(-nearest, kind="stable")[:m % k]] += 1
    labels = np.full(m, -1, dtype=np.int64)
    while (labels < 0).any():
        rows = np.flatnonzero(labels < 0)
        masked = np.where(room > 0, distances[rows], np.inf)
        choice = masked.argmin(axis=1)
        order = np.lexsort((rows, masked[np.arange(len(rows)), choice], choice))
        chosen = choice[order]
        starts = np.searchsorted(chosen, np.arange(k))
        rank = np.arange(len(order)) - starts[chosen]
        taken = rank < room[chosen]
        labels[rows[order[taken]]] = chosen[taken]
        room -= np.bincount(chosen[taken], minlength=k)
    return labels


def _seed_centers(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++: the first centroid a uniform row, each next a row drawn by its squared
    distance to the nearest chosen one (uniform where all are 0)."""
    chosen = [int(rng.integers(len(points)))]
    nearest = _squared_distances(points, points[chosen])[:, 0]
    for _ in range(1, k):
        total = nearest.sum()
        row = int(rng.choice(len(points), p=nearest / total)) if total > 0 \
            else int(rng.integers(len(points)))
        chosen.append(row)
        nearest = np.minimum(nearest, _squared_distances(points, points[[row]])[:, 0])
    return points[chosen].copy()


def _squared_distances(points: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """(m, k) squared Euclidean distances, never below 0."""
    out = ((points ** 2).sum(axis=1)[:, None] - 2.0 * points @ centers.T
           + (centers ** 2).sum(axis=1)[None, :])
    return np.maximum(out, 0.0)
