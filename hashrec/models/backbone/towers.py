"""A match backbone's two towers, told apart in its config (no modules built).

The backbone's two ``output_blocks`` are the user tower's and the item tower's blocks: a
name holding "user" (any case) is the user tower's, one holding "item" or "product" the
item tower's; where neither name tells its tower, the first is the user's and the second
the item's. A tower is its output block and every block, block package and feature group
that block depends on (through ``block_name`` inputs, package calls and their
``package_input``, and the feature groups a called package's blocks read). The two must
be apart: no block, package or feature group may feed both, so that each tower runs,
trains and exports alone with its own feature groups' tables only. Every block and
feature group must feed a tower.
"""

from dataclasses import dataclass

from hashrec.models.backbone.order import block_order
from hashrec.models.errors import ModelError

USER, ITEM = "user", "item"


@dataclass(frozen=True)
class TowerPart:
    """What one tower of a match backbone is made of.

    Attributes:
        tower: "user" or "item".
        block: its output block.
        blocks: the blocks it runs (config order), its output block among them.
        packages: the block packages its blocks call (config order).
        groups: the feature groups it reads (in ``group_names`` order).
    """

    tower: str
    block: str
    blocks: tuple[str, ...]
    packages: tuple[str, ...]
    groups: tuple[str, ...]


def tower_roles(config, where: str) -> dict[str, str]:
    """``{"user": block, "item": block}`` of the ``BackboneTower`` ``config``'s
    ``output_blocks`` (see the module docstring).

    Raises:
        ModelError: not two output blocks, concat_blocks or top_mlp set, or names that
            tell the towers ambiguously.
    """
    names = list(config.output_blocks)
    field = f"{where}.output_blocks"
    if config.concat_blocks:
        raise ModelError(f"{where}.concat_blocks: a match backbone gives two outputs, the "
                         f"user tower's and the item tower's blocks: name them in "
                         f"output_blocks, not concat_blocks")
    if config.HasField("top_mlp"):
        raise ModelError(f"{where}.top_mlp would join the two towers' outputs; a match "
                         f"backbone's towers stay apart: remove it (end each tower with its "
                         f"own MLP block)")
    if len(names) != 2 or names[0] == names[1]:
        raise ModelError(f"{field} is {names}; a match backbone names two blocks: the user "
                         f"tower's and the item tower's")
    roles = [_role(name) for name in names]
    if any(role == "both" for role in roles):
        name = names[roles.index("both")]
        raise ModelError(f"{field}: {name!r} holds both 'user' and 'item' (or 'product'), "
                         f"so it names no one tower; rename it")
    if roles == [None, None]:
        return {USER: names[0], ITEM: names[1]}
    if roles[0] == roles[1] or None in roles:
        told = ", ".join(f"{n!r} ({r or 'neither'})" for n, r in zip(names, roles))
        raise ModelError(f"{field}: {told}; name one block with 'user' and the other with "
                         f"'item' (or 'product'), or neither (then the first is the user "
                         f"tower's, the second the item tower's)")
    return {role: name for name, role in zip(names, roles)}


def _role(name: str) -> str | None:
    lower = name.lower()
    user = "user" in lower
    item = "item" in lower or "product" in lower
    if user and item:
        return "both"
    return USER if user else ITEM if item else None


def split_towers(config, group_names, where: str) -> dict[str, TowerPart]:
    """The user and the item ``TowerPart`` of the ``BackboneTower`` ``config`` over the
    feature groups ``group_names``.

    Raises:
        ModelError: bad output blocks (``tower_roles``), a bad block DAG
            (``block_order``), a block, package or feature group feeding both towers
            (naming the block that reads it), or one feeding neither.
    """
    roles = tower_roles(config, where)
    block_order(config.blocks, list(group_names), where, {p.name for p in config.packages})
    blocks = {b.name: b for b in config.blocks}
    packages = {p.name: p for p in config.packages}
    reads = {("block", name): _block_reads(block) for name, block in blocks.items()}
    reads.update({("package", name): _package_reads(package)
                  for name, package in packages.items()})
    closures = {tower: _closure(("block", name), reads) for tower, name in roles.items()}
    _check_apart(closures, reads, roles, where)
    parts = {}
    for tower, closure in closures.items():
        parts[tower] = TowerPart(
            tower, roles[tower],
            tuple(n for n in blocks if ("block", n) in closure),
            tuple(n for n in packages if ("package", n) in closure),
            tuple(n for n in group_names if ("group", n) in closure))
    _check_all_used(parts, blocks, packages, group_names, where)
    return parts


