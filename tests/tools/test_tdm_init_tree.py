import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hashrec.tools.tdm.init_tree import main
from hashrec.tools.tdm.tree_builder import build_tree, tree_depth


def _tree(ids, cates=None, attrs=(), raw=(), n_cluster=2):
    return build_tree(np.asarray(ids, dtype=np.int64),
                      None if cates is None else pa.array(cates),
                      [pa.array(a) for a in attrs], [pa.array(r) for r in raw], n_cluster)


def test_ten_items_binary_tree_matches_the_reference_layout():
    # TorchEasyRec's tree of items 0..9 (category = id): internal ids 10..24 in level
    # order, then the leaves 9..0 on level 4.
    tree = _tree(range(10), cates=list(range(10)), attrs=[list(range(10))],
                 raw=[[0.1 * i for i in range(10)]])
    assert tree.ids.tolist() == list(range(10, 25)) + list(range(9, -1, -1))
    assert tree.levels.tolist() == [0] + [1] * 2 + [2] * 4 + [3] * 8 + [4] * 10
    leaves = tree.attrs[-10:]
    assert [a[0] for a in leaves] == [str(i) for i in range(9, -1, -1)]
    assert tree.attrs[0][0] == "0"  # all values once: the smallest
    assert float(tree.attrs[0][1]) == pytest.approx(0.45)


@pytest.mark.parametrize("count,n_cluster", [(2, 2), (11, 3), (17, 4), (64, 2), (125, 5)])
def test_every_leaf_on_the_last_level_in_reverse_item_order(count, n_cluster):
    rng = np.random.default_rng(count)
    ids = rng.permutation(1000)[:count]
    cates = [f"c{i % 3}" for i in range(count)]
    tree = _tree(ids, cates=cates, n_cluster=n_cluster)
    depth = tree_depth(count, n_cluster)
    assert n_cluster ** depth >= count > n_cluster ** (depth - 1)
    leaf = tree.levels == depth
    assert leaf.sum() == count and (tree.levels[~leaf] < depth).all()
    ordered = sorted(zip(cates, ids.tolist()))
    assert tree.ids[leaf].tolist() == [i for _, i in ordered][::-1]
    parents = tree.parent_index()
    assert parents[0] == -1
    assert (tree.levels[parents[1:]] == tree.levels[1:] - 1).all()
    assert np.bincount(parents[1:]).max() <= n_cluster
    assert (tree.ids[~leaf] > ids.max()).all()
    assert len(set(tree.ids.tolist())) == len(tree.ids)


def test_categories_order_as_text_then_ids():
    tree = _tree([5, 6, 7, 8], cates=[10, 9, 9, 2])
    # "10" < "2" < "9": 5, 8, 6, 7, read backwards on the last level
    assert tree.ids[tree.levels == tree.depth].tolist() == [7, 6, 8, 5]


def test_node_attrs_are_modes_and_means_of_their_leaves():
    tree = _tree([1, 2, 3, 4], attrs=[["b", "a", "", "a"], [3, 3, 1, 1]],
                 raw=[[1.0, 2.0, None, 4.0], [1, 2, 4, 4]])
    by_id = dict(zip(tree.ids.tolist(), tree.attrs))
    root = tree.attrs[0]
    assert root[0] == "a"  # the empty value does not count
    assert root[1] == "1"  # a tie between 3 and 1: the smallest
    assert float(root[2]) == pytest.approx(7 / 3)  # the missing value does not count
    assert root[3] == "2"  # an integer column's mean 2.75, truncated
    assert by_id[3] == ["", "1", "0", "4"]  # a leaf's own values; missing raw -> "0"
    # level 1: items 3, 4 under one node ("" and "a": "a"), 1, 2 under the other
    # (a tie of "b" and "a": the first in item order)
    level1 = [a[0] for a, lv in zip(tree.attrs, tree.levels) if lv == 1]
    assert sorted(level1) == ["a", "b"]


@pytest.mark.parametrize("ids,n_cluster,match", [([1], 2, "2 or more"), ([1, 1], 2, "unique"),
                                                 ([1, 2], 1, "n_cluster")])
def test_bad_input_is_refused(ids, n_cluster, match):
    with pytest.raises(ValueError, match=match):
        _tree(ids, n_cluster=n_cluster)


def _lines(path):
    with open(path) as f:
        return f.read().splitlines()


def test_command_writes_torcheasyrec_tables(tmp_path):
    items = tmp_path / "items.parquet"
    pq.write_table(pa.table({"item_id": list(range(10)), "cate_id": list(range(10)),
                             "brand": [f"b{i % 2}" for i in range(10)],
                             "price": [float(i) for i in range(10)]}), items)
    out, serving = tmp_path / "tree", tmp_path / "serving"
    assert main(["--item_input_path", str(items), "--item_id_field", "item_id",
                 "--cate_id_field", "cate_id", "--attr_fields", "cate_id,brand",
                 "--raw_attr_fields", "price", "--node_edge_output_file", str(out),
                 "--tree_output_dir", str(serving)]) == 0
    nodes = _lines(out / "node_table.txt")
    assert nodes[0] == "id:int64\tweight:float\tfeature:string"
    assert nodes[1] == "-1\t1.0\t-1,10,0,b0,4.5"
    assert nodes[2] == "10\t1.0\t0,10,0,b0,4.5"
    assert nodes[-1] == "0\t1.0\t4,0,0,b0,0.0"
    assert len(nodes) == 2 + 25
    edges = _lines(out / "edge_table.txt")
    assert edges[0] == "src_id:int64\tdst_id:int64\tweight:float"
    # every leaf to its 3 ancestors below the root; leaf 9 (code 15): codes 7, 3, 1
    assert len(edges) == 1 + 10 * 3
    assert edges[1:4] == ["9\t17\t1.0", "9\t13\t1.0", "9\t11\t1.0"]
    predict = _lines(out / "predict_edge_table.txt")
    assert predict[1] == "-1\t10\t1.0"
    assert predict[2:4] == ["10\t11\t1.0", "10\t12\t1.0"]
    assert len(predict) == 1 + 25
    tree_lines = _lines(serving / "serving_tree")
    assert tree_lines[0] == "5 2" and tree_lines[1] == "0 10" and len(tree_lines) == 26


def test_command_names_the_flag_of_a_missing_column(tmp_path, capsys):
    items = tmp_path / "items.parquet"
    pq.write_table(pa.table({"item_id": [1, 2, 3]}), items)
    assert main(["--item_input_path", str(items), "--item_id_field", "item_id",
                 "--attr_fields", "brand", "--node_edge_output_file",
                 str(tmp_path / "t")]) == 2
    assert "--attr_fields" in capsys.readouterr().err
