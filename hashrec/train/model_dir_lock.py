"""One training run per model_dir: an exclusive lock its chief holds while it trains.

Two runs writing one model_dir interleave their checkpoints, their ``eval_result.txt``
lines and their ``pipeline.config`` (a later resume would pair one run's weights with
the other's config), and each may delete the other's checkpoint being written. The
chief (rank 0) of a training run holds an advisory lock on ``<model_dir>/.hashrec_lock``
(``flock``) from before it reads the model_dir until it ends; a second run asking for it
is refused at once, naming the holder. The operating system drops the lock when the
process ends, however it ends, so a killed run leaves nothing to clean up (the file
stays, unlocked). A ``flock`` belongs to the open file, which a forked child (a loader
worker) shares: children close their copy at once, or a worker outliving a killed chief
(it notices within seconds) would keep the model_dir locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator

from hashrec.train.errors import TrainError

LOCK_FILE = ".hashrec_lock"

_held_fds: set[int] = set()  # lock files this process holds open, closed in forked children
_fork_hook_registered = False


def _close_in_child() -> None:
    for fd in _held_fds:
        with contextlib.suppress(OSError):
            os.close(fd)  # the parent's copy keeps the lock
    _held_fds.clear()


def close_in_forked_children(fd: int) -> None:
    """Forked children (loader workers) close their copy of ``fd`` at once, until
    ``keep_in_forked_children(fd)``: a ``flock`` held through ``fd`` then goes with this
    process alone."""
    global _fork_hook_registered
    if not _fork_hook_registered:
        os.register_at_fork(after_in_child=_close_in_child)
        _fork_hook_registered = True
    _held_fds.add(fd)


def keep_in_forked_children(fd: int) -> None:
    """Undoes ``close_in_forked_children(fd)`` (before ``fd`` is closed)."""
    _held_fds.discard(fd)


@contextlib.contextmanager
def model_dir_lock(model_dir: str, held: bool = True) -> Iterator[None]:
    """Holds the model_dir's lock for the ``with`` body (``held`` False: does nothing,
    for the ranks other than the chief), creating the directory.

    Raises:
        TrainError: another run holds the lock, or the lock file cannot be made.
    """
    if not held:
        yield
        return
    path = os.path.join(model_dir, LOCK_FILE)
    try:
        os.makedirs(model_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise TrainError(f"model_dir {model_dir!r}: cannot create its lock file "
                         f"{LOCK_FILE} ({err.strerror}); --model_dir must name a directory "
                         f"you can write") from None
    close_in_forked_children(fd)
    try:
        locked = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrainError(f"model_dir {model_dir!r} is in use by another training run "
                             f"({_holder(fd)}); wait for it to end, or choose another "
                             f"--model_dir") from None
        except OSError:  # a file system without flock: the run goes on unlocked
            locked = False
        if locked:
            _record(fd)
        yield
    finally:
        keep_in_forked_children(fd)
        os.close(fd)  # drops the lock


def _record(fd: int) -> None:
    """Writes who holds the lock into the lock file, for the message of a refused run."""
    holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                         "since": time.strftime("%Y-%m-%d %H:%M:%S")})
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)


def _holder(fd: int) -> str:
    """The holder as recorded in the lock file ("pid 12 on host a since ..."), or "its
    process is not recorded"."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its process is not recorded"
