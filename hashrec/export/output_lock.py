"""One ``predict`` per output: an advisory lock beside the output while it is written.

Two predictions into one ``--predict_output_path`` would write the same hidden staging
files (each truncating the other's) and one would fail on a file the other moved, or
both would publish a mix. ``predict`` holds a ``flock`` on a hidden
``.<output name>.lock`` beside the output from before it writes until it has published
or discarded its rows, so a second one is refused at once. The lock goes with the
process however it ends (forked loader workers close their copy at once); the file is
removed at the end, and one left by a killed run is reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from hashrec.export.errors import ExportError
from hashrec.train.model_dir_lock import close_in_forked_children, keep_in_forked_children


class OutputLock:
    """Holds the lock of ``output`` from construction until ``release()``.

    Raises:
        ExportError: another predict holds it.
    """

    def __init__(self, output: str) -> None:
        self.path = os.path.join(os.path.dirname(output), f".{os.path.basename(output)}.lock")
        self._fd: int | None = None
        while self._fd is None:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:  # an unwritable directory: the staging file's write says so
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ExportError(f"--predict_output_path: another predict is writing "
                                  f"{output} (it holds {self.path}); wait for it to end, or "
                                  f"choose another output path") from None
            except OSError:  # a file system without flock: the prediction goes unguarded
                pass
            if not _still_named(fd, self.path):  # removed by a holder ending meanwhile
                os.close(fd)
                continue
            close_in_forked_children(fd)
            self._fd = fd

    def release(self) -> None:
        """Removes the lock file and drops the lock (again: nothing)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.remove(self.path)
        keep_in_forked_children(self._fd)
        os.close(self._fd)
        self._fd = None


def _still_named(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False
