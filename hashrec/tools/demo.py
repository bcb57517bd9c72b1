"""End-to-end demo: generate Taobao-like data, train MultiTowerDIN with dynamicemb, print AUC.

Usage::

    python -m hashrec.tools.demo [--work_dir demo_output] [--num_rows 60000]

Steps: ``hashrec.tools.gen_taobao_data`` writes a small synthetic data set with a
planted click model under ``<work_dir>/data``; ``hashrec.train_eval`` trains
``examples/multi_tower_din_taobao_dynamicemb.config`` on it, scaled down through
``--edit_config_json`` (batch size, learning rates, sequence length), into
``<work_dir>/model``; the evaluation's AUC is printed at the end (each task's, for a
multi-task model). ``--config`` trains another Taobao example on the same data, e.g.
``examples/mmoe_taobao_dynamicemb.config``; only the edits that apply to it are made.
The GPU is used when one is present. A rerun replaces the demo's own model directory.
The default config is read from ``examples/`` under the working directory, else from the
source checkout HashRec runs from; the config is read before any data is generated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import torch

from hashrec.tools.gen_output import count, positive_float

EXAMPLE_CONFIG = os.path.join("examples", "multi_tower_din_taobao_dynamicemb.config")
MARKER = ".hashrec_demo"
# The source checkout's root, where the package runs from one (an editable install).
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config_path(path: str) -> str:
    """``path``, or for the default example config missing from the working directory,
    the checkout's copy where there is one."""
    if path == EXAMPLE_CONFIG and not os.path.exists(path):
        beside = os.path.join(CHECKOUT, EXAMPLE_CONFIG)
        if os.path.exists(beside):
            return beside
    return path


def demo_edits(batch_size: int, num_epochs: int, config=None) -> dict:
    """Config overrides that make the example train in minutes on a small machine; with
    ``config`` (an ``EasyRecConfig``), only those that apply to it: the learning rates
    of the optimizers it has, the click sequence's length if it reads that sequence."""
    edits = {
        "data_config.batch_size": batch_size,
        "data_config.num_workers": 0,
        "train_config.num_epochs": num_epochs,
        "train_config.log_step_count_steps": 20,
        "train_config.save_checkpoints_steps": 100000,
    }
    train = config.train_config if config is not None else None
    if train is None or train.sparse_optimizer.HasField("adagrad_optimizer"):
        edits["train_config.sparse_optimizer.adagrad_optimizer.lr"] = 0.05
    if train is None or train.dense_optimizer.HasField("adam_optimizer"):
        edits["train_config.dense_optimizer.adam_optimizer.lr"] = 0.003
    if config is None or any(f.WhichOneof("feature") == "sequence_feature" and
                             f.sequence_feature.sequence_name == "click_50_seq"
                             for f in config.feature_configs):
        edits["feature_configs[sequence_name=click_50_seq].sequence_feature"
              ".sequence_length"] = 50
    return edits


def auc_summary(result: dict) -> str:
    """``eval AUC 0.6441``, or each task's (``eval auc_ctr 0.61, auc_cvr 0.66``), or a
    match model's recalls (``eval recall@1 0.15, recall@5 0.26``); an AUC the evaluation
    left undefined (null: its rows hold one class) reads ``n/a``."""
    if "auc" in result:
        aucs = {"AUC": result["auc"]}
    else:
        aucs = {key: value for key, value in result.items()
                if key.startswith("auc") and (value is None or isinstance(value, float))}
    if not aucs:
        recalls = [f"{key} {value:.4f}" for key, value in result.items()
                   if key.startswith("recall@") and isinstance(value, float)]
        return "eval " + ", ".join(recalls) if recalls else "no AUC in the evaluation"
    shown = "eval " + ", ".join(f"{key} {'n/a' if value is None else f'{value:.4f}'}"
                                for key, value in aucs.items())
    if None not in aucs.values():
        return shown
    if len(aucs) == 1:
        return f"{shown} (the evaluation rows hold one class)"
    return f"{shown} (n/a: the evaluation rows hold one class of that task's label)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.tools.demo",
        description="Generate a small Taobao-like data set, train MultiTowerDIN with "
                    "dynamicemb tables (or another Taobao example, --config) on it and "
                    "print the evaluation AUC.")
    parser.add_argument("--work_dir", default="demo_output",
                        help="where data/ and model/ go (default demo_output)")
    parser.add_argument("--config", default=EXAMPLE_CONFIG,
                        help=f"pipeline config to train (default {EXAMPLE_CONFIG})")
    parser.add_argument("--num_rows", type=count(), default=60000,
                        help="training rows (default 60000)")
    parser.add_argument("--eval_rows", type=count(), default=15000,
                        help="evaluation rows (default 15000)")
    parser.add_argument("--scale", type=positive_float, default=0.002,
                        help="ID-space scale of the generator (default 0.002; 1 = Taobao sizes)")
    parser.add_argument("--batch_size", type=count(), default=1024,
                        help="rows per batch (default 1024)")
    parser.add_argument("--num_epochs", type=count(), default=2,
                        help="passes over the training rows (default 2)")
    return parser


