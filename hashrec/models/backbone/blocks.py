"""One block of a backbone: its inputs, their merge and its layers (see ``dag``)."""

import torch
from torch import nn

from hashrec.models.backbone.input_layer import NoInputLayer, build_input_layer
from hashrec.models.backbone.lambdas import (
    LIST,
    TENSOR,
    LambdaError,
    compile_lambda,
    compile_slice,
)
from hashrec.models.backbone.layers import SEQUENCE, Value, build_layer
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import WIDE

# How a block merges its inputs.
_SINGLE, _LIST, _CONCAT = 0, 1, 2


class Chain(nn.Module):
    """Value maps applied in order (none: the value itself)."""

    def __init__(self, ops: list[nn.Module]) -> None:
        super().__init__()
        self.ops = nn.ModuleList(ops)

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        for op in self.ops:
            value = op(value)
        return value


class RepeatNode(nn.Module):
    """``num_repeat`` steps over the same input (each a ``Chain`` of its input maps and
    its module); the outputs concatenated on ``axis`` or listed."""

    def __init__(self, steps: list[nn.Module], concat: bool, axis: int) -> None:
        super().__init__()
        self.steps = nn.ModuleList(steps)
        self.concat = concat
        self.axis = axis

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        outs: list[torch.Tensor] = []
        for step in self.steps:
            outs.extend(step(value))
        if self.concat and len(outs) > 1:
            return [torch.cat(outs, dim=self.axis)]
        return outs


