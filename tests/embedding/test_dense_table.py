import math

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
