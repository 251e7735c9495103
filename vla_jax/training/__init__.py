"""Training: typed configuration, data-parallel train/eval steps, orbax checkpoints."""

from vla_jax.training.config import ExperimentConfig, TrainConfig, from_config_dict
from vla_jax.training.train import (config_from_workdir, evaluate, load_model, make_optimizer,
                                    train_and_evaluate)

__all__ = ["ExperimentConfig", "TrainConfig", "from_config_dict", "evaluate", "load_model",
           "config_from_workdir", "make_optimizer",
           "train_and_evaluate"]
