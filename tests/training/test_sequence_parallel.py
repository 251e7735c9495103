"""Training on a (data, seq) mesh: 4 x 1 and 2 x 2 simulated CPU devices follow the 1-device
loss curve and parameters (data parallelism; on 2 x 2 the recurrent mixers run
sequence-sharded, the short convolutions cross the device boundary through XLA).

Every recurrent layer calls its op through `parallel.sequence_op`, and each op sharded equals
the op on one device, outputs and gradients (tests/ops/test_context_parallel.py): VLA trains
here on both meshes; Gated DeltaNet's train step is traced on 2 x 2 (its op runs sharded)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, sys
import jax, numpy as np
sys.path[:0] = [sys.argv[1] + "/tests/training"]
from test_train import tiny_config
from vla_jax.training import from_config_dict, train
from vla_jax.training.sharding import make_mesh, shard_batch
assert jax.device_count() == 4, jax.devices()
out = {}
for mixer in ("vla", "gated_deltanet"):
  config = tiny_config(seq_devices=2)
  config.model.update({"mixer": mixer, "impl": "chunked", "chunk_size": 16,
                       "num_layers": 1})   # one layer is sharded as two are; faster to compile
  config = from_config_dict(config, num_devices=4)
  meshes = [("two_by_two", make_mesh(jax.devices(), seq_devices=2))]
  if mixer == "vla":    # and data parallelism alone (the mixer does not matter to it)
    meshes += [("one", make_mesh(jax.devices()[:1])), ("four_by_one", make_mesh(jax.devices()))]
  for name, mesh in meshes:
    trainer = train.Trainer(config, mesh)
    state, losses = trainer.init_state, []
    batch = shard_batch(trainer.mesh, *trainer.task.train_batch(0, 0, 16))
    sharded = "shard_map" in str(jax.make_jaxpr(trainer.train_step)(state, *batch))
    if mixer != "vla":
      out[f"{mixer}/{name}"] = {"shard_map": sharded, "mesh": dict(trainer.mesh.shape)}
      continue
    for step in range(4):
      x, y = trainer.task.train_batch(0, step, 16)
      state, m = trainer.train_step(state, *shard_batch(trainer.mesh, x, y))
      losses.append(float(m["loss"]))
    out[f"{mixer}/{name}"] = {"losses": losses, "mesh": dict(trainer.mesh.shape),
                              "seq_len": int(x.shape[1]), "shard_map": sharded,
                              "devices": len(jax.tree.leaves(state["params"])[0]
                                             .sharding.device_set),
                              "params": [np.asarray(p).ravel()[:50].tolist()
                                         for p in jax.tree.leaves(state["params"])]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
  env = subprocess_env(devices=4)
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT)], env=env,
                        capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_by_two_mesh_follows_one_device(runs):
  one, mesh = runs["vla/one"], runs["vla/two_by_two"]
  assert mesh["mesh"] == {"data": 2, "seq": 2} and one["mesh"] == {"data": 1, "seq": 1}
  assert mesh["shard_map"] and not one["shard_map"]   # the mixers' ops ran sequence-sharded
  assert mesh["seq_len"] % 32 != 0    # each device's segment ends inside a chunk
  np.testing.assert_allclose(mesh["losses"], one["losses"], rtol=1e-5)
  assert mesh["losses"][-1] < mesh["losses"][0]
  for a, b in zip(mesh["params"], one["params"]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_gated_deltanet_runs_sequence_sharded_on_two_by_two(runs):
  assert runs["gated_deltanet/two_by_two"] == {"shard_map": True,
                                               "mesh": {"data": 2, "seq": 2}}


def test_data_parallel_equals_one_device(runs):
  """A (4, 1) mesh: the batch split over 4 devices, the parameters on all of them."""
  one, four = runs["vla/one"], runs["vla/four_by_one"]
  assert four["mesh"] == {"data": 4, "seq": 1} and four["devices"] == 4
  assert one["devices"] == 1 and not four["shard_map"]
  np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-5)
  for a, b in zip(four["params"], one["params"]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_seq_devices_must_divide_devices_and_sequences():
  from test_train import tiny_config   # pylint: disable=import-outside-toplevel
  from vla_jax.training import from_config_dict   # pylint: disable=import-outside-toplevel
  from vla_jax.training.sharding import (  # pylint: disable=import-outside-toplevel
      make_mesh, shard_batch)
  with pytest.raises(ValueError, match="seq_devices=3 must divide"):
    from_config_dict(tiny_config(seq_devices=3), num_devices=4)
  with pytest.raises(ValueError, match=r"devices \(4\) along the data axis"):
    from_config_dict(tiny_config(seq_devices=2, batch_size=6), num_devices=8)
  with pytest.raises(ValueError, match="seq_devices=2 must be >= 1 and divide"):
    make_mesh(np.zeros(3), seq_devices=2)
  mesh = make_mesh()
  with pytest.raises(ValueError, match="do not split"):
    shard_batch(mesh.abstract_mesh.update(axis_sizes=(1, 3)), np.zeros((2, 8)))


def test_a_sweep_refuses_seq_devices():
  from test_train import tiny_config   # pylint: disable=import-outside-toplevel
  from vla_jax.training import from_config_dict   # pylint: disable=import-outside-toplevel
  from vla_jax.training.sweep import SweepTrainer   # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="train.seq_devices must be 1"):
    SweepTrainer(from_config_dict(tiny_config(seq_devices=2), num_devices=2), [0], [1e-3])
