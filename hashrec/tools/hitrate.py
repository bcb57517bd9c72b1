"""Hitrate of a match model's towers: each user's top-k items by inner product over the
whole item index, exactly, against the user's ground-truth items.

Usage::

    python -m hashrec.tools.hitrate --user_gt_input user.parquet \\
        --item_embedding_input item.parquet [--gt_items_field gt_items] \\
        [--item_id_field item_id] [--request_id_field request_id] [--top_k 200] \\
        [--gt_items_delimiter ,] \\
        [--hitrate_details_output details.parquet] [--total_hitrate_output total.parquet] \\
        [--batch_size 1024] [--item_chunk_size 65536] [--device auto|cpu|cuda[:i]] \\
        [--overwrite]

``--user_gt_input`` is parquet (a file, or a directory of them) holding per user
``--user_embedding_field`` (default ``user_tower_emb``, as ``predict`` on
``<export_dir>/user`` writes it: a list of D floats, or a list of K lists of D floats for
a multi-interest model such as MIND) and ``--gt_items_field``: the user's ground-truth item
id, or a list of them (a text of ids is split at ``--gt_items_delimiter``, default ``,`` as
TorchEasyRec splits it; a sequence column such as HSTU match's candidates, ``58|61``, takes
``|``). ``--item_embedding_input``
holds per item ``--item_id_field`` and ``--item_embedding_field`` (default
``item_tower_emb``, as ``predict`` on ``<export_dir>/item`` writes it).

A user's score of an item is the inner product of its embedding with the item's; a user of
several interests scores an item by the best of its interests (all-zero interests, which
MIND gives a user beyond its interest count, are left out), so its top k are the k items of
the highest such scores: TorchEasyRec's ``--topk_across_interests`` merge of each
interest's top k, an item retrieved by two interests kept once. The search is exact: per
``--batch_size`` users, a matmul against ``--item_chunk_size`` items at a time on
``--device`` with a running top k. The order of items of equal scores is not specified.

Hitrate, as TorchEasyRec's tool prints it: a user's hitrate is the number of its distinct
ground-truth items among its k retrieved over the number of its distinct ground-truth items
(an id absent from the item index counts, and is never hit); the total is the hits summed
over users over the ground-truth items summed over users. A user without ground-truth items
is left out of the total (its hitrate is null). ``--hitrate_details_output`` gets per user,
in input order: the ``--request_id_field`` column (when named), ``topk_ids`` (best first;
fewer than k only where the index is smaller or the user has no nonzero interest),
``topk_dists`` (their inner products), ``hitrate`` and ``hit_ids``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import torch

from hashrec.export.errors import ExportError
from hashrec.export.loading import resolve_device
from hashrec.export.prediction_files import staged

logger = logging.getLogger("hashrec.tools.hitrate")


class HitrateError(ValueError):
    """Input tables or flags the hitrate cannot use (names the flag or column)."""


def embedding_tensor(column: pa.ChunkedArray | pa.Array, name: str,
                     where: str) -> torch.Tensor:
    """A column of embeddings -> (N, K, D) float32: a list of D numbers a row is K = 1, a
    list of K lists of D numbers a row is K interests.

    Raises:
        HitrateError: nulls, rows of different lengths, or not lists of numbers.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    shape = [len(array)]
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type) \
            or pa.types.is_fixed_size_list(array.type):
        if array.null_count:
            raise HitrateError(f"{where}: column {name!r} has null rows; every row needs an "
                               f"embedding")
        lengths = pc.unique(pc.list_value_length(array)).to_pylist() if len(array) else [0]
        if len(lengths) != 1:
            raise HitrateError(f"{where}: column {name!r} holds lists of lengths {lengths}; "
                               f"every row's embedding needs the same shape")
        shape.append(lengths[0])
        array = array.flatten()
    if not (pa.types.is_floating(array.type) or pa.types.is_integer(array.type)) \
            or len(shape) not in (2, 3):
        raise HitrateError(f"{where}: column {name!r} is {column.type}; expected a list of "
                           f"numbers, or a list of lists of numbers (several interests)")
    values = torch.from_numpy(array.cast(pa.float32()).to_numpy(zero_copy_only=False).copy())
    if len(shape) == 2:
        shape.insert(1, 1)
    return values.reshape(shape)


