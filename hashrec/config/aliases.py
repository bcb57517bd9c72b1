"""Second names of config fields: names that TorchEasyRec's example configs use for a
field HashRec (and TorchEasyRec's own message) names otherwise.

A config may set a field or its second name, not both; :func:`aliased` reads whichever
is set, and :func:`alias_problems` words what is wrong with a pair for
``validate_pipeline_config``.
"""

from __future__ import annotations

from hashrec.config.errors import ConfigError

# Message name -> (field, its second name, whether one of the two must be set).
# DLRM: TorchEasyRec's example dlrm_criteo writes bot_mlp and top_mlp, while its DLRM
# message, like HashRec's, names them dense_mlp and final.
ALIASES: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "DLRM": (("dense_mlp", "bot_mlp", False), ("final", "top_mlp", True)),
}


def _pair_problem(message, where: str, name: str, alias: str, required: bool) -> str | None:
    both = message.HasField(name), message.HasField(alias)
    if all(both):
        return (f"{where} sets both {name} and {alias}, which is a second name of {name} "
                f"(TorchEasyRec's examples write it); keep one")
    if required and not any(both):
        return f"{where}.{name} (or its second name {alias}) is not set; set it"
    return None


def alias_problems(where: str, message) -> list[str]:
    """One message per field pair of ``message`` (at config path ``where``) that sets both
    names, or neither where one is needed."""
    problems = []
    for name, alias, required in ALIASES.get(message.DESCRIPTOR.name, ()):
        problem = _pair_problem(message, where, name, alias, required)
        if problem:
            problems.append(problem)
    return problems


def aliased(message, name: str, where: str, error: type[Exception] = ConfigError):
    """Field ``name`` of ``message`` or, where that is unset, its second name's value;
    None where neither is set.

    Raises:
        ``error`` (ConfigError by default; a layer above passes its own): both names are
            set, or neither where one is needed (the message names ``where``).
    """
    for field, alias, required in ALIASES.get(message.DESCRIPTOR.name, ()):
        if field == name:
            problem = _pair_problem(message, where, name, alias, required)
            if problem:
                raise error(problem)
            if message.HasField(alias):
                return getattr(message, alias)
            break
    return getattr(message, name) if message.HasField(name) else None
