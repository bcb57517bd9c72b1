import math

import pytest
import torch

from hashrec.embedding.dense_table import DenseTable
from hashrec.table import InitializerArgs, SparseAdagrad, SparseRowWiseAdagrad, SparseSGD


def test_default_init_is_torchrec_uniform_and_state_starts_at_spec_value():
    table = DenseTable("t", num_rows=400, dim=8, optimizer=SparseAdagrad(
        initial_accumulator_value=0.25))
    bound = math.sqrt(1.0 / 400)
    embeddings = table.rows[:, :8]
    assert table.rows.shape == (400, 16)
    assert embeddings.abs().max() <= bound and embeddings.abs().max() > 0.8 * bound
    assert torch.all(table.rows[:, 8:] == 0.25)


def test_explicit_initializer_and_lookup_reads_rows():
    table = DenseTable("t", 5, 3, SparseRowWiseAdagrad(),
                       InitializerArgs(mode="CONSTANT", value=2.0))
    result = table.lookup(torch.tensor([4, 0]))
    assert result.slots.tolist() == [4, 0]
    torch.testing.assert_close(result.values, torch.full((2, 3), 2.0))
    assert table.row_dim == 4
    assert table.memory_bytes() == {"gpu": 0, "host": 5 * 4 * 4}


def test_apply_gradients_updates_only_given_rows():
    table = DenseTable("t", 4, 2, SparseSGD(lr=0.5), InitializerArgs(mode="CONSTANT", value=1.0))
    table.advance_step()
    table.apply_gradients(torch.tensor([2]), torch.tensor([[2.0, -2.0]]))
    assert table.rows.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 2.0], [1.0, 1.0]]
    table.apply_gradients(torch.tensor([1]), torch.tensor([[1.0, 1.0]]), lr=0.0)
    assert table.rows[1].tolist() == [1.0, 1.0]
    assert table.step == 1 and int(table.state_dict()["step_count"]) == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_rows_read_as_float32_and_take_rounded_float32_updates(dtype):
    table = DenseTable("t", 3, 2, SparseAdagrad(lr=0.5, initial_accumulator_value=0.1),
                       InitializerArgs(mode="CONSTANT", value=1.0 / 3.0), dtype=dtype)
    assert table.rows.dtype == dtype
    assert table.memory_bytes() == {"gpu": 0, "host": 3 * 4 * 2}
    assert torch.equal(table.rows[0], torch.tensor([1 / 3, 1 / 3, 0.1, 0.1]).to(dtype))
    looked = table.lookup(torch.tensor([1]))
    assert looked.values.dtype == torch.float32
    assert torch.equal(looked.values, table.rows[1:2, :2].float())
    full = table.rows.float()
    grads = torch.tensor([[0.3, -0.7]])
    table.advance_step()
    table.apply_gradients(torch.tensor([1]), grads)
    state = full[1, 2:] + grads[0] ** 2
    want = torch.cat([full[1, :2] - 0.5 * grads[0] / (state.sqrt() + 1e-10), state])
    assert torch.equal(table.rows[1], want.to(dtype))


def test_rows_dtype_is_checked():
    with pytest.raises(ValueError, match="dense table 't': dtype=torch.int32 is not valid"):
        DenseTable("t", 3, 2, SparseSGD(), dtype=torch.int32)
