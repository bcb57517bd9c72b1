"""Dynamic embedding table: bucketed hash index, scores, eviction, admission, optimizer rows.

Knows nothing of features, configs or models.
"""

from hashrec.table.errors import TableError, TableFullError
from hashrec.table.hash_table import HashTable, LookupResult
from hashrec.table.memory import estimate_table_bytes
from hashrec.table.optim import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD
from hashrec.table.options import (
    AdmissionOptions,
    CheckMode,
    InitializerArgs,
    InitializerMode,
    ScoreStrategy,
    StorageMode,
    TableOptions,
)
from hashrec.table.storage import InsertResult, TableStorage

__all__ = [
    "AdmissionOptions",
    "CheckMode",
    "HashTable",
    "InitializerArgs",
    "InitializerMode",
    "InsertResult",
    "LookupResult",
    "ScoreStrategy",
    "SparseAdagrad",
    "SparseAdam",
    "SparseRowWiseAdagrad",
    "SparseSGD",
    "StorageMode",
    "TableError",
    "TableFullError",
    "TableOptions",
    "TableStorage",
    "estimate_table_bytes",
]
