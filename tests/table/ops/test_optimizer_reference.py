import pytest
import torch

from hashrec.table.ops.optimizer.reference import apply_sparse_update
from hashrec.table.optim import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD

ROWS, DIM, STEPS = 12, 5, 6


def _batches(scale: float = 1.0):
    gen = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        ids = torch.randint(0, ROWS, (20,), generator=gen)  # repeated keys
        grads = torch.randn(20, DIM, generator=gen) * scale
        slots, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros(slots.numel(), DIM).index_add_(0, inverse, grads)
        yield slots, summed


def _rows(spec, weights):
    state = spec.initial_state(DIM).expand(ROWS, -1)
    return torch.cat([weights.clone(), state], dim=1)


def _run_ours(spec, weights, scale: float = 1.0):
    rows = _rows(spec, weights)
    for step, (slots, grads) in enumerate(_batches(scale), start=1):
        apply_sparse_update(rows, slots, grads, spec, spec.lr, step)
    return rows


@pytest.mark.parametrize(
    "spec, make_torch",
    [
        (SparseSGD(lr=0.3), lambda p: torch.optim.SGD([p], lr=0.3)),
        (SparseAdagrad(lr=0.2, initial_accumulator_value=0.1),
         lambda p: torch.optim.Adagrad([p], lr=0.2, initial_accumulator_value=0.1, eps=1e-10)),
    ],
    ids=["sgd", "adagrad"],
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


def _adam_by_hand(spec: SparseAdam, weights: torch.Tensor, scale: float):
    """dynamicemb's and FBGEMM TBE's Adam in float64, step by step: -> (w, m, v)."""
    w = weights.double()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for t, (slots, grads) in enumerate(_batches(scale), start=1):
        g = grads.double()
        m[slots] = spec.beta1 * m[slots] + (1 - spec.beta1) * g
        v[slots] = spec.beta2 * v[slots] + (1 - spec.beta2) * g * g
        m_hat = m[slots] / (1 - spec.beta1 ** t)
        v_hat = v[slots] / (1 - spec.beta2 ** t)
        w[slots] -= spec.lr * (m_hat / (v_hat.sqrt() + spec.eps) + spec.weight_decay * w[slots])
    return w, m, v


@pytest.mark.parametrize("spec, scale", [
    (SparseAdam(lr=0.05, beta1=0.8, beta2=0.95, eps=1e-6), 1.0),
    (SparseAdam(lr=0.05, weight_decay=0.3), 1.0),
    # Gradients near eps: where eps is added (after the bias correction or before)
    # changes the step tenfold.
    (SparseAdam(lr=0.05, eps=1e-8), 1e-9),
], ids=["betas", "weight-decay", "tiny-grads"])
def test_adam_matches_the_formula_by_hand(spec, scale):
    weights = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
    w, m, v = _adam_by_hand(spec, weights, scale)
    rows = _run_ours(spec, weights, scale).double()
    torch.testing.assert_close(rows[:, :DIM] - weights.double(), w - weights.double(),
                               rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(rows[:, DIM:2 * DIM], m, rtol=1e-5, atol=0.0)
    torch.testing.assert_close(rows[:, 2 * DIM:], v, rtol=1e-5, atol=0.0)


def test_adam_weight_decay_is_decoupled_on_touched_rows():
    spec = SparseAdam(lr=0.1, weight_decay=0.5)
    rows = _rows(spec, torch.ones(ROWS, DIM))
    apply_sparse_update(rows, torch.tensor([2]), torch.zeros(1, DIM), spec, 0.1, 1)
    # Not in the gradient: m and v stay 0 and w only shrinks by lr * weight_decay * w.
    torch.testing.assert_close(rows[2, :DIM], torch.full((DIM,), 0.95), rtol=1e-6, atol=0.0)
    assert torch.equal(rows[2, DIM:], torch.zeros(2 * DIM))
    assert torch.equal(rows[3, :DIM], torch.ones(DIM))


def test_half_precision_rows_are_updated_in_float32():
    spec = SparseSGD(lr=1.0)
    rows = torch.zeros(4, DIM, dtype=torch.bfloat16)
    apply_sparse_update(rows, torch.tensor([1]), torch.ones(1, DIM), spec, 0.5, 1)
    assert rows.dtype == torch.bfloat16 and bool((rows[1] == -0.5).all())
