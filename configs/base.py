"""Defaults shared by every experiment configuration (not a runnable config by itself)."""

import ml_collections


def mixer_options():
  """Per-mixer options; `config.model.mixer` picks the entry that is used.

  Every recurrent mixer gets a short convolution (conv_size=4): without it no 2-layer
  recurrent model here learns MQAR (vla_jax/layers/README.md); set 0 for the authors' layer.
  """
  return ml_collections.ConfigDict({
      # penalty_scale: a number (1, the layer's default: vla_jax/layers/README.md) or
      # "inv_sqrt_dh", the authors' 1 / sqrt(head_dim), as the grids' "vla" rows use
      # (--config.model.options.vla.penalty_scale=inv_sqrt_dh).
      # qk_map "silu_l2" (DeltaNet's, the layer's default) or "elu1" (the authors' ELU + 1,
      # every VLA row made before "silu_l2" became the default); beta: a learned write
      # strength (vla_jax.layers.vla.VLAAttention).
      "vla": {"readout": "none", "lam0": 1.0,
              "penalty_scale": ml_collections.FieldReference(1.0, field_type=object),
              "conv_size": 4,
              "out_norm": True,
              "u_init": "random",
              "qk_map": "silu_l2",
              "beta": False},
      # conv_size 0: standard attention; 4 gives it the recurrent mixers' short convolution.
      "softmax": {"implementation": "auto", "conv_size": 0},
      "linear": {"normalize": True, "conv_size": 4, "out_norm": True},
      "deltanet": {"conv_size": 4, "out_norm": True, "output_gate": False, "expand_v": 1},
      # gate_init "slow": a gate that forgets 10x more slowly at initialisation
      # (vla_jax.layers.delta.GatedDeltaNet); "fla" is the paper's code, as are the output
      # gate (gated RMSNorm) and values twice the key width. The results' Gated DeltaNet rows
      # made before these two were options have output_gate False, expand_v 1
      # (results/README.md).
      "gated_deltanet": {"conv_size": 4, "out_norm": True, "gate_init": "fla",
                         "output_gate": True, "expand_v": 2},
  })


def get_base_config():
  config = ml_collections.ConfigDict()
  # pack: examples per training row (1: off). pack > 1 concatenates that many examples into
  # each row with segment ids, so every example is still computed alone (positions, states,
  # convolutions and attention restart; vla_jax.tasks.packing); evaluation is unpacked.
  config.task = ml_collections.ConfigDict({"name": "mqar", "pack": 1})
  config.model = ml_collections.ConfigDict({
      "mixer": "vla",
      "d_model": 128,
      "num_layers": 2,
      "num_heads": 4,
      "head_dim": 32,
      "mlp_ratio": 4,
      "tie_embeddings": True,
      "pos_emb": "learned",
      "max_len": 0,  # 0: the task's longest sequence
      # "auto": the Pallas kernel where it takes the call (VLA on an NVIDIA GPU, unpacked
      # rows), else "chunked"; the choice is logged (vla_jax.ops.impl.resolve_impl).
      "impl": "auto",
      "chunk_size": 64,
      # Activations and parameters; "bfloat16" activations with float32 parameters (and so
      # float32 optimizer state) is mixed precision: configs/mqar_zoology_bf16.py.
      "dtype": "float32",
      "param_dtype": "float32",
      "remat": False,  # True: recompute each block in the backward (less memory)
      "options": mixer_options(),
  })
  config.train = ml_collections.ConfigDict({
      "seed": 0,
      # None: the data follow the seed; an int seeds the data alone (--config.train.data_seed=3).
      "data_seed": ml_collections.config_dict.placeholder(int),
      "batch_size": 64,
      "num_steps": 2000,
      "learning_rate": 1e-3,
      "warmup_steps": 100,
      "end_lr_ratio": 0.0,
      "weight_decay": 0.1,
      "b1": 0.9,
      "b2": 0.98,
      "grad_clip": 1.0,
      "eval_every": 500,
      "eval_examples": 1000,
      "eval_batch_size": 250,
      "log_every": 50,
      "checkpoint_every": 500,
      "keep_checkpoints": 2,
      "tensorboard": False,  # True: TensorBoard scalars under <workdir>/tb (tensorboardX)
      "seq_devices": 1,  # devices along each sequence (vla_jax.parallel)
      "diagnostics_every": 0,  # N > 0: probe the layers every N steps (vla_jax.training.probe)
  })
  return config
