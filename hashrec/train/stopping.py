"""Stopping a training run on SIGINT or SIGTERM, every rank after the same step.

SIGINT and SIGTERM end the run after the current step with a checkpoint
(``hashrec.train.interrupt``: ``StopSignals`` notes them); one that comes during an
evaluation (which follows a save) stops it before its next batch, and the run ends
without a result for it. Under several ranks a signal may reach some ranks only, or the
ranks at different steps: after each step every rank starts a host-side reduction of the
signal it holds and reads the previous step's (``StopAgreement.check``), so that all stop
after the same step without waiting for each other; the last step's reduction is read
after the loop by every rank alike (``StopAgreement.finish``).
"""

from __future__ import annotations

import torch.distributed as dist

from hashrec.distributed.process_group import all_reduce_int_async
from hashrec.train.interrupt import StopSignals, TrainInterrupted


class StopAgreement:
    """The stop signals of a training run, noted while entered, and the ranks' agreement
    on the one it stops on.

    Args:
        ctx: the run's distributed context.
    """

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.signals: StopSignals | None = None
        self._reduction = None  # under several ranks: the last step's, unread
        self.evaluation_cut = False  # a stop signal ended an evaluation

    def __enter__(self) -> StopAgreement:
        self.signals = StopSignals().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.signals.__exit__(*exc)

    @property
    def stopping(self) -> bool:
        """A stop signal was agreed on (see ``check``; in an evaluation,
        ``eval_batches``)."""
        return self.signals is not None and self.signals.agreed is not None

    def check(self) -> bool:
        """Whether to stop after this step: a signal was received (under several ranks:
        by any rank as of the previous step, whose reduction this step reads, so that
        all stop after the same step without waiting for each other)."""
        signals = self.signals
        if signals is None:
            return False
        if self.stopping:  # agreed in an evaluation (every rank alike)
            return True
        if not self.ctx.is_distributed:
            signals.agreed = signals.received
            return self.stopping
        agreed = self._reduction() if self._reduction is not None else 0
        self._reduction = all_reduce_int_async(signals.received or 0, self.ctx,
                                               dist.ReduceOp.MAX)
        signals.agreed = agreed or None
        return self.stopping

    def finish(self) -> None:
        """Reads the last step's reduction, which every rank started. A signal it carries
        came in the last step, as the run ends anyway; every rank reads the same value
        and leaves it alike, so none stops on its own (a final evaluation still stops on
        the signal, every rank before the same batch)."""
        if self._reduction is not None:
            self._reduction()
            self._reduction = None

    def interrupted(self, step: int, complete: bool, evaluates: bool) -> TrainInterrupted:
        """The error that ends a run stopped at ``step`` (``complete``: its training was
        done; ``evaluates``: it has an eval input), saying what is saved and what next."""
        where = " in the evaluation" if self.evaluation_cut else ""
        head = f"stopped by {self.signals.name}{where} at step {step}; "
        if not complete:
            return TrainInterrupted(head + f"the checkpoint of step {step} is saved; run "
                                    f"again with --continue_train to resume",
                                    self.signals.agreed)
        rest = f"training is complete and the checkpoint of step {step} is saved"
        if evaluates:
            rest += "; run again with --continue_train (or python -m hashrec.eval) to evaluate it"
        return TrainInterrupted(head + rest, self.signals.agreed)
