"""Ranking models built from a pipeline config (MultiTower, MultiTowerDIN, WideAndDeep,
DeepFM, DLRM) and multi-task ones (MMoE, DBMTL, PLE)."""

from hashrec.models.dbmtl import DBMTL
from hashrec.models.deepfm import DeepFM
from hashrec.models.dlrm import DLRM
from hashrec.models.errors import ModelError
from hashrec.models.mmoe import MMoE
from hashrec.models.multi_tower import MultiTower
from hashrec.models.multi_tower_din import MultiTowerDIN
from hashrec.models.ple import PLE
from hashrec.models.rank_model import RankModel
from hashrec.models.registry import MODELS, create_model
from hashrec.models.wide_and_deep import WideAndDeep

__all__ = ["DBMTL", "DLRM", "DeepFM", "MMoE", "ModelError", "MultiTower", "MultiTowerDIN",
           "PLE", "RankModel", "MODELS", "WideAndDeep", "create_model"]
