"""MLP config messages -> MLP options and modules, for every model."""

from __future__ import annotations

from hashrec.models.errors import ModelError
from hashrec.modules import MLP, MLPOptions


def mlp_options(mlp_config, where: str) -> MLPOptions:
    """Convert an ``MLP`` config message into MLPOptions.

    Raises:
        ModelError: the options are invalid; the message names ``where``.
    """
    try:
        return MLPOptions(
            hidden_units=tuple(mlp_config.hidden_units),
            dropout_ratio=tuple(mlp_config.dropout_ratio),
            activation=mlp_config.activation,
            use_bn=mlp_config.use_bn,
            use_ln=mlp_config.use_ln,
            bias=mlp_config.bias,
        )
    except ValueError as err:
        raise ModelError(f"{where}: {err}") from err


def optional_mlp(config, field: str, width: int, where: str) -> tuple[MLP | None, int]:
    """The MLP of the optional ``MLP`` field ``config.<field>`` over ``width`` inputs:
    (the MLP, its output width), or (None, ``width``) where the field is unset."""
    if not config.HasField(field):
        return None, width
    mlp = MLP(width, mlp_options(getattr(config, field), where))
    return mlp, mlp.output_dim()
