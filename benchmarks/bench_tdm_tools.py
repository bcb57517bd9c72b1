"""Speed of the TDM tools: the retrieval's beam search against scoring every item; cluster_tree.

* **retrieval**: a tree of ``2 ** --log_items`` items (``init_tree``'s, ``--categories``
  categories, ``--n_cluster`` children a node) and a TDM model built from a small config
  (``tdm_world``'s layout: user id, the candidate's item and category ids, a behaviour
  sequence of ``--seq_len`` items and categories; dynamic tables filled with random rows
  for every id, untrained dense weights) score a block of ``--users`` generated user
  rows through the retrieval's own pieces (``retrieval.PairScorer``, ``beam_search``;
  ``--beam_size``, ``--recall_num``: TorchEasyRec's 400 / 200). The baseline, in the same
  run: every leaf scored for each of ``--brute_users`` of those rows with the same scorer
  (what the tree search avoids), then its ``recall_num`` best. Both report user rows per
  second and split their time into the host's pair building (the scorer's time less the
  model's), the model's forward, and the rest (the search's top-k and children); the
  tree's share of the exact top-k is the beam's recall of it.
* **cluster_tree**: ``tree_cluster.cluster_codes`` (the k-means) and
  ``tree_builder.tree_of_leaves`` over ``2 ** n`` random items of ``--dim`` for each
  ``n`` of ``--cluster_log_items``.

    python benchmarks/bench_tdm_tools.py --out benchmarks/results/tdm_tools_cpu
    python benchmarks/bench_tdm_tools.py --quick            # seconds, on the CPU
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from _timing import command_line, environment, write_results
from bench_export import fill_tables

from hashrec.config import load_pipeline_config
from hashrec.export.loading import resolve_device
from hashrec.tools.tdm.beam_search import beam_search, first_search_level
from hashrec.tools.tdm.init_tree import main as init_tree
from hashrec.tools.tdm.retrieval import PairScorer, positive_scores, search_tree
from hashrec.tools.tdm.tree_builder import tree_depth, tree_of_leaves
from hashrec.tools.tdm.tree_cluster import cluster_codes
from hashrec.train.session import build_session

SCORER = ("TDM model (hashrec.models.tdm) built from a small config: multi-window DIN "
          "over the behaviour sequence, final MLP [64, 32]; dynamic tables filled with "
          "random rows, dense weights untrained")
QUICK = {"log_items": 10, "users": 8, "brute_users": 4, "seq_len": 5, "beam_size": 16,
         "recall_num": 8, "reps": 1, "cluster_log_items": "9,10", "dim": 16}


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log_items", type=int, default=16, help="the tree holds 2 ** N items")
    p.add_argument("--categories", type=int, default=1000, help="item categories")
    p.add_argument("--n_cluster", type=int, default=2, help="children a node")
    p.add_argument("--users", type=int, default=64, help="user rows of the searched block")
    p.add_argument("--brute_users", type=int, default=None,
                   help="of those, rows whose every item is scored (default: all)")
    p.add_argument("--seq_len", type=int, default=50, help="behaviour sequence length")
    p.add_argument("--emb_dim", type=int, default=16, help="embedding dim of every feature")
    p.add_argument("--beam_size", type=int, default=400)
    p.add_argument("--recall_num", type=int, default=200)
    p.add_argument("--chunk_pairs", type=int, default=None,
                   help="pairs a scorer call when every item is scored (default: the "
                        "beam search's, users x beam_size x n_cluster)")
    p.add_argument("--reps", type=int, default=3, help="timed searches (median)")
    p.add_argument("--cluster_log_items", default="14,15,16",
                   help="cluster_tree over 2 ** n items for each n (comma-separated; empty: "
                        "skip)")
    p.add_argument("--dim", type=int, default=64, help="embedding dim for cluster_tree")
    p.add_argument("--skip_retrieval", action="store_true")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<index>")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (seconds on a CPU): " + ", ".join(
                       f"{k} {v}" for k, v in QUICK.items()))
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    if p.parse_args(argv).quick:  # quick sizes where the command line names none
        p.set_defaults(**QUICK)
    args = p.parse_args(argv)
    args.brute_users = min(args.brute_users or args.users, args.users)
    return args


def _id_feature(name: str, dim: int, capacity: int) -> str:
    return (f'id_feature {{ feature_name: "{name}" expression: "item:{name}" '
            f'embedding_dim: {dim} dynamicemb {{ max_capacity: {capacity} '
            f'initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }}')


def _config_text(workdir: str, tree: str, args: argparse.Namespace, levels: int) -> str:
    """A TDM over the generated tree (``tdm_world``'s layout, sized to the tree)."""
    capacity = 1 << (args.log_items + 3)
    items, cates = (_id_feature(n, args.emb_dim, c) for n, c in
                    (("adgroup_id", capacity), ("cate_id", 4 * args.categories + 1024)))
    users = 1 << max(10, (2 * args.users).bit_length())
    return f"""
model_dir: "{workdir}/model"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
}}
data_config {{ batch_size: {args.users} dataset_type: ParquetDataset label_fields: "clk"
  num_workers: 0
  tdm_sampler {{ item_input_path: "{tree}/node_table.txt"
    edge_input_path: "{tree}/edge_table.txt"
    predict_edge_input_path: "{tree}/predict_edge_table.txt"
    attr_fields: ["tree_level", "adgroup_id", "cate_id"] item_id_field: "adgroup_id"
    layer_num_sample: [{", ".join(["0"] + ["1"] * (levels - 1))}] attr_delimiter: "," }} }}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: {args.emb_dim} dynamicemb {{ max_capacity: {users}
  initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }} }}
feature_configs {{ {items} }}
feature_configs {{ {cates} }}
feature_configs {{ sequence_feature {{ sequence_name: "click_seq"
  sequence_length: {args.seq_len} sequence_delim: "|" features {{ {items} }}
  features {{ {cates} }} }} }}
model_config {{
  feature_groups {{ group_name: "seq" group_type: SEQUENCE
    feature_names: ["adgroup_id", "cate_id", "click_seq__adgroup_id", "click_seq__cate_id"] }}
  feature_groups {{ group_name: "user" group_type: DEEP feature_names: "user_id" }}
  tdm {{ multiwindow_din {{ windows_len: [1, 4, {max(args.seq_len - 5, 1)}]
    attn_mlp {{ hidden_units: [32] }} }} final {{ hidden_units: [64, 32] }} }}
  num_class: 2
  losses {{ softmax_cross_entropy {{}} }}
}}
"""


def _write_tree(workdir: str, args: argparse.Namespace) -> tuple[str, float]:
    """init_tree's tree of the generated items; (its directory, seconds)."""
    count = 1 << args.log_items
    pq.write_table(pa.table({"item_id": np.arange(count),
                             "cate_id": np.arange(count) % args.categories}),
                   f"{workdir}/items.parquet")
    tree = f"{workdir}/tree"
    start = time.perf_counter()
    code = init_tree(["--item_input_path", f"{workdir}/items.parquet", "--item_id_field",
                      "item_id", "--cate_id_field", "cate_id", "--attr_fields", "cate_id",
                      "--n_cluster", str(args.n_cluster), "--node_edge_output_file", tree])
    if code != 0:
        raise SystemExit(f"init_tree exited with {code}")
    return tree, time.perf_counter() - start


def _users(args: argparse.Namespace) -> pa.Table:
    """The block's user rows: each user's sequence mostly of one category's items."""
    rng = np.random.default_rng(0)
    count, cates = 1 << args.log_items, args.categories
    liked = rng.integers(0, cates, args.users)
    picks = rng.integers(0, count // cates, (args.users, args.seq_len)) * cates + liked[:, None]
    picks = np.where(rng.random(picks.shape) < 0.8, picks, rng.integers(0, count, picks.shape))
    return pa.table({
        "user_id": np.arange(args.users), "adgroup_id": picks[:, 0], "cate_id": liked,
        "click_seq__adgroup_id": ["|".join(map(str, p)) for p in picks],
        "click_seq__cate_id": ["|".join(map(str, p % cates)) for p in picks]})


class Timers:
    """Seconds spent in the scorer and in the model's forward (synchronized on CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.scorer = self.model = 0.0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wrap(self, fn, slot: str):
        def timed(*args):
            self.sync()
            start = time.perf_counter()
            out = fn(*args)
            self.sync()
            setattr(self, slot, getattr(self, slot) + time.perf_counter() - start)
            return out
        return timed


def _filled_session(config, device: torch.device, tree, users: pa.Table):
    """The model with every id of the users' rows and of the tree's nodes in its tables."""
    session = build_session(config, device=device, purpose="retrieval")
    batches = [session.feature_set.parse(users, with_labels=False)]
    capture = PairScorer(session.feature_set, lambda b: batches.append(b) or torch.zeros(0),
                         tree, torch.device("cpu"))
    rows = len(tree.ids)
    # the nodes' ids: every node paired with one user whose sequences are empty
    bare = users.slice(0, 1).drop_columns(["click_seq__adgroup_id", "click_seq__cate_id"])
    bare = bare.append_column("click_seq__adgroup_id", pa.array([""])) \
        .append_column("click_seq__cate_id", pa.array([""])).select(users.column_names)
    capture.for_users(bare)(torch.zeros(rows, dtype=torch.int64), torch.arange(rows))
    fill_tables(session, [b.to(device) for b in batches])
    session.model.eval()
    return session


def _split(timers: Timers, total: float, rows: int) -> dict:
    return {"seconds": total, "rows_per_s": rows / total, "pairs_s": timers.scorer - timers.model,
            "model_s": timers.model, "other_s": total - timers.scorer}


def _time_tree(search, scorer: PairScorer, users: pa.Table, timers: Timers, reps: int):
    """(median search's split, its found rows (B, recall_num)) after one warm-up."""
    runs, found = [], None
    for i in range(1 + reps):
        timers.scorer = timers.model = 0.0
        score = timers.wrap(scorer.for_users(users), "scorer")
        timers.sync()
        start = time.perf_counter()
        found = search(users=users.num_rows, scorer=score)
        timers.sync()
        if i:
            runs.append(_split(timers, time.perf_counter() - start, users.num_rows))
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2], found


def _time_every_leaf(leaves: torch.Tensor, scorer: PairScorer, users: pa.Table,
                     timers: Timers, recall_num: int, chunk_pairs: int):
    """(split of scoring every leaf for each user and taking the best, found rows)."""
    timers.scorer = timers.model = 0.0
    score = timers.wrap(scorer.for_users(users), "scorer")
    count, device = users.num_rows, leaves.device
    timers.sync()
    start = time.perf_counter()
    scores = torch.empty(count, len(leaves), device=device)
    flat_users = torch.arange(count, device=device).repeat_interleave(len(leaves))
    flat_leaves = leaves.repeat(count)
    out = scores.view(-1)
    for begin in range(0, out.numel(), chunk_pairs):
        end = min(begin + chunk_pairs, out.numel())
        out[begin:end] = score(flat_users[begin:end], flat_leaves[begin:end]).float()
    found = leaves[scores.topk(min(recall_num, len(leaves)), dim=1).indices]
    timers.sync()
    return _split(timers, time.perf_counter() - start, count), found


def bench_retrieval(args: argparse.Namespace, device: torch.device, workdir: str) -> dict:
    tree_dir, init_s = _write_tree(workdir, args)
    levels = 1 + tree_depth(1 << args.log_items, args.n_cluster)
    path = f"{workdir}/pipeline.config"
    with open(path, "w", encoding="utf-8") as f:
        f.write(_config_text(workdir, tree_dir, args, levels))
    config = load_pipeline_config(path)
    tree = search_tree(config, None, None)
    users = _users(args)
    session = _filled_session(config, device, tree, users)
    timers = Timers(device)
    forward = timers.wrap(lambda batch: positive_scores(session.model(batch)), "model")
    scorer = PairScorer(session.feature_set, forward, tree, device)
    sizes = [len(tree.level_rows(lv)) for lv in range(tree.num_levels)]
    first = first_search_level(sizes, args.beam_size, tree.n_cluster)
    children = torch.from_numpy(tree.children).to(device)
    leaves = torch.from_numpy(tree.level_rows(tree.num_levels - 1)).to(device)

    def search(users: int, scorer) -> torch.Tensor:
        return beam_search(children, torch.from_numpy(tree.level_rows(first)).to(device),
                           tree.num_levels - first, users, scorer, args.beam_size,
                           args.recall_num)

    with torch.inference_mode():
        by_tree, tree_found = _time_tree(search, scorer, users, timers, args.reps)
        chunk = args.chunk_pairs or args.users * min(args.beam_size, sizes[first]) * \
            tree.n_cluster
        brute = users.slice(0, args.brute_users)
        by_leaf, leaf_found = _time_every_leaf(leaves, scorer, brute, timers, args.recall_num,
                                               chunk)
    top = leaf_found.cpu().numpy()
    kept = tree_found[:args.brute_users].cpu().numpy()
    share = np.mean([len(np.intersect1d(a, b)) / len(b) for a, b in zip(kept, top)])
    return {"items": len(leaves), "nodes": len(tree.ids), "levels": tree.num_levels,
            "first_level": first, "levels_searched": tree.num_levels - first,
            "n_cluster": tree.n_cluster, "users": args.users, "brute_users": args.brute_users,
            "seq_len": args.seq_len, "emb_dim": args.emb_dim, "beam_size": args.beam_size,
            "recall_num": args.recall_num, "chunk_pairs": chunk, "init_tree_s": init_s,
            "scorer": SCORER, "tree": by_tree, "every_item": by_leaf,
            "speedup": by_tree["rows_per_s"] / by_leaf["rows_per_s"],
            "tree_recall_of_exact_top": float(share)}


def bench_cluster(log_items: list[int], dim: int, n_cluster: int) -> list[dict]:
    out = []
    for n in log_items:
        rng = np.random.default_rng(n)
        embeddings = rng.standard_normal((1 << n, dim))
        start = time.perf_counter()
        codes = cluster_codes(embeddings, n_cluster, seed=0)
        codes_s = time.perf_counter() - start
        ids = np.arange(1 << n)
        start = time.perf_counter()
        tree_of_leaves(ids, codes, [pa.array(ids % 100)], [], n_cluster)
        out.append({"items": 1 << n, "dim": dim, "n_cluster": n_cluster,
                    "cluster_codes_s": codes_s, "tree_of_leaves_s": time.perf_counter() - start})
    return out


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [f"# TDM tools ({result['device_name']}, torch {env['torch']}, triton "
             f"{env['triton']}, {env['date']})", "", f"`{result['command']}`", ""]
    r = result.get("retrieval")
    if r:
        lines += [f"## Retrieval: {r['items']:,} items ({r['nodes']:,} nodes, {r['levels']} "
                  f"levels, {r['n_cluster']} children a node), beam {r['beam_size']}, recall "
                  f"{r['recall_num']}", "",
                  f"Scorer: {r['scorer']}; sequence length {r['seq_len']}, embedding dim "
                  f"{r['emb_dim']}. Levels {r['first_level']} to {r['levels'] - 1} searched "
                  f"for a block of {r['users']} user rows; every item scored for "
                  f"{r['brute_users']} of them, {r['chunk_pairs']:,} pairs a call.", "",
                  "| search | user rows/s | seconds | pair building s | model s | other s |",
                  "|---|---|---|---|---|---|"]
        for name, key in (("tree (beam search)", "tree"), ("every item (baseline)",
                                                           "every_item")):
            t = r[key]
            lines.append(f"| {name} | {t['rows_per_s']:,.2f} | {t['seconds']:.3f} | "
                         f"{t['pairs_s']:.3f} | {t['model_s']:.3f} | {t['other_s']:.3f} |")
        lines += ["", f"Tree search {r['speedup']:.1f}x the rows/s of scoring every item; it "
                  f"retrieves {r['tree_recall_of_exact_top']:.3f} of the exact top "
                  f"{r['recall_num']} (untrained model)."]
    if result.get("cluster_tree"):
        lines += ["", "## cluster_tree (random normal embeddings, seed 0; host CPU)", "",
                  "| items | dim | children | k-means s | tree_of_leaves s |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c['items']:,} | {c['dim']} | {c['n_cluster']} | "
                  f"{c['cluster_codes_s']:.2f} | {c['tree_of_leaves_s']:.2f} |"
                  for c in result["cluster_tree"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    device = resolve_device(args.device)
    result = {"command": command_line(), "environment": environment(),
              "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)",
              "quick": args.quick}
    if not args.skip_retrieval:
        with tempfile.TemporaryDirectory() as workdir:
            result["retrieval"] = bench_retrieval(args, device, workdir)
    log_items = [int(n) for n in args.cluster_log_items.split(",") if n.strip()]
    result["cluster_tree"] = bench_cluster(log_items, args.dim, args.n_cluster)
    text = markdown(result)
    print(text)
    if args.out:
        write_results(args.out, result, text)
    return result


if __name__ == "__main__":
    main()
