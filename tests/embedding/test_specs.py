"""Table specs: the dtype a table's rows are stored in."""

import pytest
import torch

from hashrec.embedding import EmbeddingTableSpec
from hashrec.table import TableOptions


def test_row_dtype_of_dense_and_dynamic_tables():
    assert EmbeddingTableSpec("d", 4, num_rows=3).row_dtype == torch.float32
    assert EmbeddingTableSpec("d", 4, num_rows=3, dtype=torch.bfloat16).row_dtype == \
        torch.bfloat16
    dynamic = TableOptions(dim=4, max_capacity=8, dtype=torch.float16)
    assert EmbeddingTableSpec("t", 4, dynamic=dynamic).row_dtype == torch.float16


@pytest.mark.parametrize("kwargs, message", [
    ({"dynamic": TableOptions(dim=4, max_capacity=8), "dtype": torch.float16},
     "dtype is for dense tables; set dynamic.dtype"),
    ({"num_rows": 3, "dtype": torch.int8}, "dtype=torch.int8 is not valid"),
], ids=["dynamic", "not-float"])
def test_bad_dtypes_name_the_table(kwargs, message):
    with pytest.raises(ValueError, match=f"table 't': {message}"):
        EmbeddingTableSpec("t", 4, **kwargs)
