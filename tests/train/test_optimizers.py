import pytest
import torch
from google.protobuf import text_format

from hashrec.config import optimizer_pb2, train_pb2
from hashrec.table import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD
from hashrec.train.errors import TrainError
from hashrec.train.optimizers import (
    build_dense_optimizer,
    clip_gradients,
    dense_parameters,
    sparse_optimizer_spec,
    sparse_schedule,
)


def _sparse(text):
    return text_format.Parse(text, optimizer_pb2.SparseOptimizer())


def _dense(text):
    return text_format.Parse(text, optimizer_pb2.DenseOptimizer())


@pytest.mark.parametrize("text,expected", [
    ("sgd_optimizer { lr: 0.5 }", SparseSGD(lr=0.5)),
    ("adagrad_optimizer { lr: 0.1 initial_accumulator_value: 0.2 }",
     SparseAdagrad(lr=0.1, initial_accumulator_value=0.2)),
    ("rowwise_adagrad_optimizer { lr: 0.1 }", SparseRowWiseAdagrad(lr=0.1)),
    ("adam_optimizer { lr: 0.01 beta1: 0.8 }", SparseAdam(lr=0.01, beta1=0.8)),
], ids=["sgd", "adagrad", "rowwise-adagrad", "adam"])
def test_sparse_spec(text, expected):
    spec = sparse_optimizer_spec(_sparse(text))
    assert type(spec) is type(expected)
    assert spec.lr == pytest.approx(expected.lr)


@pytest.mark.parametrize("kind", ["adagrad_optimizer", "rowwise_adagrad_optimizer",
                                  "adam_optimizer"])
def test_sparse_eps_defaults_to_dynamicembs(kind):
    # TorchEasyRec passes no eps, so its tables train with dynamicemb's / FBGEMM TBE's 1e-8.
    spec = sparse_optimizer_spec(_sparse(f"{kind} {{ lr: 0.1 }}"))
    assert spec.eps == pytest.approx(1e-8, rel=1e-6)


@pytest.mark.parametrize("text,match", [
    ("lamb_optimizer { lr: 0.1 }", "lamb_optimizer"),
    ("sgd_optimizer { lr: 0.1 gradient_clipping: true }", "gradient_clipping"),
    ("rowwise_adagrad_optimizer { lr: 0.1 weight_decay: 0.1 }", "weight_decay"),
    ("sgd_optimizer { lr: -1 }", "lr"),
], ids=["unsupported", "clipping", "rowwise-decay", "negative-lr"])
def test_sparse_spec_errors(text, match):
    with pytest.raises(TrainError, match=match):
        sparse_optimizer_spec(_sparse(text))


def test_sparse_schedule_uses_sparse_lr():
    sched = sparse_schedule(_sparse("adagrad_optimizer { lr: 0.2 } manual_step_learning_rate "
                                    "{ schedule_sizes: [5] learning_rates: [0.02] }"))
    assert sched(5) == pytest.approx(0.2) and sched(6) == pytest.approx(0.02)


@pytest.mark.parametrize("text,cls", [
    ("sgd_optimizer { lr: 0.1 }", torch.optim.SGD),
    ("adagrad_optimizer { lr: 0.1 }", torch.optim.Adagrad),
    ("adam_optimizer { lr: 0.1 }", torch.optim.Adam),
    ("adamw_optimizer { lr: 0.1 weight_decay: 0.01 }", torch.optim.AdamW),
], ids=["sgd", "adagrad", "adam", "adamw"])
def test_dense_optimizer(text, cls):
    layer = torch.nn.Linear(2, 1)
    dense = build_dense_optimizer(_dense(text), dict(layer.named_parameters()))
    assert [type(o) for o in dense.optimizers] == [cls]
    assert dense.set_learning_rates(7, 0) == pytest.approx(0.1)
    assert all(g["lr"] == pytest.approx(0.1) for g in dense.param_groups)


def test_dense_parameters_skip_embedding():
    model = torch.nn.Module()
    model.embedding = torch.nn.Linear(2, 2)
    model.tower = torch.nn.Linear(2, 1)
    assert {id(p) for p in dense_parameters(model).values()} == {
        id(p) for p in model.tower.parameters()}


def test_dense_optimizer_needs_parameters():
    with pytest.raises(TrainError, match="no dense parameters"):
        build_dense_optimizer(_dense("adam_optimizer { lr: 0.1 }"), {})


def _clipping(text):
    return text_format.Parse(text, train_pb2.GradClipping())


def _params_with_grad(values):
    p = torch.nn.Parameter(torch.zeros(len(values)))
    p.grad = torch.tensor(values)
    return [p]


def test_clip_by_norm():
    params = _params_with_grad([3.0, 4.0])
    clip_gradients(params, _clipping('clipping_type: "norm" max_gradient: 1.0'))
    assert torch.allclose(params[0].grad.norm(), torch.tensor(1.0), atol=1e-5)


def test_clip_by_value_and_none():
    params = _params_with_grad([3.0, -4.0, 0.5])
    clip_gradients(params, _clipping('clipping_type: "value" max_gradient: 1.0'))
    assert params[0].grad.tolist() == [1.0, -1.0, 0.5]
    params = _params_with_grad([3.0])
    clip_gradients(params, _clipping('clipping_type: "none"'))
    clip_gradients(params, None)
    assert params[0].grad.tolist() == [3.0]


def test_clip_unknown_type():
    with pytest.raises(TrainError, match="clipping_type"):
        clip_gradients(_params_with_grad([1.0]), _clipping('clipping_type: "l3"'))
