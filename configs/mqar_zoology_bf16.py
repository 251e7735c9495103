"""Zoology's MQAR (`mqar_zoology.py`) in mixed precision, for GPU training: bfloat16
activations, float32 parameters (so float32 AdamW moments) and float32 recurrent states (the
layers keep states in float32 whatever the activations; logits and the loss are float32).

    python experiments/train.py --config=configs/mqar_zoology_bf16.py:256

The same as `--config=configs/mqar_zoology.py:256 --config.model.dtype=bfloat16` (any config
takes that override). Not the default: float32 stays the default until a GPU run shows the
bfloat16 runs reach the float32 accuracies.
"""

from vla_jax.configs import mqar_zoology


def get_config(seq_len="256"):
  config = mqar_zoology.get_config(seq_len)
  config.model.update({"dtype": "bfloat16", "param_dtype": "float32"})
  return config
