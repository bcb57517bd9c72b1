"""Write synthetic Taobao-like display-ad parquet files.

Usage::

    python -m hashrec.tools.gen_taobao_data --output_dir data/taobao \\
        --num_rows 1000000 --eval_rows 100000 --num_files 4 --seed 0 --scale 0.1

Without ``--eval_rows`` the files go straight into ``--output_dir``. With it,
``--num_rows`` training rows go to ``<output_dir>/train`` and the
``--eval_rows`` rows that follow them in time (same users, items and click
model) go to ``<output_dir>/eval``.

Each directory written (``<output_dir>``, or its ``train`` and ``eval``) receives
``part-*.parquet`` files and a ``_gen_taobao_data.json`` marker naming them (readers
skip names starting with ``_``). A directory that holds anything else is refused
unless ``--overwrite`` is given; a rerun into a directory holding only an earlier
run's files and marker replaces them without it. The marker is written before the
parts and says ``"complete": true`` once all of them are.

Columns (exactly those of the Taobao example config): user_id, cms_segid,
cms_group_id, final_gender_code, age_level, pvalue_level, shopping_level,
occupation, new_user_class_level, adgroup_id, cate_id, campaign_id, customer,
brand (int64), price (float64), pid (string), click_50_seq__adgroup_id,
click_50_seq__cate_id, click_50_seq__brand (strings of IDs joined by ``|``, or
list<int64> with ``--sequence_format list``,
most recent click first, at most 50, empty string when the user has no
clicks yet), clk (int64 0/1) and buy (int64 0/1: a conversion, only ever on a clicked
row; the label of a multi-task example's second task). Rows are in time order. See
:mod:`hashrec.tools.taobao_world` for the ID spaces and the click and conversion models.
``buy`` is drawn last from a generator of its own: the other columns are the same as
before it was added, for the same arguments.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hashrec.tools.gen_output import (
    Progress,
    generator_parser,
    output_dirs,
    prepare_dir,
    run_generator,
    write_marker,
)
from hashrec.tools.taobao_world import (
    PIDS,
    Catalog,
    Impressions,
    Users,
    build_catalog,
    build_users,
    simulate,
    space_sizes,
    with_conversions,
)

USER_COLUMNS = ("cms_segid", "cms_group_id", "final_gender_code", "age_level",
                "pvalue_level", "shopping_level", "occupation", "new_user_class_level")
ITEM_COLUMNS = ("adgroup_id", "cate_id", "campaign_id", "customer", "brand")
SEQUENCE_FIELDS = ("adgroup_id", "cate_id", "brand")
COLUMNS = ("user_id", *USER_COLUMNS, *ITEM_COLUMNS, "price", "pid",
           *(f"click_50_seq__{f}" for f in SEQUENCE_FIELDS), "clk", "buy")


SEQUENCE_FORMATS = ("string", "list")


def _sequence_column(offsets: np.ndarray, values: np.ndarray, fmt: str) -> pa.Array:
    """Rows of int IDs -> strings joined by '|' ('' for an empty row), or list<int64>."""
    list_type = pa.list_ if offsets[-1] < 2**31 - 1 else pa.large_list
    offset_type = pa.int32() if list_type is pa.list_ else pa.int64()
    lists = pa.ListArray.from_arrays if list_type is pa.list_ else pa.LargeListArray.from_arrays
    arr = lists(pa.array(offsets, type=offset_type), pa.array(values, type=pa.int64()))
    if fmt == "list":
        return arr
    return pc.binary_join(arr.cast(list_type(pa.string())), "|")


def impressions_table(users: Users, catalog: Catalog, imp: Impressions,
                      lo: int, hi: int, sequence_format: str = "string") -> pa.Table:
    """The parquet table of impressions [lo, hi) (sequences as ``sequence_format``)."""
    user, rank = imp.user[lo:hi], imp.rank[lo:hi]
    cols: dict[str, pa.Array] = {"user_id": pa.array(user, pa.int64())}
    for name in USER_COLUMNS:
        cols[name] = pa.array(users.profile[name][user], pa.int64())
    for name in ITEM_COLUMNS:
        cols[name] = pa.array(getattr(catalog, name)[rank], pa.int64())
    cols["price"] = pa.array(catalog.price[rank], pa.float64())
    cols["pid"] = pa.DictionaryArray.from_arrays(
        pa.array(imp.pid[lo:hi], pa.int32()), pa.array(PIDS)).cast(pa.string())
    offsets = imp.seq_offsets[lo:hi + 1]
    seq = imp.seq_rank[offsets[0]:offsets[-1]]
    offsets = offsets - offsets[0]
    for name in SEQUENCE_FIELDS:
        cols[f"click_50_seq__{name}"] = _sequence_column(offsets, getattr(catalog, name)[seq],
                                                         sequence_format)
    cols["clk"] = pa.array(imp.clk[lo:hi], pa.int64())
    cols["buy"] = pa.array(imp.buy[lo:hi], pa.int64())
    return pa.table([cols[c] for c in COLUMNS], names=list(COLUMNS))


MARKER = "_gen_taobao_data.json"


def write_split(out_dir: str, users: Users, catalog: Catalog, imp: Impressions,
                lo: int, hi: int, num_files: int, row_group_size: int, log,
                sequence_format: str = "string", stale: tuple[str, ...] = ()) -> list[str]:
    """Write impressions [lo, hi) as ``num_files`` parquet files; return their paths.

    ``stale`` names files of ``out_dir`` removed first (see :func:`stale_files`).
    """
    prepare_dir(out_dir, stale, log)
    names = [f"part-{i:05d}.parquet" for i in range(num_files)]
    # The marker goes first: a run killed halfway leaves a directory a rerun recognises.
    write_marker(out_dir, MARKER, names, hi - lo, complete=False)
    bounds = np.linspace(lo, hi, num_files + 1).round().astype(np.int64)
    paths = []
    for i, name in enumerate(names):
        path = os.path.join(out_dir, name)
        table = impressions_table(users, catalog, imp, int(bounds[i]), int(bounds[i + 1]),
                                  sequence_format)
        pq.write_table(table, path, row_group_size=row_group_size)
        paths.append(path)
        log(f"wrote {path} ({table.num_rows} rows)")
    write_marker(out_dir, MARKER, names, hi - lo, complete=True)
    return paths


def generate(output_dir: str, num_rows: int, num_files: int = 1, seed: int = 0,
             scale: float = 1.0, eval_rows: int = 0, row_group_size: int = 65536,
             quiet: bool = False, sequence_format: str = "string",
             overwrite: bool = False) -> dict[str, list[str]]:
    """Generate the data set; return {"train"|"eval"|"data": [paths]}.

    ``sequence_format``: ``string`` (IDs joined by ``|``, as in the Taobao data) or
    ``list`` (parquet list<int64>, which the reader parses in about half the CPU time).
    ``overwrite``: write into directories holding other files too (their
    ``part-*.parquet`` files are deleted first); otherwise only new or empty
    directories, or ones holding an earlier run's output, are written.

    Raises:
        GeneratorError: an output directory is a file or holds other files (nothing is
            written or deleted then).
    """
    if sequence_format not in SEQUENCE_FORMATS:
        raise ValueError(f"sequence_format={sequence_format!r}; allowed: "
                         f"{', '.join(SEQUENCE_FORMATS)}")
    dirs, stale = output_dirs(output_dir, eval_rows, overwrite, MARKER)
    log = Progress("gen_taobao_data", quiet)
    # The third child (conversions) came later; spawning it leaves the first two as they were.
    world_seed, rows_seed, buy_seed = np.random.SeedSequence(seed).spawn(3)
    world_rng = np.random.default_rng(world_seed)
    spaces = space_sizes(scale)
    log(f"ID spaces {spaces}")
    catalog = build_catalog(world_rng, spaces)
    users = build_users(world_rng, spaces)
    log(f"built catalog and users; simulating {num_rows + eval_rows} impressions")
    imp = simulate(np.random.default_rng(rows_seed), users, catalog, num_rows + eval_rows)
    imp = with_conversions(np.random.default_rng(buy_seed), users, catalog, imp)
    log(f"simulated {num_rows + eval_rows} impressions, CTR {imp.clk.mean():.4f}, "
        f"conversions per click {imp.buy.sum() / max(imp.clk.sum(), 1):.4f}, "
        f"mean history length {imp.seq_offsets[-1] / max(imp.clk.size, 1):.1f}")
    eval_files = max(1, min(num_files, round(num_files * eval_rows / num_rows)))
    spans = {"data": (0, num_rows, num_files), "train": (0, num_rows, num_files),
             "eval": (num_rows, num_rows + eval_rows, eval_files)}
    return {split: write_split(d, users, catalog, imp, *spans[split], row_group_size, log,
                               sequence_format, stale[split])
            for split, d in dirs.items()}


def _parser() -> argparse.ArgumentParser:
    p = generator_parser("gen_taobao_data", __doc__.split("\n\n")[0], MARKER, 1.0,
                         "multiplies the large ID spaces (default 1: Taobao sizes)",
                         "also write this many later rows to OUTPUT_DIR/eval (and the "
                         "training rows to OUTPUT_DIR/train)")
    p.add_argument("--sequence_format", choices=SEQUENCE_FORMATS, default="string",
                   help="behaviour sequences as IDs joined by '|' (string, default, as in "
                        "the Taobao data) or as parquet list<int64> (list: parsed in about "
                        "half the CPU time)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_generator("gen_taobao_data", lambda: generate(
        args.output_dir, args.num_rows, args.num_files, args.seed, args.scale, args.eval_rows,
        args.row_group_size, args.quiet, args.sequence_format, args.overwrite))


if __name__ == "__main__":
    sys.exit(main())
