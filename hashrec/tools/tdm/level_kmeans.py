"""``tree_cluster``'s balanced k-means run on many nodes of one size at once.

``split_nodes`` gives, for G nodes of m items each, what ``tree_cluster.balanced_split``
gives node by node, the same to the last bit: every step is the per-node step on a stack
of nodes, with the arithmetic in the same form and order (the distances'
``(2 * points) @ centers.T`` is one matrix product a node, as numpy's stacked matmul
computes it; sums run over the same axis of the same layout), each node's draws come
from its own generator in the per-node order, and a node leaves the k-means rounds when
its assignment repeats, as it stops alone. What is left to Python per node is its draws
(k-means++ seeding) and its parts.
"""

from __future__ import annotations

import numpy as np


def split_nodes(points: np.ndarray, k: int, rngs: list[np.random.Generator],
                iterations: int, restarts: int) -> np.ndarray:
    """(G, m) cluster of each item of the G nodes ``points`` (G, m, d), m > k: the labels
    of ``balanced_split``'s best restart (the parts are the labels' rows; order them by
    their first row as it does)."""
    twice = 2.0 * points
    norms = (points ** 2).sum(axis=2)
    best_labels, best_cost = None, np.full(len(points), np.inf)
    for _ in range(restarts):
        centers = _seed_centers(points, twice, norms, k, rngs)
        labels, cost = _balanced_kmeans(points, twice, norms, centers, iterations)
        better = cost < best_cost
        best_labels = labels if best_labels is None else \
            np.where(better[:, None], labels, best_labels)
        best_cost = np.where(better, cost, best_cost)
    return best_labels


def _distances(twice: np.ndarray, norms: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """(G, m, c) squared distances of the nodes' points (``twice``: 2 x the points,
    ``norms``: their squared norms) to their ``centers`` (G, c, d), as
    ``tree_cluster._squared_distances`` computes them."""
    centers = np.ascontiguousarray(centers)
    out = (norms[:, :, None] - twice @ centers.transpose(0, 2, 1)
           + (centers ** 2).sum(axis=2)[:, None, :])
    return np.maximum(out, 0.0)


def _seed_centers(points, twice, norms, k: int, rngs) -> np.ndarray:
    """(G, k, d) k-means++ centroids of each node, its draws from its own generator."""
    nodes, m = points.shape[:2]
    every = np.arange(nodes)
    chosen = [np.array([int(rng.integers(m)) for rng in rngs], dtype=np.int64)]
    nearest = _distances(twice, norms, points[every, chosen[0]][:, None, :])[:, :, 0]
    for _ in range(1, k):
        total = nearest.sum(axis=1)
        share = nearest / np.where(total > 0, total, 1.0)[:, None]  # all-equal nodes: unused
        chosen.append(np.array([int(rng.choice(m, p=share[g])) if total[g] > 0
                                else int(rng.integers(m)) for g, rng in enumerate(rngs)],
                               dtype=np.int64))
        nearest = np.minimum(nearest, _distances(
            twice, norms, points[every, chosen[-1]][:, None, :])[:, :, 0])
    return points[every[:, None], np.stack(chosen, axis=1)]


def _balanced_kmeans(points, twice, norms, centers, iterations: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(labels (G, m), each node's total squared distance to its centroids (G,)) of one
    run; ``centers`` (G, k, d) is updated in place."""
    nodes, m = points.shape[:2]
    k = centers.shape[1]
    labels = np.zeros((nodes, m), dtype=np.int64)
    running = np.arange(nodes)
    for step in range(iterations):
        every = len(running) == nodes  # no copy of the stacks while every node runs
        new = balanced_assignment(_distances(
            twice if every else twice[running], norms if every else norms[running],
            centers if every else centers[running]))
        if step:  # a node whose assignment repeats stops
            moved = (new != (labels if every else labels[running])).any(axis=1)
            if not moved.all():
                running, new, every = running[moved], new[moved], False
            if not len(running):
                break
        labels[running] = new
        centers[running] = _centroids(points if every else points[running], new, k)
    near = np.take_along_axis(_distances(twice, norms, centers), labels[:, :, None], axis=2)
    return labels, near[:, :, 0].sum(axis=1)


def _centroids(points: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """(G, k, d) each cluster's mean: its rows in order, summed over the same axis of the
    same layout as ``points[labels == c].mean(axis=0)`` of one node."""
    nodes, m, dim = points.shape
    # rows by (node, cluster, row); labels of few values sort stably by radix
    order = np.argsort(labels.astype(np.int16 if k < 2 ** 15 else np.int64), axis=1,
                       kind="stable") + (np.arange(nodes) * m)[:, None]
    sizes = np.bincount((labels + (np.arange(nodes) * k)[:, None]).reshape(-1),
                        minlength=nodes * k)
    starts = np.cumsum(sizes) - sizes
    flat, order = points.reshape(nodes * m, dim), order.reshape(-1)
    out = np.empty((nodes * k, dim))
    for size in np.unique(sizes):  # the clusters of one size: a (count, size, d) stack
        which = np.flatnonzero(sizes == size)
        block = flat[order[starts[which][:, None] + np.arange(size)]]
        out[which] = block.sum(axis=1) / size
    return out.reshape(nodes, k, dim)


def balanced_assignment(distances: np.ndarray) -> np.ndarray:
    """(G, m) ``tree_cluster.balanced_assignment`` of each node's ``distances`` (G, m, k),
    its rounds run for every node at once."""
    nodes, m, k = distances.shape
    nearest = np.bincount((distances.argmin(axis=2) + (np.arange(nodes) * k)[:, None])
                          .reshape(-1), minlength=nodes * k).reshape(nodes, k)
    room = np.full((nodes, k), m // k, dtype=np.int64)
    extra = np.argsort(-nearest, axis=1, kind="stable")[:, :m % k]
    room[np.arange(nodes)[:, None], extra] += 1
    labels = np.full((nodes, m), -1, dtype=np.int64)
    while True:
        node, rows = np.nonzero(labels < 0)
        if not len(node):
            return labels
        masked = np.where(room[node] > 0, distances[node, rows], np.inf)
        choice = masked.argmin(axis=1)
        # by (node, choice), then distance, then row: the rows come in (node, row) order
        # and lexsort keeps the order of ties
        key = node * k + choice
        order = np.lexsort((masked[np.arange(len(rows)), choice], key))
        key = key[order]
        rank = np.arange(len(order)) - np.searchsorted(key, key)
        taken = rank < room.reshape(-1)[key]
        labels[node[order[taken]], rows[order[taken]]] = key[taken] % k
        room -= np.bincount(key[taken], minlength=nodes * k).reshape(nodes, k)
