"""Training: typed configuration, data-parallel train/eval steps, orbax checkpoints."""

from vla_jax.training.config import ExperimentConfig, TrainConfig, from_config_dict
from vla_jax.training.train import evaluate, make_optimizer, train_and_evaluate

__all__ = ["ExperimentConfig", "TrainConfig", "from_config_dict", "evaluate", "make_optimizer",
           "train_and_evaluate"]
