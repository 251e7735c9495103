"""Shared fixtures: float64 mode, seeded random inputs and modules, scripts run in one process;
one XLA compilation cache per run; cheap XLA:CPU compilation for this process and the scripts
the tests start."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

# Compiling is most of the suite's time (small shapes, many programs). Without LLVM's
# optimisation passes (level 0) XLA:CPU compiles the suite's programs about 1.3x faster (CPU
# time, tests/layers/test_masks.py: 72 s at level 1, 51 s at level 0; the default level is
# slower still). XLA's own passes and emitters are the same and LLVM does not reassociate
# float arithmetic (no fast-math), but level 0 rounds some float32 results differently (a
# last bit of the Gated DeltaNet initialiser's exp and log): the check against recorded bits
# draws them at level 1 (tests/layers/test_layers.py); checks that compare two programs allow
# float32 rounding.
# XLA:CPU also verifies the IR its fusion emitters produce (a check of XLA's own code
# generation, not of any result); level 0 skips it: the suite's CPU time fell from 1,311 s to
# 1,129 s, the interpret-mode kernel tests most (tests/kernels/test_penalty_backward.py's
# chunk-start and layout tests 62 s -> 52 s).
# Set before JAX starts its backend; scripts started by the tests inherit it
# (`subprocess_env`).
_FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                 " --xla_cpu_emitter_verification_level=0")
if _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):   # xdist workers inherit it
  os.environ["XLA_FLAGS"] = " ".join(filter(None, (os.environ.get("XLA_FLAGS"), _FAST_COMPILE)))

import jax  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position
import pytest  # noqa: E402  pylint: disable=wrong-import-position
from flax import nnx  # noqa: E402  pylint: disable=wrong-import-position
# The first Pallas call in interpret mode imports Pallas' fuser, which registers a setting in
# JAX's trace context: every function traced before it (jitted references, eager operations)
# would be traced, lowered and looked up again after it. Imported here, before any tracing,
# in the tests' processes and in those that import this module (test_context_parallel's).
# pylint: disable-next=wrong-import-position,unused-import
from jax.experimental.pallas import fuser  # noqa: E402,F401

_CACHE_ENV = "VLA_JAX_TEST_COMPILATION_CACHE"
# The environment variables of JAX's persistent compilation cache settings.
_CACHE_DIR = "JAX_COMPILATION_CACHE_DIR"
_CACHE_MIN_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
_cache_key = pytest.StashKey[str]()


def random_module(make, seed=0, scale=0.5):
  """The nnx module that `make()` builds with every variable drawn from N(0, scale^2) by NumPy:
  no initialiser is compiled (eager initialisers cost a compilation per operation and shape,
  seconds for a small model), and biases are non-zero. For tests whose checks hold for any
  parameter values (such as packed vs separate)."""
  graphdef, state = nnx.split(nnx.eval_shape(make))
  rng = np.random.default_rng(seed)
  return nnx.merge(graphdef, jax.tree.map(
      lambda v: jax.numpy.asarray(scale * rng.standard_normal(v.shape), v.dtype), state))


def subprocess_env(devices=None):
  """The environment for a script a test starts: this one's (XLA flags included), on the CPU,
  with `devices` simulated CPU devices where given."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  if devices is not None:
    env["XLA_FLAGS"] = f"{env['XLA_FLAGS']} --xla_force_host_platform_device_count={devices}"
  return env


# Runs each script of a list as `python SCRIPT ARGS...` does (the script's folder first on
# sys.path, the script as __main__, SystemExit and uncaught exceptions turned into the exit
# status and message Python gives them, atexit handlers run) in a child forked from one
# process that has imported the package once. The parent starts no JAX backend (no threads
# when it forks); each child starts from the same fresh imports as a new interpreter.
_SCRIPTS = r"""
import atexit, json, os, runpy, sys, tempfile, traceback
import jax, jax.numpy, flax.nnx, ml_collections, absl.app, vla_jax.training.lock   # the scripts' imports
results = []
for argv in json.loads(sys.argv[1]):
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    pid = os.fork()
    if pid == 0:
      os.dup2(out.fileno(), 1)
      os.dup2(err.fileno(), 2)
      sys.argv, sys.path[0] = argv, os.path.dirname(os.path.abspath(argv[0]))
      try:
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
      except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
          print(e.code, file=sys.stderr)
      except BaseException:   # pylint: disable=broad-except
        traceback.print_exc()
        code = 1
      atexit._run_exitfuncs()   # pylint: disable=protected-access
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)
    status = os.waitpid(pid, 0)[1]
    out.seek(0)
    err.seek(0)
    results.append({"returncode": os.waitstatus_to_exitcode(status),
                    "stdout": out.read().decode(), "stderr": err.read().decode()})
print(json.dumps(results))
"""


