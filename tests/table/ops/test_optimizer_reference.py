import pytest
import torch

from hashrec.table.ops.optimizer.reference import apply_sparse_update
from hashrec.table.optim import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD

ROWS, DIM, STEPS = 12, 5, 6


def _batches():
    gen = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        ids = torch.randint(0, ROWS, (20,), generator=gen)  # repeated keys
        grads = torch.randn(20, DIM, generator=gen)
        slots, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros(slots.numel(), DIM).index_add_(0, inverse, grads)
        yield slots, summed


def _rows(spec, weights):
    state = spec.initial_state(DIM).expand(ROWS, -1)
    return torch.cat([weights.clone(), state], dim=1)


def _run_ours(spec, weights):
    rows = _rows(spec, weights)
    for step, (slots, grads) in enumerate(_batches(), start=1):
        apply_sparse_update(rows, slots, grads, spec, spec.lr, step)
    return rows


@pytest.mark.parametrize(
    "spec, make_torch",
    [
        (SparseSGD(lr=0.3), lambda p: torch.optim.SGD([p], lr=0.3)),
        (SparseAdagrad(lr=0.2, initial_accumulator_value=0.1),
         lambda p: torch.optim.Adagrad([p], lr=0.2, initial_accumulator_value=0.1, eps=1e-10)),
        (SparseAdam(lr=0.05, beta1=0.8, beta2=0.95, eps=1e-6),
         lambda p: torch.optim.SparseAdam([p], lr=0.05, betas=(0.8, 0.95), eps=1e-6)),
    ],
    ids=["sgd", "adagrad", "adam"],
)
def test_matches_torch_optim_with_sparse_grads(spec, make_torch):
    weights = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
    param = torch.nn.Parameter(weights.clone())
    optimizer = make_torch(param)
    for slots, grads in _batches():
        param.grad = torch.sparse_coo_tensor(slots[None], grads, (ROWS, DIM),
                                             check_invariants=True).coalesce()
        optimizer.step()
    rows = _run_ours(spec, weights)
    torch.testing.assert_close(rows[:, :DIM], param.detach(), rtol=1e-5, atol=1e-6)


def test_rowwise_adagrad_matches_dense_formula():
    spec = SparseRowWiseAdagrad(lr=0.1, initial_accumulator_value=0.5, eps=1e-8)
    weights = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
    expected, acc = weights.clone().double(), torch.full((ROWS,), 0.5, dtype=torch.float64)
    for slots, grads in _batches():
        g = grads.double()
        acc[slots] += (g * g).mean(dim=1)
        expected[slots] -= 0.1 * g / (acc[slots].sqrt()[:, None] + 1e-8)
    rows = _run_ours(spec, weights)
    torch.testing.assert_close(rows[:, :DIM].double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rows[:, DIM].double(), acc, rtol=1e-5, atol=1e-6)


def test_adam_weight_decay_is_l2_on_touched_rows():
    spec = SparseAdam(lr=0.1, weight_decay=0.5)
    rows = _rows(spec, torch.ones(ROWS, DIM))
    apply_sparse_update(rows, torch.tensor([2]), torch.zeros(1, DIM), spec, 0.1, 1)
    # g = 0.5 * w = 0.5: first Adam step moves by lr * sign(g).
    torch.testing.assert_close(rows[2, :DIM], torch.full((DIM,), 0.9), rtol=1e-5, atol=1e-6)
    assert torch.equal(rows[3, :DIM], torch.ones(DIM))


def test_half_precision_rows_are_updated_in_float32():
    spec = SparseSGD(lr=1.0)
    rows = torch.zeros(4, DIM, dtype=torch.bfloat16)
    apply_sparse_update(rows, torch.tensor([1]), torch.ones(1, DIM), spec, 0.5, 1)
    assert rows.dtype == torch.bfloat16 and bool((rows[1] == -0.5).all())
