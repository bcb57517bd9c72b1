"""Evaluate a checkpoint of a pipeline config's model.

Usage::

    python -m hashrec.eval --pipeline_config_path <model_dir>/pipeline.config \\
        [--checkpoint_path <model_dir>/model.ckpt-<step>] [--eval_input_path P] \\
        [--eval_result_filename F]

Under ``torchrun`` every rank evaluates its share of the input with the
checkpoint's dynamic tables resharded to the ranks; metrics are summed over the
ranks and rank 0 appends the one result line.
"""

from __future__ import annotations

import argparse
import sys

from hashrec.train.cli import add_config_arguments, run_distributed
from hashrec.train.evaluation import EVAL_RESULT_FILE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.eval",
        description="Evaluate a checkpoint on eval_input_path. The step, the model's metrics "
                    "(model_config.metrics, or each task tower's with the tower name after "
                    "them; by default auc, multiclass_auc for more than two classes, "
                    "mean_squared_error for l2_loss), the loss (the total that training "
                    "minimizes), each loss under its name and the rows evaluated are logged "
                    "and appended as one JSON line to <model_dir>/eval_result.txt (or "
                    "--eval_result_filename).")
    add_config_arguments(parser)
    parser.add_argument("--checkpoint_path", default=None,
                        help="a model.ckpt-<step> directory or a model_dir; default: the latest "
                             "complete checkpoint of the config's model_dir")
    parser.add_argument("--eval_input_path", default=None,
                        help="overrides eval_input_path (comma-separated files, dirs, globs)")
    parser.add_argument("--model_dir", default=None,
                        help="overrides the config's model_dir: where eval_result.txt goes "
                             "and, without --checkpoint_path, the checkpoint is looked up")
    parser.add_argument("--eval_result_filename", default=EVAL_RESULT_FILE,
                        help="the file, in model_dir, that the result line is appended to "
                             "(default %(default)s, which the best exporter and "
                             "--continue_train read: name another for an evaluation on "
                             "other input, as TorchEasyRec's eval does)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def run(config, ctx) -> None:
        from hashrec.train import evaluate_checkpoint

        evaluate_checkpoint(config, args.checkpoint_path, ctx=ctx,
                            result_filename=args.eval_result_filename)

    from hashrec.train.interrupt import terminate_raises

    # SIGTERM (a scheduler's stop) ends it as Ctrl-C does: one line, no result written.
    with terminate_raises():
        return run_distributed(args, {"eval_input_path": args.eval_input_path,
                                      "model_dir": args.model_dir}, run,
                               interrupted="no eval result written")


if __name__ == "__main__":
    sys.exit(main())
