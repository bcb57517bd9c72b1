"""The block DAG of a configurable backbone (TorchEasyRec's ``BackboneTower``): build
order, checks and the scriptable network.

A block reads its ``inputs`` (feature groups by ``feature_group_name``, other blocks by
``block_name``), each through its optional ``input_slice`` then ``input_fn``; one input
is taken as it is; several are concatenated along ``input_concat_axis`` when all are
tensors, joined into one list when some are lists, or, with ``merge_inputs_into_list``,
made a list of the (tensor) inputs. ``extra_input_fn`` then maps the merged input, and
the block's layer (``module``, ``lambda``, ``repeat``, ``recurrent``, or the sequence of
``layers``) maps it to the block's output; a block without one passes it on, and an
``input_layer`` block passes on its feature group (normalized and dropped out as its
options say, see ``input_layer``). A ``package_name`` input calls a block package (see
``packages``). Blocks run in an order where every block follows its inputs (config order
among the ready ones).

The backbone's output is the ``output_blocks``' outputs as a list, else the
``concat_blocks``' outputs (else, as in TorchEasyRec, those of every block no other block
reads) concatenated on the last axis where all are tensors, joined into one list where
some are lists (an ``MMoE`` module's); ``top_mlp`` then maps it (a list concatenated
first).

Modules are sized by running each block once on example inputs of two rows while the
DAG is built; the network itself only runs tensor ops of fixed shapes (no host reads),
for the CUDA graphs, and is scriptable for the export.
"""

import torch
from torch import nn

from hashrec.models.backbone.blocks import build_block
from hashrec.models.backbone.lambdas import LIST, TENSOR
from hashrec.models.backbone.layers import SEQUENCE, Value
from hashrec.models.backbone.order import block_order, output_blocks
from hashrec.models.backbone.packages import PackageNet, Packages
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP, WIDE, GroupSpec
from hashrec.models.mlp_config import mlp_options
from hashrec.modules import MLP


def group_value(group: GroupSpec) -> Value:
    """Example value (two rows) of a feature group: (B, D) for DEEP and WIDE;
    [query, sequence of one position, lengths] for SEQUENCE."""
    if group.group_type in (DEEP, WIDE):
        return Value(TENSOR, (torch.zeros(2, group.dim),))
    return Value(SEQUENCE, (torch.zeros(2, group.query_dim),
                            torch.zeros(2, 1, group.sequence_dim),
                            torch.ones(2, dtype=torch.int64)))


class BackboneNet(nn.Module):
    """The backbone: ``forward(inputs)`` over the feature groups' tensors in ``slots``
    order (one each, three for a SEQUENCE group) -> the output value.

    Args:
        group_sizes: tensors of each group, in slot order.
        blocks: the ``BlockNode`` of each block and the ``PackageCall`` of each package
            call, in run order.
        outputs: the value slots of the output blocks.
        concat: concatenate the outputs on the last axis (else a list).
        top_mlp: the MLP over the (concatenated) output, or None.
        packages: the packages' ``PackageNet``.
        calls: for each of ``blocks``, the package it calls (-1: a block) and the
            variant of the package's input layers for the call.
    """

    group_sizes: list[int]
    outputs: list[int]
    package_of: list[int]
    variant_of: list[int]

    def __init__(self, group_sizes: list[int], blocks: list[nn.Module], outputs: list[int],
                 concat: bool, top_mlp: nn.Module | None,
                 packages: list[PackageNet] | None = None,
                 calls: list[tuple[int, int]] | None = None) -> None:
        super().__init__()
        self.group_sizes = group_sizes
        self.blocks = nn.ModuleList(blocks)
        self.outputs = outputs
        self.concat = concat or top_mlp is not None
        self.has_top = top_mlp is not None
        self.top_mlp = top_mlp if top_mlp is not None else nn.Identity()
        self.packages = nn.ModuleList(packages or [])
        calls = calls or [(-1, 0)] * len(blocks)
        self.package_of = [c[0] for c in calls]
        self.variant_of = [c[1] for c in calls]

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        values: list[list[torch.Tensor]] = []
        start = 0
        for size in self.group_sizes:
            values.append(inputs[start:start + size])
            start += size
        groups = values[:len(self.group_sizes)]
        for i, block in enumerate(self.blocks):
            value = block(values)
            package = self.package_of[i]
            if package >= 0:
                for j, net in enumerate(self.packages):
                    if j == package:
                        value = net(groups, value, self.variant_of[i])
            values.append(value)
        out: list[torch.Tensor] = []
        for slot in self.outputs:
            out.extend(values[slot])
        if self.concat:
            hidden = torch.cat(out, dim=-1) if len(out) > 1 else out[0]
            return [self.top_mlp(hidden)]
        return out


