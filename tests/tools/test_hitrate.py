"""The hitrate tool on hand-built embeddings of known answers: single users and users of
several interests (the best interest scores an item, zero interests take no part), the
hitrate's definition, chunked search equal to one matmul, and errors naming the flag or
column."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hashrec.tools.hitrate import main, top_k_items

# Five items on the axes of a plane and between them; scores have no ties for the users.
ITEMS = {"item_id": [10, 11, 12, 13, 14],
         "item_tower_emb": [[1.0, 0.0], [0.0, 1.0], [0.8, 0.5], [-1.0, 0.1], [0.3, -0.9]]}


def _run(tmp_path, users: dict, *flags: str, items: dict = ITEMS) -> tuple[int, pa.Table]:
    pq.write_table(pa.table(users), tmp_path / "users.parquet")
    pq.write_table(pa.table(items), tmp_path / "items.parquet")
    details = tmp_path / "details.parquet"
    code = main(["--user_gt_input", str(tmp_path / "users.parquet"),
                 "--item_embedding_input", str(tmp_path / "items.parquet"),
                 "--hitrate_details_output", str(details), "--device", "cpu",
                 "--overwrite", *flags])
    return code, pq.read_table(details) if code == 0 else None


def test_single_embedding_users_retrieve_their_top_k_and_hits_count_distinct_ids(
        tmp_path, capsys):
    users = {"request_id": ["a", "b", "c"],
             # a: 12 (0.8+0.5a), 10, 11 ... ; b: 11, 12, 13 ; c: 14, 10, 12
             "user_tower_emb": [[1.0, 0.6], [-0.1, 1.0], [0.2, -1.0]],
             "gt_items": [[10, 11, 10], [13], [99, 14]]}
    total = tmp_path / "total.parquet"
    code, details = _run(tmp_path, users, "--top_k", "2", "--request_id_field", "request_id",
                         "--total_hitrate_output", str(total))
    assert code == 0 and pq.read_table(total).to_pylist() == [{"hitrate": 0.4}]
    assert details.column_names == ["request_id", "topk_ids", "topk_dists", "hitrate",
                                    "hit_ids"]
    assert details["topk_ids"].to_pylist() == [[12, 10], [11, 12], [14, 10]]
    torch.testing.assert_close(torch.tensor(details["topk_dists"].to_pylist()),
                               torch.tensor([[1.1, 1.0], [1.0, 0.42], [0.96, 0.2]]))
    # a: 10 of {10, 11}; b: 13 not in its top 2; c: 14 of {99 (not an item), 14}
    assert details["hit_ids"].to_pylist() == [[10], [], [14]]
    assert details["hitrate"].to_pylist() == [0.5, 0.0, 0.5]
    out = capsys.readouterr().out
    assert "hitrate@2: 0.4000 (2 of 5 ground-truth items retrieved over 3 users" in out


def test_several_interests_score_an_item_by_the_best_and_zero_interests_take_no_part(
        tmp_path):
    users = {"user_tower_emb": [
        # x-interest: 10 (1.0), 12 (0.8); y-interest at half strength: 11 (0.5), 12 (0.25)
        [[1.0, 0.0], [0.0, 0.5], [0.0, 0.0]],
        # one interest (the rest zero): 13 (1.02), 11 (0.2), 14 (-0.48)
        [[-1.0, 0.2], [0.0, 0.0], [0.0, 0.0]],
        # no interest at all: nothing retrieved
        [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]],
        "gt_items": [[11, 14], [13], [10]]}
    code, details = _run(tmp_path, users, "--top_k", "3")
    assert code == 0
    # 12 is the x-interest's second and the y-interest's second: kept once, by its best
    assert details["topk_ids"].to_pylist() == [[10, 12, 11], [13, 11, 14], []]
    torch.testing.assert_close(torch.tensor(details["topk_dists"].to_pylist()[0]),
                               torch.tensor([1.0, 0.8, 0.5]))
    assert details["hitrate"].to_pylist() == [0.5, 1.0, 0.0]
    assert details["hit_ids"].to_pylist() == [[11], [13], []]


def test_a_single_id_column_and_text_ids_are_ground_truth_too(tmp_path, capsys):
    users = {"uid": [7, 8], "user_tower_emb": [[1.0, 0.6], [-0.1, 1.0]],
             "clicked": ["12,11", "13"]}
    code, details = _run(tmp_path, users, "--top_k", "1", "--gt_items_field", "clicked")
    assert code == 0 and details["hitrate"].to_pylist() == [0.5, 0.0]
    users["clicked"] = [12, 13]
    code, details = _run(tmp_path, users, "--top_k", "1", "--gt_items_field", "clicked",
                         "--request_id_field", "uid")
    assert code == 0 and details["hitrate"].to_pylist() == [1.0, 0.0]
    assert details["uid"].to_pylist() == [7, 8]
    assert "hitrate@1: 0.5000 (1 of 2" in capsys.readouterr().out


def test_text_ids_split_at_the_delimiter_given(tmp_path):
    # a sequence column's text, as HSTU match's candidates hold it
    users = {"user_tower_emb": [[1.0, 0.6], [-0.1, 1.0]], "clicked": ["12|11", "13| 11"]}
    code, details = _run(tmp_path, users, "--top_k", "1", "--gt_items_field", "clicked",
                         "--gt_items_delimiter", "|")
    assert code == 0 and details["hitrate"].to_pylist() == [0.5, 0.5]
    assert details["hit_ids"].to_pylist() == [[12], [11]]


@pytest.mark.parametrize("interests", [1, 3], ids=["single", "interests3"])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000], ids=lambda c: f"chunk{c}")
def test_chunked_search_equals_one_matmul_over_all_items(interests, chunk):
    generator = torch.Generator().manual_seed(interests * 100 + chunk)
    users = torch.randn(17, interests, 8, generator=generator)
    users[3, 1:] = 0  # a user with fewer interests
    items = torch.randn(300, 8, generator=generator)
    scores, rows = top_k_items(users, items, 10, chunk)
    full = torch.einsum("bkd,nd->bkn", users, items).masked_fill(
        (users == 0).all(-1, keepdim=True), float("-inf")).amax(1)
    expected = full.topk(10, dim=1)
    assert torch.equal(rows, expected.indices)
    torch.testing.assert_close(scores, expected.values)


def test_an_index_smaller_than_k_returns_every_item_ranked():
    users = torch.tensor([[[1.0, 0.0]]])
    items = torch.tensor([[0.5, 0.0], [2.0, 0.0], [-1.0, 0.0]])
    scores, rows = top_k_items(users, items, 10, 2)
    assert rows.tolist() == [[1, 0, 2]] and scores.tolist() == [[2.0, 0.5, -1.0]]


@pytest.mark.parametrize("change, message", [
    ({"gt": "nope"}, r"--user_gt_input .* has no column 'gt_items' \(set by --gt_items_field\)"),
    ({"item_id": "id"}, r"--item_embedding_input .* has no column 'item_id' "
                        r"\(set by --item_id_field\)"),
    ({"ragged": True}, r"column 'user_tower_emb' holds lists of lengths \[2, 3\]"),
    ({"dim": 3}, r"--user_embedding_field 'user_tower_emb' is of dimension 3, the items' "
                 r"'item_tower_emb' of 2"),
    ({"gt_text": True}, r"--gt_items_field 'gt_items' \(list<.*string>\) does not "
                        r"convert to the item ids' type int64"),
    ({"flag": ["--top_k", "0"]}, r"--top_k 0 must be 1 or more"),
    ({"flag": ["--gt_items_delimiter", ""]}, r"--gt_items_delimiter is empty"),
    ({"flag": ["--device", "tpu"]}, r"--device 'tpu' is not supported"),
], ids=["gt-column", "item-id-column", "ragged", "dimension", "gt-type", "top-k", "delimiter",
                 "device"])
def test_bad_inputs_are_errors_naming_the_flag_or_column(tmp_path, capsys, change, message):
    users = {"user_tower_emb": [[1.0, 0.0], [0.0, 1.0]], "gt_items": [[10], [11]]}
    items = dict(ITEMS)
    if "gt" in change:
        users = {"user_tower_emb": users["user_tower_emb"], change["gt"]: [[10], [11]]}
    if "item_id" in change:
        items = {"id": ITEMS["item_id"], "item_tower_emb": ITEMS["item_tower_emb"]}
    if "ragged" in change:
        users["user_tower_emb"] = [[1.0, 0.0], [0.0, 1.0, 2.0]]
    if "dim" in change:
        users["user_tower_emb"] = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    if "gt_text" in change:
        users["gt_items"] = [["x"], ["11"]]
    code, _ = _run(tmp_path, users, *change.get("flag", []), items=items)
    assert code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "details.parquet").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_retrieves_what_the_cpu_does(tmp_path):
    generator = torch.Generator().manual_seed(0)
    items = torch.randn(5000, 16, generator=generator)
    interests = torch.randn(300, 3, 16, generator=generator)
    interests[::7, 2] = 0.0
    users = {"request_id": list(range(300)), "user_tower_emb": interests.tolist(),
             "gt_items": torch.randint(0, 5000, (300, 4), generator=generator).tolist()}
    pq.write_table(pa.table(users), tmp_path / "users.parquet")
    pq.write_table(pa.table({"item_id": list(range(5000)), "item_tower_emb": items.tolist()}),
                   tmp_path / "items.parquet")
    found = {}
    for device in ("cpu", "cuda"):
        details, total = tmp_path / f"details_{device}.parquet", tmp_path / f"{device}.parquet"
        assert main(["--user_gt_input", str(tmp_path / "users.parquet"),
                     "--item_embedding_input", str(tmp_path / "items.parquet"),
                     "--hitrate_details_output", str(details), "--total_hitrate_output",
                     str(total), "--request_id_field", "request_id", "--top_k", "50",
                     "--batch_size", "128", "--item_chunk_size", "1024",
                     "--device", device]) == 0
        found[device] = pq.read_table(details), pq.read_table(total)
    (cpu, cpu_total), (cuda, cuda_total) = found["cpu"], found["cuda"]
    # the same items and scores; two items of scores equal to the last bits may swap ranks
    # (CUDA's and the CPU's matmuls round differently: on an H100 one pair of 15,000 did)
    cpu_ids, cuda_ids = cpu["topk_ids"].to_pylist(), cuda["topk_ids"].to_pylist()
    assert [sorted(ids) for ids in cuda_ids] == [sorted(ids) for ids in cpu_ids]
    assert sum(a != b for a, b in zip(cuda_ids, cpu_ids)) <= 3
    assert [sorted(h) for h in cuda["hit_ids"].to_pylist()] == [
        sorted(h) for h in cpu["hit_ids"].to_pylist()]
    assert cuda_total.to_pylist() == cpu_total.to_pylist()
    torch.testing.assert_close(torch.tensor(cuda["topk_dists"].to_pylist()),
                               torch.tensor(cpu["topk_dists"].to_pylist()))


def test_a_single_embedding_of_zeros_retrieves_nothing(tmp_path):
    users = {"user_tower_emb": [[0.0, 0.0], [1.0, 0.6]], "gt_items": [[10], [12]]}
    code, details = _run(tmp_path, users, "--top_k", "2")
    assert code == 0
    assert details["topk_ids"].to_pylist() == [[], [12, 10]]
    assert details["hit_ids"].to_pylist() == [[], [12]]
