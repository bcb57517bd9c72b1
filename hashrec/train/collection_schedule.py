"""Python's cyclic garbage collection at fixed training steps.

The automatic collector runs whenever allocations pass its thresholds. A full
pass over a trainer's heap (model, config messages, tables' bookkeeping, loader
state) stalls the step for tens of milliseconds, at moments that differ from rank
to rank; under torchrun every other rank then waits for that one at the next
collective. While training runs, :class:`CollectionSchedule`:

* freezes the objects built before training (``gc.freeze``: never scanned again);
* switches automatic collection off;
* collects the young generations every ``every`` steps, at the same step on
  every rank (short: only objects allocated since the last collection), and
  everything every ``FULL_EVERY`` such collections (objects frozen at the start are
  not scanned, so this stays short too);
* collects everything at the end of each epoch, and leaves collection automatic
  during checkpoints and evaluation (then collects everything).

On leaving, the frozen objects are released and automatic collection is restored
as it was. Reference counting, which frees almost every object of a step, is not
affected: only garbage held in reference cycles waits for a scheduled collection.
"""

from __future__ import annotations

import contextlib
import gc

DEFAULT_EVERY = 50
FULL_EVERY = 20


class CollectionSchedule:
    """Context manager running the garbage collector on a step schedule (see the module).

    Args:
        every: steps between two collections of the young generations (>= 1).
    """

    def __init__(self, every: int = DEFAULT_EVERY) -> None:
        if every < 1:
            raise ValueError(f"every={every}; allowed: >= 1")
        self.every = every
        self._was_enabled: bool | None = None

    def __enter__(self) -> CollectionSchedule:
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        return self

    def __exit__(self, *exc) -> None:
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None

    @property
    def active(self) -> bool:
        return self._was_enabled is not None

    def step(self, step: int) -> None:
        """After training step ``step`` (1-based): the young generations when due, and
        every ``FULL_EVERY``-th time everything."""
        if self.active and step % self.every == 0:
            if step % (self.every * FULL_EVERY) == 0:
                gc.collect()
            else:
                gc.collect(1)

    def full(self) -> None:
        """Everything not frozen (epoch ends)."""
        if self.active:
            gc.collect()

    @contextlib.contextmanager
    def automatic(self):
        """Automatic collection as before training, for work outside the step loop
        (checkpoints, evaluation); a full collection when it ends."""
        if not self.active:
            yield
            return
        if self._was_enabled:
            gc.enable()
        try:
            yield
        finally:
            gc.disable()
            gc.collect()
