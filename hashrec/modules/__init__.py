"""Small neural-network building blocks: MLP, DIN attention, factorization machine,
pairwise dot interactions, MaskNet, cross networks (DCN v1, v2), CIN (xDeepFM), WuKong
layers, DC2VR's intervention, sequence encoders (simple attention, pooling, multi-window
DIN, HSTU) and PEPNet's gates and towers per domain."""

from hashrec.modules.activation import ACTIVATIONS, Dice, create_activation
from hashrec.modules.cin import CIN
from hashrec.modules.cross import Cross, CrossV2
from hashrec.modules.din import NORMALIZERS, DINAttention, sequence_mask
from hashrec.modules.fm import FactorizationMachine
from hashrec.modules.hstu import HSTUBlock, HSTUEncoder
from hashrec.modules.interaction import PairwiseDot
from hashrec.modules.intervention import Intervention, OrthonormalMatrix
from hashrec.modules.masknet import MaskBlockOptions, MaskNet
from hashrec.modules.mlp import MLP, MLPOptions
from hashrec.modules.personalized import DomainTowers, EPNet, GateNU, PPNet, pick_domain
from hashrec.modules.sequence_encoders import MultiWindowDIN, SequencePooling, SimpleAttention
from hashrec.modules.wukong import FactorizationMachineBlock, LinearCompress, WuKongLayer

__all__ = [
    "ACTIVATIONS", "Dice", "create_activation", "NORMALIZERS", "DINAttention",
    "sequence_mask", "FactorizationMachine", "Intervention", "OrthonormalMatrix", "MLP",
    "MLPOptions", "PairwiseDot",
    "MaskBlockOptions", "MaskNet", "CIN", "Cross", "CrossV2",
    "FactorizationMachineBlock", "LinearCompress", "WuKongLayer", "EPNet", "GateNU", "PPNet",
    "DomainTowers", "pick_domain",
    "MultiWindowDIN", "SequencePooling", "SimpleAttention", "HSTUBlock", "HSTUEncoder",
]
