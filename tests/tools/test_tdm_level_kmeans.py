"""cluster_tree's k-means on a stack of nodes against the same k-means one node at a time
(``tree_cluster``'s per-node functions): the same trees, labels, centroids and distances to
the last bit, on random embeddings of many dims (1 included), node sizes on both sides of
``ONE_BY_ONE``, 2 to 5 children, and integer embeddings full of ties."""

from __future__ import annotations

import numpy as np
import pytest

from hashrec.tools.tdm import level_kmeans, tree_cluster
from hashrec.tools.tdm.tree_cluster import (
    ONE_BY_ONE,
    balanced_split,
    cluster_codes,
    cluster_codes_by_node,
)


def _embeddings(rng, count: int, dim: int, kind: str) -> np.ndarray:
    if kind == "ties":  # many equal points and equal distances
        return rng.integers(0, 3, size=(count, dim)).astype(np.float64)
    scale = 1e3 if kind == "wide" else 1.0
    return rng.normal(size=(count, dim)) * scale


@pytest.mark.parametrize("count,dim,k,kind", [
    (40, 1, 2, "normal"), (97, 3, 3, "ties"), (300, 8, 2, "normal"), (257, 16, 4, "wide"),
    (700, 5, 2, "ties"), (1100, 2, 5, "normal"), (ONE_BY_ONE * 3 + 1, 64, 2, "normal"),
], ids=lambda v: str(v))
@pytest.mark.parametrize("seed", [0, 3])
def test_the_tree_is_the_one_of_splitting_node_by_node(count, dim, k, kind, seed):
    rng = np.random.default_rng([count, dim, seed])
    points = _embeddings(rng, count, dim, kind)
    codes = cluster_codes(points, k, seed=seed)
    assert np.array_equal(codes, cluster_codes_by_node(points, k, seed=seed))
    assert len(np.unique(codes)) == count  # a leaf an item


@pytest.mark.parametrize("nodes,size,dim,k,kind", [
    (5, 3, 1, 2, "normal"), (40, 9, 4, 3, "ties"), (7, 64, 16, 2, "normal"),
    (3, 130, 2, 5, "wide"), (1, 600, 8, 2, "ties"),
], ids=lambda v: str(v))
def test_stacked_nodes_split_as_each_alone(nodes, size, dim, k, kind):
    rng = np.random.default_rng([nodes, size, dim])
    points = _embeddings(rng, nodes * size, dim, kind).reshape(nodes, size, dim)
    labels = level_kmeans.split_nodes(points, k, [np.random.default_rng([9, g])
                                                  for g in range(nodes)], 20, 3)
    for g in range(nodes):
        alone = balanced_split(points[g], k, np.random.default_rng([9, g]), 20, 3)
        together = sorted((np.flatnonzero(labels[g] == c) for c in range(k)),
                          key=lambda part: int(part[0]))
        assert [p.tolist() for p in together] == [p.tolist() for p in alone]


@pytest.mark.parametrize("dim", [1, 2, 7, 64])
def test_distances_and_centroids_are_the_per_node_bits(dim):
    rng = np.random.default_rng(dim)
    nodes, size, k = 6, 50, 3
    points = rng.normal(size=(nodes, size, dim))
    centers = rng.normal(size=(nodes, k, dim))
    labels = np.stack([rng.permutation(np.arange(size) % k) for _ in range(nodes)])
    stacked = level_kmeans._distances(2.0 * points, (points ** 2).sum(axis=2), centers)
    means = level_kmeans._centroids(points, labels, k)
    for g in range(nodes):
        assert np.array_equal(stacked[g], tree_cluster._squared_distances(points[g],
                                                                          centers[g]))
        alone = np.stack([points[g][labels[g] == c].mean(axis=0) for c in range(k)])
        assert np.array_equal(means[g], alone)


def test_balanced_assignment_of_a_stack_is_each_nodes():
    rng = np.random.default_rng(0)
    for nodes, size, k in [(30, 7, 2), (12, 20, 3), (5, 11, 5), (1, 64, 4)]:
        distances = rng.integers(0, 4, size=(nodes, size, k)).astype(np.float64)
        stacked = level_kmeans.balanced_assignment(distances)
        for g in range(nodes):
            assert stacked[g].tolist() == \
                tree_cluster.balanced_assignment(distances[g]).tolist()
