"""Training and evaluation: optimizers, schedules, loop, metrics, checkpoints, logging."""

from hashrec.train.errors import TrainError
from hashrec.train.run import evaluate_checkpoint, train_and_evaluate

__all__ = ["TrainError", "evaluate_checkpoint", "train_and_evaluate"]
