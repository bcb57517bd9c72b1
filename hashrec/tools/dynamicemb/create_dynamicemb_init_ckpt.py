"""Build a starting checkpoint from the ``init_table`` of dynamic-embedding features.

Usage::

    python -m hashrec.tools.dynamicemb.create_dynamicemb_init_ckpt \\
        --pipeline_config_path P --world_size W --save_dir S \\
        [--reader_worker_num N] [--separator ,]

then train from it with ``train_eval --fine_tune_checkpoint S/model.ckpt-0``.

The tool builds the config's model on the CPU (the same seed as training, so the
dense state it stores is the model's initial one), reads every dynamic table's
``init_table`` (see ``init_table.py`` for the accepted files and how bad rows and
duplicate ids are handled) and writes each id's row to the shard of the rank that
owns it for ``world_size`` ranks. Tables fused into one storage (table fusion)
are written into that storage with their tags. Rows start with the sparse
optimizer's initial state; scores are 1 for LFU tables, the current time for
TIMESTAMP tables and 0 otherwise. A summary per table (rows read, kept,
duplicates, bad rows) is logged and stored in ``meta.json`` under
``extra.init_tables``. A table none of whose rows is kept fails the run (nothing
is written); one whose rows are mostly bad is warned about. Both messages show an
unparseable embedding and, when another separator splits it, suggest that
``--separator``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch
from google.protobuf.message import Message

from hashrec.checkpoint.table_io import initial_scores
from hashrec.checkpoint.tags import model_tag_tables
from hashrec.config import load_pipeline_config
from hashrec.tools.dynamicemb.ckpt_writer import CheckpointBuilder, initial_state_rows
from hashrec.tools.dynamicemb.cli import run_tool, world_size_arg
from hashrec.tools.dynamicemb.errors import MigrationError
from hashrec.tools.dynamicemb.init_table import InitTableReport, read_init_table

logger = logging.getLogger("hashrec.tools")

# Above this share of bad rows the table is more likely misread than dirty: warn loudly.
BAD_SHARE_WARNING = 0.5
_SEPARATORS = (",", " ", ";", "|", "\t", ":")


NO_INIT_TABLE = "no dynamicemb feature sets init_table; nothing to initialize"


def _sets_init_table(message) -> bool:
    """Whether a config message (a feature config) sets an ``init_table`` anywhere."""
    for field, value in message.ListFields():
        if field.name == "init_table" and value:
            return True
        if field.type == field.TYPE_MESSAGE:
            values = [value] if isinstance(value, Message) else value  # else repeated
            if any(_sets_init_table(v) for v in values):
                return True
    return False


def init_tables_of(feature_set) -> dict[str, str]:
    """Logical table -> init_table path, for dynamic tables that set one (and that exist:
    the table of a feature only WIDE groups read is not built)."""
    built = {table.name for table in feature_set.embedding_tables()}
    found: dict[str, str] = {}
    for feature in feature_set.features.values():
        request = feature.table
        if request is None or request.dynamicemb is None or not request.dynamicemb.init_table:
            continue
        if request.name in built:
            found.setdefault(request.name, request.dynamicemb.init_table)
        else:
            logger.warning("table %r: init_table %s is not read: only WIDE feature groups "
                           "name feature %r, so its own table is not built (its wide table "
                           "starts as configured)", request.name,
                           request.dynamicemb.init_table, feature.name)
    return found


def _load_table(builder: CheckpointBuilder, name: str, path: str, storage: str, tag: int,
                table, separator: str, workers: int) -> InitTableReport:
    report = InitTableReport(name)
    logger.info("table %r: reading init_table %s into storage %r (tag %d)", name, path,
                storage, tag)
    last_file = None
    for ids, embeddings, file in read_init_table(path, report, table.dim, separator, workers):
        if file != last_file:
            logger.info("table %r: reading %s", name, file)
            last_file = file
        keys = torch.from_numpy(ids)
        rows = initial_state_rows(table, torch.from_numpy(embeddings))
        tags = torch.full((keys.numel(),), tag, dtype=torch.int32)
        builder.write_rows(storage, keys, tags, rows, initial_scores(table, keys.numel()))
        logger.info("table %r: %d rows read, %d kept so far", name, report.rows_read,
                    report.rows_kept)
    level = logging.WARNING if report.duplicates or report.bad_rows else logging.INFO
    logger.log(level, "table %r: %d rows read, %d written, %d duplicate ids (first kept), "
               "%d bad rows skipped%s", name, report.rows_read, report.rows_kept,
               report.duplicates, report.bad_rows,
               "".join(f"\n  {e}" for e in report.examples))
    _check_kept(report, path, table.dim, separator)
    return report


def _check_kept(report: InitTableReport, path: str, dim: int, separator: str) -> None:
    """Fails a table none of whose rows is kept; warns when most rows are bad.

    Raises:
        MigrationError: no row of ``path`` is kept (naming the table, the file, the
            first unparseable value and the separator that would split it).
    """
    where = f"table {report.table!r}: init_table {path}"
    if report.rows_read == 0:
        raise MigrationError(f"{where} holds no rows")
    if report.rows_kept and report.bad_rows < BAD_SHARE_WARNING * report.rows_read:
        return
    detail = f"{report.bad_rows} of its {report.rows_read} rows are bad"
    if report.bad_value:
        value = report.bad_value
        shown = value if len(value) <= 80 else value[:77] + "..."
        detail += (f"; an unparseable embedding reads {shown!r}"
                   f"{_separator_hint(report.bad_value, dim, separator)}")
    elif report.examples:
        detail += f"; first: {report.examples[0]}"
    if not report.rows_kept:
        raise MigrationError(f"{where}: no row can be used: {detail}")
    logger.warning("%s: %s", where, detail)


def _separator_hint(value: str, dim: int, separator: str) -> str:
    """Which ``--separator`` would split ``value`` into ``dim`` numbers, if any."""
    for candidate in _SEPARATORS:
        tokens = [t.strip() for t in value.strip().split(candidate)]
        if candidate != separator and len(tokens) == dim and all(map(_is_number, tokens)):
            return f"; it splits into {dim} numbers on {candidate!r}: pass --separator " \
                   f"{candidate!r}"
    return (f" (split on --separator {separator!r}); if the embeddings are joined by "
            f"another character, pass it as --separator")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def create_init_checkpoint(config, world_size: int, save_dir: str,
                           reader_worker_num: int | None = None,
                           separator: str = ",") -> tuple[str, dict[str, InitTableReport]]:
    """Writes ``save_dir/model.ckpt-0`` from the config's init tables.

    Returns:
        (checkpoint path, {table: InitTableReport}).

    Raises:
        MigrationError: no init_table set, unreadable files or invalid rows.
        CheckpointError: the checkpoint exists, or a rank's share exceeds max_capacity.
    """
    from hashrec.train.session import build_session

    if not any(_sets_init_table(feature) for feature in config.feature_configs):
        raise MigrationError(NO_INIT_TABLE)  # said before the model is built
    session = build_session(config, device=torch.device("cpu"),
                            purpose="create_dynamicemb_init_ckpt")
    embedding = session.model.embedding
    paths = init_tables_of(session.feature_set)
    if not paths:
        raise MigrationError(NO_INIT_TABLE)
    storages = embedding.dynamic_tables()
    locations = embedding.table_locations()
    workers = reader_worker_num or min(8, os.cpu_count() or 1)
    builder = CheckpointBuilder(save_dir, world_size, storages,
                                tag_tables=model_tag_tables(session.model))
    reports = {}
    try:
        for name, path in paths.items():
            storage, tag = locations[name]
            reports[name] = _load_table(builder, name, path, storage, tag, storages[storage],
                                        separator, workers)
        extra = {"init_tables": {name: {"path": paths[name], **r.as_dict()}
                                 for name, r in reports.items()}}
        final = builder.commit(session.model.state_dict(), None, extra)
    except BaseException:
        builder.abort()
        raise
    logger.info("wrote %s for world_size %d", final, world_size)
    return final, reports


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.tools.dynamicemb.create_dynamicemb_init_ckpt",
        description="Write <save_dir>/model.ckpt-0 holding the init_table rows of every "
                    "dynamicemb feature, sharded for --world_size ranks; train from it with "
                    "train_eval --fine_tune_checkpoint <save_dir>/model.ckpt-0.")
    parser.add_argument("--pipeline_config_path", required=True,
                        help="training config whose dynamicemb features set init_table")
    parser.add_argument("--world_size", type=world_size_arg, required=True,
                        help="number of training processes (nnodes * nproc-per-node; "
                             "a product such as 2*8 is multiplied)")
    parser.add_argument("--save_dir", required=True, help="directory of the new checkpoint")
    parser.add_argument("--reader_worker_num", type=int, default=None,
                        help="files read in parallel (default: from the CPU count)")
    parser.add_argument("--separator", default=",",
                        help="separator of embeddings stored as strings (default ',')")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_tool(args.world_size, lambda: create_init_checkpoint(
        load_pipeline_config(args.pipeline_config_path), args.world_size, args.save_dir,
        args.reader_worker_num, args.separator))


if __name__ == "__main__":
    sys.exit(main())
