"""The README's demo: a 2-layer VLA model on a small MQAR problem, a few minutes on a CPU.

    python experiments/train.py --config=configs/mqar_demo.py

MQAR short form with 8 key-value pairs (T = 25, vocabulary 64); 2 layers, d_model 64, 2 heads
of d_h = 32, short convolution 4 (see vla_jax/layers/README.md), 700 steps of batch 64,
evaluated on 1000 held-out examples. Its curves on a 2-core CPU:
results/plots/demo_curves.png (command, machine and date in results/README.md).
"""

from vla_jax.configs import base


def get_config():
  config = base.get_base_config()
  config.task.update({"vocab_size": 64, "n_pairs": 8, "form": "short"})
  config.model.update({"d_model": 64, "num_heads": 2, "head_dim": 32, "chunk_size": 16})
  config.train.update({"batch_size": 64, "num_steps": 700, "learning_rate": 3e-3,
                       "warmup_steps": 50, "eval_every": 350, "checkpoint_every": 350,
                       "eval_examples": 1000, "log_every": 50})
  return config
