"""When and what the trainer saves and restores (the format is hashrec.checkpoint's).

A run writes ``model_dir/model.ckpt-<step>/`` every ``save_checkpoints_steps``
steps, or every ``save_checkpoints_epochs`` epochs where that is set (it replaces the step
interval, as in TorchEasyRec), and once at the end.
Checkpoint ``extra`` carries the epoch count and the batches trained of the epoch
in progress, so a resumed run continues where it stopped: the partly trained
epoch's first batches are read again (the order of the rest depends on them) but
not trained. They are the same batches when the readers are laid out as before
(ranks, loader workers, batch size; also in ``extra``). Otherwise the resumption is
approximate, and a warning says so: each rank skips as many of its batches as cover
the rows trained in the epoch (``hashrec.train.batch_shares.resumed_batches``: the saved
count x ranks x batch size then, over ranks x batch size now, rounded down), so that
the epoch trains at least its row count in all, but not the same rows. Each reader
(``hashrec.data.sharding``) reads a contiguous range of the rows, cut by the number
of ranks and loader workers (and, with ``shuffle``, mixes it by a seed of its own), so
a new layout skips the first rows of each new range: some rows trained before are
trained again, and up to as many others are not trained in that epoch.

Each rank also saves its random generators' states (torch's CPU generator, the training
GPU's, and the dynamic tables' own: ``TableOptions.seed``'s generator and the in-kernel
initializers' seeds), put back before the resumed run's first step: dropout
and the initial values of rows inserted later draw what an uninterrupted run would
have, so resuming on the same device and number of ranks trains the same model bit
for bit (compared on the CPU in the tests), full tables too: a restore on as many ranks
puts every entry back in its slot, which breaks ties of equal scores when a full bucket
evicts (``hashrec.checkpoint.table_io``). Under another number of ranks (or from a
GPU run onto the CPU) the states do not apply; the run then draws others and says so.

Under several ranks "the latest checkpoint" of a model_dir (``--continue_train``, a
fine-tune start, eval and export of a model_dir) is looked up by rank 0 alone and its
path given to every rank: a run still training there may commit a new one between two
ranks' looks, and ranks restoring different checkpoints would evaluate or export a mix.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

import torch

from hashrec.checkpoint import (
    CheckpointError,
    ParamMap,
    latest_checkpoint,
    restore_checkpoint,
    restore_fine_tune,
    save_checkpoint,
)
from hashrec.checkpoint.dist_util import rank_and_world, run_on_rank_zero
from hashrec.checkpoint.errors import CheckpointDamagedError
from hashrec.checkpoint.layout import (
    CHECKPOINT_PREFIX,
    checkpoint_dirs,
    complete_checkpoints,
    is_complete,
    read_meta,
)
from hashrec.checkpoint.restore import torcheasyrec_message
from hashrec.config.errors import ConfigError
from hashrec.data.paths import relative_to_cwd
from hashrec.table import TableError
from hashrec.train.errors import TrainError
from hashrec.train.evaluation import EVAL_RESULT_FILE, best_checkpoint

logger = logging.getLogger("hashrec.train")


@dataclass(frozen=True)
class Resume:
    """Where training starts: ``step`` and ``epoch`` already done, ``epoch_step`` batches
    of the next epoch trained (read by ``readers``: ranks, loader workers and batch
    size, or None where unknown), restored from ``path``."""

    step: int = 0
    epoch: int = 0
    path: str | None = None
    epoch_step: int = 0
    readers: tuple[int, ...] | None = None
    random_state: dict | None = None
    # Whether the run that saved it went on to evaluate it (None: not recorded).
    evaluates: bool | None = None
    # A run continued from its own checkpoint (not a fresh or fine-tune start), and the
    # checkpoint's train metric state (None: it holds none).
    continued: bool = False
    train_metrics: dict | None = None


def existing_checkpoints(model_dir: str) -> list[str]:
    """Every ``model.ckpt-<step>`` directory in ``model_dir`` (complete or not; saves in
    progress or abandoned, ``.tmp``, are not checkpoints), oldest first. A step whose only
    complete copy is ``model.ckpt-<step>.replaced`` (a save of that step interrupted while
    swapping copies) is listed as that copy: it is the step's checkpoint, and the next save
    renames it back (``layout.remove_leftovers``)."""
    found = {int(os.path.basename(p)[len(CHECKPOINT_PREFIX):]): p
             for p in checkpoint_dirs(model_dir)}
    for step, path in complete_checkpoints(model_dir):
        found.setdefault(step, path)
    return [found[step] for step in sorted(found)]


def check_model_dir(model_dir: str, continue_train: bool) -> None:
    """Refuse to train over an existing run unless asked to continue it. Incremental
    dumps without a checkpoint (a run killed before its first save) are no reason to
    refuse: the training loop moves them aside before its first dump.

    Raises:
        TrainError: ``model_dir`` is a file, or it holds checkpoints and
            ``continue_train`` is False.
    """
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise TrainError(f"model_dir {model_dir!r} is a file; --model_dir (or model_dir in the "
                         f"config) must name a directory")
    found = existing_checkpoints(model_dir)
    if found and not continue_train:
        held = (f"a checkpoint ({os.path.basename(found[0])})" if len(found) == 1 else
                f"{len(found)} checkpoints (the latest {os.path.basename(found[-1])})")
        raise TrainError(f"model_dir {model_dir!r} already holds {held}; pass --continue_train "
                         f"to resume it, or choose an empty --model_dir")


def restore_for_training(model_dir: str, model, dense_optimizer, continue_train: bool,
                         fine_tune_checkpoint: str | None,
                         restore_optimizer: bool = True,
                         param_map: ParamMap | None = None) -> Resume:
    """Restore the latest checkpoint of ``model_dir`` (continue) or a fine-tune start.

    With ``continue_train`` and a complete checkpoint in ``model_dir`` training
    resumes from it, strictly: the model must be the one saved (optimizer state too
    unless ``restore_optimizer`` is False). Otherwise ``fine_tune_checkpoint`` (a
    checkpoint directory, or a model_dir whose latest checkpoint is taken) initializes
    what of the model and tables it holds in the same shape, under the names
    ``param_map`` gives (``hashrec.checkpoint.fine_tune``); the rest starts fresh and
    training starts at step 0. Under several ranks the latest checkpoint of a model_dir
    is the one rank 0 finds, on every rank.
    """
    tables = model.embedding.dynamic_tables()
    if continue_train:
        path = run_on_rank_zero(lambda: latest_checkpoint(model_dir),
                                f"finding the latest checkpoint of {model_dir}", TrainError)
        if path is not None:
            try:
                meta = restore_checkpoint(path, model, dense_optimizer.optimizers, tables,
                                          restore_optimizer=restore_optimizer,
                                          read_rank_state=True, read_train_metrics=True)
            except CheckpointDamagedError as err:
                raise CheckpointDamagedError(f"{err}{damaged_hint(path, None)}") from None
            extra = meta.get("extra") or {}
            _note_skipped(model_dir, path)
            logger.info("continuing from %s (step %d)", path, int(meta["step"]))
            readers = extra.get("readers")
            if meta.get("rank_state") is None:
                saved, world = int(meta.get("world_size") or 0), rank_and_world()[1]
                why = (f"they are restored only on as many ranks as saved them ({saved}, "
                       f"now {world})" if saved and saved != world
                       else "it holds none for this rank")
                logger.info("%s: the random generator states are not restored (%s): the "
                            "resumed run draws other random numbers than an uninterrupted "
                            "one would", path, why)
            if fine_tune_checkpoint:
                logger.info("fine-tune checkpoint %s is not used: the run continues from its "
                            "own checkpoint", fine_tune_checkpoint)
            if param_map is not None:
                logger.info("fine_tune_ckpt_param_map %s is not used: the run continues "
                            "from its own checkpoint", param_map.path)
            return Resume(int(meta["step"]), int(extra.get("epoch", 0)), path,
                          int(extra.get("epoch_step", 0)),
                          tuple(readers) if readers is not None else None,
                          meta.get("rank_state"), extra.get("evaluates"), continued=True,
                          train_metrics=meta.get("train_metrics_state"))
        if existing_checkpoints(model_dir):
            logger.warning("model_dir %s holds no complete checkpoint; starting fresh",
                           model_dir)
        else:
            logger.info("--continue_train: model_dir %s holds no checkpoint yet; starting "
                        "fresh", model_dir)
    elif not restore_optimizer:
        logger.warning("--ignore_restore_optimizer has no effect without --continue_train "
                       "(a fine-tune start never restores optimizer state)")
    if fine_tune_checkpoint:
        path = agreed_checkpoint(fine_tune_checkpoint)
        try:
            restore_fine_tune(path, model, tables, param_map)
        except CheckpointDamagedError as err:
            raise CheckpointDamagedError(
                f"{err}{damaged_hint(path, '--fine_tune_checkpoint')}") from None
        return Resume(0, 0, path)
    if param_map is not None:
        logger.warning("fine_tune_ckpt_param_map %s has no effect without a fine-tune "
                       "checkpoint (train_config.fine_tune_checkpoint or "
                       "--fine_tune_checkpoint)", param_map.path)
    return Resume()


def damaged_hint(checkpoint: str, option: str | None) -> str:
    """What to do about ``checkpoint`` once a file of it proved damaged: restore the file
    from a copy, or take the complete checkpoint before it in its model_dir, through
    ``option`` (``"--checkpoint_path"``), or, resuming (``option`` None), by moving the
    damaged one out of the model_dir so that ``--continue_train`` finds the one before."""
    checkpoint = os.path.normpath(checkpoint)
    model_dir, name = os.path.split(checkpoint)
    found = complete_checkpoints(model_dir)
    step = next((s for s, p in found if os.path.normpath(p) == checkpoint), None)
    earlier = [p for s, p in found if step is not None and s < step]
    hint = f"; {name} is damaged: restore the file from a copy"
    if not earlier:
        return f"{hint} (there is no complete checkpoint before it in {model_dir})"
    if option is None:
        return (f"{hint}, or move {name} out of {model_dir} and run again with "
                f"--continue_train to resume from {os.path.basename(earlier[-1])}, the "
                f"complete checkpoint before it")
    return f"{hint}, or pass {option} {earlier[-1]} (the complete checkpoint before it)"


def note_unread_init_tables(feature_set) -> None:
    """Warn, once, that the dynamicemb ``init_table`` the features set is not read: a run
    that starts fresh, not from a fine-tune checkpoint, starts its tables as their
    initializers say. The ``create_dynamicemb_init_ckpt`` tool reads it into a checkpoint,
    which ``--fine_tune_checkpoint`` then starts from."""
    named = [name for name, feature in feature_set.features.items()
             if feature.table is not None and feature.table.dynamicemb is not None
             and feature.table.dynamicemb.init_table]
    if not named:
        return
    logger.warning(
        "dynamicemb.init_table of feature%s %s is not read by training: the run starts fresh, "
        "with rows drawn by the initializers. To start from it, write a checkpoint of it with "
        "python -m hashrec.tools.dynamicemb.create_dynamicemb_init_ckpt "
        "--pipeline_config_path <this config> --world_size <ranks> --save_dir <dir>, then "
        "train with --fine_tune_checkpoint <dir>/model.ckpt-0",
        "s" if len(named) > 1 else "", ", ".join(map(repr, named)))


def note_empty_frozen_tables(feature_set) -> None:
    """Warn about the frozen (``trainable: false``) dynamic and ZCH tables of a run that
    starts fresh: they start empty and training adds no id to a frozen table, so every
    lookup reads the eval initializer (dynamic) or zeros (ZCH, no slot assigned)."""
    frozen = [spec for spec in feature_set.embedding_tables() if not spec.trainable]
    dynamic = [spec.name for spec in frozen if spec.is_dynamic]
    zch = [spec.name for spec in frozen if spec.zch is not None]
    if not dynamic and not zch:
        return
    def verb(names: list[str], plural: str, singular: str) -> str:
        return plural if len(names) > 1 else singular

    reads = []
    if dynamic:
        reads.append(f"{_names(dynamic)} {verb(dynamic, 'read', 'reads')} the eval initializer")
    if zch:
        reads.append(f"{_names(zch)} (ZCH) {verb(zch, 'read', 'reads')} zeros")
    both = dynamic + zch
    logger.warning(
        "frozen table%s %s (trainable: false) %s empty and training adds no id to a "
        "frozen table: %s for every id. Start from a checkpoint that holds %s "
        "(--fine_tune_checkpoint), or make %s trainable", verb(both, "s", ""), _names(both),
        verb(both, "start", "starts"), "; ".join(reads), verb(both, "them", "it"),
        verb(both, "them", "it"))


def _names(names: list[str]) -> str:
    return ", ".join(map(repr, names))


def _note_skipped(model_dir: str, latest: str) -> None:
    """Warn about checkpoints after ``latest`` that are incomplete (a save interrupted)."""
    names = [os.path.basename(p) for p in existing_checkpoints(model_dir)]  # by step
    name = os.path.basename(os.path.normpath(latest))
    later = names[names.index(name) + 1:] if name in names else []
    if later:
        logger.warning("%s: incomplete (a save was interrupted), not restored; the run "
                       "continues from the latest complete checkpoint", ", ".join(later))


# Values of export_config.exporter_type: "best" exports the checkpoint that evaluated best
# (and training keeps it from keep_checkpoint_max's pruning); the others the latest.
EXPORTER_TYPES = ("latest", "final", "best", "none")


@dataclass(frozen=True)
class BestBy:
    """export_config's ``exporter_type: "best"``: the metric of eval_result.txt that
    decides, and whether larger is better."""

    metric: str
    larger_is_better: bool = True

    @classmethod
    def from_config(cls, config) -> BestBy | None:
        """From ``config.export_config`` (None unless exporter_type is "best").

        Raises:
            ConfigError: an exporter_type HashRec does not know.
        """
        export = config.export_config
        kind = export.exporter_type
        if kind not in EXPORTER_TYPES:
            raise ConfigError(f"export_config.exporter_type {kind!r} is not valid; allowed: "
                              f"{', '.join(EXPORTER_TYPES)}")
        if kind != "best":
            return None
        return cls(export.best_exporter_metric, bool(export.metric_larger_is_better))

    def describe(self) -> str:
        return f"{'highest' if self.larger_is_better else 'lowest'} {self.metric}"


def resolve_checkpoint(path: str, best: BestBy | None = None) -> str:
    """A checkpoint directory itself, or the latest complete one inside a model_dir (with
    ``best``, the one evaluated best by its metric; the latest, with a warning, where
    eval_result.txt names none still there).

    Raises:
        TrainError: nothing restorable at ``path``, or ``best``'s metric is in none of
            the results.
    """
    if not os.path.isdir(path):
        raise TrainError(f"checkpoint path {path!r} does not exist{relative_to_cwd(path)}")
    if os.path.basename(os.path.normpath(path)).startswith("model.ckpt-"):
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise TrainError(_not_a_checkpoint(path))
    if best is None:
        return latest
    chosen = best_checkpoint(path, best.metric, best.larger_is_better)
    if chosen is None:
        logger.warning("exporter_type best: %s names no checkpoint still in %s; taking the "
                       "latest, %s", EVAL_RESULT_FILE, path, latest)
        return latest
    logger.info("exporter_type best: taking %s, the %s in %s", chosen, best.describe(),
                EVAL_RESULT_FILE)
    return chosen


def _not_a_checkpoint(path: str) -> str:
    """Why ``path``, a directory without a complete checkpoint in it, cannot be restored,
    and what to pass instead."""
    instead = "pass a model_dir or one of its model.ckpt-<step> directories"
    if is_complete(path):
        with contextlib.suppress(CheckpointError):
            kind = read_meta(path).get("kind")
            if kind in ("full", "delta"):
                return (f"{path!r} is an incremental dump or an apply_delta output ({kind}): "
                        f"dynamic tables without the dense model, not a checkpoint; "
                        f"{instead}")
    foreign = torcheasyrec_message(path)
    if foreign is not None:
        return foreign
    return (f"{path!r} holds no complete checkpoint (model.ckpt-<step>/); {instead} (an "
            f"export directory is not one)")


def agreed_checkpoint(path: str, best: BestBy | None = None) -> str:
    """``resolve_checkpoint(path, best)`` as rank 0 finds it, on every rank (one lookup, so
    that all ranks take the same checkpoint while a run may be writing new ones).

    Raises:
        TrainError: nothing restorable at ``path`` (on every rank).
    """
    return run_on_rank_zero(lambda: resolve_checkpoint(path, best),
                            f"finding a checkpoint at {path}", TrainError)


def restore_resolved(path: str, restore, best: BestBy | None = None):
    """``restore(checkpoint)`` of the checkpoint ``path`` names: itself, or a model_dir's
    latest complete one (or its best: ``best``), as rank 0 finds it, on every rank
    (:func:`agreed_checkpoint`), taken as late as possible (after the model is built)
    since a run still training there may prune it. Returns (checkpoint, what ``restore``
    gave).

    Raises:
        TrainError: nothing restorable at ``path``, or the checkpoint taken was removed
            while it was read.
    """
    checkpoint = agreed_checkpoint(path, best)
    try:
        return checkpoint, restore(checkpoint)
    except CheckpointError as err:
        if os.path.normpath(checkpoint) != os.path.normpath(path) \
                and not os.path.isdir(checkpoint):
            raise TrainError(
                f"{checkpoint} was removed while it was read: a run training into {path} "
                f"with keep_checkpoint_max deletes older checkpoints; run again (the latest "
                f"is taken then), or name a checkpoint that run keeps") from None
        if isinstance(err, CheckpointDamagedError):
            raise CheckpointDamagedError(
                f"{err}{damaged_hint(checkpoint, '--checkpoint_path')}") from None
        raise


def kept_best(model_dir: str, best: BestBy | None) -> list[str]:
    """The checkpoint that pruning keeps beside the latest ones under ``exporter_type:
    "best"`` (none otherwise, or where nothing was evaluated yet); a metric the results
    lack is warned about, not raised, so that training goes on."""
    if best is None:
        return []
    try:
        chosen = best_checkpoint(model_dir, best.metric, best.larger_is_better)
    except TrainError as err:
        logger.warning("%s; no checkpoint is kept for it beyond keep_checkpoint_max", err)
        return []
    return [] if chosen is None else [chosen]


def save(model_dir: str, step: int, epoch: int, model, dense_optimizer,
         keep_checkpoint_max: int, epoch_step: int = 0,
         readers: tuple[int, ...] | None = None, evaluates: bool = False,
         keep_best: BestBy | None = None, train_metrics: dict | None = None) -> str:
    """Write ``model.ckpt-<step>`` (dense state, optimizer, dynamic tables, the
    ``train_metrics`` state when given); ``extra`` records ``epoch``, ``epoch_step``,
    ``readers`` and ``evaluates`` (whether an evaluation of it follows; see
    :class:`Resume`). Pruning to ``keep_checkpoint_max`` spares the checkpoint evaluated
    best so far by ``keep_best`` (:func:`kept_best`)."""
    extra = {"epoch": epoch, "epoch_step": epoch_step, "evaluates": bool(evaluates)}
    if readers is not None:
        extra["readers"] = list(readers)
    path = save_checkpoint(model_dir, step, model, dense_optimizer.optimizers,
                           model.embedding.dynamic_tables(), keep_checkpoint_max,
                           extra=extra, rank_state=random_states(model),
                           keep=kept_best(model_dir, keep_best) if keep_checkpoint_max else (),
                           train_metrics=train_metrics)
    logger.info("saved checkpoint %s", path)
    return path


def _model_device(model) -> torch.device:
    tensor = next(iter(model.parameters()), None)
    return torch.device("cpu") if tensor is None else tensor.device


def random_states(model) -> dict:
    """This rank's random generator states: torch's CPU generator, the model's GPU's
    (when it trains on one) and each dynamic table's ``random_state()`` (its own
    generator, the in-kernel initializers' seed sequence)."""
    state: dict = {"cpu": torch.get_rng_state()}
    device = _model_device(model)
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    tables = {}
    for name, table in model.embedding.dynamic_tables().items():
        table_state = table.random_state()
        if table_state is not None:
            tables[name] = table_state
    state["tables"] = tables
    return state


def set_random_states(model, state: dict) -> None:
    """Puts back ``random_states(model)`` of a checkpoint; a GPU state is skipped (with a
    warning) when the model is not on a GPU now, and a table's generator when the table
    has none of its own now."""
    torch.set_rng_state(state["cpu"])
    device = _model_device(model)
    if "cuda" in state:
        if device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], device)
        else:
            logger.warning("the checkpoint's GPU random state does not apply on %s: the "
                           "resumed run draws other random numbers", device)
    tables = model.embedding.dynamic_tables()
    for name, table_state in state.get("tables", {}).items():
        table = tables.get(name)
        if table is None:
            continue
        try:
            table.set_random_state(table_state)
        except TableError as e:
            logger.warning("%s: the resumed run draws other initial values", e)
