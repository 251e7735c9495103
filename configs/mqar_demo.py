"""The README's demo: a 2-layer VLA model on a small MQAR problem, a few minutes on a CPU.

    python experiments/train.py --config=configs/mqar_demo.py
"""

from configs import base


def get_config():
  config = base.get_base_config()
  config.task.update({"vocab_size": 64, "n_pairs": 8, "form": "short"})
  config.model.update({"d_model": 64, "num_heads": 2, "head_dim": 32, "chunk_size": 16})
  config.train.update({"batch_size": 64, "num_steps": 700, "learning_rate": 3e-3,
                       "warmup_steps": 50, "eval_every": 350, "checkpoint_every": 350,
                       "eval_examples": 1000, "log_every": 50})
  return config
