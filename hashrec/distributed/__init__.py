"""Distributed training: process groups, row-wise sharded dynamic tables, the storage planner."""

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
