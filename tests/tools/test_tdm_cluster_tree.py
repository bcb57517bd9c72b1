"""cluster_tree: planted groups of embeddings under one subtree each, balanced parts,
every leaf on the last level, determinism by seed, init_tree's files read by the
retrieval's tree reader, and errors naming the flag."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hashrec.config.data_pb2 import TDMSampler as SamplerConfig
from hashrec.tools.tdm.cluster_tree import main
from hashrec.tools.tdm.search_tree import read_search_tree
from hashrec.tools.tdm.tree_builder import tree_depth
from hashrec.tools.tdm.tree_cluster import balanced_assignment, cluster_codes


def _planted(groups: int, per_group: int, seed: int, dim: int = 8):
    """Shuffled items (ids 100 + i) of ``groups`` well-separated tight groups: (ids,
    group of each, embeddings)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(groups, dim)) * 3.0
    group = rng.permutation(np.repeat(np.arange(groups), per_group))
    embeddings = centers[group] + rng.normal(size=(len(group), dim)) * 0.1
    return 100 + np.arange(len(group)), group, embeddings


def _write_items(path, ids, embeddings, **columns) -> None:
    pq.write_table(pa.table({"item_id": ids, "item_emb": [list(e) for e in embeddings],
                             **columns}), path)


def _run(tmp_path, *extra, name="tree") -> int:
    return main(["--item_input_path", str(tmp_path / "items.parquet"), "--item_id_field",
                 "item_id", "--node_edge_output_file", str(tmp_path / name), *extra])


def _ancestors(tree_dir) -> dict[int, list[int]]:
    """leaf -> its ancestors but the root, nearest first (the edge table)."""
    out: dict[int, list[int]] = {}
    with open(tree_dir / "edge_table.txt") as f:
        for line in f.read().splitlines()[1:]:
            src, dst, _ = line.split("\t")
            out.setdefault(int(src), []).append(int(dst))
    return out


def _search_tree(tree_dir, levels: int, attrs=("tree_level", "item_id")):
    """The tree of ``levels`` levels as the retrieval reads it."""
    return read_search_tree(SamplerConfig(
        layer_num_sample=[0] + [1] * (levels - 1),
        item_input_path=str(tree_dir / "node_table.txt"),
        edge_input_path=str(tree_dir / "edge_table.txt"),
        predict_edge_input_path=str(tree_dir / "predict_edge_table.txt"),
        attr_fields=list(attrs), item_id_field="item_id", attr_delimiter=","))


