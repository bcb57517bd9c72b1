"""gen_kuairand_data: columns, splits, sequences of one length per row, the planted clicks
(a candidate of the user's history's main category), determinism, the command line."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.parquet as pq

from hashrec.tools.gen_kuairand_data import (
    GROUPS,
    MARKER,
    MAX_CANDIDATES,
    MAX_HISTORY,
    generate,
    main,
    num_videos,
)

HISTORY = ("uih_seq__video_id", "uih_seq__video_cat", "uih_seq__action_timestamp",
           "uih_seq__action_weight", "uih_seq__watch_time")
CANDIDATES = ("cand_seq__video_id", "cand_seq__video_cat", "cand_seq__query_time",
              "cand_seq__action_weight", "cand_seq__watch_time")


def test_splits_columns_and_sequences(tmp_path):
    paths = generate(str(tmp_path / "d"), 300, num_files=2, eval_rows=100, seed=1,
                     scale=0.0001, quiet=True)
    train = pq.read_table(paths["train"])
    assert train.num_rows == 300 and pq.read_table(paths["eval"]).num_rows == 100
    assert set(HISTORY + CANDIDATES) <= set(train.column_names)
    users = train.column("user_id").to_pylist()
    assert len(set(users)) == 300  # a user a row
    for row in train.slice(0, 50).to_pylist():
        history = [row[c].split("|") for c in HISTORY]
        candidates = [row[c].split("|") for c in CANDIDATES]
        assert len({len(h) for h in history}) == 1 and 1 <= len(history[0]) <= MAX_HISTORY
        assert len({len(c) for c in candidates}) == 1
        assert 1 <= len(candidates[0]) <= MAX_CANDIDATES
        stamps = [float(t) for t in history[2]]
        assert stamps == sorted(stamps) and float(candidates[2][0]) > stamps[-1]
        videos = [int(v) for v in history[0] + candidates[0]]
        cats = [int(c) for c in history[1] + candidates[1]]
        assert all(v % GROUPS == c and v < num_videos(0.0001) for v, c in zip(videos, cats))
    assert sorted(p.name for p in (tmp_path / "d" / "train").iterdir()) == [
        MARKER, "part-00000.parquet", "part-00001.parquet"]


def test_a_click_is_a_candidate_of_the_historys_main_category(tmp_path):
    (path,) = generate(str(tmp_path / "d"), 2000, seed=2, scale=0.0001, quiet=True)["data"]
    agree, likes = [], []
    for row in pq.read_table(path).to_pylist():
        main_category = Counter(row["uih_seq__video_cat"].split("|")).most_common(1)[0][0]
        for video, cat, bits in zip(row["cand_seq__video_id"].split("|"),
                                    row["cand_seq__video_cat"].split("|"),
                                    row["cand_seq__action_weight"].split("|")):
            agree.append((cat == main_category) == bool(int(bits) & 1))
            if int(bits) & 2:
                likes.append(int(video) % 3 == 0 and int(bits) & 1)
    assert np.mean(agree) > 0.9 and all(likes) and likes


def test_same_seed_same_rows(tmp_path):
    a = pq.read_table(generate(str(tmp_path / "a"), 50, seed=3, quiet=True)["data"][0])
    b = pq.read_table(generate(str(tmp_path / "b"), 50, seed=3, quiet=True)["data"][0])
    c = pq.read_table(generate(str(tmp_path / "c"), 50, seed=4, quiet=True)["data"][0])
    assert a.equals(b) and not a.equals(c)


def test_the_command_line_writes_the_splits(tmp_path):
    out = tmp_path / "d"
    assert main(["--output_dir", str(out), "--num_rows", "20", "--eval_rows", "5",
                 "--scale", "0.0001", "--quiet"]) == 0
    assert pq.read_table(out / "eval").num_rows == 5
