"""How a ``HashTable`` reports the inserts it refused at ``max_capacity``.

``TableRefusals`` is a mixin of ``HashTable``: by ``check_mode`` a refusal raises
``TableFullError`` (ERROR: in the call that refused, or once a call that writes rows after
placing keys has written the placed ones), is summed into a warning at most once a minute
(WARNING) or is only counted (IGNORE). The sync-free lookup keeps its refused count on the
device; this mixin decides when that count is read.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator

import torch

from hashrec.table.errors import TableFullError
from hashrec.table.options import CheckMode, ScoreStrategy

# Seconds between two "inserts refused" warnings of one table (refusals in between
# are summed into the next warning).
REFUSED_WARNING_INTERVAL_S = 60.0
logger = logging.getLogger("hashrec.table.hash_table")


class TableRefusals:
    """Mixin of ``HashTable``: counting, warning about and raising on refused inserts."""

    _refused_pending = 0  # refused inserts not yet reported by a warning
    _refused_warned_at = -math.inf
    _refused_unread: torch.Tensor | None = None  # device-side count not yet read (WARNING)
    _refused_read_at = -math.inf
    _refused_quiet = False  # the last WARNING read found no refusal
    _refused_unannounced = 0  # refused inserts read from the totals, not yet warned about
    _operation = "lookup"  # the public write call running (named by refusal errors)
    # Set while a call that writes rows after placing keys runs: a refusal error waits here
    # until the placed keys' rows are written (``_raise_deferred_refusal``).
    _defer_refusal: bool = False
    _deferred_refusal: TableFullError | None = None
    # Set by ``refusals_counted_only``: refusals are counted, neither warned nor raised.
    _refusals_counted_only: bool = False

    @contextlib.contextmanager
    def refusals_counted_only(self) -> Iterator[None]:
        """Within: refused inserts are only counted (``stats()["refused"]``), whatever
        ``check_mode`` says, for a caller that deals with them itself (a restore that
        grows the table past max_capacity and loads again)."""
        before, self._refusals_counted_only = self._refusals_counted_only, True
        try:
            yield
        finally:
            self._refusals_counted_only = before

    def _announce_refused(self, refused: int) -> None:
        """Raises (ERROR) or warns (WARNING: at most once a minute, with the count since
        the last warning) about ``refused`` inserts."""
        if self._refusals_counted_only:
            return
        mode = self.options.check_mode
        if mode is CheckMode.WARNING:
            self._refused_pending += refused
            if time.monotonic() - self._refused_warned_at < REFUSED_WARNING_INTERVAL_S:
                return
            refused, self._refused_pending = self._refused_pending, 0
            self._refused_warned_at = time.monotonic()
        message = (f"table {self.options.name!r}: {refused} inserts refused ({self._why_refused()}"
                   f"); {self._what_refused_means(mode)}. Raise max_capacity or "
                   f"bucket_capacity{self._refusal_hint()}.")
        if mode is CheckMode.ERROR:
            if not self._defer_refusal:
                raise TableFullError(message)
            self._deferred_refusal = TableFullError(message)
        if mode is CheckMode.WARNING:
            logger.warning(message)

    def _raise_deferred_refusal(self) -> None:
        """Raises the refusal error a deferred call met, once its stored keys' rows are
        written (ERROR); clears the deferral."""
        error, self._deferred_refusal, self._defer_refusal = self._deferred_refusal, None, False
        if error is not None:
            raise error

    def _why_refused(self) -> str:
        strategy = self.options.score_strategy
        full = f"their buckets are full at max_capacity={self.options.max_capacity}"
        if self.options.whole_max_capacity is not None:
            full += (f" (this rank's shard of the table's max_capacity "
                     f"{self.options.whole_max_capacity} over all ranks)")
        if strategy is ScoreStrategy.NO_EVICTION:
            return f"{full} and score_strategy=NO_EVICTION never evicts"
        return (f"{full} and every entry there is one this call touched or scores higher than "
                f"the incoming key, score_strategy={strategy.value}")

    def _refusal_hint(self) -> str:
        if self.options.score_strategy is ScoreStrategy.CUSTOMIZED:
            return ", or give the keys to keep higher scores"
        if self.options.score_strategy is ScoreStrategy.NO_EVICTION:
            return ", or use a score strategy that evicts"
        return ""

    def _what_refused_means(self, mode: CheckMode) -> str:
        """What the refused keys became: by operation under ERROR (raised by the call
        that refused), for every operation under WARNING (a sum over a minute)."""
        initializer = self._refused_read_as()
        effects = {
            "lookup": f"the refused keys read as {initializer} and get no gradient update",
            "find_or_insert": f"the refused keys read as {initializer} and are not stored",
            "insert_or_assign": "the refused keys' values were not stored",
            "load_state": "the refused keys' rows were not loaded and are lost from this "
                          "table",
        }
        if mode is CheckMode.ERROR:
            return f"in {self._operation}, {effects[self._operation]}"
        return (f"refused keys of lookup and find_or_insert read as {initializer}; those "
                f"of insert_or_assign and load_state were not stored")

    def _refused_read_as(self) -> str:
        """The initializer a refused key of a training lookup reads (``_train_missing_args``):
        the admission one of a table with admission, else the eval one."""
        which = "admission" if self.options.admission is not None else "eval"
        args = self._train_missing_args()
        mode = args.mode.value
        return f"the {which} initializer ({mode} {args.value:g})" if mode == "CONSTANT" \
            else f"the {which} initializer ({mode})"

    def _report_refused(self, refused: int) -> None:
        """Counts and announces ``refused`` inserts read on the host."""
        if refused == 0:
            return
        self._stats["refused"] += refused
        self._announce_refused(refused)

    def _report_refused_fixed(self, refused: torch.Tensor | int | None) -> None:
        """Counts refused inserts on the device; reads the count for every lookup under
        ERROR, at most once a minute under WARNING, never under IGNORE. None: this
        lookup's count is in the device totals (``_count_in_place``).

        A WARNING read that finds nothing does not hold back the next refusals for a
        minute on the CPU: until one is found, each lookup copies its count to the host
        (``_refused_seen``) and a copy that shows refusals triggers the read. On a GPU
        such a read still starts the minute's window."""
        mode = self.options.check_mode
        if refused is not None and (not isinstance(refused, torch.Tensor)
                                    or mode is CheckMode.ERROR):
            self._report_refused(int(refused))
            return
        if refused is not None:
            self._stats["refused"] += refused
            if mode is CheckMode.WARNING:
                unread = self._refused_unread
                self._refused_unread = refused if unread is None else unread + refused
        if mode is not CheckMode.WARNING:
            return
        if time.monotonic() - self._refused_read_at < REFUSED_WARNING_INTERVAL_S and not (
                self._refused_quiet and self._refused_seen()):
            return
        totals = [names for names in (self._device_totals or {}) if names[-1] == "refused"]
        if self._refused_unread is None and not totals and not self._refused_unannounced:
            return  # nothing on the device can hold a refusal: no read, no window started
        self._fold_device_counts()  # the totals' refused count, read once a minute
        unread = self._refused_unannounced + (
            int(self._refused_unread) if self._refused_unread is not None else 0)
        self._refused_unread, self._refused_unannounced = None, 0
        self._refused_read_at, self._refused_quiet = time.monotonic(), unread == 0
        if unread:
            self._announce_refused(unread)

    def _refused_seen(self) -> bool:
        """Whether the unread refused count shows refusals, where reading it costs no
        wait for a device: on the CPU. On a GPU (False) a copy and an event a lookup, in
        the training step's hot path, are not measured yet, so there a read that found
        none still starts the minute's window, as it always did."""
        unread = self._refused_unread
        if unread is None or unread.is_cuda:
            return False
        return int(unread.reshape(1).numpy()[0]) > 0  # host memory: no device read
