"""Checkpoints of dense state and dynamic tables: atomic saves, resharding, incremental dumps.

Public API::

    save_checkpoint(model_dir, step, model, dense_optimizer, dynamic_tables,
                    keep_checkpoint_max=0, extra=None) -> path
    latest_checkpoint(model_dir) -> path | None      (complete checkpoints only)
    restore_checkpoint(path, model, dense_optimizer, dynamic_tables,
                       restore_optimizer=True, read_rank_state=False) -> meta
                       (strict: the model saved; the rank state only when asked, to resume)
    restore_fine_tune(path, model, dynamic_tables, param_map=None) -> meta
                       (what fits a changed model; the rest starts fresh)
    read_param_map(path) -> ParamMap                 (fine_tune_ckpt_param_map)
    IncrementalDumper(output_dir, dynamic_tables, interval_steps).maybe_dump(step)
    discard_dumps_after(output_dir, step) -> folder | None   (before a resumed run dumps)
    apply_deltas(base, deltas, output)
    CheckpointError
"""

from hashrec.checkpoint.delta_apply import apply_deltas
from hashrec.checkpoint.errors import CheckpointError
from hashrec.checkpoint.fine_tune import restore_fine_tune
from hashrec.checkpoint.incremental import IncrementalDumper, discard_dumps_after
from hashrec.checkpoint.layout import latest_checkpoint
from hashrec.checkpoint.param_map import ParamMap, read_param_map
from hashrec.checkpoint.restore import restore_checkpoint
from hashrec.checkpoint.save import save_checkpoint

__all__ = [
    "CheckpointError",
    "IncrementalDumper",
    "ParamMap",
    "apply_deltas",
    "discard_dumps_after",
    "latest_checkpoint",
    "read_param_map",
    "restore_checkpoint",
    "restore_fine_tune",
    "save_checkpoint",
]
