"""Byte-level language modelling on real text (`vla_jax.tasks.text`), the small model: about
10M parameters (d_model 384, 6 layers, 6 heads of 64; Gated DeltaNet, with fla's output gate
and values twice the key width, 14M), context T = 1024.

    python experiments/fetch_text.py                      # once: the corpus cache
    python experiments/train.py --config=configs/text_small.py --config.model.mixer=deltanet

The mixer is chosen by `--config.model.mixer`; every mixer keeps its base options (the
recurrent ones their short convolution) and impl is base's default. No position embedding
(`pos_emb="none"`): softmax attention gets rotary embeddings (`positions="rope"`), the
recurrent mixers have their order and short convolution, so every model runs at contexts
longer than it was trained on (`--config.task.eval_lengths`; experiments/evaluate.py). The
study: experiments/text_study.py.
"""

from vla_jax.configs import base

SEQ_LEN = 1024


def text_config(d_model, num_layers, head_dim=64):
  """The text configuration at width `d_model` and depth `num_layers`."""
  config = base.get_base_config()
  config.task = base.ml_collections.ConfigDict({
      "name": "text", "seq_len": SEQ_LEN, "eval_lengths": (SEQ_LEN,), "data_dir": "",
      "pack": 1})
  config.model.update({"d_model": d_model, "num_layers": num_layers,
                       "num_heads": d_model // head_dim, "head_dim": head_dim,
                       "pos_emb": "none", "max_len": 0})
  config.model.options.softmax.update({"positions": "rope"})
  # 32 x 1024 = 32,768 bytes a step, 600 steps: 19.7M bytes, about one pass over the train
  # split (experiments/text_study.py sizes its runs so). Validation and test: 256 windows
  # of 1024 bytes each (262,144 bytes; at L = 4T and 16T as many bytes in fewer windows);
  # one row an evaluation batch, so contexts 16x longer fit softmax attention's XLA path.
  config.train.update({"batch_size": 32, "num_steps": 600, "learning_rate": 1e-3,
                       "warmup_steps": 60, "eval_every": 0, "checkpoint_every": 200,
                       "eval_examples": 256, "eval_batch_size": 1, "log_every": 50})
  return config


def get_config():
  return text_config(d_model=384, num_layers=6)
