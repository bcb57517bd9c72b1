"""Where a match model's options live in its config."""

from __future__ import annotations


def match_params(model_config):
    """The message holding the match model's ``output_dim``, ``similarity``,
    ``temperature`` and ``in_batch_negative``: ``match_backbone.model_params`` (its
    defaults where unset), the model's own message for the other match models."""
    kind = model_config.WhichOneof("model")
    model = getattr(model_config, kind)
    return model.model_params if kind == "match_backbone" else model
