"""Train a model from a pipeline config, checkpointing and evaluating on the way.

Usage::

    python -m hashrec.train_eval --pipeline_config_path examples/x.config \\
        [--model_dir D] [--train_input_path P] [--eval_input_path P] [--continue_train] \\
        [--fine_tune_checkpoint C] [--ignore_restore_optimizer] [--edit_config_json J]

Several GPUs or hosts: the same command under torchrun, e.g.
``torchrun --nproc_per_node 2 -m hashrec.train_eval ...`` (NCCL on GPUs, gloo on
CPU). Each rank reads its share of the input, dynamic tables are sharded
row-wise over the ranks, and only rank 0 logs and writes files (checkpoints
hold one dynamic-table shard per rank).
"""

from __future__ import annotations

import argparse
import sys

from hashrec.train.cli import add_config_arguments, run_distributed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.train_eval",
        description="Train the pipeline config's model. Checkpoints go to "
                    "<model_dir>/model.ckpt-<step>/ every save_checkpoints_steps, or every "
                    "save_checkpoints_epochs where set (and at the end); each evaluation "
                    "appends a JSON line to <model_dir>/eval_result.txt; TensorBoard "
                    "summaries go to <model_dir>/train (train_config.use_tensorboard); "
                    "the effective config is written to <model_dir>/pipeline.config once "
                    "its checkpoints fit it. Ctrl-C or SIGTERM stops after the current "
                    "step with a checkpoint, or an evaluation (which follows a checkpoint) "
                    "at its next batch without a result (exit 130 / 143); --continue_train "
                    "then resumes inside the epoch, past the batches already trained.")
    add_config_arguments(parser)
    parser.add_argument("--model_dir", default=None,
                        help="overrides the config's model_dir")
    parser.add_argument("--train_input_path", default=None,
                        help="overrides train_input_path (comma-separated files, dirs, globs)")
    parser.add_argument("--eval_input_path", default=None,
                        help="overrides eval_input_path (comma-separated files, dirs, globs)")
    parser.add_argument("--continue_train", action="store_true",
                        help="resume from the latest checkpoint in model_dir; without it a "
                             "model_dir holding checkpoints is an error")
    parser.add_argument("--fine_tune_checkpoint", default=None,
                        help="initialize model and tables from this checkpoint (or model_dir) "
                             "when not resuming: what it holds in the same shape is restored "
                             "(under the names of train_config.fine_tune_ckpt_param_map), "
                             "the rest starts fresh, and one log line says which; overrides "
                             "train_config.fine_tune_checkpoint")
    parser.add_argument("--ignore_restore_optimizer", action="store_true",
                        help="with --continue_train, restore weights but not optimizer state")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def run(config, ctx) -> None:
        from hashrec.train import train_and_evaluate

        train_and_evaluate(config, args.continue_train, args.fine_tune_checkpoint,
                           args.ignore_restore_optimizer, ctx=ctx)

    return run_distributed(args, {
        "model_dir": args.model_dir, "train_input_path": args.train_input_path,
        "eval_input_path": args.eval_input_path}, run,
        interrupted="the steps after the last checkpoint, if any, are not saved")


if __name__ == "__main__":
    sys.exit(main())
