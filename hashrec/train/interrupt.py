"""Stopping a training run cleanly on SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption).

While :class:`StopSignals` is entered, the first SIGINT or SIGTERM is only noted: the
loop finishes the step it is in, saves a checkpoint and ends with
:class:`TrainInterrupted`, which the command line reports as one line and exits with
128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a killed process
would. A second signal of either kind acts at once (SIGINT raises KeyboardInterrupt,
SIGTERM ends the process) for a user who does not want to wait for the save.
A signal that comes during an evaluation (which follows a save) stops it before its
next batch, without a result, and the run ends the same way.

Commands that train nothing and clean up after a Ctrl-C (``hashrec.predict`` removes its
temporary output, ``hashrec.export`` its staging directory) handle SIGTERM alike inside
:func:`terminate_raises`: it raises
:class:`Terminated`, which the command line reports as one line, exiting 143.

Under several ranks a signal may reach some ranks only, or the ranks at different
steps (``hashrec.train.stopping``): every step each rank starts a host-side reduction of the signal it holds and
reads the previous step's result (so nobody waits for it), and all stop after the
same step, one step after the first rank noted a signal. Loader workers neither stop
nor end on the first SIGINT or SIGTERM (``hashrec.data.loader``): the training
process stops them when it is done with them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

from hashrec.train.errors import TrainError

logger = logging.getLogger("hashrec.train")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainInterrupted(TrainError):
    """Training stopped on a signal after saving; ``exit_code`` is 128 + its number."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + int(signum)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread inside :func:`terminate_raises` (a
    ``BaseException``, as ``KeyboardInterrupt`` is); ``exit_code`` is 143."""

    exit_code = 128 + int(signal.SIGTERM)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """While entered, SIGTERM raises :class:`Terminated` in the main thread as SIGINT
    raises ``KeyboardInterrupt``, so ``finally`` blocks and cleanups on ``BaseException``
    run (elsewhere than in the main thread: a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def raise_terminated(signum: int, frame) -> None:
        del signum, frame
        if os.getpid() == pid:  # not in a loader worker forked meanwhile
            raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def report_stop(stop: KeyboardInterrupt | Terminated, undone: str, prefix: str = "") -> int:
    """Prints a command's stop by Ctrl-C or SIGTERM as one stderr line (``prefix``, then
    ``interrupted`` or ``stopped by SIGTERM``, then ``(undone)``) and returns its exit
    code: 130 or 143."""
    if isinstance(stop, Terminated):
        print(f"{prefix}stopped by SIGTERM ({undone})", file=sys.stderr)
        return stop.exit_code
    print(f"{prefix}interrupted ({undone})", file=sys.stderr)
    return 128 + int(signal.SIGINT)


class StopSignals:
    """Notes SIGINT / SIGTERM while entered (in the main thread; elsewhere a no-op)."""

    def __init__(self) -> None:
        self.received: int | None = None
        # The signal the loop stops on (set by it: under several ranks, any rank's).
        self.agreed: int | None = None
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()

    @property
    def name(self) -> str | None:
        """The name (``SIGINT``) of the signal agreed on, else of the one received."""
        signum = self.agreed or self.received
        return None if signum is None else signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _note(self, signum: int, frame) -> None:
        del frame
        if os.getpid() != self._pid:
            # A loader worker forked while the handler was set: the training process
            # stops it when it stops itself (a Ctrl-C reaches the whole process group).
            return
        if self.received is not None:  # the second one: stop now, without the save
            for other, handler in self._previous.items():
                signal.signal(other, handler)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.received = signum
        logger.warning("%s received: stopping after this step and saving a checkpoint, or "
                       "in an evaluation at its next batch (send it again to stop at once, "
                       "without saving)",
                       signal.Signals(signum).name)