@pytest.mark.parametrize("n_cluster,groups,per_group",
                         [(2, 8, 8), (3, 9, 9), (4, 4, 16), (4, 16, 4)],
                         ids=["n2-8x8", "n3-9x9", "n4-4x16", "n4-16x4"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_groups_each_fill_one_subtree(tmp_path, n_cluster, groups, per_group, seed):
    ids, group, embeddings = _planted(groups, per_group, seed)
    _write_items(tmp_path / "items.parquet", ids, embeddings, group=group)
    assert _run(tmp_path, "--n_cluster", str(n_cluster), "--attr_fields", "group") == 0
    ancestors = _ancestors(tmp_path / "tree")
    assert sorted(ancestors) == ids.tolist()
    up = round(np.log(per_group) / np.log(n_cluster))  # a group's subtree is this tall
    by_group = {g: {ancestors[i][up - 1] for i in ids[group == g]} for g in range(groups)}
    assert all(len(heads) == 1 for heads in by_group.values()), by_group
    assert len(set.union(*by_group.values())) == groups
    # the retrieval's reader takes the tree: every item on the last level, and a group's
    # head node holds the group as its most common attr
    tree = _search_tree(tmp_path / "tree", tree_depth(len(ids), n_cluster) + 1,
                        ("tree_level", "item_id", "group"))
    last = tree.levels == tree.levels.max()
    assert sorted(tree.ids[last].tolist()) == ids.tolist()
    head_attr = dict(zip(tree.ids.tolist(), tree.attrs["group"].to_pylist()))
    assert all(head_attr[next(iter(heads))] == str(g) for g, heads in by_group.items())


@pytest.mark.parametrize("count,n_cluster", [(5, 2), (7, 2), (100, 3), (61, 4), (26, 5)])
def test_parts_are_balanced_and_leaves_on_the_last_level(tmp_path, count, n_cluster):
    rng = np.random.default_rng(count)
    ids = rng.permutation(10 * count)[:count]
    _write_items(tmp_path / "items.parquet", ids, rng.normal(size=(count, 4)))
    assert _run(tmp_path, "--n_cluster", str(n_cluster)) == 0
    depth = tree_depth(count, n_cluster)
    tree = _search_tree(tmp_path / "tree", depth + 1)
    assert tree.levels.max() == depth
    assert sorted(tree.ids[tree.levels == depth].tolist()) == sorted(ids.tolist())
    assert (tree.ids[tree.levels < depth] > ids.max()).all()
    items_below = np.where(tree.levels == depth, 1, 0)
    for level in range(depth - 1, -1, -1):  # leaves up: each node's item count
        for row in np.flatnonzero(tree.levels == level):
            kids = tree.children[row][tree.children[row] >= 0]
            assert 1 <= len(kids) <= n_cluster
            items_below[row] = items_below[kids].sum()
            # siblings' parts differ by at most one item
            assert items_below[kids].max() - items_below[kids].min() <= 1
    assert items_below[tree.levels == 0].tolist() == [count]


def test_balanced_assignment_keeps_the_nearest_and_fills_every_cluster():
    distances = np.array([[0.0, 5.0], [1.0, 4.0], [2.0, 3.0], [0.5, 9.0], [3.0, 0.0]])
    # 4 rows nearest cluster 0, room 3 (the extra row goes to the fuller cluster): it
    # keeps rows 0, 3, 1; row 2 goes to cluster 1
    assert balanced_assignment(distances).tolist() == [0, 0, 1, 0, 1]
    rng = np.random.default_rng(0)
    for m, k in [(10, 3), (64, 4), (5, 5), (33, 2)]:
        labels = balanced_assignment(rng.random((m, k)))
        assert sorted(np.bincount(labels, minlength=k)) == \
            sorted([m // k + (i < m % k) for i in range(k)])


def _files(tree_dir) -> list[str]:
    return [(tree_dir / n).read_text() for n in
            ("node_table.txt", "edge_table.txt", "predict_edge_table.txt")]


def test_the_seed_alone_decides_the_tree(tmp_path):
    rng = np.random.default_rng(7)
    _write_items(tmp_path / "items.parquet", np.arange(50), rng.normal(size=(50, 6)))
    for name, seed in [("a", 3), ("b", 3), ("c", 4)]:
        assert _run(tmp_path, "--seed", str(seed), name=name) == 0
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _files(tmp_path / "a") != _files(tmp_path / "c")
    points = rng.normal(size=(30, 3))
    assert (cluster_codes(points, 3, seed=1) == cluster_codes(points.copy(), 3, seed=1)).all()


def test_text_embeddings_give_the_tree_of_lists(tmp_path):
    ids, _, embeddings = _planted(4, 4, 0, dim=3)
    _write_items(tmp_path / "items.parquet", ids, embeddings)
    assert _run(tmp_path, name="lists") == 0
    texts = ["[" + ", ".join(repr(float(v)) for v in e) + "]" for e in embeddings]
    pq.write_table(pa.table({"item_id": ids, "item_emb": texts}), tmp_path / "items.parquet")
    assert _run(tmp_path, name="texts") == 0
    assert _files(tmp_path / "lists") == _files(tmp_path / "texts")


@pytest.mark.parametrize("columns,flags,message", [
    ({"item_emb": [[1.0, 2.0]] * 3}, ["--embedding_field", "vec"],
     "--embedding_field: .* has no column vec"),
    ({"item_emb": [[1.0, 2.0]] * 3}, ["--attr_fields", "brand"],
     "--attr_fields: .* has no column brand"),
    ({"item_emb": [[1.0, 2.0], [1.0], [0.0, 0.0]]}, [],
     "--embedding_field: .* row 1 holds 1 numbers"),
    ({"item_emb": [[1.0, 2.0], [1.0, float("nan")], [0.0, 0.0]]}, [],
     "--embedding_field: .* row 1 holds a missing, NaN"),
    ({"item_emb": [[1.0, 2.0], None, [0.0, 0.0]]}, [], "--embedding_field: .* 1 missing"),
    ({"item_emb": [1.0, 2.0, 3.0]}, [], "--embedding_field: .* is double"),
    ({"item_emb": ["1,2", "1,x", "0,0"]}, [], "--embedding_field: .* does not hold numbers"),
    ({"item_emb": [[1.0, 2.0]] * 3}, ["--n_cluster", "1"], "--n_cluster 1; allowed"),
    ({"item_emb": [[1.0, 2.0]] * 3}, ["--seed", "-1"], "--seed -1; allowed"),
    ({"item_emb": [[1.0, 2.0]] * 3, "item_id": [1, 2, 1]}, [], "--item_input_path .* unique"),
], ids=["no-embedding-column", "no-attr-column", "lengths-differ", "nan", "null",
        "not-a-list", "not-numbers", "n-cluster", "seed", "repeated-id"])
def test_bad_input_is_an_error_naming_the_flag(tmp_path, capsys, columns, flags, message):
    pq.write_table(pa.table({"item_id": [1, 2, 3], **columns}), tmp_path / "items.parquet")
    assert _run(tmp_path, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("cluster_tree: ")
    assert re.search(message, err), err
    assert not (tmp_path / "tree").exists()
