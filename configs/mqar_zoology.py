"""Zoology's standard MQAR (Arora et al., 2023): vocabulary 8192, power-law query placement.

    python experiments/train.py --config=configs/mqar_zoology.py:256       # T = 256
    python experiments/train.py --config=configs/mqar_zoology.py:512 --config.task.n_pairs=64

The argument is the sequence length T in {64, 128, 256, 512} (default 256); n_pairs defaults
to T / 16 (zoology's 64/4, 128/8, 256/16, 512/32 settings) and may be overridden up to T / 4.
"""

from vla_jax.configs import base


def get_config(seq_len="256"):
  seq_len = int(seq_len)
  config = base.get_base_config()
  config.task.update({"vocab_size": 8192, "seq_len": seq_len, "n_pairs": seq_len // 16,
                      "form": "zoology", "power_a": 0.01})
  config.model.update({"d_model": 128, "num_heads": 4, "head_dim": 32})
  config.train.update({"batch_size": 128, "num_steps": 8000, "learning_rate": 1e-3,
                       "warmup_steps": 400, "eval_every": 1000, "checkpoint_every": 1000,
                       "eval_examples": 3000})
  return config