def build_backbone(config, groups: dict[str, GroupSpec], where: str
                   ) -> tuple[BackboneNet, list[str], Value]:
    """(the network of the ``BackboneTower`` ``config``, the feature groups it reads in
    input order, an example of its output value).

    Raises:
        ModelError: a bad block or package (see ``block_order``, ``build_block`` and
            ``Packages``), an output naming no block, or a list output into top_mlp of
            unequal ranks.
    """
    if not config.blocks:
        raise ModelError(f"{where} has no blocks")
    packages = Packages(config, groups, where)
    order = block_order(config.blocks, groups, where, packages.names)
    read = {i.feature_group_name for b in config.blocks for i in b.inputs
            if i.WhichOneof("name") == "feature_group_name"} | packages.groups_read()
    used = [n for n in groups if n in read]
    unused = [n for n in groups if n not in used]
    if unused:
        raise ModelError(f"{where}: feature groups {unused} feed no block and would be left "
                         f"out of the model; read them in a block, or remove them")
    slots = {f"group:{n}": i for i, n in enumerate(used)}
    values = [group_value(groups[n]) for n in used]
    nodes, calls = [], []

    def emit(node: nn.Module, package: int, variant: int, value: Value) -> int:
        nodes.append(node)
        calls.append((package, variant))
        values.append(value)
        return len(values) - 1

    for block in order:
        at = f"{where}.blocks[{block.name!r}]"
        input_slots = {i: packages.call(c, slots, values, emit, f"{at}.inputs[{i}]")
                       for i, c in enumerate(block.inputs)
                       if c.WhichOneof("name") == "package_name"}
        node, value = build_block(block, slots, values, groups, at, input_slots)
        slots[f"block:{block.name}"] = emit(node, -1, 0, value)
    names, concat = output_blocks(config, order, where)
    outputs = [slots[f"block:{n}"] for n in names]
    # as TorchEasyRec merges outputs: tensors concatenated, any list joins them into one
    concat = concat and all(values[slot].kind == TENSOR for slot in outputs)
    out = [t for slot in outputs for t in values[slot].tensors]
    top = None
    if config.HasField("top_mlp"):
        width = _concat_width(out, where + ".top_mlp")
        top = MLP(width, mlp_options(config.top_mlp, where + ".top_mlp"))
    net = BackboneNet([len(v.tensors) for v in values[:len(used)]], nodes, outputs,
                      concat, top, packages.nets, calls)
    with torch.no_grad():
        net.eval()
        example = net([t for v in values[:len(used)] for t in v.tensors])
        net.train()
    kind = LIST if not net.concat and len(example) > 1 else TENSOR
    return net, used, Value(kind, tuple(example))


def _concat_width(tensors: list[torch.Tensor], where: str) -> int:
    if any(t.dim() != 2 for t in tensors):
        raise ModelError(f"{where}: reads (B, D) outputs, got shapes "
                         f"{[tuple(t.shape[1:]) for t in tensors]}; flatten them first")
    return sum(int(t.shape[-1]) for t in tensors)
