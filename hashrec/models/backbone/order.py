"""The run order of a backbone's (or a block package's) blocks and its output blocks."""

import logging

from hashrec.models.errors import ModelError

logger = logging.getLogger(__name__)


def block_order(blocks, groups, where: str, packages=None) -> list:
    """The blocks (``Block`` messages) in run order: every block after the blocks it
    reads (config order among the ready ones).

    ``packages``: the names of the block packages a block may call (``package_name``),
    for the backbone's blocks; None for a package's own blocks, which may read the
    package's input (``use_package_input``) instead.

    Raises:
        ModelError: a block without a name or inputs, two blocks of one name, an input
            naming no feature group, block or package, or a cycle (named).
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
        needs[block.name] = [_input_block(i, block.name, by_name, groups, packages, where)
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


def _input_block(config, block: str, by_name: dict, groups, packages,
                 where: str) -> str | None:
    """The block an input reads (None for a feature group, a package's input, or a
    package call without a block as its package_input)."""
    kind = config.WhichOneof("name")
    at = f"{where}.blocks[{block!r}]"
    if kind == "use_package_input":
        if packages is not None:
            raise ModelError(f"{at}: use_package_input reads a package's input; only a "
                             f"block of a package (backbone.packages) can read it")
        if not config.use_package_input:
            raise ModelError(f"{at}: use_package_input: false names nothing; set it true "
                             f"or name a feature_group_name or block_name")
        return None
    if kind == "package_name":
        if packages is None:
            raise ModelError(f"{at}: a package's block calls package "
                             f"{config.package_name!r}; packages are called from the "
                             f"backbone's blocks only (pass its output in as package_input)")
        if config.package_name not in packages:
            raise ModelError(f"{at}: package_name {config.package_name!r} is not a package "
                             f"(packages: {', '.join(packages) or 'none'})")
        source = config.package_input if config.HasField("package_input") else ""
        if source and source not in by_name and source not in packages:
            raise ModelError(f"{at}: package_input {source!r} is neither a block nor a "
                             f"package (blocks: {', '.join(by_name)})")
        return source if source in by_name else None
    if kind == "feature_group_name":
        if config.feature_group_name not in groups:
            raise ModelError(f"{at}: feature_group_name {config.feature_group_name!r} is not "
                             f"a feature group (groups: {', '.join(groups) or 'none'})")
        return None
    if kind == "block_name":
        if config.block_name not in by_name:
            inside = "" if packages is not None else (
                "; a package reads its own blocks, feature groups and use_package_input "
                "(pass a backbone block in as the call's package_input)")
            raise ModelError(f"{at}: block_name {config.block_name!r} is not a block "
                             f"(blocks: {', '.join(by_name)}){inside}")
        return config.block_name
    raise ModelError(f"{at}: an input names nothing; set feature_group_name or block_name")


def _cycle(edges: dict[str, list[str]]) -> list[str]:
    """One cycle of the graph ``edges`` (block -> the blocks it reads), closed."""
    start = next(iter(edges))
    path = [start]
    while True:
        nxt = edges[path[-1]][0]
        if nxt in path:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)


def output_blocks(config, order, where: str) -> tuple[list[str], bool]:
    """(the output blocks of a ``BackboneTower`` or ``BlockPackage``, whether they are
    concatenated): ``output_blocks`` (a list), else ``concat_blocks``, else every block
    no other block reads, concatenated (as in TorchEasyRec)."""
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
