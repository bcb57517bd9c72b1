"""Checkpoints of dense state and dynamic tables: atomic saves, resharding, incremental dumps.

Public API::

    save_checkpoint(model_dir, step, model, dense_optimizer, dynamic_tables,
                    keep_checkpoint_max=0, extra=None) -> path
    latest_checkpoint(model_dir) -> path | None      (complete checkpoints only)
    restore_checkpoint(path, model, dense_optimizer, dynamic_tables,
                       restore_optimizer=True) -> meta
    IncrementalDumper(output_dir, dynamic_tables, interval_steps).maybe_dump(step)
    discard_dumps_after(output_dir, step) -> folder | None   (before a resumed run dumps)
    apply_deltas(base, deltas, output)
    CheckpointError
"""

from hashrec.checkpoint.delta_apply import apply_deltas
from hashrec.checkpoint.errors import CheckpointError
from hashrec.checkpoint.incremental import IncrementalDumper, discard_dumps_after
from hashrec.checkpoint.layout import latest_checkpoint
from hashrec.checkpoint.restore import restore_checkpoint
from hashrec.checkpoint.save import save_checkpoint

__all__ = [
    "CheckpointError",
    "IncrementalDumper",
    "apply_deltas",
    "discard_dumps_after",
    "latest_checkpoint",
    "restore_checkpoint",
    "save_checkpoint",
]
