"""TensorBoard summaries in ``model_dir`` (rank 0, when ``use_tensorboard``).

The events are written by the training thread itself, not by TensorBoard's
``SummaryWriter``: that one writes from a background thread, whose failure (a full
disk, a file where the summary folder should be) prints a traceback from the thread and
raises again at a later, unrelated call. Here a failed write turns the summaries off with
one warning naming the file, and training goes on (on a full disk its next checkpoint
fails too, with that save's own error).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections.abc import Callable

from hashrec.checkpoint.errors import disk_full_hint

logger = logging.getLogger("hashrec.train")

_FILE_IDS = itertools.count()  # tells apart event files opened in the same second


class Summaries:
    """Writes scalars to an event file in ``<model_dir>/<subdir>``; every method is a no-op
    when disabled, or once a write failed (see the module docstring).

    Args:
        model_dir: the run's model directory.
        enabled: ``train_config.use_tensorboard`` and rank 0.
        subdir: ``train`` or ``eval``.
    """

    def __init__(self, model_dir: str, enabled: bool, subdir: str = "train") -> None:
        self.directory = os.path.join(model_dir, subdir)
        self.path: str | None = None
        self._file = None
        self._records = None
        if enabled:
            self._guarded(self._open)

    def _open(self) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter

        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{next(_FILE_IDS)}")
        os.makedirs(self.directory, exist_ok=True)
        self.path = os.path.join(self.directory, name)
        self._file = open(self.path, "wb")
        self._records = RecordWriter(self._file)
        self._records.write(Event(wall_time=time.time(),
                                  file_version="brain.Event:2").SerializeToString())
        self._file.flush()

    def _guarded(self, write: Callable[[], object]) -> None:
        """Runs ``write()``; an OSError turns the summaries off with one warning."""
        try:
            write()
        except OSError as err:
            where = err.filename or self.path or self.directory
            logger.warning("TensorBoard summaries are off from now on: cannot write %s: %s%s",
                           where, err.strerror or err,
                           disk_full_hint(err, None, "run again"))
            self._discard()

    def _discard(self) -> None:
        file, self._file, self._records = self._file, None, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass  # its buffer could not be written either; the warning said why

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        """Writes ``values`` (name -> number) at ``step``, each name after ``prefix``."""
        self._write(step, {f"{prefix}{name}": value for name, value in values.items()})

    def tables(self, step: int, counters: dict[str, dict[str, float]]) -> None:
        """Writes each table's counters under ``table/<table>/``."""
        self._write(step, {f"table/{table}/{name}": value
                           for table, stats in counters.items() for name, value in stats.items()})

    def _write(self, step: int, values: dict[str, float]) -> None:
        """One event of ``values`` (tag -> number) at ``step``, flushed at once (a few
        hundred bytes every log step) so that TensorBoard shows it while training runs."""
        if self._file is None or not values:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))
                                 for tag, value in values.items()])
        event = Event(wall_time=time.time(), step=int(step), summary=summary)

        def write() -> None:
            self._records.write(event.SerializeToString())
            self._file.flush()

        self._guarded(write)

    def flush(self) -> None:
        if self._file is not None:
            self._guarded(self._file.flush)

    def close(self) -> None:
        if self._file is not None:
            self._guarded(self._file.close)
            self._file = self._records = None
