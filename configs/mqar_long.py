"""MQAR at growing context length with a fixed number of pairs (the seed's long-context test).

    python experiments/train.py --config=configs/mqar_long.py:512     # T = 512, 8 pairs

Zoology-form MQAR (filler tokens, power-law query placement) with vocabulary 256 and
n_pairs = 8; the argument is the sequence length T (default 512). Same model as
configs/mqar_paper.py: 2 layers, d_model 128, 4 heads of d_h = 32.
"""

from vla_jax.configs import base


def get_config(seq_len="512"):
  seq_len = int(seq_len)
  config = base.get_base_config()
  config.task.update({"vocab_size": 256, "seq_len": seq_len, "n_pairs": 8, "form": "zoology",
                      "power_a": 0.01})
  config.model.update({"d_model": 128, "num_heads": 4, "head_dim": 32})
  config.train.update({"batch_size": 64, "num_steps": 3000, "learning_rate": 1e-3,
                       "warmup_steps": 150, "eval_every": 0, "checkpoint_every": 1000,
                       "eval_examples": 1000})
  return config
