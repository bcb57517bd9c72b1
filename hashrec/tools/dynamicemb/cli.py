"""Command-line plumbing shared by the dynamic-embedding migration tools."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable

from hashrec.checkpoint import CheckpointError
from hashrec.distributed import DistributedError
from hashrec.table import TableError
from hashrec.tools.dynamicemb.errors import MigrationError
from hashrec.train.interrupt import Terminated, report_stop, terminate_raises


def world_size_arg(text: str) -> int:
    """``--world_size``: an int, or a product of ints as ``nnodes*nproc-per-node`` reads
    (``2*8``: a shell leaves ``$NNODES*$NPROC_PER_NODE`` unmultiplied)."""
    factors = text.split("*")
    try:
        values = [int(factor.strip()) for factor in factors]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}; allowed: an int, or a product of ints such as "
            f"2*8 (nnodes * nproc-per-node)") from None
    return math.prod(values)


def run_tool(world_size: int | None, main: Callable[[], object]) -> int:
    """Run a tool's ``main`` with INFO logging and return its exit code.

    Args:
        world_size: the tool's ``--world_size`` (None: not given); below 1 exits 2.
        main: the tool's work.

    Returns:
        0; 2 for an invalid ``--world_size`` or a start under torchrun (one process
        writes every rank's shards: several would write the same checkpoint); 1 after a
        migration, checkpoint, config (any ValueError), storage planning or table error,
        printed as one ``error:`` line on stderr; 130 after Ctrl-C, 143 after SIGTERM,
        also as one line (the tools remove their partial checkpoint).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if world_size is not None and world_size < 1:
        print(f"error: --world_size={world_size} is not valid; allowed: >= 1", file=sys.stderr)
        return 2
    launched = os.environ.get("WORLD_SIZE", "1")
    if launched != "1":
        print(f"error: started as {launched} processes (WORLD_SIZE={launched}); run the tool "
              f"as one process: it writes the shards of all --world_size ranks itself",
              file=sys.stderr)
        return 2
    try:
        # SIGTERM (a scheduler's stop) cleans up as Ctrl-C does: no partial checkpoint.
        with terminate_raises():
            main()
    except (MigrationError, CheckpointError, ValueError, DistributedError, TableError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as stop:
        return report_stop(stop, "no checkpoint written")
    return 0
