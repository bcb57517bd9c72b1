"""The backbone's lambdas: the allowed forms compute what Python would, scripted too, and
anything else is refused naming the expression and the part."""

from __future__ import annotations

import pytest
import torch

from hashrec.models.backbone.lambdas import (
    LIST,
    TENSOR,
    LambdaError,
    compile_lambda,
    compile_slice,
)

X = torch.arange(2 * 12, dtype=torch.float32).reshape(2, 12)


@pytest.mark.parametrize("text, kind, arg, expected", [
    ("lambda x: [x, x]", TENSOR, [X], [X, X]),
    ("lambda x: x.reshape(x.shape[0], 3, 4)", TENSOR, [X], [X.reshape(2, 3, 4)]),
    ("lambda x: torch.sum(x, dim=-1, keepdim=True)", TENSOR, [X], [X.sum(-1, keepdim=True)]),
    ("lambda x: x.mean(dim=(1,))", TENSOR, [X], [X.mean(1)]),
    ("lambda xs: torch.cat(xs, dim=1)", LIST, [X, X + 1], [torch.cat([X, X + 1], 1)]),
    ("lambda xs: xs[1]", LIST, [X, X + 1], [X + 1]),
    ("lambda xs: xs[1:]", LIST, [X, X + 1, X + 2], [X + 1, X + 2]),
    ("lambda xs: xs[0] * 2 - xs[1]", LIST, [X, X + 1], [X * 2 - (X + 1)]),
    ("lambda x: x[..., 2:5].sigmoid()", TENSOR, [X], [X[..., 2:5].sigmoid()]),
    ("lambda x: x[:, -1]", TENSOR, [X], [X[:, -1]]),
    ("lambda x: torch.stack([x, x], dim=1).flatten(1)", TENSOR, [X],
     [torch.stack([X, X], 1).flatten(1)]),
], ids=["pair", "reshape", "torch-sum", "mean", "cat", "pick", "slice-list", "arithmetic",
        "slice-tensor", "last-column", "stack-flatten"])
def test_allowed_forms_compute_as_python_eager_and_scripted(text, kind, arg, expected):
    op, _ = compile_lambda(text, kind, len(arg))
    for run in (op, torch.jit.script(op)):
        out = run(list(arg))
        assert len(out) == len(expected)
        for got, want in zip(out, expected):
            torch.testing.assert_close(got, want)


def test_slices_and_the_repeat_index():
    op, kind = compile_slice("[i]", LIST, 3, repeat=2)
    assert kind == TENSOR and torch.equal(op([X, X + 1, X + 2])[0], X + 2)
    op, kind = compile_slice("[..., :4]", TENSOR)
    assert torch.equal(op([X])[0], X[..., :4])


@pytest.mark.parametrize("text, part", [
    ("lambda x: __import__('os').system('true')", "__import__"),
    ("lambda x: x.numpy()", "'numpy' is not an allowed method"),
    ("lambda x: eval('1')", "eval"),
    ("x + 1", "expected 'lambda x: <expression>'"),
    ("lambda x: x.sum()", "give dim"),
    ("lambda x: torch.cat(x, dim=1)", "torch.cat of a tensor"),
    ("lambda xs: xs[3]", "index 3 out of a list of 2"),
    ("lambda x: x[::2]", "a slice with a step"),
], ids=["import", "numpy", "eval", "not-lambda", "sum-all", "cat-tensor", "out-of-list", "step"])
def test_other_forms_are_refused_naming_the_expression(text, part):
    kind = LIST if "xs" in text else TENSOR
    with pytest.raises(LambdaError) as err:
        compile_lambda(text, kind, 2)
    assert repr(text) in str(err.value) and part in str(err.value)
