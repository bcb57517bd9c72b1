"""The portable inference model: TorchScript modules made of plain tensor ops.

Dynamic tables become sorted keys searched with ``torch.searchsorted`` (ids
not found read as the table's eval initializer); dense tables are matrices
indexed by id. The dense network is the trained model's own modules, compiled
with ``torch.jit.script``. The saved file loads with ``torch.jit.load`` in any
process, on CPU or GPU, without HashRec installed.
"""

from hashrec.export.scripted.build import build_inference_model, load_hashmaps, save_scripted
from hashrec.export.scripted.lookup import EmbeddingLookup, FeatureLayout, TableLookup

__all__ = ["EmbeddingLookup", "FeatureLayout", "TableLookup", "build_inference_model",
           "load_hashmaps", "save_scripted"]
