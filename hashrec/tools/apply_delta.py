"""Apply incremental dumps onto a full dump or checkpoint.

Usage::

    python -m hashrec.tools.apply_delta --base DIR --delta D1 [--delta D2 ...] --output OUT

``DIR`` is a full dump (``dump-<step>`` of the first incremental dump, or an
earlier output of this tool) or a ``model.ckpt-<step>`` checkpoint, never a
delta; the deltas are ``dump-<step>`` directories in step order, the first one
taken against the base's step (a checkpoint of the step of a dump), each next
one against the previous one's step. A dump's step is written with 12 digits
(``incremental/dump-000000000200`` is the dump of step 200). ``OUT`` must not exist;
its parent folder is created where missing. The tables are written into ``OUT.tmp``,
renamed to ``OUT`` when complete; a failure, Ctrl-C or SIGTERM removes it.
"""

from __future__ import annotations

import argparse
import sys

from hashrec.checkpoint import CheckpointError, apply_deltas
from hashrec.checkpoint.table_io import DEFAULT_CHUNK_ROWS
from hashrec.train.interrupt import Terminated, report_stop, terminate_raises


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hashrec.tools.apply_delta",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True,
                        help="full dump (<model_dir>/incremental/dump-<step, 12 digits>) or "
                             "checkpoint (<model_dir>/model.ckpt-<step>) directory")
    parser.add_argument("--delta", action="append", default=[], required=True,
                        help="delta dump directory (<model_dir>/incremental/dump-<step, 12 "
                             "digits>, e.g. dump-000000000200); repeat in step order")
    parser.add_argument("--output", required=True, help="directory to create")
    parser.add_argument("--chunk_rows", type=int, default=DEFAULT_CHUNK_ROWS,
                        help=f"rows per streamed chunk (default {DEFAULT_CHUNK_ROWS})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.chunk_rows < 1:
        print(f"--chunk_rows={args.chunk_rows} is not valid; allowed: >= 1", file=sys.stderr)
        return 2
    try:
        # SIGTERM (a scheduler's stop) cleans up as Ctrl-C does: no partial output.
        with terminate_raises():
            out = apply_deltas(args.base, args.delta, args.output, chunk_rows=args.chunk_rows)
    except CheckpointError as e:
        print(f"apply_delta: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as stop:
        return report_stop(stop, "no output written", prefix="apply_delta: ")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
