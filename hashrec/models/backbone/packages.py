"""Block packages (TorchEasyRec's ``BlockPackage``): a sub-DAG of blocks that the
backbone's blocks call, each call running the same modules (shared parameters), as for
contrastive learning over two dropped-out views of one tower.

A block input ``package_name: P`` calls package P; its value is P's output
(``output_blocks`` a list, else ``concat_blocks`` or the blocks no other reads,
concatenated). The call's ``package_input`` (a backbone block, or another package, called
without an input) through ``package_input_fn`` is what P's blocks read with
``use_package_input: true``; P's blocks also read feature groups and P's own blocks. A
call's ``reset_input`` replaces the options of every ``input_layer`` block of P for that
call (``reset_input {}``: none, e.g. no dropout for the main model's view). Dropout draws
anew at each call.

The package's modules are built at its first call, on that call's input; every call
must give an input of the same shapes.
"""

import torch
from torch import nn

from hashrec.models.backbone.blocks import BlockNode, Chain, _lambda, build_block
from hashrec.models.backbone.lambdas import LIST, TENSOR
from hashrec.models.backbone.layers import Value
from hashrec.models.backbone.order import block_order, output_blocks
from hashrec.models.errors import ModelError


def gather_outputs(values: list[list[torch.Tensor]], outputs: list[int],
                   concat: bool) -> list[torch.Tensor]:
    """The values of the slots ``outputs`` as one list, concatenated on the last axis
    where ``concat``."""
    out: list[torch.Tensor] = []
    for slot in outputs:
        out.extend(values[slot])
    if concat and len(out) > 1:
        return [torch.cat(out, dim=-1)]
    return out


