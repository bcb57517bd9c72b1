"""How the input's batches fall to the ranks: the batches of a resumed epoch a run skips,
and why a rank got none."""

from __future__ import annotations

from hashrec.train import checkpoints


def resumed_batches(resume: checkpoints.Resume, readers: tuple[int, int, int]) -> int:
    """Batches per rank of the resumed epoch that a run reading with ``readers`` (ranks,
    loader workers, batch size) skips: the checkpoint's count, or, where it read with
    another number of ranks or batch size, as many of this run's batches as cover the
    rows trained in the epoch, ``epoch_step x ranks x batch size`` then, rounded down
    (rows may be trained twice, the count never falls short of the epoch's rows)."""
    if not resume.epoch_step or resume.readers is None:
        return resume.epoch_step
    world, _, batch = (int(n) for n in resume.readers)
    return resume.epoch_step * world * batch // (readers[0] * readers[2])


def empty_shares(rows: int, batch_size: int, workers: int, per_rank: list[int],
                 drop_remainder: bool = False) -> str:
    """Why some of the ranks have no batch of the input's ``rows`` (``per_rank``: each
    rank's batches per epoch) and what to change. Its readers (each rank's loader workers,
    or the rank itself without workers) share out the input's full batches
    (``hashrec.data.sharding``); with fewer full batches than readers some get none, and
    every rank trains as many steps as the one with the fewest."""
    ranks, full = len(per_rank), rows // batch_size
    readers = ranks * max(workers, 1)
    empty = [rank for rank, count in enumerate(per_rank) if count == 0]
    who = (f"rank {empty[0]}" if len(empty) == 1
           else "ranks " + ", ".join(str(rank) for rank in empty))
    rest = rows - full * batch_size
    partial = "" if not rest else (f" (the {rest} rows left over are dropped: drop_remainder)"
                                   if drop_remainder else
                                   f" (plus {rest} rows, a partial batch of rank 0)")
    layout = (f"{ranks} ranks x {workers} loader workers" if workers
              else f"{ranks} ranks without loader workers")
    more = "ranks or loader workers" if workers else "ranks"
    fix = (f"lower data_config.batch_size to at most {rows // readers}, or use fewer {more}"
           if rows >= readers else f"use fewer {more}")
    return (f"{who} of {ranks} got no batch, and every rank trains as many steps as the rank "
            f"with the fewest. The shares are cut at whole batches: the {rows} rows make "
            f"{full} full batch{'' if full == 1 else 'es'} of data_config.batch_size "
            f"{batch_size}{partial} for {readers} readers ({layout}); {fix}")
