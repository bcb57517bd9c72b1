"""The TDM retrieval's tree (predict edges) and layer-wise beam search, on a hand-built tree
scored by a fake scorer whose scores are known."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from tdm_world import ITEMS, build_tree

from hashrec.config.data_pb2 import TDMSampler
from hashrec.data.errors import DataError
from hashrec.tools.tdm.beam_search import beam_search, first_search_level, recall_hits
from hashrec.tools.tdm.search_tree import build_search_tree, read_search_tree

# root 100; A 101, B 102; A1 103, A2 104 under A; B1 105, B2 106 under B; leaves 0, 1
# under A1, 2, 3 under A2, 4 (alone) under B1, 6, 7 under B2
NODES = {100: 0, 101: 1, 102: 1, 103: 2, 104: 2, 105: 2, 106: 2,
         0: 3, 1: 3, 2: 3, 3: 3, 4: 3, 6: 3, 7: 3}
EDGES = [(-1, 100), (100, 101), (100, 102), (101, 103), (101, 104), (102, 105), (102, 106),
         (103, 0), (103, 1), (104, 2), (104, 3), (105, 4), (106, 6), (106, 7)]
# per user: node id -> score. User 0 likes A, then A2, while leaf 4 (under B) scores best
# of all leaves; user 1 likes B, then B1 (one child).
SCORES = [
    {101: 0.9, 102: 0.1, 103: 0.2, 104: 0.3, 105: 0.95, 106: 0.05,
     0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 4: 0.99, 6: 0.5, 7: 0.6},
    {101: 0.2, 102: 0.8, 103: 0.1, 104: 0.2, 105: 0.7, 106: 0.6,
     0: 0.9, 1: 0.8, 2: 0.7, 3: 0.6, 4: 0.5, 6: 0.4, 7: 0.3},
]


def _tree():
    ids = np.array(list(NODES), dtype=np.int64)
    levels = np.array(list(NODES.values()), dtype=np.int64)
    src, dst = (np.array(c, dtype=np.int64) for c in zip(*EDGES))
    return build_search_tree(ids, levels, {}, src, dst)


class FakeScorer:
    """Scores (user, node) pairs from ``SCORES``, recording how many pairs each call
    scores."""

    def __init__(self, tree, scores) -> None:
        self.table = torch.tensor([[user.get(int(i), 0.0) for i in tree.ids]
                                   for user in scores])
        self.calls: list[int] = []

    def __call__(self, user_index, node_rows):
        self.calls.append(len(user_index))
        return self.table[user_index, node_rows]


def _search(tree, scorer, beam_size: int, recall_num: int) -> list[list[int]]:
    sizes = [len(tree.level_rows(lv)) for lv in range(tree.num_levels)]
    first = first_search_level(sizes, beam_size, tree.n_cluster)
    found = beam_search(torch.from_numpy(tree.children), torch.from_numpy(tree.level_rows(first)),
                        tree.num_levels - first, len(scorer.table), scorer, beam_size,
                        recall_num).numpy()
    return np.where(found >= 0, tree.ids[found.clip(min=0)], -1).tolist()


def test_children_follow_the_predict_edges():
    tree = _tree()
    assert tree.n_cluster == 2 and tree.num_levels == 4
    children = {int(tree.ids[r]): sorted(int(tree.ids[c]) for c in tree.children[r] if c >= 0)
                for r in range(len(tree.ids))}
    assert children[100] == [101, 102] and children[105] == [4] and children[106] == [6, 7]
    assert all(children[leaf] == [] for leaf in (0, 1, 2, 3, 4, 6, 7))


def test_beam_of_one_follows_the_best_node_of_each_level():
    tree = _tree()
    scorer = FakeScorer(tree, SCORES)
    # searched from level 1 (2 nodes >= beam 1 x 2 children). User 0: A, A2, then its
    # leaves 3, 2 (leaf 4 scores best but B was cut on level 1). User 1: B, B1, whose one
    # leaf 4 leaves the second place empty.
    assert _search(tree, scorer, beam_size=1, recall_num=2) == [[3, 2], [4, -1]]
    # every call scores a fixed 2 users x 2 candidates, the missing child included
    assert scorer.calls == [4, 4, 4]


def test_beam_of_two_starts_lower_and_keeps_two_nodes_a_level():
    tree = _tree()
    scorer = FakeScorer(tree, SCORES)
    # searched from level 2 (4 nodes >= beam 2 x 2). User 0 keeps B1 and A2: leaves 4, 3,
    # 2; user 1 keeps B1 and B2: leaves 4, 6, 7.
    assert _search(tree, scorer, beam_size=2, recall_num=3) == [[4, 3, 2], [4, 6, 7]]
    assert scorer.calls == [8, 8]


def test_a_beam_wider_than_the_tree_ranks_every_leaf():
    tree = _tree()
    rng = np.random.default_rng(0)
    scores = [{int(i): float(s) for i, s in zip(tree.ids, rng.random(len(tree.ids)))}
              for _ in range(5)]
    leaves = [int(i) for i in tree.ids[tree.level_rows(3)]]
    expected = [sorted(leaves, key=lambda leaf: -user[leaf])[:4] for user in scores]
    assert _search(tree, FakeScorer(tree, scores), beam_size=100, recall_num=4) == expected


def test_more_recalls_than_leaves_pad_with_minus_one():
    tree = _tree()
    found = _search(tree, FakeScorer(tree, SCORES), beam_size=100, recall_num=9)
    assert found[1] == [0, 1, 2, 3, 4, 6, 7, -1, -1]


def test_first_search_level_is_torcheasyrecs_on_a_full_tree():
    sizes = [2 ** level for level in range(7)]
    # TorchEasyRec: ceil(log2(2 * 2 * recall_num)) with its beam 2 * recall_num
    for recall_num in (1, 2, 4, 8, 16):
        assert first_search_level(sizes, 2 * recall_num, 2) == \
            int(np.ceil(np.log2(4 * recall_num)))
    assert first_search_level(sizes, 64, 2) == 6  # no level above the leaves is wide enough


def test_recall_hits_compare_with_the_clicked_item():
    hits = recall_hits(np.array([[3, 2], [4, -1], [5, 6]]), np.array([2, 7, 6]))
    assert hits.tolist() == [True, False, True]


@pytest.mark.parametrize("edges, message", [
    ([(100, 101), (101, 0)], "not one level down"),
    ([(100, 101), (100, 102), (101, 103), (102, 103)], "has 2 parents"),
    ([(100, 101), (100, 999)], "node 999 is not in the node table"),
], ids=["skips-a-level", "two-parents", "unknown-node"])
def test_malformed_edges_are_errors_naming_the_field(edges, message):
    nodes = {**NODES}
    ids = np.array(list(nodes), dtype=np.int64)
    levels = np.array(list(nodes.values()), dtype=np.int64)
    src, dst = (np.array(c, dtype=np.int64) for c in zip(*edges))
    with pytest.raises(DataError, match=message) as err:
        build_search_tree(ids, levels, {}, src, dst)
    assert "predict_edge_input_path" in str(err.value)


def test_a_node_without_children_above_the_last_level_is_an_error():
    ids = np.array([100, 101, 102, 0], dtype=np.int64)
    levels = np.array([0, 1, 1, 2], dtype=np.int64)
    with pytest.raises(DataError, match="node 102 of level 1 has no children"):
        build_search_tree(ids, levels, {}, np.array([100, 100, 101]), np.array([101, 102, 0]))


def test_the_tree_of_init_tree_reads_as_its_edge_table_says(tmp_path):
    tree_dir = build_tree(tmp_path)
    config = TDMSampler(
        item_input_path=f"{tree_dir}/node_table.txt", edge_input_path=f"{tree_dir}/edge_table.txt",
        predict_edge_input_path=f"{tree_dir}/predict_edge_table.txt",
        attr_fields=["tree_level", "adgroup_id", "cate_id"], item_id_field="adgroup_id",
        layer_num_sample=[0, 1, 1, 2, 2, 3, 4], attr_delimiter=",")
    tree = read_search_tree(config)
    assert tree.n_cluster == 2 and tree.num_levels == 7
    assert sorted(tree.ids[tree.level_rows(6)].tolist()) == list(range(ITEMS))
    parent = {int(c): int(p) for p in range(len(tree.ids)) for c in tree.children[p] if c >= 0}
    # edge_table.txt: each leaf to its ancestors but the root, nearest first
    edges = np.loadtxt(f"{tree_dir}/edge_table.txt", skiprows=1, usecols=(0, 1), dtype=np.int64)
    for leaf in range(ITEMS):
        row, chain = int(np.flatnonzero(tree.ids == leaf)[0]), []
        while parent.get(row, 0) != 0:
            row = parent[row]
            chain.append(int(tree.ids[row]))
        assert chain == edges[edges[:, 0] == leaf, 1].tolist()
    # the node table's attrs come along: item i is of category i % 8
    leaf_cates = tree.attrs["cate_id"].take(pa.array(tree.level_rows(6))).to_pylist()
    assert leaf_cates == [str(i % 8) for i in tree.ids[tree.level_rows(6)]]


def test_nodes_rank_by_the_logit_margin_where_the_probabilities_round_to_one():
    from hashrec.models.outputs import task_outputs
    from hashrec.tools.tdm.retrieval import positive_scores
    logits = torch.tensor([[0.0, 30.0], [1.0, 41.0], [0.0, -3.0], [5.0, 25.0]])
    outputs = task_outputs([logits], [""], [False])
    assert outputs["probs1"][0] == outputs["probs1"][1] == outputs["probs1"][3] == 1.0
    assert positive_scores(outputs).argsort(descending=True).tolist() == [1, 0, 3, 2]
    single = task_outputs([torch.tensor([20.0, 30.0, -2.0])], [""], [False])
    assert single["probs"][0] == single["probs"][1] == 1.0
    assert positive_scores(single).argsort(descending=True).tolist() == [1, 0, 2]


def test_nodes_of_equal_scores_are_kept_in_candidate_order():
    tree = _tree()
    # every node alike (as nodes a model never saw in training may score): the first
    # candidates of each level win, children in their parents' order
    flat = [{int(i): 0.5 for i in tree.ids}] * 2
    assert _search(tree, FakeScorer(tree, flat), beam_size=1, recall_num=2) == [[0, 1]] * 2
    assert _search(tree, FakeScorer(tree, flat), beam_size=2, recall_num=4) == [[0, 1, 2, 3]] * 2
    # ties below a better node keep their order after it
    ties = [{**flat[0], 3: 0.9}, {**flat[0], 7: 0.9}]
    assert _search(tree, FakeScorer(tree, ties), beam_size=100, recall_num=3) == [
        [3, 0, 1], [7, 0, 1]]
