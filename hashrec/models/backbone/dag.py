"""The block DAG of a configurable backbone (TorchEasyRec's ``BackboneTower``): build
order, checks and the scriptable network.

A block reads its ``inputs`` (feature groups by ``feature_group_name``, other blocks by
``block_name``), each through its optional ``input_slice`` then ``input_fn``; one input
is taken as it is; several are concatenated along ``input_concat_axis`` when all are
tensors, joined into one list when some are lists, or, with ``merge_inputs_into_list``,
made a list of the (tensor) inputs. ``extra_input_fn`` then maps the merged input, and
the block's layer (``module``, ``lambda``, ``repeat``, ``recurrent``, or the sequence of
``layers``) maps it to the block's output; a block without one passes it on, and an
``input_layer`` block passes on its feature group. Blocks run in an order where every
block follows its inputs (config order among the ready ones).

The backbone's output is the ``output_blocks``' outputs as a list, else the
``concat_blocks``' outputs (else, as in TorchEasyRec, those of every block no other block
reads) concatenated on the last axis where all are tensors, joined into one list where
some are lists (an ``MMoE`` module's); ``top_mlp`` then maps it (a list concatenated
first).

Modules are sized by running each block once on example inputs of two rows while the
DAG is built; the network itself only runs tensor ops of fixed shapes (no host reads),
for the CUDA graphs, and is scriptable for the export.
"""

import logging

import torch
from torch import nn

from hashrec.models.backbone.blocks import BlockNode, build_block
from hashrec.models.backbone.lambdas import LIST, TENSOR
from hashrec.models.backbone.layers import SEQUENCE, Value
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP, WIDE, GroupSpec
from hashrec.models.mlp_config import mlp_options
from hashrec.modules import MLP

logger = logging.getLogger(__name__)


def block_order(blocks, groups, where: str) -> list:
    """The blocks (``Block`` messages) in run order.

    Raises:
        ModelError: a block without a name or inputs, two blocks of one name, an input
            naming no feature group or block, a package input, or a cycle (named).
    """
    by_name = {}
    for block in blocks:
        if not block.name:
            raise ModelError(f"{where}.blocks: a block has no name")
        if block.name in by_name:
            raise ModelError(f"{where}.blocks: two blocks are named {block.name!r}")
        by_name[block.name] = block
    needs = {}
    for block in blocks:
        if not block.inputs:
            raise ModelError(f"{where}.blocks[{block.name!r}] has no inputs; give it a "
                             f"feature_group_name or block_name input")
        needs[block.name] = [_input_block(i, block.name, by_name, groups, where)
                             for i in block.inputs]
    order, done = [], set()
    while len(order) < len(blocks):
        ready = [b for b in blocks if b.name not in done
                 and all(n is None or n in done for n in needs[b.name])]
        if not ready:
            cycle = _cycle({n: [m for m in needs[n] if m and m not in done]
                            for n in needs if n not in done})
            raise ModelError(f"{where}: blocks {' -> '.join(cycle)} form a cycle; a block "
                             f"cannot read its own output")
        order.append(ready[0])
        done.add(ready[0].name)
    return order


def _input_block(config, block: str, by_name: dict, groups, where: str) -> str | None:
    """The block an input reads (None for a feature group)."""
    kind = config.WhichOneof("name")
    if kind in ("package_name", "use_package_input") or config.HasField("package_input"):
        raise ModelError(f"{where}.blocks[{block!r}]: package inputs are not implemented "
                         f"in HashRec; write the package's blocks into the backbone")
    if kind == "feature_group_name":
        if config.feature_group_name not in groups:
            raise ModelError(f"{where}.blocks[{block!r}]: feature_group_name "
                             f"{config.feature_group_name!r} is not a feature group "
                             f"(groups: {', '.join(groups) or 'none'})")
        return None
    if kind == "block_name":
        if config.block_name not in by_name:
            raise ModelError(f"{where}.blocks[{block!r}]: block_name {config.block_name!r} "
                             f"is not a block (blocks: {', '.join(by_name)})")
        return config.block_name
    raise ModelError(f"{where}.blocks[{block!r}]: an input names nothing; set "
                     f"feature_group_name or block_name")


