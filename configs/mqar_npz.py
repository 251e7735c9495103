"""Train or evaluate on externally generated MQAR data (`.npz` with `inputs` and `labels`).

    python experiments/train.py --config=configs/mqar_npz.py \
        --config.task.train_path=train.npz --config.task.eval_path=test.npz \
        --config.task.vocab_size=8192

A sweep (`experiments/sweep.py`) also needs --config.task.valid_path, a validation file apart
from the test file, to choose its learning rate on.
"""

from vla_jax.configs import base


def get_config():
  config = base.get_base_config()
  config.task = base.ml_collections.ConfigDict({
      "name": "npz", "vocab_size": 8192, "train_path": "", "eval_path": "", "valid_path": "",
      "pack": 1})
  config.model.update({"d_model": 128, "num_heads": 4, "head_dim": 32})
  return config
