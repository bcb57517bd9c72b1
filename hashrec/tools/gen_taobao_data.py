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

With ``--item_table`` (which needs ``--eval_rows``) the catalog also goes to
``<output_dir>/items``: the item table a match model's ``data_config.negative_sampler``
reads, one row per ad group with ``id`` (its adgroup_id), ``weight`` (its share of the
impressions the simulation draws, so negatives come as often as items are shown) and
``attrs`` (adgroup_id, cate_id, campaign_id, customer, brand and price, joined by ``:``,
the sampler's default ``attr_delimiter``), then those six as columns of their own, so
that ``predict`` of an exported item tower over it embeds every item once (an index for
retrieval). It takes no random draws: the impressions are the same with it as without. A
later run without it removes an earlier run's item table.
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
    GeneratorError,
    Progress,
    generator_parser,
    output_dirs,
    prepare_dir,
    run_generator,
    stale_files,
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
# The item table's attrs, in order (a negative sampler's attr_fields), and their separator
# (NegativeSampler's default attr_delimiter).
ITEM_ATTR_FIELDS = (*ITEM_COLUMNS, "price")
ITEM_ATTR_DELIMITER = ":"
ITEMS_DIR = "items"
ITEM_TABLE_NEEDS_EVAL = (
    "--item_table needs --eval_rows: the item table goes to OUTPUT_DIR/items beside "
    "OUTPUT_DIR/train and OUTPUT_DIR/eval (without --eval_rows the rows go to OUTPUT_DIR "
    "itself, and reading it would read the item table as rows)")


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


def catalog_item_table(catalog: Catalog) -> pa.Table:
    """The negative sampler's item table of ``catalog``, one row per ad group in popularity
    order: ``id`` (adgroup_id), ``weight`` (the item's impression probability), ``attrs``
    (``ITEM_ATTR_FIELDS`` as text joined by ``ITEM_ATTR_DELIMITER``), then the same fields
    as columns typed as in the rows (the sampler reads the first three; the item tower of
    an export reads the others)."""
    columns = {name: pa.array(getattr(catalog, name),
                              pa.float64() if name == "price" else pa.int64())
               for name in ITEM_ATTR_FIELDS}
    texts = [pc.cast(column, pa.string()) for column in columns.values()]
    return pa.table({
        "id": columns["adgroup_id"],
        "weight": pa.array(np.diff(catalog.show_cdf, prepend=0.0), pa.float64()),
        "attrs": pc.binary_join_element_wise(*texts, ITEM_ATTR_DELIMITER), **columns})


def write_items(out_dir: str, catalog: Catalog, row_group_size: int, log,
                stale: tuple[str, ...] = ()) -> list[str]:
    """Write the item table of ``catalog`` to ``out_dir`` (as :func:`write_split` writes a
    split: one part file and the marker); return its path in a list."""
    prepare_dir(out_dir, stale, log)
    name = "part-00000.parquet"
    table = catalog_item_table(catalog)
    write_marker(out_dir, MARKER, [name], table.num_rows, complete=False)
    path = os.path.join(out_dir, name)
    pq.write_table(table, path, row_group_size=row_group_size)
    write_marker(out_dir, MARKER, [name], table.num_rows, complete=True)
    log(f"wrote {path} ({table.num_rows} items)")
    return [path]


def _earlier_items(items_dir: str) -> tuple[str, ...]:
    """The files of an earlier run's item table in ``items_dir`` where it holds nothing
    else (a folder holding other files is left as it is)."""
    if not os.path.isdir(items_dir) or not os.path.exists(os.path.join(items_dir, MARKER)):
        return ()
    try:
        return tuple(stale_files(items_dir, False, MARKER))
    except GeneratorError:
        return ()


def _remove_earlier_items(items_dir: str, files: tuple[str, ...], log) -> None:
    for name in files:
        os.remove(os.path.join(items_dir, name))
    if files and not os.listdir(items_dir):
        os.rmdir(items_dir)
        log(f"removed the earlier run's item table {items_dir} (pass --item_table to "
            f"write a new one)")


def generate(output_dir: str, num_rows: int, num_files: int = 1, seed: int = 0,
             scale: float = 1.0, eval_rows: int = 0, row_group_size: int = 65536,
             quiet: bool = False, sequence_format: str = "string",
             overwrite: bool = False, item_table: bool = False) -> dict[str, list[str]]:
    """Generate the data set; return {"train"|"eval"|"data"|"items": [paths]}.

    ``sequence_format``: ``string`` (IDs joined by ``|``, as in the Taobao data) or
    ``list`` (parquet list<int64>, which the reader parses in about half the CPU time).
    ``overwrite``: write into directories holding other files too (their
    ``part-*.parquet`` files are deleted first); otherwise only new or empty
    directories, or ones holding an earlier run's output, are written.
    ``item_table``: also write the catalog's item table to ``<output_dir>/items`` (see the
    module docstring); needs ``eval_rows`` (without it ``output_dir`` holds the rows, and
    reading it would read the item table too).

    Raises:
        GeneratorError: an output directory is a file or holds other files (nothing is
            written or deleted then).
    """
    if sequence_format not in SEQUENCE_FORMATS:
        raise ValueError(f"sequence_format={sequence_format!r}; allowed: "
                         f"{', '.join(SEQUENCE_FORMATS)}")
    if item_table and not eval_rows:
        raise ValueError(ITEM_TABLE_NEEDS_EVAL)
    dirs, stale = output_dirs(output_dir, eval_rows, overwrite, MARKER)
    items_dir = os.path.join(output_dir, ITEMS_DIR)
    items_stale = tuple(stale_files(items_dir, overwrite, MARKER)) if item_table else ()
    earlier_items = _earlier_items(items_dir) if eval_rows and not item_table else ()
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
    paths = {split: write_split(d, users, catalog, imp, *spans[split], row_group_size, log,
                                sequence_format, stale[split])
             for split, d in dirs.items()}
    if item_table:
        paths["items"] = write_items(items_dir, catalog, row_group_size, log, items_stale)
    _remove_earlier_items(items_dir, earlier_items, log)
    return paths


def _parser() -> argparse.ArgumentParser:
    p = generator_parser("gen_taobao_data", __doc__.split("\n\n")[0], MARKER, 1.0,
                         "multiplies the large ID spaces (default 1: Taobao sizes)",
                         "also write this many later rows to OUTPUT_DIR/eval (and the "
                         "training rows to OUTPUT_DIR/train)")
    p.add_argument("--sequence_format", choices=SEQUENCE_FORMATS, default="string",
                   help="behaviour sequences as IDs joined by '|' (string, default, as in "
                        "the Taobao data) or as parquet list<int64> (list: parsed in about "
                        "half the CPU time)")
    p.add_argument("--item_table", action="store_true",
                   help="also write OUTPUT_DIR/items: one row per ad group (id, weight: its "
                        "impression share, attrs: adgroup_id:cate_id:campaign_id:customer:"
                        "brand:price, then those six as columns), the item table of a "
                        "match model's negative_sampler; needs --eval_rows")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.item_table and not args.eval_rows:
        parser.error(ITEM_TABLE_NEEDS_EVAL)
    return run_generator("gen_taobao_data", lambda: generate(
        args.output_dir, args.num_rows, args.num_files, args.seed, args.scale, args.eval_rows,
        args.row_group_size, args.quiet, args.sequence_format, args.overwrite,
        args.item_table))


if __name__ == "__main__":
    sys.exit(main())