def run_scripts(*argvs, env=None, cwd=None, timeout=600):
  """`subprocess.run(argv, capture_output=True, text=True)` for each argv (a script's path and
  its arguments, without the interpreter) in order, in one process that imports the package
  once (about 1.5 s a script less): a list of `subprocess.CompletedProcess`. For the scripts of
  one test or module (--help, flag and usage errors, tiny runs) run one after another; a run
  that must overlap another (a lock, a signal) needs its own process."""
  argvs = [[str(a) for a in argv] for argv in argvs]
  proc = subprocess.run([sys.executable, "-c", _SCRIPTS, json.dumps(argvs)], cwd=cwd,
                        env=env if env is not None else subprocess_env(), capture_output=True,
                        text=True, timeout=timeout, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [subprocess.CompletedProcess(argv, r["returncode"], r["stdout"], r["stderr"])
          for argv, r in zip(argvs, json.loads(proc.stdout.strip().splitlines()[-1]))]


# The files that take longest (CPU seconds on 2 cores, in that order), collected first: with
# `--dist loadfile` (setup.cfg) a file runs whole on one worker, and a long one started last
# leaves the other worker idle at the end of the run.
LONGEST_FILES = ("kernels/test_vla_pallas.py", "ops/test_properties.py",
                 "kernels/test_penalty_backward.py", "training/test_train.py",
                 "ops/test_baselines.py", "layers/test_layers.py",
                 "ops/test_vla_recurrence.py", "models/test_model.py", "layers/test_streaming.py",
                 "training/test_sequence_parallel.py")


def pytest_collection_modifyitems(config, items):
  """LONGEST_FILES' tests first, in that order; the others keep theirs."""
  del config
  rank = {f"tests/{name}": i for i, name in enumerate(LONGEST_FILES)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_configure(config):
  """Points JAX's persistent compilation cache at a folder made for this test run and shared by
  its xdist workers and the scripts the tests start (they inherit the variables), so a
  computation that several tests, scripts or Trainer instances compile (a tiny model's
  initialisers, a run's evaluation step read back by evaluate.py) is compiled once. A cache
  hit returns the executable XLA built for the same program (the key holds the XLA flags and
  the devices); results are unchanged."""
  folder = os.environ.get(_CACHE_ENV)
  if folder is None:
    folder = tempfile.mkdtemp(prefix="vla-jax-xla-cache-")
    os.environ[_CACHE_ENV] = folder
    config.stash[_cache_key] = folder
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  # The same settings for the processes the tests start (JAX reads them at import).
  os.environ.update({_CACHE_DIR: folder, _CACHE_MIN_TIME: "0"})


def pytest_unconfigure(config):
  folder = config.stash.get(_cache_key, None)
  if folder is not None:
    shutil.rmtree(folder, ignore_errors=True)
    for name in (_CACHE_ENV, _CACHE_DIR, _CACHE_MIN_TIME):
      os.environ.pop(name, None)


@pytest.fixture
def x64():
  """Runs the test with float64 enabled (float64 inputs then give a float64 state)."""
  with jax.enable_x64(True):
    yield


def random_inputs(seed, B, T, H, dk, dv, dtype=np.float64):
  """Fresh standard-normal q, k, v, u (u scaled by 1/sqrt(dk)) for one test."""
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((B, T, H, dk)) for _ in range(2))
  v = rng.standard_normal((B, T, H, dv))
  u = rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
  return tuple(x.astype(dtype) for x in (q, k, v, u))


def rel_err(actual, expected):
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))