class PackageNet(nn.Module):
    """A package: ``forward(groups, package_input, variant)`` -> its output value.

    ``groups``: the feature groups' values (the backbone's first slots); the package
    input takes the next slot, its blocks the ones after.
    """

    outputs: list[int]

    def __init__(self, blocks: list[BlockNode], outputs: list[int], concat: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.outputs = outputs
        self.concat = concat

    def forward(self, groups: list[list[torch.Tensor]], package_input: list[torch.Tensor],
                variant: int) -> list[torch.Tensor]:
        values = [v for v in groups]
        values.append(package_input)
        for block in self.blocks:
            values.append(block(values, variant))
        return gather_outputs(values, self.outputs, self.concat)


class PackageCall(nn.Module):
    """The input of a package call: ``forward(values)`` -> the value of slot ``slot``
    through ``package_input_fn`` (an empty list for a call without package_input)."""

    def __init__(self, slot: int, prepare: nn.Module) -> None:
        super().__init__()
        self.slot = slot
        self.prepare = prepare

    def forward(self, values: list[list[torch.Tensor]], variant: int = 0
                ) -> list[torch.Tensor]:
        if self.slot < 0:
            return []
        return self.prepare(values[self.slot])


class Packages:
    """Builds the packages of a ``BackboneTower`` as the backbone's blocks call them.

    Args:
        config: the ``BackboneTower``.
        groups: ``GroupSpec`` of every feature group.
        where: the config path, for errors.
    """

    def __init__(self, config, groups: dict, where: str) -> None:
        self.where = where
        self.groups = groups
        self.configs = {}
        for i, package in enumerate(config.packages):
            at = f"{where}.packages[{i}]"
            if not package.name:
                raise ModelError(f"{at} has no name")
            if package.name in self.configs:
                raise ModelError(f"{where}.packages: two packages are named {package.name!r}")
            if not package.blocks:
                raise ModelError(f"{at} ({package.name!r}) has no blocks")
            self.configs[package.name] = package
        self.resets = {name: [] for name in self.configs}
        calls = [i for b in config.blocks for i in b.inputs
                 if i.WhichOneof("name") == "package_name"]
        for call in calls:
            if call.package_name in self.resets and call.HasField("reset_input"):
                text = call.reset_input.SerializeToString(deterministic=True)
                if text not in [r.SerializeToString(deterministic=True)
                                for r in self.resets[call.package_name]]:
                    self.resets[call.package_name].append(call.reset_input)
        called = {c.package_name for c in calls} | {
            c.package_input for c in calls if c.HasField("package_input")}
        unused = [n for n in self.configs if n not in called]
        if unused:
            raise ModelError(f"{where}.packages: {unused} are never called; call them with "
                             f"an input package_name: NAME, or remove them")
        self.built: dict[str, tuple[int, Value | None]] = {}
        self.nets: list[PackageNet] = []

    @property
    def names(self) -> set[str]:
        return set(self.configs)

    def groups_read(self) -> set[str]:
        """The feature groups the packages' blocks read."""
        return {i.feature_group_name for p in self.configs.values() for b in p.blocks
                for i in b.inputs if i.WhichOneof("name") == "feature_group_name"}

    def call(self, config, slots: dict, values: list, emit, where: str) -> int:
        """Add the call of the package an ``Input`` message names; its slot.

        ``slots``: the backbone's slots so far; ``values``: their example values;
        ``emit(call, package index, variant, example output) -> slot`` adds a call to the
        backbone. A call whose package_input is a package emits that call first.
        """
        name = config.package_name
        source = config.package_input if config.HasField("package_input") else ""
        call, value = PackageCall(-1, Chain([])), None
        if source:
            slot = slots.get(f"block:{source}")
            if slot is None:
                inner = self._package(source, None, slots, values, where + ".package_input")
                slot = emit(PackageCall(-1, Chain([])), inner, 0,
                            self._run(self.nets[inner], slots, values, None, 0))
            prepare, value = Chain([]), values[slot]
            if config.HasField("package_input_fn"):
                op, value = _lambda(config.package_input_fn, value,
                                    where + ".package_input_fn")
                prepare = Chain([op])
            call = PackageCall(slot, prepare)
        elif config.HasField("package_input_fn"):
            raise ModelError(f"{where}.package_input_fn without package_input; name the "
                             f"block or package whose output the package reads")
        variant = 0
        if config.HasField("reset_input"):
            text = config.reset_input.SerializeToString(deterministic=True)
            variant = 1 + [r.SerializeToString(deterministic=True)
                           for r in self.resets[name]].index(text)
        index = self._package(name, value, slots, values, where)
        return emit(call, index, variant,
                    self._run(self.nets[index], slots, values, value, variant))

    def _package(self, name: str, value: Value | None, slots: dict, values: list,
                 where: str) -> int:
        """The index of package ``name``, built on its first call (input ``value``)."""
        if name in self.built:
            index, first = self.built[name]
            if _shapes(first) != _shapes(value):
                raise ModelError(f"{where}: package {name!r} is called with an input of "
                                 f"shapes {_shapes(value)} but was built for {_shapes(first)}"
                                 f"; its calls share its modules, so give them one shape")
            return index
        self.nets.append(self._build(self.configs[name], value, slots, values))
        self.built[name] = (len(self.nets) - 1, value)
        return len(self.nets) - 1

    def _build(self, config, value: Value | None, main_slots: dict, main_values: list
               ) -> PackageNet:
        where = f"{self.where}.packages[{config.name!r}]"
        order = block_order(config.blocks, self.groups, where)
        slots = {k: v for k, v in main_slots.items() if k.startswith("group:")}
        values = main_values[:len(slots)]
        if value is not None:
            slots["input"] = len(values)
        values.append(value if value is not None else Value(LIST, ()))
        nodes = []
        for block in order:
            node, out = build_block(block, slots, values, self.groups,
                                    f"{where}.blocks[{block.name!r}]",
                                    resets=tuple(self.resets[config.name]))
            slots[f"block:{block.name}"] = len(values)
            values.append(out)
            nodes.append(node)
        names, concat = output_blocks(config, order, where)
        outputs = [slots[f"block:{n}"] for n in names]
        concat = concat and all(values[s].kind == TENSOR for s in outputs)
        return PackageNet(nodes, outputs, concat)

    @staticmethod
    def _run(net: PackageNet, slots: dict, values: list, value: Value | None,
             variant: int) -> Value:
        """An example of the output of ``net`` on the backbone's example values."""
        groups = [list(v.tensors) for v in values[:sum(k.startswith("group:") for k in slots)]]
        training = net.training
        with torch.no_grad():
            net.eval()
            out = net(groups, list(value.tensors) if value is not None else [], variant)
            net.train(training)
        kind = LIST if not net.concat and len(out) > 1 else TENSOR
        return Value(kind, tuple(out))


def _shapes(value: Value | None):
    if value is None:
        return None
    return value.kind, [tuple(t.shape[1:]) for t in value.tensors]
