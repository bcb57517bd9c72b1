"""Overlapping file I/O with table work: read-ahead and write-behind on one thread each.

File reads and writes, checksums and most torch ops release the GIL, so a reader
that fetches the next chunk while the table inserts the current one (and a
writer that writes the previous chunk while the table exports the next) keeps
the disk and the table busy at once. Both bound memory: at most ``depth`` chunks
wait in the queue. An exception on the background thread is raised again in the
caller at its next call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def read_ahead(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """Yields ``items`` in order, producing up to ``depth`` of them ahead on a thread.

    Closing the returned generator early (or an exception in the consumer) stops
    the producer after the item it is working on.
    """
    if depth < 1:
        raise ValueError(f"depth={depth!r} is not valid; allowed: an int >= 1")
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                slots.put(item)
                if stop.is_set():
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the consumer
            slots.put(_Failure(error))
            return
        slots.put(_DONE)

    thread = threading.Thread(target=produce, name="checkpoint-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = slots.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                slots.get(timeout=0.05)
            except queue.Empty:
                pass
        thread.join()


class WriteBehind:
    """Runs submitted jobs in order on one thread, at most ``depth`` waiting.

    Args:
        depth: jobs that may wait behind the running one before ``submit`` blocks.
    """

    def __init__(self, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth={depth!r} is not valid; allowed: an int >= 1")
        self._jobs: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-write-behind",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _DONE:
                return
            if self._error is None:
                try:
                    job()
                except BaseException as error:  # noqa: BLE001 - raised in the caller
                    self._error = error

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, job: Callable[[], None]) -> None:
        """Queues ``job``; raises the error of an earlier job, if one failed (jobs after
        a failure are skipped)."""
        self._raise()
        self._jobs.put(job)

    def finish(self, raise_error: bool = True) -> None:
        """Waits for every queued job and stops the thread; raises a job's error unless
        ``raise_error`` is False."""
        if self._thread.is_alive():
            self._jobs.put(_DONE)
            self._thread.join()
        if raise_error:
            self._raise()
