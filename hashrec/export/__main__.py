"""Export a trained model.

Usage::

    python -m hashrec.export --pipeline_config_path <model_dir>/pipeline.config \\
        [--checkpoint_path <model_dir>/model.ckpt-<step>] --export_dir <dir>

Also runs under ``torchrun``: each rank writes ``model-<rank>-of-<world>``.
"""

from __future__ import annotations

import argparse
import logging
import sys

from hashrec.export.errors import ExportError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.export",
        description="Write model-<rank>-of-<world>.safetensors with JSON meta (dynamic tables "
                    "as is_hashmap key/value pairs), the pipeline config and a TorchScript "
                    "inference model (scripted_model.pt) into --export_dir.")
    parser.add_argument("--pipeline_config_path", required=True,
                        help="pipeline config (protobuf text format)")
    parser.add_argument("--checkpoint_path", default=None,
                        help="a model.ckpt-<step> directory or a model_dir; default: the latest "
                             "complete checkpoint of the config's model_dir")
    parser.add_argument("--export_dir", required=True, help="output directory (new or empty)")
    parser.add_argument("--edit_config_json", default=None,
                        help="JSON object of dotted config overrides")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from hashrec.distributed.process_group import init_distributed, teardown
    from hashrec.train.cli import load_effective_config, run_main, setup_logging

    def run() -> None:
        from hashrec.export.exporter import export_model

        context = init_distributed()
        setup_logging(context.rank)
        try:
            config = load_effective_config(args, {})
            export_model(config, args.export_dir, args.checkpoint_path)
        finally:
            teardown(context)

    try:
        return run_main(run)
    except ExportError as err:
        logging.getLogger("hashrec").error("ExportError: %s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
