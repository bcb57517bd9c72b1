"""Retrieve items for each user row of a TDM: a layer-wise beam search of the tree scored by
the model, and the recall of the row's clicked item.

Usage::

    python -m hashrec.tools.tdm.retrieval --scripted_model_path export/ \\
        --predict_input_path eval.parquet --predict_output_path recall.parquet \\
        [--recall_num 200] [--beam_size N] [--n_cluster 2] [--batch_size N] \\
        [--reserved_columns user_id] [--device auto|cpu|cuda[:i]] [--overwrite] \\
        [--item_input_path node_table.txt] [--predict_edge_input_path edges.txt]
    python -m hashrec.tools.tdm.retrieval --pipeline_config_path tdm.config \\
        [--checkpoint_path model_dir/checkpoint-N] --predict_input_path ... (as above)

The model is an export (``python -m hashrec.export``) or a checkpoint (of the config's
``model_dir``, the latest unless named) restored into the eager model. The tree is the
config's ``data_config.tdm_sampler``: its node table (``item_input_path``) and its
``predict_edge_input_path`` (``hashrec.tools.tdm.search_tree``), either replaceable by the
flags of those names; ``init_tree`` writes both. Its ``item_id_field`` must be among
its ``attr_fields``.

Each block of ``--batch_size`` input rows (users) is searched as
``hashrec.tools.tdm.beam_search`` describes (``--beam_size`` default ``2 *
recall_num``, TorchEasyRec's beam): a (user, node) pair is the user's row with the node's
``attr_fields`` values in those columns, as the training sampler makes them, parsed by the
config's features (the block's rows and the tree's nodes are parsed once and each level's
pairs gathered from them on the model's device: ``hashrec.tools.tdm.pair_batch``) and
ranked by the model's probability of class 1 (``probs1``; ``probs`` of a one-class model),
computed as its logit margin, which orders them alike without the probability's rounding
to 1.0 (``positive_scores``). The output (parquet: a ``.parquet`` path, or
``part-00000.parquet`` in a directory) holds, per input row in input order, the
``--reserved_columns`` and ``recall_ids``: the retrieved item ids, best first (fewer than
``recall_num`` only where the kept nodes hold fewer items). The recall printed is the
share of rows whose ``item_id_field`` is among their retrieved ids (TorchEasyRec's
retrieval recall).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hashrec.checkpoint.errors import CheckpointError
from hashrec.data.errors import DataError
from hashrec.data.sampler import as_input_type
from hashrec.export.errors import ExportError
from hashrec.export.loading import input_data_config, load_export, model_inputs, resolve_device
from hashrec.export.prediction_files import check_not_an_input, output_file, staged
from hashrec.features.batch import Batch
from hashrec.features.errors import FeatureError
from hashrec.tools.tdm.beam_search import (
    Scorer,
    beam_search,
    first_search_level,
    recall_hits,
)
from hashrec.tools.tdm.pair_batch import PairBatches, feature_sides, parse_side
from hashrec.tools.tdm.search_tree import SearchTree, read_search_tree

logger = logging.getLogger("hashrec.tools.tdm.retrieval")


class RetrievalError(Exception):
    """A retrieval setting that does not fit the model or the tree (names the flag)."""


class PairScorer:
    """Scores (user, node) pairs with a model (see the module docstring).

    The pairs of a level are gathered from the block's user rows and the tree's nodes,
    each parsed once (``hashrec.tools.tdm.pair_batch``); where a feature reads both user
    and node columns, the pairs' table is parsed instead (``pairs_table``).

    Args:
        feature_set: parses the pairs' rows into a Batch.
        forward: Batch on ``device`` -> (M,) scores.
        tree: the searched tree (its nodes' attrs).
        device: where the model runs.
    """

    def __init__(self, feature_set, forward, tree: SearchTree, device: torch.device) -> None:
        self.feature_set = feature_set
        self.forward = forward
        self.tree = tree
        self.device = device
        self._typed: dict[str, pa.Array] = {}
        self._nodes: dict[tuple, Batch] = {}

    def for_users(self, users: pa.Table) -> Scorer:
        """The scorer of the pairs of the rows of ``users`` (the feature columns)."""
        for field in users.schema:
            if field.name in self.tree.attrs and field.name not in self._typed:
                self._typed[field.name] = as_input_type(
                    self.tree.attrs[field.name], field, "data_config.tdm_sampler")
        node_columns = [f for f in users.schema if f.name in self.tree.attrs]
        sides = feature_sides(self.feature_set, {f.name for f in node_columns})
        if sides is None:
            return lambda user_index, node_rows: self.forward(self.feature_set.parse(
                self.pairs_table(users, user_index, node_rows),
                with_labels=False).to(self.device))
        key = tuple((f.name, str(f.type)) for f in node_columns)
        if key not in self._nodes:  # the nodes of the tree, parsed once
            nodes = pa.Table.from_arrays([self._typed[f.name] for f in node_columns],
                                         schema=pa.schema(node_columns))
            self._nodes[key] = parse_side(self.feature_set, sides[1], nodes).to(self.device)
        pairs = PairBatches(self.feature_set, parse_side(self.feature_set, sides[0], users),
                            self._nodes[key], self.device)
        return lambda user_index, node_rows: self.forward(pairs.batch(
            user_index.to(self.device), node_rows.to(self.device)))

    def pairs_table(self, users: pa.Table, user_index: torch.Tensor,
                    node_rows: torch.Tensor) -> pa.Table:
        """The rows of the pairs (``users``' row ``user_index[i]`` with node
        ``node_rows[i]``'s attrs in its columns), as the training sampler makes them;
        ``for_users`` has typed the node columns."""
        take_users = pa.array(user_index.cpu().numpy())
        take_nodes = pa.array(node_rows.cpu().numpy())
        columns = [self._typed[f.name].take(take_nodes) if f.name in self._typed
                   else users.column(f.name).take(take_users) for f in users.schema]
        return pa.Table.from_arrays(columns, schema=users.schema)


def positive_scores(outputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """(M,) scores of a model's ``outputs`` that order the rows as the probability of class 1
    does: the logit of class 1 less that of class 0 ((M, 2) logits) or the logit ((M,)).
    The probability itself rounds to exactly 1.0 in float32 once a node's logit margin
    passes about 17, so that a well-trained model's best nodes would tie and the beam would
    keep an arbitrary few of them (differently on the CPU and CUDA)."""
    logits = outputs["logits"]
    return logits[:, 1] - logits[:, 0] if logits.dim() == 2 else logits


def scripted_model(export_dir: str, device: torch.device):
    """(config, feature set, forward) of an export directory."""
    config, feature_set, model, tower = load_export(export_dir, device)
    if tower is not None:
        raise RetrievalError(f"--scripted_model_path {export_dir} is one tower of a match "
                             f"model; name the export directory of a TDM")
    weighted = {f.input_key for f in feature_set.embedding_features() if f.weighted}
    model.eval()
    return config, feature_set, lambda batch: positive_scores(
        model(*model_inputs(batch, weighted)))


def checkpoint_model(config_path: str, checkpoint_path: str | None, device: torch.device):
    """(config, feature set, forward) of a checkpoint restored into the eager model."""
    config, session = restored_session(config_path, checkpoint_path, device)
    return config, session.feature_set, lambda batch: positive_scores(
        session.model(batch))


def restored_session(config_path: str, checkpoint_path: str | None, device: torch.device):
    """(config, session) of ``config_path`` on ``device`` with the checkpoint
    ``checkpoint_path`` (None: the latest of the config's ``model_dir``) restored into its
    model, in eval mode.

    Raises:
        RetrievalError: no checkpoint given and none in ``model_dir``.
    """
    from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
    from hashrec.config import load_pipeline_config
    from hashrec.train.session import build_session

    config = load_pipeline_config(config_path)
    checkpoint = checkpoint_path or latest_checkpoint(config.model_dir)
    if checkpoint is None:
        raise RetrievalError(f"--checkpoint_path not given and model_dir {config.model_dir!r} "
                             f"of {config_path} holds no complete checkpoint")
    session = build_session(config, device=device, purpose="retrieval")
    restore_checkpoint(checkpoint, session.model, None,
                       session.model.embedding.dynamic_tables(), restore_optimizer=False)
    session.model.eval()
    logger.info("%s restored from %s", type(session.model).__name__, checkpoint)
    return config, session


def search_tree(config, item_input_path: str | None,
                predict_edge_input_path: str | None) -> SearchTree:
    """The tree of ``config``'s ``tdm_sampler``, its paths replaced where given."""
    if not config.data_config.HasField("tdm_sampler"):
        raise RetrievalError("the model's config has no data_config.tdm_sampler: the "
                             "retrieval searches a TDM's tree")
    if config.model_config.num_class > 2:
        raise RetrievalError(f"model_config.num_class is {config.model_config.num_class}; "
                             f"the retrieval ranks by the probability of class 1 of a model "
                             f"of 1 or 2 classes")
    sampler = type(config.data_config.tdm_sampler)()
    sampler.CopyFrom(config.data_config.tdm_sampler)
    if item_input_path:
        sampler.item_input_path = item_input_path
    if predict_edge_input_path:
        sampler.predict_edge_input_path = predict_edge_input_path
    tree = read_search_tree(sampler)
    if sampler.item_id_field not in tree.attrs:
        raise RetrievalError(f"data_config.tdm_sampler.item_id_field "
                             f"{sampler.item_id_field!r} is not among its attr_fields "
                             f"{list(sampler.attr_fields)}: a candidate node's id goes there")
    return tree


def retrieve(args: argparse.Namespace) -> dict:
    """Runs the retrieval of the parsed command line ``args``; returns {"rows", "hits",
    "recall", "output"}.

    Raises:
        RetrievalError, DataError, ExportError, FeatureError, CheckpointError: naming the
            flag, field or file at fault.
    """
    from hashrec.data import create_dataloader

    beam_size = args.beam_size or 2 * args.recall_num
    if args.recall_num < 1 or beam_size < 1:
        raise RetrievalError(f"--recall_num {args.recall_num} and --beam_size {beam_size} "
                             f"must be 1 or more")
    output = output_file(args.predict_output_path, args.overwrite)
    check_not_an_input(output, args.predict_input_path)
    device = resolve_device(args.device)
    if args.scripted_model_path:
        config, feature_set, forward = scripted_model(args.scripted_model_path, device)
    else:
        config, feature_set, forward = checkpoint_model(args.pipeline_config_path,
                                                        args.checkpoint_path, device)
    tree = search_tree(config, args.item_input_path, args.predict_edge_input_path)
    if args.n_cluster is not None and args.n_cluster != tree.n_cluster:
        raise RetrievalError(f"--n_cluster {args.n_cluster}, but the tree's nodes have up to "
                             f"{tree.n_cluster} children")
    item_id = config.data_config.tdm_sampler.item_id_field
    columns = list(dict.fromkeys([*feature_set.feature_columns, item_id,
                                  *args.reserved_columns]))
    loader = create_dataloader(input_data_config(config.data_config, args.predict_input_path),
                               feature_set, args.predict_input_path, "predict",
                               batch_size=args.batch_size, reserved_columns=columns,
                               num_workers=0)
    sizes = [len(tree.level_rows(lv)) for lv in range(tree.num_levels)]
    first = first_search_level(sizes, beam_size, tree.n_cluster)
    logger.info("searching levels %d to %d of level sizes %s (beam %d, recall %d)", first,
                tree.num_levels - 1, sizes, beam_size, args.recall_num)
    search = functools.partial(
        beam_search, torch.from_numpy(tree.children).to(device),
        torch.from_numpy(tree.level_rows(first)).to(device), tree.num_levels - first,
        beam_size=beam_size, recall_num=args.recall_num)
    start = time.perf_counter()
    rows, hits = _write_retrieved(loader, search, PairScorer(feature_set, forward, tree, device),
                                  tree, item_id, tuple(args.reserved_columns), output)
    logger.info("retrieved for %d rows in %.1fs", rows, time.perf_counter() - start)
    return {"rows": rows, "hits": hits, "recall": hits / max(rows, 1), "output": output}


def _write_retrieved(loader, search, scorer: PairScorer, tree: SearchTree, item_id: str,
                     reserved: tuple[str, ...], output: str) -> tuple[int, int]:
    """Searches for every batch of ``loader`` and writes ``output`` (through a hidden
    sibling file, renamed once every row is written); returns (rows, hits)."""
    rows = hits = 0
    feature_columns = scorer.feature_set.feature_columns
    schema = _output_schema(loader.dataset.schema, reserved)
    with staged(output) as staging, pq.ParquetWriter(staging, schema) as out, \
            torch.inference_mode():
        for batch in loader:
            users = pa.table({c: batch.reserved[c] for c in feature_columns})
            found = search(users=batch.batch_size,
                           scorer=scorer.for_users(users)).cpu().numpy()
            ids = np.where(found >= 0, tree.ids[found.clip(min=0)], -1)
            hits += int(recall_hits(ids, batch.reserved[item_id].to_numpy()).sum())
            rows += batch.batch_size
            out.write_table(_output_table(ids, batch.reserved, reserved, out.schema))
    return rows, hits


def _output_schema(input_schema: pa.Schema, reserved: tuple[str, ...]) -> pa.Schema:
    fields = [input_schema.field(c) for c in reserved]
    return pa.schema([*fields, pa.field("recall_ids", pa.list_(pa.int64()))])


def _output_table(ids: np.ndarray, columns: dict, reserved: tuple[str, ...],
                  schema: pa.Schema) -> pa.Table:
    """The reserved columns and ``recall_ids`` (the ids (B, k) without the -1 fill)."""
    kept = ids >= 0
    offsets = np.concatenate([[0], np.cumsum(kept.sum(axis=1))]).astype(np.int32)
    recall_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids[kept]))
    return pa.Table.from_arrays([*(columns[c] for c in reserved), recall_ids], schema=schema)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hashrec.tools.tdm.retrieval",
                                     description=__doc__.split("\n")[0])
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--scripted_model_path", help="export directory of the TDM")
    model.add_argument("--pipeline_config_path",
                       help="pipeline config of the TDM (with --checkpoint_path or its "
                            "model_dir's latest checkpoint)")
    parser.add_argument("--checkpoint_path", default=None,
                        help="checkpoint to restore (with --pipeline_config_path)")
    parser.add_argument("--predict_input_path", required=True,
                        help="user rows with the clicked item: files, directories or globs")
    parser.add_argument("--predict_output_path", required=True,
                        help="output parquet file (.parquet) or directory")
    parser.add_argument("--recall_num", type=int, default=200,
                        help="items retrieved per row (default 200)")
    parser.add_argument("--beam_size", type=int, default=None,
                        help="nodes kept per row on each level (default 2 * recall_num)")
    parser.add_argument("--n_cluster", type=int, default=None,
                        help="children a node has at most; checked against the tree "
                             "(default: the tree's)")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="user rows searched together (default: the config's)")
    parser.add_argument("--reserved_columns", default="",
                        type=lambda text: [c.strip() for c in text.split(",") if c.strip()],
                        help="comma-separated input columns copied to the output")
    parser.add_argument("--item_input_path", default=None,
                        help="node table (default: the config's tdm_sampler.item_input_path)")
    parser.add_argument("--predict_edge_input_path", default=None,
                        help="parent-child edge table (default: the config's "
                             "tdm_sampler.predict_edge_input_path)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<index>")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints the recall and returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.checkpoint_path and not args.pipeline_config_path:
        print("retrieval: --checkpoint_path goes with --pipeline_config_path", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        result = retrieve(args)
    except (RetrievalError, DataError, ExportError, FeatureError, CheckpointError) as err:
        print(f"retrieval: {err}", file=sys.stderr)
        return 2
    print(f"retrieval: {result['rows']} rows, recall@{args.recall_num} "
          f"{result['recall']:.4f} ({result['hits']} hits) -> {result['output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
