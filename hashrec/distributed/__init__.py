"""Distributed training: process groups, row-wise sharded dynamic tables, the storage planner.

Commands under ``torchrun`` (one process per GPU; gloo on CPU-only hosts)::

    torchrun --nproc_per_node 2 -m hashrec.train_eval --pipeline_config_path P ...
    torchrun --nproc_per_node 2 -m hashrec.eval --pipeline_config_path P ...
    torchrun --nproc_per_node 2 -m hashrec.export --pipeline_config_path P --export_dir E

* ``train_eval``: each rank reads its share of the rows; dynamic tables are
  sharded row-wise (key owner ``owner_of(key, world_size)``, each rank holds
  ``1 / world_size`` of every capacity); dense tables and the dense network are
  replicated with gradients averaged over ranks; every rank runs the same steps
  (training stops all ranks at the first step where one has no batch). Rank 0
  logs, writes ``pipeline.config`` and ``eval_result.txt``; every rank writes its
  dynamic-table shard into each checkpoint. The storage planner runs on rank 0
  and its plan is printed at start.
* ``eval``: every rank evaluates its share with the checkpoint resharded to the
  current world size; metrics are summed over ranks; one result line.
* ``export``: each rank writes ``model-<rank>-of-<world>.safetensors`` with the
  keys it owns.
* ``predict`` and the offline tools (``create_dynamicemb_init_ckpt``,
  ``zch_to_dynamicemb_convert``, ``gen_taobao_data``) run as one process; the
  checkpoint tools take ``--world_size`` to write shards for that many ranks
  (any world size can load them: restore reshards).
"""

from hashrec.distributed.all_to_all import (
    Routing,
    Splits,
    all_to_all,
    exchange_splits,
    route_by_owner,
)
from hashrec.distributed.cost_model import CostModel
from hashrec.distributed.errors import DistributedError, PlannerError
from hashrec.distributed.metrics import (
    RankZeroLogger,
    all_reduce_scalars,
    all_reduce_sum,
    global_auc,
    mean_over_ranks,
)
from hashrec.distributed.planner import Plan, TablePlan, Variant, plan_tables, plan_to_table
from hashrec.distributed.process_group import (
    DistContext,
    barrier,
    init_distributed,
    single_process_context,
    teardown,
)
from hashrec.distributed.sharded_lookup import ShardedLookupResult, ShardedTable
from hashrec.distributed.storage_estimate import PlannerTable
from hashrec.distributed.topology import Topology, detect_topology

__all__ = [
    "CostModel",
    "DistContext",
    "DistributedError",
    "Plan",
    "PlannerError",
    "PlannerTable",
    "RankZeroLogger",
    "Routing",
    "ShardedLookupResult",
    "ShardedTable",
    "Splits",
    "TablePlan",
    "Topology",
    "Variant",
    "all_reduce_scalars",
    "all_reduce_sum",
    "all_to_all",
    "barrier",
    "detect_topology",
    "exchange_splits",
    "global_auc",
    "init_distributed",
    "mean_over_ranks",
    "plan_tables",
    "plan_to_table",
    "route_by_owner",
    "single_process_context",
    "teardown",
]
