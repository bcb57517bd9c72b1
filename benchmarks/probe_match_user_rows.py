"""What the sampled negatives' user-side rows cost a match model's training step.

A match model's batch holds its B rows, then the N sampled negatives' rows, which carry
item features only: the user-side features (those only the user tower's groups read)
are empty or default there, yet are embedded and pooled (or padded) over all B + N rows,
and the user tower reads the first B. This probe times, on the example config's real
batches, the training step, and the embedding forward and backward of the user-side
features alone (a collection of just them) over the B rows and over the B + N rows (the
output sliced to B as the model does): the difference is what embedding only the B rows
could save a step.

Usage::

    python benchmarks/probe_match_user_rows.py --out benchmarks/results/probe_match_user_rows
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_train_step import _endless  # noqa: E402

from hashrec.config import apply_edit_config_json, load_pipeline_config  # noqa: E402
from hashrec.embedding import EmbeddingCollection  # noqa: E402
from hashrec.embedding.jagged import KeyedJaggedTensor  # noqa: E402
from hashrec.tools.gen_taobao_data import generate  # noqa: E402
from hashrec.train import checkpoints  # noqa: E402
from hashrec.train.loop import LoopOptions, TrainLoop  # noqa: E402
from hashrec.train.optimizers import sparse_optimizer_spec  # noqa: E402
from hashrec.train.prefetch import DevicePrefetcher  # noqa: E402
from hashrec.train.session import build_session  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"dssm": os.path.join(ROOT, "examples", "dssm_taobao_dynamicemb.config"),
           "mind": os.path.join(ROOT, "examples", "mind_taobao_dynamicemb.config")}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="dssm", choices=sorted(CONFIGS))
    p.add_argument("--rows", type=int, default=200_000, help="generated training rows")
    p.add_argument("--batch_size", type=int, default=8192, help="the example's")
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5, help="alternated timings of each side")
    p.add_argument("--out", default=None, help="path prefix of the .json result")
    return p.parse_args(argv)


def _config(args, work: str):
    data = os.path.join(work, "data")
    generate(data, args.rows, seed=0, eval_rows=1000, quiet=True, item_table=True)
    edits = {"train_input_path": os.path.join(data, "train"), "eval_input_path": "",
             "model_dir": os.path.join(work, "model"), "data_config.num_workers": 4,
             "data_config.batch_size": args.batch_size,
             "data_config.negative_sampler.input_path": os.path.join(data, "items"),
             "train_config.num_steps": args.warmup + args.steps + 10}
    return apply_edit_config_json(load_pipeline_config(CONFIGS[args.config]), edits)


def _timed(fn, warmup: int, steps: int) -> float:
    """Milliseconds per call of ``fn`` after ``warmup`` calls."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - start) * 1000.0 / steps


def _user_side(model) -> set[str]:
    """The embedded features only the user tower's groups read."""
    item = {f.name for f in model.item_group.features}
    return {name for name in model.embedding.feature_names if name not in item}


def _user_collection(session, names: set[str]) -> EmbeddingCollection:
    fs = session.feature_set
    features = [f for f in fs.embedding_features() if f.name in names]
    tables = {f.table for f in features}
    specs = [dataclasses.replace(t, features=tuple(n for n in t.features if n in names))
             for t in fs.embedding_tables() if t.name in tables]
    spec = sparse_optimizer_spec(session.config.train_config.sparse_optimizer)
    return EmbeddingCollection(specs, features, spec, session.device).train()


def _kjt(sparse: KeyedJaggedTensor, keys: list[str], rows: int | None) -> KeyedJaggedTensor:
    """``keys`` of ``sparse`` (on the CPU), their first ``rows`` bags (None: all)."""
    bags = sparse.to_dict()
    values, lengths = [], []
    for key in keys:
        jt = bags[key]
        n = jt.lengths.numel() if rows is None else rows
        values.append(jt.values[:int(jt.offsets[n])])
        lengths.append(jt.lengths[:n])
    return KeyedJaggedTensor(keys, torch.cat(values), torch.cat(lengths))


def run(args) -> dict:
    with tempfile.TemporaryDirectory() as work:
        config = _config(args, work)
        session = build_session(config)
        loop = TrainLoop(session, LoopOptions.from_config(config), checkpoints.Resume())
        session.model.train()
        data = config.train_input_path
        prefetcher = DevicePrefetcher(_endless(loop, data), session.device, loop.prepare_ahead)
        it = iter(prefetcher)
        step_ms = _timed(lambda: loop.train_step(next(it), prefetcher.upcoming),
                         args.warmup, args.steps)
        batch = next(iter(session.loader(data, "train")))
        names = _user_side(session.model)
        keys = [f.input_key for f in session.feature_set.embedding_features()
                if f.name in names]
        keys = list(dict.fromkeys(keys))
        collection = _user_collection(session, names)
        rows = batch.batch_size
        head = _kjt(batch.sparse, keys, rows).values().numel()
        result = {"config": args.config, "batch_rows": rows, "negatives": batch.negatives,
                  "user_side_features": sorted(names), "train_step_ms": step_ms,
                  # ids the negatives' rows add to the user-side features (defaults)
                  "user_side_ids_of_batch_rows": head,
                  "user_side_ids_of_negative_rows":
                      _kjt(batch.sparse, keys, None).values().numel() - head}
        runs = {}
        for label, kjt_rows in (("user_side_b_rows_ms", rows), ("user_side_b_plus_n_ms", None)):
            kjt = _kjt(batch.sparse, keys, kjt_rows).to(session.device)

            def embed_user_side(kjt=kjt):
                out = collection(kjt)
                parts = [t[:rows].sum() for t in out.pooled.values()]
                parts += [s[:rows].sum() for s, _ in out.sequences.values()]
                torch.stack(parts).sum().backward()

            runs[label] = embed_user_side
            for _ in range(10):  # the tables take the batch's keys first
                embed_user_side()
        # alternated rounds, the median of each: drifts hit both alike
        times = {label: [] for label in runs}
        for _ in range(args.rounds):
            for label, fn in runs.items():
                times[label].append(_timed(fn, 1, args.steps))
        result.update({label: statistics.median(t) for label, t in times.items()})
    result["saving_ms"] = result["user_side_b_plus_n_ms"] - result["user_side_b_rows_ms"]
    result["saving_share_of_step"] = result["saving_ms"] / step_ms
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    result.update(device=device, torch=torch.__version__,
                  date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  command="python " + " ".join(sys.argv))
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out + ".json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
