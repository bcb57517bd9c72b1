"""Command-line plumbing shared by ``hashrec.train_eval``, ``hashrec.eval``,
``hashrec.export`` and ``hashrec.predict``."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Callable

from hashrec.config import (
    ConfigError,
    apply_edit_config_json,
    load_pipeline_config,
    validate_pipeline_config,
)
from hashrec.config.fg_mode import fg_mode_conflict
from hashrec.config.unused import fg_mode_note, ignored_field_notes
from hashrec.train.errors import TrainError


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline_config_path", required=True,
                        help="pipeline config (protobuf text format)")
    parser.add_argument("--edit_config_json", default=None,
                        help='JSON object of dotted config overrides, e.g. '
                             '\'{"train_config.num_steps": 100, "data_config.batch_size": 256}\'')


def load_effective_config(args: argparse.Namespace, overrides: dict[str, str | None]):
    """Load the config, apply ``--edit_config_json``, then non-empty path overrides; warn
    of the fields HashRec ignores and say how an encoded-input fg_mode is read (on the
    ``hashrec.config`` logger, which ranks other than 0 keep quiet: ``setup_logging``).

    Raises:
        ConfigError: unreadable config, a bad edit, or an unsupported setting.
    """
    config = load_pipeline_config(args.pipeline_config_path)
    if args.edit_config_json:
        config = apply_edit_config_json(config, args.edit_config_json)
    for field, value in overrides.items():
        if value:
            setattr(config, field, value)
    validate_pipeline_config(config)
    ignored = ignored_field_notes(config)
    if ignored:
        logging.getLogger("hashrec.config").warning(
            "%s: HashRec ignores %s (%s nothing it trains)", args.pipeline_config_path,
            ", ".join(ignored), "it changes" if len(ignored) == 1 else "they change")
    conflict = fg_mode_conflict(config.data_config if config.HasField("data_config") else None)
    if conflict:
        logging.getLogger("hashrec.config").warning("%s: %s", args.pipeline_config_path,
                                                    conflict)
    encoded = fg_mode_note(config)
    if encoded:
        logging.getLogger("hashrec.config").info("%s: %s", args.pipeline_config_path, encoded)
    return config


def distributed_context():
    """Join torchrun's process group (NCCL on GPUs, gloo on CPU), or run alone without one.

    Returns:
        The worker's ``DistContext`` (rank 0 of 1 outside torchrun).
    """
    from hashrec.distributed import init_distributed

    return init_distributed()


# Loggers whose warnings every rank derives alike from the same config (a field a mode
# does not read, a vocabulary's ids, the fields HashRec ignores): ranks other than 0 log
# only their errors.
CONFIG_LOGGERS = ("hashrec.config", "hashrec.features")


def setup_logging(rank: int, world_size: int = 1) -> None:
    """INFO on rank 0, WARNING on the others (ERROR for ``CONFIG_LOGGERS``, whose
    warnings rank 0 gives); under several ranks each line names its rank, so the
    warnings and errors of ranks other than 0 are told apart."""
    where = f" [rank {rank}]" if world_size > 1 else ""
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s",
                        stream=sys.stderr)
    for name in CONFIG_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if rank == 0 else logging.ERROR)


# Texts of gloo's errors when a peer's process ended (they come as plain RuntimeErrors).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
# Gloo's text when a collective waited past the process group's timeout for a peer that
# is alive but does not answer (hung, stopped, or far behind).
_TIMED_OUT = "Timed out waiting"


def _lost_peer(err: BaseException) -> bool:
    """Whether ``err`` is a collective failing because another rank is gone."""
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err) for text in _PEER_GONE)


def _collective_failure(err: BaseException, rank: int) -> Exception | None:
    """The one-line ``DistributedError`` of a collective that failed on ``rank`` because
    another rank is gone or did not answer within ``HASHREC_COLLECTIVE_TIMEOUT_S``; None
    for other errors."""
    from hashrec.distributed import DistributedError
    from hashrec.distributed.process_group import collective_timeout_s

    first = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    if isinstance(err, RuntimeError) and _TIMED_OUT in str(err):
        try:
            waited = f"{collective_timeout_s(os.environ):g} s"
        except DistributedError:
            waited = "its timeout"
        return DistributedError(
            f"rank {rank}: a collective waited {waited} (HASHREC_COLLECTIVE_TIMEOUT_S) for "
            f"another rank that did not answer ({first}); a rank that hangs or is stopped "
            f"holds the others this long: the other ranks' logs say where it stopped")
    if _lost_peer(err):
        return DistributedError(f"rank {rank}: a collective failed because another rank is "
                                f"gone ({first}); its log says why")
    return None


def _file_system_problem(err: OSError) -> bool:
    """Whether ``err`` is about the files the user pointed to (it names its file) or the
    disk they are on (full, over quota, read-only), not a failure of the program."""
    return err.filename is not None or err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def run_main(main: Callable[[], object], interrupted: str | None = None) -> int:
    """Run ``main``; user errors (config, data, features, embeddings, tables, model,
    checkpoint, export, and an OSError naming its file or a full or read-only disk) exit
    1 with one message (other errors keep their traceback); a run stopped by a signal
    exits with 128 + its number (130 for Ctrl-C), also with one message, which after a
    Ctrl-C (or a SIGTERM that raised ``Terminated``) ends with ``interrupted``: what the
    command left undone, e.g. "no eval result written"."""
    from hashrec.checkpoint import CheckpointError
    from hashrec.checkpoint.errors import disk_full_hint
    from hashrec.data import DataError
    from hashrec.distributed import DistributedError
    from hashrec.embedding import EmbeddingError
    from hashrec.export.errors import ExportError
    from hashrec.features import FeatureError
    from hashrec.models import ModelError
    from hashrec.table import TableError
    from hashrec.train.interrupt import Terminated, TrainInterrupted

    undone = f" ({interrupted})" if interrupted else ""
    try:
        main()
    except TrainInterrupted as stop:
        logging.getLogger("hashrec").warning("%s", stop)
        return stop.exit_code
    except KeyboardInterrupt:
        logging.getLogger("hashrec").warning("interrupted%s", undone)
        return 130
    except Terminated as stop:
        logging.getLogger("hashrec").warning("stopped by SIGTERM%s", undone)
        return stop.exit_code
    except (ConfigError, TrainError, ModelError, FeatureError, DataError, EmbeddingError,
            TableError, CheckpointError, DistributedError, ExportError) as err:
        logging.getLogger("hashrec").error("%s: %s", type(err).__name__, err)
        return 1
    except OSError as err:
        if not _file_system_problem(err):
            raise
        logging.getLogger("hashrec").error("%s: %s%s", type(err).__name__, err,
                                           disk_full_hint(err, None, "run again"))
        return 1
    return 0


def run_distributed(args: argparse.Namespace, overrides: dict[str, str | None],
                    body: Callable[[object, object], object],
                    interrupted: str | None = None) -> int:
    """Run ``body(config, ctx)`` as a (possibly torchrun) worker of a config command;
    ``interrupted`` as in :func:`run_main`.

    Joins the process group, logs on rank 0 (warnings and errors on every rank; the
    config's warnings, the same on every rank, on rank 0), loads the effective config
    (``load_effective_config(args, overrides)``) and leaves the process group again.
    After an error under several ranks it leaves at once, without the barrier of a clean
    teardown: the error may be this rank's alone while the others wait in a collective,
    and they learn of it when this process exits (torchrun ends them; under gloo their
    collectives fail, which they report as a lost peer). A peer that is alive but does
    not answer (hung or stopped) fails the others' collectives after
    ``HASHREC_COLLECTIVE_TIMEOUT_S``, which they report in one line too.

    Returns:
        The exit code of :func:`run_main`: 0, 1 after a user error, 128 + the signal
        after a signal stopped training.
    """
    from hashrec.train.interrupt import TrainInterrupted

    world_size = 1

    def run() -> None:
        nonlocal world_size
        from hashrec.distributed import teardown

        ctx = distributed_context()
        world_size = ctx.world_size
        setup_logging(ctx.rank, ctx.world_size)
        try:
            body(load_effective_config(args, overrides), ctx)
        except TrainInterrupted:  # every rank stopped after the same step
            teardown(ctx)
            raise
        except BaseException as err:
            failure = _collective_failure(err, ctx.rank) if ctx.world_size > 1 else None
            if failure is not None:
                raise failure from None
            if ctx.world_size == 1:
                teardown(ctx)
            raise
        teardown(ctx)

    code = run_main(run, interrupted)
    if world_size > 1:
        # A torchrun worker's work is complete and its process group is gone; some
        # native library threads still abort now and then during interpreter teardown
        # ("terminate called without an active exception"), which would turn a finished
        # run into a failed one. Flush what is buffered and leave without that teardown.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
