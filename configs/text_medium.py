"""Byte-level language modelling on real text, the medium model: about 40M parameters
(d_model 640, 8 layers, 10 heads of 64; Gated DeltaNet with fla's defaults 53M), context
T = 1024; otherwise configs/text_small.py.

    python experiments/train.py --config=configs/text_medium.py --config.model.mixer=vla
"""

from vla_jax.configs import text_small


def get_config():
  return text_small.text_config(d_model=640, num_layers=8)
