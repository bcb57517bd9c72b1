"""The scripted dense network of dlrm_hstu (``hashrec.models.dlrm_hstu``): its network
over the history, the contextual features, the history's actions, watch times and
timestamps, the candidates and their request times -> each candidate slot's logits
(B * K, T), as the model computes them (the inference model gives each output a row's
K slots, ``InferenceModel.candidates``)."""

import torch
from torch import nn

from hashrec.export.scripted.heads import DeepGroup, SequenceGroup, Tensors
from hashrec.export.scripted.hstu_head import SequenceValues
from hashrec.models.dlrm_hstu import CANDIDATE_TIMESTAMP, HISTORY_VALUES


class DlrmHSTUHead(nn.Module):
    """dlrm_hstu's groups through its network -> (B * K, T) logits."""

    candidates: int

    def __init__(self, model) -> None:
        super().__init__()
        self.history = SequenceGroup(model.history_group)
        self.candidate = SequenceGroup(model.candidate_group)
        self.contextual = DeepGroup(model.contextual_group, model) \
            if model.contextual_group is not None else None
        self.values = nn.ModuleList([SequenceValues(model.value_groups.get(name))
                                     for name in HISTORY_VALUES])
        self.request_times = SequenceValues(model.value_groups.get(CANDIDATE_TIMESTAMP))
        self.net = model.net
        self.candidates = model.candidates

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        _, history, lengths = self.history(pooled, sequences, sequence_lengths, dense,
                                           sequence_dense)
        rows, length = history.shape[0], history.shape[1]
        contextual = history.new_zeros(rows, 0)
        if self.contextual is not None:
            contextual = self.contextual(pooled, sequences, sequence_lengths, dense,
                                         sequence_dense)
        values: list[torch.Tensor] = []
        for part in self.values:
            values.append(part(rows, length, history, pooled, sequences, sequence_lengths,
                               dense, sequence_dense))
        _, candidates, counts = self.candidate(pooled, sequences, sequence_lengths, dense,
                                               sequence_dense)
        candidates = candidates[:, :self.candidates]
        candidates = nn.functional.pad(candidates,
                                       [0, 0, 0, self.candidates - candidates.shape[1]])
        times = self.request_times(rows, self.candidates, history, pooled, sequences,
                                   sequence_lengths, dense, sequence_dense)
        logits = self.net(history, lengths, contextual, values[0], values[1], values[2],
                          candidates, counts.clamp(max=self.candidates), times)
        return logits.reshape(-1, logits.shape[-1])
