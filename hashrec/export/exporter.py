"""Export a checkpoint: safetensors parts with meta JSON, the pipeline config, a scripted model.

Under ``torchrun`` every rank restores the checkpoint (of a model_dir, the latest as
rank 0 finds it), keeping the dynamic keys it owns (every one of them: a table whose
buckets cannot hold them all grows past max_capacity), and writes its own part; after a
barrier rank 0 writes the pipeline config and builds the scripted model from all parts
(and, of a match model, each tower's scripted model alone in ``user/`` and ``item/``:
``towers.py``).
Everything is written into a staging directory that is renamed to the export directory
at the end (see ``staging.py``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from hashrec.checkpoint import restore_checkpoint
from hashrec.checkpoint.dist_util import barrier, rank_and_world, run_on_all_ranks
from hashrec.config import save_pipeline_config
from hashrec.export import meta
from hashrec.export.errors import ExportError
from hashrec.export.part_writer import PartContents, write_part
from hashrec.export.scripted import build_inference_model, load_hashmaps, save_scripted
from hashrec.export.staging import discard, prepare_staging, publish, staging_dir
from hashrec.export.tables import (
    DEFAULT_CHUNK_ROWS,
    dense_network_tensors,
    dense_table_weights,
    dynamic_table_views,
)
from hashrec.export.towers import write_tower_exports
from hashrec.models import MatchModel

logger = logging.getLogger("hashrec.export")


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote.

    Attributes:
        export_dir: the export directory.
        checkpoint: the checkpoint exported.
        step: its training step.
        files: paths written by this rank (rank 0 also lists config and scripted model,
            and a match model's tower exports).
    """

    export_dir: str
    checkpoint: str
    step: int
    files: tuple[str, ...]


def _restored_session(config, checkpoint_path: str | None, rank: int, world_size: int,
                      ctx=None):
    from hashrec.train.checkpoints import BestBy, agreed_checkpoint, restore_resolved
    from hashrec.train.session import build_session

    source = checkpoint_path or config.model_dir
    best = BestBy.from_config(config)
    # Nothing there: say so before building (the best one is chosen, and named, after).
    agreed_checkpoint(source)
    session = build_session(config, rank, world_size, ctx=ctx, purpose="export")
    path, meta_json = restore_resolved(
        source, lambda path: restore_checkpoint(path, session.model, None,
                                                session.model.embedding.dynamic_tables(),
                                                restore_optimizer=False, keep_every_row=True),
        best)
    session.model.eval()
    return session, path, int(meta_json["step"])


def _write_chief_files(session, export_dir: str, world_size: int) -> list[str]:
    """Rank 0: pipeline config and the scripted model built from every part; of a match
    model, each tower's export too."""
    config_path = os.path.join(export_dir, meta.PIPELINE_CONFIG_FILE)
    save_pipeline_config(session.config, config_path)
    views = dynamic_table_views(session.model.embedding)
    hashmaps = load_hashmaps(export_dir, world_size, [v.name for v in views])
    missing = {v.name: v.missing_value() for v in views}
    module = build_inference_model(session.model, session.feature_set, hashmaps, missing)
    scripted_path = os.path.join(export_dir, meta.SCRIPTED_MODEL_FILE)
    save_scripted(module, scripted_path)
    files = [config_path, scripted_path]
    if isinstance(session.model, MatchModel):
        files += write_tower_exports(session.model, session.config, export_dir, hashmaps,
                                     missing)
    return files


def export_model(config, export_dir: str, checkpoint_path: str | None = None,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS, ctx=None) -> ExportResult:
    """Export ``config``'s model from a checkpoint into ``export_dir``.

    The files are written into ``<export_dir>.tmp`` and that directory is renamed to
    ``export_dir`` when all of them are complete, so ``export_dir`` never holds a partial
    export; a failed export removes its staging directory, and one left by a killed
    export is removed by the next export of the same ``export_dir`` (one still running
    there is an error).

    Args:
        config: the pipeline config (EasyRecConfig).
        export_dir: where the files go: a new or empty directory.
        checkpoint_path: a ``model.ckpt-<step>`` directory or a model_dir; default the
            latest complete checkpoint of ``config.model_dir``.
        chunk_rows: rows of a dynamic table read and written at a time.
        ctx: the ``DistContext`` of a ``torchrun`` worker (``init_distributed``): each rank
            then holds only its share of the dynamic tables, as in training; None: one
            process on the default device, or ranks read from the environment.

    Raises:
        ExportError: export_dir is a file or not empty, another export into it is
            running, a table cannot be exported, the model has no scripted form, or a
            file cannot be written (a full disk says so). (TrainError, CheckpointError
            and ConfigError from the layers below pass through.)
    """
    rank, world_size = rank_and_world()
    start = time.perf_counter()
    staging = staging_dir(export_dir)
    lock = run_on_all_ranks(lambda: prepare_staging(export_dir) if rank == 0 else None,
                            "preparing export_dir", ExportError)
    barrier()
    try:
        path, step, files = _export_into(config, staging, checkpoint_path, chunk_rows, rank,
                                         world_size, ctx)
        barrier()
        run_on_all_ranks(lambda: publish(staging, export_dir) if rank == 0 else None,
                         "moving the export into export_dir", ExportError)
    except BaseException:
        if rank == 0:
            discard(staging)
        raise
    finally:
        if lock is not None:
            os.close(lock)  # another export of export_dir may start now
    if rank == 0:
        logger.info("exported %s (step %d) to %s in %.1fs", path, step, export_dir,
                    time.perf_counter() - start)
    files = [os.path.join(export_dir, os.path.relpath(f, staging)) for f in files]
    return ExportResult(export_dir, path, step, tuple(files))


def _export_into(config, staging: str, checkpoint_path: str | None, chunk_rows: int,
                 rank: int, world_size: int, ctx) -> tuple[str, int, list[str]]:
    """Restores the checkpoint and writes every file into ``staging``.

    Returns:
        (checkpoint path, step, files written by this rank).
    """
    session, path, step = _restored_session(config, checkpoint_path, rank, world_size, ctx)
    views = dynamic_table_views(session.model.embedding, rank, world_size)
    contents = PartContents(
        dense_network_tensors(session.model) if rank == 0 else {},
        dense_table_weights(session.model.embedding) if rank == 0 else {},
        views)
    for view in views:
        view.missing_value()  # an unexportable eval initializer fails before any file is written
    run_on_all_ranks(lambda: write_part(staging, contents, rank, world_size, chunk_rows),
                     "writing the export part", ExportError)
    files = [os.path.join(staging, meta.weights_file(rank, world_size)),
             os.path.join(staging, meta.meta_file(rank, world_size))]
    barrier()
    files += run_on_all_ranks(
        lambda: _write_chief_files(session, staging, world_size) if rank == 0 else [],
        "writing the config and the scripted model", ExportError)
    return path, step, files
