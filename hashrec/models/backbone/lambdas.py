"""The lambda expressions of a backbone config, parsed by an allow-list, never run.

TorchEasyRec evaluates a block's ``lambda``, an input's ``input_fn`` and ``input_slice``
and a repeat's ``input_fn`` / ``input_slice`` as Python. HashRec parses them with
``ast`` and builds a tree of small scriptable modules from the forms below; anything
else is a :class:`LambdaError` naming the expression and the part.

A value is a tensor or a flat list of tensors (``List[Tensor]`` at run time, one element
for a tensor; which of the two is known when the model is built). Allowed:

- ``lambda x: <e>`` (``lambda x, i: <e>`` in a repeat, ``i`` the repetition);
- ``x``; a list or tuple of tensor expressions ``[x, x]``;
- a list's element or slice ``x[0]``, ``x[1:]``, ``x[i]``; a tensor's ``x[..., :10]``,
  ``x[:, 0]`` (integers, slices of step 1, one ``...``);
- on a tensor ``.sum`` / ``.mean`` (``dim`` an int or tuple of ints, ``keepdim``),
  ``.reshape`` / ``.view`` (sizes: ints, ``-1`` or ``x.shape[k]`` / ``x.size(k)`` of the
  argument), ``.flatten(start_dim, end_dim)``, ``.unsqueeze`` / ``.squeeze(dim)``,
  ``.transpose(a, b)``, ``.permute(...)``, ``.relu()``, ``.sigmoid()``, ``.tanh()``,
  ``.contiguous()``, and the same as ``torch.<name>(x, ...)``;
- ``torch.cat`` / ``torch.stack`` of a list (``dim``); ``+ - * /`` of tensors and numbers,
  ``torch.add`` / ``torch.sub`` / ``torch.mul`` / ``torch.div``.
"""


import ast

import torch
from torch import nn

TENSOR = "tensor"
LIST = "list"

_REDUCE = ("sum", "mean")
_ELEMENTWISE = ("relu", "sigmoid", "tanh", "contiguous")
_SHAPE = ("reshape", "view", "flatten", "unsqueeze", "squeeze", "transpose", "permute")
_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_TORCH_BINARY = ("add", "sub", "mul", "div")


class LambdaError(ValueError):
    """An expression outside the allowed forms; the message names it and the part."""


class ArgOp(nn.Module):
    """The lambda's argument."""

    def forward(self, arg: list[torch.Tensor]) -> list[torch.Tensor]:
        return arg


