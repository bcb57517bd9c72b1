"""Small neural-network building blocks: MLP and DIN attention."""

from hashrec.modules.activation import ACTIVATIONS, Dice, create_activation
from hashrec.modules.din import NORMALIZERS, DINAttention, sequence_mask
from hashrec.modules.mlp import MLP, MLPOptions

__all__ = [
    "ACTIVATIONS", "Dice", "create_activation", "NORMALIZERS", "DINAttention",
    "sequence_mask", "MLP", "MLPOptions",
]
