"""Export a trained model.

Usage::

    python -m hashrec.export --pipeline_config_path <model_dir>/pipeline.config \\
        [--checkpoint_path <model_dir>/model.ckpt-<step>] --export_dir <dir>

Also runs under ``torchrun``: each rank writes ``model-<rank>-of-<world>``.
"""

from __future__ import annotations

import argparse
import sys

from hashrec.train.cli import add_config_arguments, run_distributed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.export",
        description="Write model-<rank>-of-<world>.safetensors (six-digit numbers: "
                    "model-000000-of-000001 on one rank) with JSON meta (dynamic tables "
                    "as is_hashmap key/value pairs), the pipeline config and a TorchScript "
                    "inference model (scripted_model.pt) into --export_dir; of a match "
                    "model (dssm, dat, mind, match_backbone, hstu_match) also each tower alone in "
                    "--export_dir/user and "
                    "/item (scripted_model.pt, pipeline.config, tower.json), which predict runs "
                    "on that tower's columns alone.")
    add_config_arguments(parser)
    parser.add_argument("--checkpoint_path", default=None,
                        help="a model.ckpt-<step> directory or a model_dir; default: the latest "
                             "complete checkpoint of the config's model_dir (of a model_dir, "
                             "with export_config { exporter_type: \"best\" }, the one "
                             "eval_result.txt scores best by best_exporter_metric)")
    parser.add_argument("--export_dir", required=True,
                        help="output directory, new or empty; the files are written into "
                             "<export_dir>.tmp, which is renamed to it when complete (a "
                             "second export into it meanwhile is refused)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def run(config, ctx) -> None:
        from hashrec.export.exporter import export_model

        export_model(config, args.export_dir, args.checkpoint_path, ctx=ctx)

    from hashrec.train.interrupt import terminate_raises

    # SIGTERM (a scheduler's stop) cleans up as Ctrl-C does: the staging directory goes.
    with terminate_raises():
        return run_distributed(args, {}, run, interrupted="nothing exported")


if __name__ == "__main__":
    sys.exit(main())