def _check_work_dir(parser: argparse.ArgumentParser, work_dir: str) -> None:
    """Exit 2 (a usage error) when ``work_dir`` cannot be a directory: it, or the
    nearest of its parents that exists, is not one."""
    existing = os.path.abspath(work_dir)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is a file" if existing == os.path.abspath(work_dir) else \
            f"is below the file {existing}"
        parser.error(f"--work_dir {work_dir!r} {what}; name a directory")


def _prepare_work_dir(work_dir: str) -> None:
    model_dir = os.path.join(work_dir, "model")
    if os.path.isdir(work_dir) and os.listdir(work_dir) and not os.path.exists(
            os.path.join(work_dir, MARKER)):
        raise SystemExit(f"--work_dir {work_dir!r} exists and was not made by the demo; "
                         f"choose another directory")
    shutil.rmtree(model_dir, ignore_errors=True)
    os.makedirs(work_dir, exist_ok=True)
    open(os.path.join(work_dir, MARKER), "w").close()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check_work_dir(parser, args.work_dir)
    from hashrec import train_eval
    from hashrec.config import ConfigError, load_pipeline_config
    from hashrec.tools.gen_taobao_data import generate

    path = config_path(args.config)
    try:
        config = load_pipeline_config(path)
    except ConfigError as err:
        hint = (" (run from the repository root, or pass --config)"
                if args.config == EXAMPLE_CONFIG else "")
        print(f"[demo] error: {err}{hint}", file=sys.stderr, flush=True)
        return 1
    _prepare_work_dir(args.work_dir)
    data_dir = os.path.join(args.work_dir, "data")
    model_dir = os.path.join(args.work_dir, "model")
    device = "GPU " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(f"[demo] generating {args.num_rows} + {args.eval_rows} rows into {data_dir}",
          flush=True)
    start = time.perf_counter()
    shutil.rmtree(data_dir, ignore_errors=True)
    # a match model's negative sampler reads the generated item table
    sampled = config.data_config.HasField("negative_sampler")
    generate(data_dir, args.num_rows, seed=0, scale=args.scale, eval_rows=args.eval_rows,
             quiet=True, item_table=sampled)
    edits = demo_edits(args.batch_size, args.num_epochs, config)
    if sampled:
        edits["data_config.negative_sampler.input_path"] = os.path.join(data_dir, "items")
    print(f"[demo] training {path} on {device}", flush=True)
    code = train_eval.main([
        "--pipeline_config_path", path, "--model_dir", model_dir,
        "--train_input_path", os.path.join(data_dir, "train"),
        "--eval_input_path", os.path.join(data_dir, "eval"),
        "--edit_config_json", json.dumps(edits)])
    if code != 0:
        return code
    with open(os.path.join(model_dir, "eval_result.txt"), encoding="utf-8") as f:
        result = json.loads(f.read().splitlines()[-1])
    print(f"[demo] done in {time.perf_counter() - start:.0f}s: {auc_summary(result)} "
          f"at step {result['step']} on {result['num_examples']} rows; checkpoints in "
          f"{model_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
