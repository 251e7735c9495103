"""Copy: strings of 1..64 random symbols, then a separator and the string again; evaluated at
lengths 64 (trained) and 128, 256 (longer than training).

    python experiments/train.py --config=configs/copy.py --config.model.mixer=vla

No position embedding by default (`pos_emb="none"`): a learned table has nothing for unseen
lengths, and the recurrent mixers' short convolutions give them relative position.
"""

from vla_jax.configs import base


def get_config():
  config = base.get_base_config()
  config.task = base.ml_collections.ConfigDict({
      "name": "copy", "vocab_size": 32, "min_len": 1, "max_len": 64,
      "eval_lengths": (64, 128, 256), "pack": 1})
  config.model.update({"d_model": 128, "num_heads": 4, "head_dim": 32, "pos_emb": "none"})
  config.train.update({"batch_size": 64, "num_steps": 5000, "learning_rate": 1e-3,
                       "warmup_steps": 250, "eval_every": 1000, "checkpoint_every": 1000,
                       "eval_examples": 500})
  return config
