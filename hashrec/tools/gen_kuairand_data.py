"""Write synthetic KuaiRand-like parquet files of a generative ranking model's rows.

Usage::

    python -m hashrec.tools.gen_kuairand_data --output_dir data/kuairand \\
        --num_rows 100000 --eval_rows 10000 --num_files 2 --seed 0 --scale 0.01

A row is one user's time window, as TorchEasyRec's dlrm_hstu reads KuaiRand: the user's
features, the videos the user watched before (the history, ``uih_seq__*``) and the
videos shown in the window (the candidates, ``cand_seq__*``) with what the user did.

Columns: user_id (int64, a new user each row), user_active_degree (0-7),
follow_user_num_range, fans_user_num_range (0-8), friend_user_num_range,
register_days_range (0-7) (int64); uih_seq__video_id, uih_seq__video_cat,
uih_seq__action_timestamp (seconds), uih_seq__action_weight (action bits: 1 click, 2
like, 4 follow), uih_seq__watch_time (seconds), oldest first, 1 to ``MAX_HISTORY`` a
row; cand_seq__video_id, cand_seq__video_cat, cand_seq__query_time,
cand_seq__action_weight, cand_seq__watch_time, 1 to ``MAX_CANDIDATES`` a row; every
sequence a string of values joined by ``|``.

The planted behaviour: videos fall into ``GROUPS`` categories (video_cat, the video_id
modulo the count); each user favours one, which most of the history's videos come from.
A candidate is
clicked when it is of the user's group (a share ``FLIP`` of the candidates the other way):
the history alone tells the clicks. A clicked candidate is liked when its video_id is a
multiple of 3 (the item alone tells it), followed when both hold. Watch time is long for
a click, short otherwise.

Directories are handled as ``hashrec.tools.gen_taobao_data`` does them (``--eval_rows``
splits into ``train`` and ``eval``; ``_gen_kuairand_data.json`` names the files written;
a directory holding other files is refused unless ``--overwrite``).
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa

from hashrec.tools.gen_output import (
    Progress,
    generator_parser,
    output_dirs,
    run_generator,
    write_splits,
)

MARKER = "_gen_kuairand_data.json"
GROUPS = 8
MAX_HISTORY, MAX_CANDIDATES = 32, 8
# The share of the history from the user's group, and of the clicks flipped.
FAVOURED, FLIP = 0.8, 0.05
USER_COLUMNS = {"user_active_degree": 8, "follow_user_num_range": 9,
                "fans_user_num_range": 9, "friend_user_num_range": 8,
                "register_days_range": 8}


def num_videos(scale: float) -> int:
    """The video catalog at ``scale`` (KuaiRand's order, 8 million, at 1)."""
    return max(GROUPS * 100, round(8_000_000 * scale))


def _joined(values: np.ndarray, lengths: np.ndarray, fmt: str) -> pa.Array:
    """Each row's ``lengths`` values, as ``|``-joined text."""
    texts = np.char.mod(fmt, values) if values.size else np.zeros(0, dtype=str)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return pa.array(["|".join(texts[bounds[i]:bounds[i + 1]]) for i in range(len(lengths))],
                    pa.string())


def _videos(rng: np.random.Generator, groups: np.ndarray, videos: int) -> np.ndarray:
    """A video of each of ``groups``."""
    return rng.integers(0, videos // GROUPS, groups.size) * GROUPS + groups


def rows_table(rng: np.random.Generator, first_user: int, n: int, videos: int) -> pa.Table:
    """``n`` rows, users ``first_user`` on."""
    cols: dict[str, pa.Array] = {"user_id": pa.array(np.arange(first_user, first_user + n))}
    for name, count in USER_COLUMNS.items():
        cols[name] = pa.array(rng.integers(0, count, n))
    favourite = rng.integers(0, GROUPS, n)
    now = 1.7e9 + rng.integers(0, 86400 * 30, n).astype(np.float64)
    history = rng.integers(1, MAX_HISTORY + 1, n)
    rows = np.repeat(np.arange(n), history)
    favoured = rng.random(rows.size) < FAVOURED
    groups = np.where(favoured, favourite[rows], rng.integers(0, GROUPS, rows.size))
    ago = np.concatenate([np.sort(rng.uniform(60, 86400 * 7, k))[::-1] for k in history])
    actions = rng.integers(0, 8, rows.size)
    cols["uih_seq__video_id"] = _joined(_videos(rng, groups, videos), history, "%d")
    cols["uih_seq__video_cat"] = _joined(groups, history, "%d")
    cols["uih_seq__action_timestamp"] = _joined(np.round(now[rows] - ago), history, "%.0f")
    cols["uih_seq__action_weight"] = _joined(actions, history, "%d")
    cols["uih_seq__watch_time"] = _joined(rng.uniform(0, 60, rows.size), history, "%.1f")
    count = rng.integers(1, MAX_CANDIDATES + 1, n)
    rows = np.repeat(np.arange(n), count)
    ours = rng.random(rows.size) < 0.5
    groups = np.where(ours, favourite[rows], rng.integers(0, GROUPS, rows.size))
    video = _videos(rng, groups, videos)
    click = (groups == favourite[rows]) != (rng.random(rows.size) < FLIP)
    like = click & (video % 3 == 0)
    weight = click.astype(np.int64) + 2 * like + 4 * (like & (video % 2 == 0))
    cols["cand_seq__video_id"] = _joined(video, count, "%d")
    cols["cand_seq__video_cat"] = _joined(groups, count, "%d")
    cols["cand_seq__query_time"] = _joined(np.round(now[rows] + rng.uniform(0, 600, rows.size)),
                                           count, "%.0f")
    cols["cand_seq__action_weight"] = _joined(weight, count, "%d")
    watch = np.where(click, rng.uniform(20, 120, rows.size), rng.uniform(0, 5, rows.size))
    cols["cand_seq__watch_time"] = _joined(watch, count, "%.1f")
    return pa.table(cols)


def generate(output_dir: str, num_rows: int, num_files: int = 1, seed: int = 0,
             scale: float = 0.01, eval_rows: int = 0, row_group_size: int = 65536,
             quiet: bool = False, overwrite: bool = False) -> dict[str, list[str]]:
    """Generate the data set; return {"train"|"eval"|"data": [paths]}.

    Raises:
        GeneratorError: an output directory is a file or holds other files (nothing is
            written or deleted then).
    """
    dirs, stale = output_dirs(output_dir, eval_rows, overwrite, MARKER)
    log = Progress("gen_kuairand_data", quiet)
    rng = np.random.default_rng(seed)
    videos = num_videos(scale)
    users = 0

    def table_of(size: int) -> pa.Table:
        nonlocal users
        table = rows_table(rng, users, size, videos)
        users += size
        return table

    return write_splits(dirs, stale, num_rows, num_files, eval_rows, MARKER, row_group_size,
                        log, table_of)


def _parser():
    return generator_parser("gen_kuairand_data", __doc__.split("\n\n")[0], MARKER, 0.01,
                            "multiplies the video catalog (default 0.01: 80,000 videos; "
                            "1: 8 million)",
                            "also write this many rows to OUTPUT_DIR/eval (and the training "
                            "rows to OUTPUT_DIR/train)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_generator("gen_kuairand_data", lambda: generate(
        args.output_dir, args.num_rows, args.num_files, args.seed, args.scale, args.eval_rows,
        args.row_group_size, args.quiet, args.overwrite))


if __name__ == "__main__":
    sys.exit(main())
