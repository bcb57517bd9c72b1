"""What ``model_config.dlrm_hstu`` asks for that HashRec refuses before any data is read.

dlrm_hstu (``hashrec.models.dlrm_hstu``) builds TorchEasyRec's HSTU settings for a ranking
model: the contextual (and contextual interleave) preprocessor, the positional encoder,
the STU layers, the output postprocessor, the item embedding MLP and the fusion tower's
tasks. Each message names the field and what it may hold. (Semi-local attention,
attention truncation and MoT channel names are refused by ``hashrec.config.unused``.)
"""

from __future__ import annotations

from hashrec.config.hstu_match import (
    actions_problems,
    contextualized_mlp_problems,
    positional_problems,
    postprocessor_problems,
    ratio_problems,
    stu_problems,
)

WHERE = "model_config.dlrm_hstu"
PREPROCESSORS = ("contextual_preprocessor", "contextual_interleave_preprocessor")


def dlrm_hstu_problems(model_config) -> list[str]:
    """One message per refused setting of ``model_config.dlrm_hstu``."""
    config = model_config.dlrm_hstu
    problems = []
    if config.max_seq_len < 1:
        problems.append(f"{WHERE}.max_seq_len is {config.max_seq_len}; set it to the longest "
                        f"history plus candidates, 1 or more (the attention divides by it)")
    if config.item_embedding_hidden_dim < 1:
        problems.append(f"{WHERE}.item_embedding_hidden_dim is "
                        f"{config.item_embedding_hidden_dim}; it must be 1 or more")
    hstu = config.hstu
    where = f"{WHERE}.hstu"
    problems += stu_problems(hstu.stu, f"{where}.stu")
    if hstu.attn_num_layers < 1:
        problems.append(f"{where}.attn_num_layers is 0; it must be 1 or more")
    problems += ratio_problems(hstu.input_dropout_ratio, f"{where}.input_dropout_ratio")
    problems += positional_problems(hstu.positional_encoder, f"{where}.positional_encoder")
    problems += _preprocessor_problems(hstu.input_preprocessor, f"{where}.input_preprocessor")
    problems += postprocessor_problems(hstu.output_postprocessor,
                                       f"{where}.output_postprocessor")
    problems += _task_problems(config.fusion_mtl_tower, f"{WHERE}.fusion_mtl_tower")
    return problems


def _preprocessor_problems(preprocessor, where: str) -> list[str]:
    kind = preprocessor.WhichOneof("input_preprocessor")
    if kind not in PREPROCESSORS:
        return [f"{where}.{kind} is not supported by dlrm_hstu (hstu_match reads it); use "
                f"{' or '.join(PREPROCESSORS)}"]
    options = getattr(preprocessor, kind)
    where = f"{where}.{kind}"
    problems = _content_problems(options.content_encoder, f"{where}.content_encoder")
    problems += contextualized_mlp_problems(options.content_mlp, f"{where}.content_mlp")
    interleave = kind == PREPROCESSORS[1] and options.enable_interleaving
    problems += actions_problems(options, where)
    if interleave and not options.HasField("action_encoder") \
            and not options.HasField("action_mlp"):
        problems.append(f"{where}.enable_interleaving makes each position's actions a "
                        f"token of its own: set action_encoder and action_mlp")
    return problems


def _content_problems(encoder, where: str) -> list[str]:
    kind = encoder.WhichOneof("content_encoder")
    if kind is None:
        return [f"{where} sets no encoder; use slice_content_encoder {{}}, "
                f"pad_content_encoder {{}} or mlp_content_encoder {{ uih_mlp target_mlp }}"]
    if kind != "mlp_content_encoder":
        return []
    problems = []
    for name in ("uih_mlp", "target_mlp"):
        mlp = getattr(encoder.mlp_content_encoder, name)
        if not mlp.hidden_units:
            problems.append(f"{where}.mlp_content_encoder.{name} has no hidden_units; list "
                            f"its layers' widths (the last is the content's width)")
    return problems


def _task_problems(tower, where: str) -> list[str]:
    if not tower.task_configs:
        return [f"{where} has no task_configs; add one per task (task_name, label_name, "
                f"losses, metrics)"]
    problems = []
    for i, task in enumerate(tower.task_configs):
        if task.num_class < 1:
            problems.append(f"{where}.task_configs[{i}].num_class is 0; it must be 1 or more")
    return problems
