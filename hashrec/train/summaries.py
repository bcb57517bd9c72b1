"""Tensorboard summaries in ``model_dir`` (rank 0, when ``use_tensorboard``)."""

from __future__ import annotations

import os


class Summaries:
    """Writes scalars to ``<model_dir>/<subdir>``; every method is a no-op when disabled.

    Args:
        model_dir: the run's model directory.
        enabled: ``train_config.use_tensorboard`` and rank 0.
        subdir: ``train`` or ``eval``.
    """

    def __init__(self, model_dir: str, enabled: bool, subdir: str = "train") -> None:
        self._writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(os.path.join(model_dir, subdir))

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        if self._writer is None:
            return
        for name, value in values.items():
            self._writer.add_scalar(f"{prefix}{name}", value, step)

    def tables(self, step: int, counters: dict[str, dict[str, float]]) -> None:
        for table, stats in counters.items():
            self.scalars(step, stats, prefix=f"table/{table}/")

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
