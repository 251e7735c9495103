"""MQAR in the paper's setting: d_model 128, 4 heads of d_h = 32, the short form T = 3 n + 1.

    python experiments/train.py --config=configs/mqar_paper.py:24      # n_pairs = 24
    python experiments/train.py --config=configs/mqar_paper.py:8 --config.model.mixer=deltanet

n_pairs in {4, 8, 12, 16, 24, 32, 48, 64} (the argument after the colon; default 24).
Vocabulary: 256 tokens (keys from [1, 128), values from [128, 256)).
"""

from vla_jax.configs import base

PAPER_N_PAIRS = (4, 8, 12, 16, 24, 32, 48, 64)


def get_config(n_pairs="24"):
  n_pairs = int(n_pairs)
  config = base.get_base_config()
  config.task.update({"vocab_size": 256, "n_pairs": n_pairs, "form": "short"})
  config.model.update({"d_model": 128, "num_heads": 4, "head_dim": 32})
  config.train.update({"batch_size": 64, "num_steps": 3000, "learning_rate": 1e-3,
                       "warmup_steps": 150, "eval_every": 500, "checkpoint_every": 500,
                       "eval_examples": 2000})
  return config