def top_k_items(users: torch.Tensor, items: torch.Tensor, k: int,
                chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each user's k best items by inner product, the best of its nonzero interests.

    Args:
        users: (B, K, D) embeddings; an all-zero interest is not one.
        items: (N, D) item embeddings on the users' device.
        k: items per user (at most N are returned).
        chunk_size: items scored in one matmul.

    Returns:
        (scores (B, min(k, N)) best first, item rows (B, min(k, N))); a user without a
        nonzero interest gets -inf scores.
    """
    batch, kept = users.shape[0], min(k, items.shape[0])
    best = users.new_full((batch, 0), float("-inf"))
    rows = torch.empty((batch, 0), dtype=torch.long, device=users.device)
    absent = (users == 0).all(dim=-1, keepdim=True)  # (B, K, 1)
    single = users.shape[1] == 1
    for start in range(0, items.shape[0], chunk_size):
        chunk = items[start:start + chunk_size]
        scores = torch.matmul(users, chunk.T)
        # one interest: its scores as they are (a user without one is masked once, below:
        # two passes over the (B, chunk) scores fewer); several: the best present one
        scores = scores[:, 0] if single else scores.masked_fill(
            absent, float("-inf")).amax(dim=1)
        found = scores.topk(min(kept, chunk.shape[0]), dim=1)
        best = torch.cat([best, found.values], dim=1)
        rows = torch.cat([rows, found.indices + start], dim=1)
        if best.shape[1] > kept:
            best, order = best.topk(kept, dim=1)
            rows = rows.gather(1, order)
    if single:
        best = best.masked_fill(absent[:, 0], float("-inf"))
    return best, rows


def _read(path: str, flag: str, columns: list[str]) -> pads.Dataset:
    """The parquet ``path`` as a dataset holding ``columns`` (checked)."""
    if not os.path.exists(path):
        raise HitrateError(f"{flag} {path!r} does not exist")
    try:
        dataset = pads.dataset(path, format="parquet")
    except (pa.ArrowInvalid, OSError) as err:
        raise HitrateError(f"{flag} {path!r} is not readable parquet: {err}") from err
    names = dataset.schema.names
    for column, column_flag in columns:
        if column not in names:
            raise HitrateError(f"{flag} {path!r} has no column {column!r} (set by "
                               f"{column_flag}); its columns: {', '.join(names)}")
    return dataset


def _ground_truth(column: pa.Array, id_type: pa.DataType, name: str,
                  delimiter: str) -> pa.ListArray:
    """A ground-truth column (an id, a list of ids, or ids joined by ``delimiter``) as lists
    of ids of the item index's id type; a null row is an empty list."""
    given = column.type
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        split = pc.split_pattern(column, delimiter)
        column = pa.ListArray.from_arrays(split.offsets, pc.utf8_trim_whitespace(split.values),
                                          mask=split.is_null())
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        column = pa.ListArray.from_arrays(pa.array(range(len(column) + 1), pa.int32()),
                                          column)
    column = pc.if_else(pc.is_null(column), pa.scalar([], column.type), column)
    try:
        return column.cast(pa.list_(id_type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise HitrateError(f"--gt_items_field {name!r} ({given}) does not convert to "
                           f"the item ids' type {id_type}: {err}") from err


def _hits(rows: torch.Tensor, found: torch.Tensor, truth: pa.ListArray,
          index_of: dict) -> tuple[list, list, list]:
    """Per user: (distinct ground-truth count, hit item rows, hitrate or None)."""
    counts, hit_rows, rates = [], [], []
    for user, ids in enumerate(truth.to_pylist()):
        wanted = {i for i in ids if i is not None}
        hit, seen = [], set()
        for row in rows[user][found[user]].tolist():  # an id held by two rows hits once
            if index_of[row] in wanted and index_of[row] not in seen:
                seen.add(index_of[row])
                hit.append(row)
        counts.append(len(wanted))
        hit_rows.append(hit)
        rates.append(len(hit) / len(wanted) if wanted else None)
    return counts, hit_rows, rates


def _item_index(args: argparse.Namespace,
                device: torch.device) -> tuple[pa.Array, torch.Tensor]:
    """(item ids (N,), item embeddings (N, D) on ``device``) of ``--item_embedding_input``."""
    items = _read(args.item_embedding_input, "--item_embedding_input",
                  [(args.item_id_field, "--item_id_field"),
                   (args.item_embedding_field, "--item_embedding_field")]).to_table(
        columns=[args.item_id_field, args.item_embedding_field])
    item_ids = items[args.item_id_field].combine_chunks()
    if item_ids.null_count:
        raise HitrateError(f"--item_id_field {args.item_id_field!r} has null ids")
    vectors = embedding_tensor(items[args.item_embedding_field], args.item_embedding_field,
                               "--item_embedding_input")
    if vectors.shape[1] != 1:
        raise HitrateError(f"--item_embedding_field {args.item_embedding_field!r} holds "
                           f"{vectors.shape[1]} vectors an item; an item has one")
    vectors = vectors[:, 0].to(device)
    return item_ids, vectors


def hitrate(args: argparse.Namespace) -> dict:
    """Runs the hitrate of the parsed command line ``args``; returns {"users", "hits",
    "gt_items", "hitrate"}.

    Raises:
        HitrateError, ExportError (a bad ``--device``): naming the flag or column.
    """
    for flag in ("top_k", "batch_size", "item_chunk_size"):
        if getattr(args, flag) < 1:
            raise HitrateError(f"--{flag} {getattr(args, flag)} must be 1 or more")
    if not args.gt_items_delimiter:
        raise HitrateError("--gt_items_delimiter is empty; give the text that joins a "
                           "user's ground-truth ids (default ',')")
    outputs = [p for p in (args.hitrate_details_output, args.total_hitrate_output) if p]
    for path in outputs:
        if os.path.exists(path) and not args.overwrite:
            raise HitrateError(f"output {path!r} exists; pass --overwrite to replace it")
    device = resolve_device(args.device)
    item_ids, vectors = _item_index(args, device)
    index_of = dict(enumerate(item_ids.to_pylist()))
    columns = [(args.user_embedding_field, "--user_embedding_field"),
               (args.gt_items_field, "--gt_items_field")]
    if args.request_id_field:
        columns.append((args.request_id_field, "--request_id_field"))
    users = _read(args.user_gt_input, "--user_gt_input", columns)
    details = []
    total = {"users": 0, "hits": 0, "gt_items": 0}
    with torch.inference_mode():
        for batch in users.to_batches(columns=[c for c, _ in columns],
                                      batch_size=args.batch_size):
            if not batch.num_rows:
                continue
            queries = embedding_tensor(batch[args.user_embedding_field],
                                       args.user_embedding_field, "--user_gt_input")
            if queries.shape[2] != vectors.shape[1]:
                raise HitrateError(f"--user_embedding_field {args.user_embedding_field!r} is "
                                   f"of dimension {queries.shape[2]}, the items' "
                                   f"{args.item_embedding_field!r} of {vectors.shape[1]}")
            scores, rows = top_k_items(queries.to(device), vectors, args.top_k,
                                       args.item_chunk_size)
            scores, rows = scores.cpu(), rows.cpu()
            found = torch.isfinite(scores)
            truth = _ground_truth(batch[args.gt_items_field], item_ids.type,
                                  args.gt_items_field, args.gt_items_delimiter)
            counts, hit_rows, rates = _hits(rows, found, truth, index_of)
            total["users"] += batch.num_rows
            total["hits"] += sum(len(h) for h in hit_rows)
            total["gt_items"] += sum(counts)
            if args.hitrate_details_output:
                details.append(_details(batch, args.request_id_field, rows, scores, found,
                                        hit_rows, rates, item_ids))
    total["hitrate"] = total["hits"] / total["gt_items"] if total["gt_items"] else 0.0
    if args.hitrate_details_output:
        _write(args.hitrate_details_output, "--hitrate_details_output",
               pa.concat_tables(details) if details else None)
    if args.total_hitrate_output:
        _write(args.total_hitrate_output, "--total_hitrate_output",
               pa.table({"hitrate": [total["hitrate"]]}))
    return total


def _details(batch: pa.RecordBatch, request_id: str | None, rows: torch.Tensor,
             scores: torch.Tensor, found: torch.Tensor, hit_rows: list, rates: list,
             item_ids: pa.Array) -> pa.Table:
    """One block of the details table (see the module docstring)."""
    offsets = pa.array([0, *found.sum(dim=1).cumsum(0).tolist()], pa.int32())
    kept = rows[found].numpy()
    hit_offsets = pa.array([0, *torch.tensor([len(h) for h in hit_rows]).cumsum(0).tolist()],
                           pa.int32())
    hits = pa.array([r for h in hit_rows for r in h], pa.int64())
    columns = {} if not request_id else {request_id: batch[request_id]}
    columns["topk_ids"] = pa.ListArray.from_arrays(offsets, item_ids.take(pa.array(kept)))
    columns["topk_dists"] = pa.ListArray.from_arrays(offsets, pa.array(scores[found].numpy()))
    columns["hitrate"] = pa.array(rates, pa.float64())
    columns["hit_ids"] = pa.ListArray.from_arrays(hit_offsets, item_ids.take(hits))
    return pa.table(columns)


def _write(path: str, flag: str, table: pa.Table | None) -> None:
    """Writes ``table`` to ``path`` (``flag``'s) through a hidden sibling file moved into
    place when complete."""
    if table is None:
        return
    with staged(path, flag) as staging:
        pq.write_table(table, staging)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hashrec.tools.hitrate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--user_gt_input", required=True,
                        help="parquet of user embeddings with their ground-truth item ids")
    parser.add_argument("--item_embedding_input", required=True,
                        help="parquet of item ids and embeddings")
    parser.add_argument("--hitrate_details_output", default=None,
                        help="parquet file of per-user topk_ids, topk_dists, hitrate, hit_ids")
    parser.add_argument("--total_hitrate_output", default=None,
                        help="parquet file of one row: the total hitrate")
    parser.add_argument("--top_k", type=int, default=200, help="items retrieved per user")
    parser.add_argument("--batch_size", type=int, default=1024,
                        help="users searched together")
    parser.add_argument("--item_chunk_size", type=int, default=65536,
                        help="items scored in one matmul")
    parser.add_argument("--item_id_field", default="item_id")
    parser.add_argument("--item_embedding_field", default="item_tower_emb")
    parser.add_argument("--request_id_field", default=None,
                        help="user id column copied to the details (default: none)")
    parser.add_argument("--gt_items_field", default="gt_items",
                        help="ground-truth item id, or list of ids, a user")
    parser.add_argument("--gt_items_delimiter", default=",",
                        help="what joins the ids of a text ground-truth column")
    parser.add_argument("--user_embedding_field", default="user_tower_emb")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<index>")
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints the hitrate and returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = hitrate(args)
    except (HitrateError, ExportError) as err:
        print(f"hitrate: {err}", file=sys.stderr)
        return 2
    print(f"hitrate@{args.top_k}: {result['hitrate']:.4f} ({result['hits']} of "
          f"{result['gt_items']} ground-truth items retrieved over {result['users']} users; "
          f"a user's hitrate is its distinct ground-truth items among its top {args.top_k} "
          f"over its distinct ground-truth items, the total their hits over their "
          f"ground-truth items summed over users)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