class ListOp(nn.Module):
    """``[a, b, ...]`` of tensor expressions."""

    def __init__(self, items: list[nn.Module]) -> None:
        super().__init__()
        self.items = nn.ModuleList(items)

    def forward(self, arg: list[torch.Tensor]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for item in self.items:
            out.append(item(arg)[0])
        return out


class PickOp(nn.Module):
    """Elements ``indices`` of a list (its length is known when the model is built)."""

    indices: list[int]

    def __init__(self, child: nn.Module, indices: list[int]) -> None:
        super().__init__()
        self.child = child
        self.indices = indices

    def forward(self, arg: list[torch.Tensor]) -> list[torch.Tensor]:
        value = self.child(arg)
        return [value[i] for i in self.indices]


class IndexOp(nn.Module):
    """A tensor's ``[...]``: per item, 0 ``...``, 1 an integer, 2 a slice of step 1."""

    kinds: list[int]
    starts: list[int]
    stops: list[int]
    has_stop: list[bool]

    def __init__(self, child: nn.Module, kinds: list[int], starts: list[int],
                 stops: list[int], has_stop: list[bool]) -> None:
        super().__init__()
        self.child = child
        self.kinds = kinds
        self.starts = starts
        self.stops = stops
        self.has_stop = has_stop

    def forward(self, arg: list[torch.Tensor]) -> list[torch.Tensor]:
        t = self.child(arg)[0]
        dim = 0
        for j in range(len(self.kinds)):
            kind = self.kinds[j]
            if kind == 0:
                rest = 0
                for k in self.kinds[j + 1:]:
                    rest += 1 if k == 2 or k == 1 else 0
                dim = t.dim() - rest
            elif kind == 1:
                t = t.select(dim, self.starts[j])
            else:
                size = t.shape[dim]
                start = _bound(self.starts[j], size)
                stop = _bound(self.stops[j], size) if self.has_stop[j] else size
                t = t.narrow(dim, start, max(stop - start, 0))
                dim += 1
        return [t]


def _bound(index: int, size: int) -> int:
    if index < 0:
        index += size
    return min(max(index, 0), size)


class TensorOp(nn.Module):
    """A tensor method or torch function ``name`` (see the module docstring).

    ``ints``: its integer arguments (dims); ``size_dims`` (reshape / view): per size, -1
    for the number in ``ints``, else the argument's dimension whose size it is.
    """

    ints: list[int]
    size_dims: list[int]

    def __init__(self, name: str, first: nn.Module, second: nn.Module | None = None,
                 ints: list[int] | None = None, size_dims: list[int] | None = None,
                 keepdim: bool = False, scalar: float = 0.0, scalar_left: bool = False
                 ) -> None:
        super().__init__()
        self.name = name
        self.first = first
        self.has_second = second is not None
        self.second = second if second is not None else ArgOp()
        self.ints = list(ints or [])
        self.size_dims = list(size_dims or [])
        self.keepdim = keepdim
        self.scalar = scalar
        self.scalar_left = scalar_left

    def forward(self, arg: list[torch.Tensor]) -> list[torch.Tensor]:
        value = self.first(arg)
        if self.name == "cat":
            return [torch.cat(value, dim=self.ints[0])]
        if self.name == "stack":
            return [torch.stack(value, dim=self.ints[0])]
        t = value[0]
        if self.name in ("add", "sub", "mul", "div"):
            return [self._binary(t, arg)]
        if self.name == "sum":
            return [t.sum(dim=self.ints, keepdim=self.keepdim)]
        if self.name == "mean":
            return [t.mean(dim=self.ints, keepdim=self.keepdim)]
        if self.name == "reshape" or self.name == "view":
            sizes: list[int] = []
            for j in range(len(self.ints)):
                source = self.size_dims[j]
                sizes.append(self.ints[j] if source < 0 else arg[0].shape[source])
            return [t.reshape(sizes)]
        if self.name == "flatten":
            return [t.flatten(self.ints[0], self.ints[1])]
        if self.name == "unsqueeze":
            return [t.unsqueeze(self.ints[0])]
        if self.name == "squeeze":
            return [t.squeeze(self.ints[0])]
        if self.name == "transpose":
            return [t.transpose(self.ints[0], self.ints[1])]
        if self.name == "permute":
            return [t.permute(self.ints)]
        if self.name == "relu":
            return [torch.relu(t)]
        if self.name == "sigmoid":
            return [torch.sigmoid(t)]
        if self.name == "tanh":
            return [torch.tanh(t)]
        return [t]  # contiguous: the value itself

    def _binary(self, t: torch.Tensor, arg: list[torch.Tensor]) -> torch.Tensor:
        other = self.second(arg)[0] if self.has_second else torch.full_like(t, self.scalar)
        left, right = (other, t) if self.scalar_left else (t, other)
        if self.name == "add":
            return left + right
        if self.name == "sub":
            return left - right
        if self.name == "mul":
            return left * right
        return left / right


class Compiler:
    """Turns one lambda expression into an op tree for an argument of kind ``arg_kind``
    with ``list_length`` elements (a list's; 1 for a tensor), ``i`` bound to ``repeat``.
    """

    def __init__(self, text: str, arg_kind: str, list_length: int,
                 repeat: int | None = None) -> None:
        self.text = text
        self.arg_kind = arg_kind
        self.list_length = list_length
        self.repeat = repeat
        self.names: tuple[str, ...] = ()

    def fail(self, node: ast.AST | None, why: str) -> LambdaError:
        part = f" at {ast.unparse(node)!r}" if node is not None else ""
        return LambdaError(f"lambda {self.text!r}{part}: {why}")

    def compile(self) -> tuple[nn.Module, str]:
        """(the op tree, the kind of its value)."""
        try:
            tree = ast.parse(self.text.strip(), mode="eval").body
        except SyntaxError as err:
            raise self.fail(None, f"not a Python expression ({err.msg})") from None
        arity = 1 if self.repeat is None else 2
        if not isinstance(tree, ast.Lambda) or len(tree.args.args) != arity or \
                tree.args.vararg or tree.args.kwarg or tree.args.kwonlyargs or \
                tree.args.defaults:
            args = "x" if arity == 1 else "x, i"
            raise self.fail(None, f"expected 'lambda {args}: <expression>'")
        self.names = tuple(a.arg for a in tree.args.args)
        return self.expr(tree.body)

    def expr(self, node: ast.AST) -> tuple[nn.Module, str]:
        if isinstance(node, ast.Name) and node.id == self.names[0]:
            return ArgOp(), self.arg_kind
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.tensor(item) for item in node.elts]
            if not items:
                raise self.fail(node, "an empty list")
            return ListOp(items), LIST
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self.binary(_BINARY[type(node.op)], node.left, node.right, node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return self.call(node)
        raise self.fail(node, "not an allowed form (see hashrec/models/backbone/lambdas.py)")

    def tensor(self, node: ast.AST) -> nn.Module:
        op, kind = self.expr(node)
        if kind != TENSOR:
            raise self.fail(node, "a list where a tensor is needed")
        return op

    def integer(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.integer(node.operand)
        if isinstance(node, ast.Name) and self.repeat is not None and node.id == self.names[1]:
            return self.repeat
        raise self.fail(node, "expected an integer")

    def subscript(self, node: ast.Subscript) -> tuple[nn.Module, str]:
        child, kind = self.expr(node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if kind == LIST:
            if len(items) != 1:
                raise self.fail(node, "a list takes one index or slice")
            return self.list_pick(child, items[0], node)
        kinds, starts, stops, has_stop = [], [], [], []
        for item in items:
            if isinstance(item, ast.Constant) and item.value is Ellipsis:
                if 0 in kinds:
                    raise self.fail(node, "more than one '...'")
                kinds.append(0), starts.append(0), stops.append(0), has_stop.append(False)
            elif isinstance(item, ast.Slice):
                if item.step is not None:
                    raise self.fail(node, "a slice with a step")
                kinds.append(2)
                starts.append(self.integer(item.lower) if item.lower is not None else 0)
                stops.append(self.integer(item.upper) if item.upper is not None else 0)
                has_stop.append(item.upper is not None)
            else:
                kinds.append(1), starts.append(self.integer(item)), stops.append(0)
                has_stop.append(False)
        return IndexOp(child, kinds, starts, stops, has_stop), TENSOR

    def list_pick(self, child: nn.Module, item: ast.AST, node: ast.AST
                  ) -> tuple[nn.Module, str]:
        length = self.list_length if isinstance(child, ArgOp) else len(child.items) \
            if isinstance(child, ListOp) else None
        if length is None:
            raise self.fail(node, "indexing a list that is not the argument or a literal")
        indices = list(range(length))
        if isinstance(item, ast.Slice):
            if item.step is not None:
                raise self.fail(node, "a slice with a step")
            lower = self.integer(item.lower) if item.lower is not None else None
            upper = self.integer(item.upper) if item.upper is not None else None
            picked = indices[lower:upper]
            if not picked:
                raise self.fail(node, f"an empty slice of a list of {length}")
            return PickOp(child, picked), LIST
        index = self.integer(item)
        if not -length <= index < length:
            raise self.fail(node, f"index {index} out of a list of {length}")
        return PickOp(child, [indices[index]]), TENSOR

    def binary(self, name: str, left: ast.AST, right: ast.AST, node: ast.AST
               ) -> tuple[nn.Module, str]:
        numbers = [isinstance(n, ast.Constant) and type(n.value) in (int, float)
                   for n in (left, right)]
        if all(numbers):
            raise self.fail(node, "arithmetic of two numbers")
        if numbers[0]:
            return TensorOp(name, self.tensor(right), scalar=float(left.value),
                            scalar_left=True), TENSOR
        if numbers[1]:
            return TensorOp(name, self.tensor(left), scalar=float(right.value)), TENSOR
        return TensorOp(name, self.tensor(left), self.tensor(right)), TENSOR

    def call(self, node: ast.Call) -> tuple[nn.Module, str]:
        func = node.func
        args = list(node.args)
        if isinstance(func.value, ast.Name) and func.value.id == "torch":
            name = func.attr
            if not args:
                raise self.fail(node, f"torch.{name} without an argument")
            receiver = args.pop(0)
        else:
            name, receiver = func.attr, func.value
        keywords = {k.arg: k.value for k in node.keywords}
        if None in keywords:
            raise self.fail(node, "** arguments")
        if name in ("cat", "stack"):
            child, kind = self.expr(receiver)
            if kind != LIST:
                raise self.fail(node, f"torch.{name} of a tensor; it takes a list")
            dim = self.take(keywords, args, "dim", 0, node)
            self.done(keywords, args, node)
            return TensorOp(name, child, ints=[self.integer(dim)]), TENSOR
        if name in _TORCH_BINARY:
            if len(args) != 1:
                raise self.fail(node, f"{name} takes two operands")
            other = args.pop()
            self.done(keywords, args, node)
            return self.binary(name, receiver, other, node)
        child = self.tensor(receiver)
        if name in _REDUCE:
            return self.reduce(name, child, keywords, args, node)
        if name in _ELEMENTWISE:
            self.done(keywords, args, node)
            return TensorOp(name, child), TENSOR
        if name in _SHAPE:
            return self.shape_op(name, child, keywords, args, node)
        raise self.fail(node, f"{name!r} is not an allowed method or function")

    def reduce(self, name, child, keywords, args, node) -> tuple[nn.Module, str]:
        dim = self.take(keywords, args, "dim", None, node)
        keepdim = self.take(keywords, args, "keepdim", None, node)
        self.done(keywords, args, node)
        if dim is None:
            raise self.fail(node, f"{name} over every dimension (the rows too); give dim")
        dims = [self.integer(d) for d in dim.elts] if isinstance(dim, ast.Tuple) \
            else [self.integer(dim)]
        keep = False
        if keepdim is not None:
            if not (isinstance(keepdim, ast.Constant) and type(keepdim.value) is bool):
                raise self.fail(node, "keepdim must be True or False")
            keep = keepdim.value
        return TensorOp(name, child, ints=dims, keepdim=keep), TENSOR

    def shape_op(self, name, child, keywords, args, node) -> tuple[nn.Module, str]:
        if name in ("reshape", "view"):
            if keywords:
                raise self.fail(node, f"{name} with keyword arguments")
            sizes = args[0].elts if len(args) == 1 and isinstance(args[0], ast.Tuple) \
                else args
            ints, dims = zip(*[self.size(s) for s in sizes]) if sizes else ((), ())
            if not sizes:
                raise self.fail(node, f"{name} without sizes")
            return TensorOp(name, child, ints=list(ints), size_dims=list(dims)), TENSOR
        defaults = {"flatten": [("start_dim", 0), ("end_dim", -1)],
                    "unsqueeze": [("dim", None)], "squeeze": [("dim", None)],
                    "transpose": [("dim0", None), ("dim1", None)]}
        if name == "permute":
            if keywords:
                raise self.fail(node, "permute with keyword arguments")
            dims = args[0].elts if len(args) == 1 and isinstance(args[0], ast.Tuple) else args
            return TensorOp(name, child, ints=[self.integer(d) for d in dims]), TENSOR
        ints = []
        for key, default in defaults[name]:
            value = self.take(keywords, args, key, default, node)
            if value is None:
                raise self.fail(node, f"{name} needs {key}")
            ints.append(value if isinstance(value, int) else self.integer(value))
        self.done(keywords, args, node)
        return TensorOp(name, child, ints=ints), TENSOR

    def size(self, node: ast.AST) -> tuple[int, int]:
        """(number, -1) or (0, the argument's dimension) of a reshape size."""
        shape = None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and \
                node.value.attr == "shape":
            shape, index = node.value.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "size" and len(node.args) == 1:
            shape, index = node.func.value, node.args[0]
        if shape is None:
            return self.integer(node), -1
        if not (isinstance(shape, ast.Name) and shape.id == self.names[0]) or \
                self.arg_kind != TENSOR:
            raise self.fail(node, "a size of something other than the tensor argument")
        dim = self.integer(index)
        if dim < 0:
            raise self.fail(node, "a negative dimension in a size")
        return 0, dim

    def take(self, keywords: dict, args: list, key: str, default, node: ast.AST):
        if key in keywords:
            return keywords.pop(key)
        if args:
            return args.pop(0)
        return default

    def done(self, keywords: dict, args: list, node: ast.AST) -> None:
        if keywords or args:
            extra = list(keywords) or [ast.unparse(a) for a in args]
            raise self.fail(node, f"unexpected arguments {extra}")


def compile_lambda(text: str, arg_kind: str, list_length: int = 1,
                   repeat: int | None = None) -> tuple[nn.Module, str]:
    """(op tree, value kind) of ``text`` over an argument of ``arg_kind``.

    Raises:
        LambdaError: an expression outside the allowed forms.
    """
    return Compiler(text, arg_kind, list_length, repeat).compile()


def compile_slice(text: str, arg_kind: str, list_length: int = 1,
                  repeat: int | None = None) -> tuple[nn.Module, str]:
    """An ``input_slice`` such as ``[..., :10]`` or ``[i]``, as ``lambda x: x<slice>``."""
    args = "x" if repeat is None else "x, i"
    try:
        return compile_lambda(f"lambda {args}: x{text.strip()}", arg_kind, list_length,
                              repeat)
    except LambdaError as err:
        raise LambdaError(f"input_slice {text!r}: {err}") from None