def _cycle(edges: dict[str, list[str]]) -> list[str]:
    """One cycle of the graph ``edges`` (block -> the blocks it reads), closed."""
    start = next(iter(edges))
    path = [start]
    while True:
        nxt = edges[path[-1]][0]
        if nxt in path:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)


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
        blocks: the ``BlockNode`` of each block, in run order.
        outputs: the value slots of the output blocks.
        concat: concatenate the outputs on the last axis (else a list).
        top_mlp: the MLP over the (concatenated) output, or None.
    """

    group_sizes: list[int]
    outputs: list[int]

    def __init__(self, group_sizes: list[int], blocks: list[BlockNode], outputs: list[int],
                 concat: bool, top_mlp: nn.Module | None) -> None:
        super().__init__()
        self.group_sizes = group_sizes
        self.blocks = nn.ModuleList(blocks)
        self.outputs = outputs
        self.concat = concat or top_mlp is not None
        self.has_top = top_mlp is not None
        self.top_mlp = top_mlp if top_mlp is not None else nn.Identity()

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        values: list[list[torch.Tensor]] = []
        start = 0
        for size in self.group_sizes:
            values.append(inputs[start:start + size])
            start += size
        for block in self.blocks:
            values.append(block(values))
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
        ModelError: packages, a bad block (see ``block_order`` and ``build_block``), an
            output naming no block, or a list output into top_mlp of unequal ranks.
    """
    if config.packages:
        raise ModelError(f"{where}.packages: block packages are not implemented in "
                         f"HashRec; write their blocks into {where}.blocks")
    if not config.blocks:
        raise ModelError(f"{where} has no blocks")
    order = block_order(config.blocks, groups, where)
    used = [n for n in groups if any(
        i.WhichOneof("name") == "feature_group_name" and i.feature_group_name == n
        for b in config.blocks for i in b.inputs)]
    unused = [n for n in groups if n not in used]
    if unused:
        raise ModelError(f"{where}: feature groups {unused} feed no block and would be left "
                         f"out of the model; read them in a block, or remove them")
    slots = {f"group:{n}": i for i, n in enumerate(used)}
    values = [group_value(groups[n]) for n in used]
    group_types = {n: groups[n].group_type for n in used}
    nodes = []
    for block in order:
        node, value = build_block(block, slots, values, group_types, f"{where}.blocks"
                                  f"[{block.name!r}]")
        slots[f"block:{block.name}"] = len(values)
        values.append(value)
        nodes.append(node)
    names, concat = _outputs(config, order, where)
    outputs = [slots[f"block:{n}"] for n in names]
    # as TorchEasyRec merges outputs: tensors concatenated, any list joins them into one
    concat = concat and all(values[slot].kind == TENSOR for slot in outputs)
    out = [t for slot in outputs for t in values[slot].tensors]
    top = None
    if config.HasField("top_mlp"):

        width = _concat_width(out, where + ".top_mlp")
        top = MLP(width, mlp_options(config.top_mlp, where + ".top_mlp"))
    net = BackboneNet([len(v.tensors) for v in values[:len(used)]], nodes, outputs,
                      concat, top)
    with torch.no_grad():
        net.eval()
        example = net([t for v in values[:len(used)] for t in v.tensors])
        net.train()
    kind = LIST if not net.concat and len(example) > 1 else TENSOR
    return net, used, Value(kind, tuple(example))


def _outputs(config, order, where: str) -> tuple[list[str], bool]:
    """(the output blocks, whether they are concatenated)."""
    names = {b.name for b in order}
    chosen, concat = (list(config.output_blocks), False) if config.output_blocks \
        else (list(config.concat_blocks), True)
    if config.output_blocks and config.concat_blocks:
        raise ModelError(f"{where}: both concat_blocks and output_blocks are set; "
                         f"output_blocks would win (as in TorchEasyRec): keep one")
    for name in chosen:
        if name not in names:
            field = "concat_blocks" if concat else "output_blocks"
            raise ModelError(f"{where}.{field}: {name!r} is not a block (blocks: "
                             f"{', '.join(names)})")
    if not chosen:
        read = {i.block_name for b in order for i in b.inputs
                if i.WhichOneof("name") == "block_name"}
        chosen = [b.name for b in order if b.name not in read]
        logger.warning("%s sets neither concat_blocks nor output_blocks: concatenating "
                       "the blocks no other block reads: %s", where, ", ".join(chosen))
    return chosen, concat


def _concat_width(tensors: list[torch.Tensor], where: str) -> int:
    if any(t.dim() != 2 for t in tensors):
        raise ModelError(f"{where}: reads (B, D) outputs, got shapes "
                         f"{[tuple(t.shape[1:]) for t in tensors]}; flatten them first")
    return sum(int(t.shape[-1]) for t in tensors)