class RecurrentNode(nn.Module):
    """``num_steps`` modules, each over the previous step's value; with a fixed input
    (``fixed >= 0``) the other elements take the step's output and the fixed one is
    dropped at the end."""

    def __init__(self, layers: list[nn.Module], fixed: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.fixed = fixed

    def forward(self, value: list[torch.Tensor]) -> list[torch.Tensor]:
        for layer in self.layers:
            out = layer(value)
            if self.fixed < 0:
                value = out
            else:
                updated: list[torch.Tensor] = []
                j = 0
                for idx in range(len(value)):
                    if idx == self.fixed:
                        updated.append(value[idx])
                    else:
                        updated.append(out[j] if len(out) > 1 else out[0])
                        j += 1
                value = updated
        if self.fixed >= 0:
            return value[:self.fixed] + value[self.fixed + 1:]
        return value


class BlockNode(nn.Module):
    """A block: ``forward(values, variant)`` (every earlier value, by slot; the input
    layer options' variant, see ``input_layer``) -> its value. ``input_layer`` maps the
    first input before its ``input_slice`` / ``input_fn``."""

    slots: list[int]

    def __init__(self, slots: list[int], inputs: list[nn.Module], merge: int, axis: int,
                 extra: nn.Module, layers: list[nn.Module], input_layer: nn.Module) -> None:
        super().__init__()
        self.slots = slots
        self.inputs = nn.ModuleList(inputs)
        self.merge = merge
        self.axis = axis
        self.extra = extra
        self.layers = nn.ModuleList(layers)
        self.input_layer = input_layer

    def forward(self, values: list[list[torch.Tensor]], variant: int = 0
                ) -> list[torch.Tensor]:
        parts: list[list[torch.Tensor]] = []
        for j, prepare in enumerate(self.inputs):
            value = values[self.slots[j]]
            if j == 0:
                value = self.input_layer(value, variant)
            parts.append(prepare(value))
        if self.merge == 0:
            value = parts[0]
        elif self.merge == 2:
            value = [torch.cat([p[0] for p in parts], dim=self.axis)]
        else:
            value = []
            for p in parts:
                value.extend(p)
        value = self.extra(value)
        for layer in self.layers:
            value = layer(value)
        return value


def _run(module: nn.Module, value: Value, kind: str) -> Value:
    """The example value of ``module`` over ``value`` (no gradients, eval mode)."""
    training = module.training
    with torch.no_grad():
        module.eval()
        out = module(list(value.tensors))
        module.train(training)
    return Value(kind, tuple(out))


def _lambda(text: str, value: Value, where: str, repeat: int | None = None,
            is_slice: bool = False) -> tuple[nn.Module, Value]:
    if value.kind == SEQUENCE:
        raise ModelError(f"{where}: a lambda over a SEQUENCE feature group; only a DIN "
                         f"module reads one")
    try:
        compile_ = compile_slice if is_slice else compile_lambda
        op, kind = compile_(text, value.kind, len(value.tensors), repeat)
        return op, _run(op, value, kind)
    except LambdaError as err:
        raise ModelError(f"{where}: {err}") from None
    except (RuntimeError, IndexError) as err:
        raise ModelError(f"{where}: {text!r} fails on inputs of shapes "
                         f"{[tuple(t.shape[1:]) for t in value.tensors]} (rows left out): "
                         f"{str(err).splitlines()[0]}") from None


def _prepare(config, value: Value, where: str) -> tuple[nn.Module, Value]:
    """An input's ``input_slice`` then ``input_fn``."""
    ops = []
    if config.HasField("input_slice"):
        op, value = _lambda(config.input_slice, value, where + ".input_slice", is_slice=True)
        ops.append(op)
    if config.HasField("input_fn"):
        op, value = _lambda(config.input_fn, value, where + ".input_fn")
        ops.append(op)
    return Chain(ops), value


def _merge(config, parts: list[Value], where: str) -> tuple[int, Value]:
    if len(parts) == 1:
        return _SINGLE, parts[0]
    if any(p.kind == SEQUENCE for p in parts):
        raise ModelError(f"{where}: a SEQUENCE feature group among several inputs; give "
                         f"it a DIN block of its own")
    tensors = tuple(t for p in parts for t in p.tensors)
    if config.merge_inputs_into_list:
        if any(p.kind != TENSOR for p in parts):
            raise ModelError(f"{where}: merge_inputs_into_list over an input that is a "
                             f"list; HashRec's values are flat lists of tensors")
        return _LIST, Value(LIST, tensors)
    if any(p.kind == LIST for p in parts):
        return _LIST, Value(LIST, tensors)
    axis = config.input_concat_axis
    try:
        merged = torch.cat(tensors, dim=axis)
    except RuntimeError:
        raise ModelError(f"{where}: cannot concatenate inputs of shapes "
                         f"{[tuple(t.shape[1:]) for t in tensors]} (rows left out) on "
                         f"input_concat_axis {axis}") from None
    return _CONCAT, Value(TENSOR, (merged,))


def _layer(config, kind: str, value: Value, where: str) -> tuple[nn.Module, Value]:
    """A layer (``lambda``, ``module``, ``repeat`` or ``recurrent`` of ``config``)."""
    where = f"{where}.{kind}"
    if kind == "lambda":
        return _lambda(getattr(config, "lambda").expression, value, where)
    if kind == "module":
        module, out_kind = build_layer(config.module, value, where)
        return module, _run(module, value, out_kind)
    if kind == "repeat":
        return _repeat(config.repeat, value, where)
    return _recurrent(config.recurrent, value, where)


def _repeat(config, value: Value, where: str) -> tuple[nn.Module, Value]:
    if config.num_repeat < 1:
        raise ModelError(f"{where}.num_repeat={config.num_repeat}; allowed: 1 or more")
    steps, kinds = [], []
    for i in range(config.num_repeat):
        ops, step = [], value
        if config.HasField("input_slice"):
            op, step = _lambda(config.input_slice, step, where + ".input_slice", i, True)
            ops.append(op)
        if config.HasField("input_fn"):
            op, step = _lambda(config.input_fn, step, where + ".input_fn", i)
            ops.append(op)
        layer, out_kind = build_layer(config.module, step, f"{where}.module")
        steps.append(Chain(ops + [layer]))
        kinds.append(out_kind)
    concat = config.HasField("output_concat_axis")
    if concat and LIST in kinds:
        raise ModelError(f"{where}.output_concat_axis: the module gives lists; leave it "
                         f"unset to list the outputs")
    node = RepeatNode(steps, concat, config.output_concat_axis)
    single = config.num_repeat == 1 and kinds[0] == TENSOR
    return node, _run(node, value, TENSOR if concat or single else LIST)


def _recurrent(config, value: Value, where: str) -> tuple[nn.Module, Value]:
    if config.num_steps < 1:
        raise ModelError(f"{where}.num_steps={config.num_steps}; allowed: 1 or more")
    fixed = config.fixed_input_index if config.HasField("fixed_input_index") else -1
    if fixed >= 0 and (value.kind != LIST or fixed >= len(value.tensors)):
        raise ModelError(f"{where}.fixed_input_index={fixed} needs a list input of more "
                         f"elements; give the block a list, e.g. input_fn: "
                         f"'lambda x: [x, x]'")
    layers, step = [], value
    for _ in range(config.num_steps):
        layer, out_kind = build_layer(config.module, step, f"{where}.module")
        layers.append(layer)
        out = _run(layer, step, out_kind)
        if fixed < 0:
            step = out
        else:
            kept = list(step.tensors)
            others = [i for i in range(len(kept)) if i != fixed]
            for j, idx in enumerate(others):
                kept[idx] = out.tensors[j] if len(out.tensors) > 1 else out.tensors[0]
            step = Value(LIST, tuple(kept))
    node = RecurrentNode(layers, fixed)
    kind = step.kind if fixed < 0 else TENSOR if len(step.tensors) == 2 else LIST
    return node, _run(node, value, kind)


def _input_layer(config, groups: dict, resets: list, where: str) -> nn.Module:
    """Check an ``input_layer`` block (one feature group) and build its options' node."""
    if len(config.inputs) != 1 or config.inputs[0].WhichOneof("name") != \
            "feature_group_name":
        raise ModelError(f"{where}: an input_layer block reads one feature_group_name")
    options = config.input_layer
    group = groups[config.inputs[0].feature_group_name]
    if options.HasField("wide_output_dim") and group.group_type != WIDE:
        raise ModelError(f"{where}.input_layer.wide_output_dim on the {group.group_type} "
                         f"group {group.name!r}; it sets the width of a WIDE group's "
                         f"embeddings")
    return build_input_layer([options] + list(resets), group, where)


def _input_slot(config, i: int, slots: dict[str, int], input_slots: dict[int, int],
                where: str) -> int:
    """The value slot input ``i`` (an ``Input`` message) reads."""
    source = config.WhichOneof("name")
    if source != "package_name":
        for name in ("reset_input", "package_input", "package_input_fn"):
            if config.HasField(name):
                raise ModelError(f"{where}.{name} is set on a {source} input; it belongs to "
                                 f"an input that calls a package (package_name)")
    if source == "package_name":
        return input_slots[i]
    if source == "use_package_input":
        if "input" not in slots:
            raise ModelError(f"{where}: use_package_input, but this package's call gives "
                             f"no package_input; set package_input on the input that calls "
                             f"it")
        return slots["input"]
    name = getattr(config, source)
    return slots["group:" + name if source == "feature_group_name" else "block:" + name]


def build_block(config, slots: dict[str, int], values: list[Value], groups: dict,
                where: str, input_slots: dict[int, int] | None = None,
                resets: tuple = ()) -> tuple[BlockNode, Value]:
    """(the node of the ``Block`` message ``config``, an example of its value).

    ``slots``: ``group:<name>`` / ``block:<name>`` (/ ``input``, a package's input) -> the
    slot of its value in ``values``; ``input_slots``: input index -> the slot of a package
    call's value; ``groups``: the ``GroupSpec`` of each feature group; ``resets``: the
    ``reset_input`` messages of the package's calls (its input layers' other variants).
    """
    kind = config.WhichOneof("layer")
    input_layer = NoInputLayer()
    if kind == "input_layer":
        input_layer = _input_layer(config, groups, list(resets), where)
    if config.layers and kind is not None:
        raise ModelError(f"{where}: both layers and {kind}; put {kind} into layers")
    inputs, parts, slot_list = [], [], []
    for i, input_config in enumerate(config.inputs):
        slot = _input_slot(input_config, i, slots, input_slots or {},
                           f"{where}.inputs[{i}]")
        op, value = _prepare(input_config, values[slot], f"{where}.inputs[{i}]")
        if input_config.ignore_input:
            continue
        inputs.append(op)
        parts.append(value)
        slot_list.append(slot)
    if not parts:
        raise ModelError(f"{where}: every input is ignore_input")
    merge, value = _merge(config, parts, where)
    extra = Chain([])
    if config.HasField("extra_input_fn"):
        op, value = _lambda(config.extra_input_fn, value, where + ".extra_input_fn")
        extra = Chain([op])
    layers = []
    if config.layers:
        for j, layer_config in enumerate(config.layers):
            layer, value = _layer(layer_config, layer_config.WhichOneof("layer"), value,
                                  f"{where}.layers[{j}]")
            layers.append(layer)
    elif kind not in (None, "input_layer"):
        layer, value = _layer(config, kind, value, where)
        layers.append(layer)
    node = BlockNode(slot_list, inputs, merge, config.input_concat_axis, extra, layers,
                     input_layer)
    return node, value