def _block_reads(block) -> list[tuple[str, str]]:
    """What a backbone block reads directly: ("block" | "package" | "group", name)."""
    out = []
    for item in block.inputs:
        kind = item.WhichOneof("name")
        if kind == "feature_group_name":
            out.append(("group", item.feature_group_name))
        elif kind == "block_name":
            out.append(("block", item.block_name))
        elif kind == "package_name":
            out.append(("package", item.package_name))
            if item.package_input:
                # a block, or another package called without an input: told by the names
                # of the backbone's blocks (``_resolve``)
                out.append(("source", item.package_input))
    return out


def _package_reads(package) -> list[tuple[str, str]]:
    """The feature groups a package's blocks read (its own blocks and its input are the
    package's, not the backbone's)."""
    return [("group", i.feature_group_name) for b in package.blocks for i in b.inputs
            if i.WhichOneof("name") == "feature_group_name"]


def _closure(start: tuple[str, str], reads: dict) -> set[tuple[str, str]]:
    """``start`` and everything it depends on."""
    seen, todo = set(), [start]
    while todo:
        node = _resolve(todo.pop(), reads)
        if node in seen:
            continue
        seen.add(node)
        todo.extend(reads.get(node, ()))
    return seen


def _resolve(node: tuple[str, str], reads: dict) -> tuple[str, str]:
    """A package call's ``package_input`` ("source", name) as the block or the package it
    names; any other node as it is."""
    if node[0] == "source":
        return ("block", node[1]) if ("block", node[1]) in reads else ("package", node[1])
    return node


def _check_apart(closures: dict, reads: dict, roles: dict, where: str) -> None:
    """Refuses a block (or package) of one tower that reads what the other tower depends
    on too, naming the block, what it reads and both towers' output blocks."""
    shared = closures[USER] & closures[ITEM]
    if not shared:
        return
    for tower, other in ((USER, ITEM), (ITEM, USER)):
        for node in sorted(closures[tower] - shared):
            for read in (_resolve(r, reads) for r in reads.get(node, ())):
                if read in shared:
                    what = "feature group" if read[0] == "group" else read[0]
                    raise ModelError(
                        f"{where}.blocks[{node[1]!r}] of the {tower} tower (output block "
                        f"{roles[tower]!r}) reads {what} {read[1]!r}, which the {other} "
                        f"tower (output block {roles[other]!r}) depends on too; each tower "
                        f"reads its own blocks and feature groups only, so that it exports "
                        f"alone with its own tables: give each tower its own")
    # an output block inside the other tower: that tower's blocks read it
    raise ModelError(f"{where}.output_blocks: the user tower ({roles[USER]!r}) and the item "
                     f"tower ({roles[ITEM]!r}) depend on the same blocks "
                     f"{sorted(n for _, n in shared)}; give each tower its own")


def _check_all_used(parts: dict, blocks: dict, packages: dict, group_names,
                    where: str) -> None:
    used_blocks = {n for p in parts.values() for n in p.blocks}
    idle = [n for n in blocks if n not in used_blocks]
    if idle:
        raise ModelError(f"{where}.blocks {idle} feed neither tower's output block "
                         f"({parts[USER].block!r}, {parts[ITEM].block!r}); remove them")
    used_packages = {n for p in parts.values() for n in p.packages}
    idle = [n for n in packages if n not in used_packages]
    if idle:
        raise ModelError(f"{where}.packages {idle} are called by neither tower; remove them")
    used_groups = {n for p in parts.values() for n in p.groups}
    idle = [n for n in group_names if n not in used_groups]
    if idle:
        raise ModelError(f"{where}: feature groups {idle} feed neither tower and would be "
                         f"left out of the model; read them in a tower's block, or remove "
                         f"them")


def tower_config(config, part: TowerPart):
    """The ``BackboneTower`` of ``part`` alone: its packages and blocks (config order),
    its block the one output."""
    out = type(config)()
    out.packages.extend(p for p in config.packages if p.name in part.packages)
    out.blocks.extend(b for b in config.blocks if b.name in part.blocks)
    out.output_blocks.append(part.block)
    return out
