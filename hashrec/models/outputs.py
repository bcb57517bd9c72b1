"""A ranking model's outputs from its logits, shared by the model and its exported
TorchScript form (``hashrec.export.scripted.build``), so that the two cannot drift apart.

No ``from __future__ import annotations`` here: TorchScript reads these functions'
annotations as types.
"""

import torch


def split_task_logits(logits: torch.Tensor, num_classes: list[int],
                      multi_task: bool) -> list[torch.Tensor]:
    """The dense network's logits -> each task's: (B,) for one logit, (B, C) for C
    classes; a multi-task model's tasks have their ``num_class`` columns side by side."""
    if not multi_task:
        return [logits]
    out: list[torch.Tensor] = []
    start = 0
    for width in num_classes:
        out.append(logits[:, start] if width == 1 else logits[:, start:start + width])
        start += width
    return out


def task_outputs(task_logits: list[torch.Tensor], suffixes: list[str],
                 regression: list[bool]) -> dict[str, torch.Tensor]:
    """Each task's outputs, name + its suffix: ``logits``; then ``y`` (the logits, a
    regression task), or ``probs`` = the softmax of (B, C) logits and with two classes
    ``probs1`` = probs[:, 1], or ``probs`` = the sigmoid of (B,) logits."""
    out: dict[str, torch.Tensor] = {}
    for i, suffix in enumerate(suffixes):
        logits = task_logits[i]
        out["logits" + suffix] = logits
        if regression[i]:
            out["y" + suffix] = logits
        elif logits.dim() == 2:
            probs = torch.softmax(logits, dim=-1)
            out["probs" + suffix] = probs
            if logits.shape[1] == 2:
                out["probs1" + suffix] = probs[:, 1]
        else:
            out["probs" + suffix] = torch.sigmoid(logits)
    return out
