"""The training loop's checkpoints, on its schedule, each followed by an evaluation.

A checkpoint is due every ``save_checkpoints_steps`` steps or every
``save_checkpoints_epochs`` epochs (``LoopOptions``), and the loop saves one at the end of
the run; with an eval input each is then evaluated, its result appended to
``<model_dir>/eval_result.txt`` and to the summaries. A checkpoint records whether its
run goes on to evaluate it: with an eval input, every one but those saved on a stop
signal. A resumed run whose checkpoint has no line in eval_result.txt evaluates it before
training on (``CheckpointSchedule.unevaluated_resume``) when the run that saved it went
on to evaluate it or when its own schedule evaluates it (a step or epoch checkpoint, or
the last): a stop or crash in an evaluation leaves no hole in the results, also where the
resumed run trains longer.
"""

from __future__ import annotations

from hashrec.checkpoint.dist_util import run_on_rank_zero
from hashrec.train import checkpoints
from hashrec.train.errors import TrainError
from hashrec.train.evaluation import evaluate as evaluate_model
from hashrec.train.evaluation import evaluated, write_eval_result


class CheckpointSchedule:
    """Says when the loop's checkpoints are due; saves and evaluates them.

    Args:
        session: the training ``Session``.
        options: the loop's ``LoopOptions``.
        resume: where the run starts (``checkpoints.Resume``).
        readers: the training input's layout (ranks, loader workers, batch size),
            recorded in each checkpoint.
        train_metrics: the training batches' ``TrainMetrics``, saved with each checkpoint.
        summaries: the run's ``Summaries``, which receive the evaluation results.
        stop: the run's ``StopAgreement``: a stop signal cuts an evaluation short.
    """

    def __init__(self, session, options, resume: checkpoints.Resume, readers: tuple,
                 train_metrics, summaries, stop) -> None:
        self.session = session
        self.options = options
        self.readers = readers
        self.train_metrics = train_metrics
        self.summaries = summaries
        self.stop = stop
        self.last_saved = resume.step if resume.path and resume.step else -1
        self.resumed_from = resume.path if resume.step else None
        self._resume_evaluates = resume.evaluates

    def due_at_step(self, step: int) -> bool:
        every = self.options.save_checkpoints_steps
        return bool(every) and step % every == 0

    def due_at_epoch(self, epoch: int) -> bool:
        every = self.options.save_checkpoints_epochs
        return bool(every) and epoch % every == 0

    def unevaluated_resume(self, step: int, epoch: int, epoch_step: int, done: bool) -> bool:
        """Whether the checkpoint this run resumes from (at ``step``, ``epoch`` and
        ``epoch_step``; ``done``: the run has nothing left to train) is one the run that
        saved it went on to evaluate (its ``evaluates`` record: the last of a run that
        trained fewer steps counts) or one this run's schedule evaluates (a step or epoch
        checkpoint, or the last), and its evaluation left no result in eval_result.txt:
        the run before stopped, or was killed, in it. Rank 0 reads the file; every rank
        takes its answer."""
        if self.resumed_from is None or not self.options.eval_input_path:
            return False
        due = bool(self._resume_evaluates) or self.due_at_step(step) or done or (
            not epoch_step and self.due_at_epoch(epoch))
        if not due:  # a checkpoint saved on a stop signal, not evaluated by design
            return False
        path, model_dir = self.resumed_from, self.session.model_dir
        return run_on_rank_zero(lambda: not evaluated(model_dir, path),
                                "reading eval_result.txt", TrainError)

    def save(self, step: int, epoch: int, epoch_step: int, evaluate: bool = True) -> dict | None:
        """Saves the checkpoint of ``step`` (``epoch_step`` batches into ``epoch``), then
        evaluates it when an eval input is set (and ``evaluate``); returns the result."""
        s = self.session
        evaluate = evaluate and bool(self.options.eval_input_path)
        path = checkpoints.save(s.model_dir, step, epoch, s.model, s.dense,
                                self.options.keep_checkpoint_max, epoch_step,
                                self.readers, evaluates=evaluate,
                                keep_best=self.options.keep_best,
                                train_metrics=self.train_metrics.state_dict()
                                if self.train_metrics else None)
        self.last_saved = step
        return self.evaluate(path, step) if evaluate else None

    def evaluate(self, path: str, step: int) -> dict | None:
        """Evaluates the model (the checkpoint ``path`` of ``step``) and records the
        result; None when a stop signal cut it short."""
        s = self.session
        result = evaluate_model(s, self.options.eval_input_path, step,
                                self.options.eval_num_steps, self.stop.signals)
        if result is None:  # a stop signal cut it short: ``stopping`` now
            self.stop.evaluation_cut = True
            return None
        try:
            write_eval_result(s.model_dir, result, s.rank, path)
        except TrainError as err:  # the checkpoint it evaluated is complete: say so
            raise TrainError(f"{err}; the checkpoint {path} is saved (--continue_train "
                             f"resumes from it)") from None
        self.summaries.scalars(step, {k: v for k, v in result.items() if k != "step"},
                               prefix="eval/")
        self.summaries.flush()
        return result
