"""The package's metadata has one source, pyproject.toml: the installed version is its version,
setup.cfg holds tool configuration only, and the installed package ships py.typed (PEP 561)
with kernels/ and configs/ mapped into it, and annotates its public API."""

import configparser
import inspect
import pathlib
import tomllib

from flax import nnx

import vla_jax
import vla_jax.configs.base
import vla_jax.kernels
import vla_jax.layers
import vla_jax.models
import vla_jax.ops.delta_rule
import vla_jax.ops.vla

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_version_is_pyprojects():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  assert vla_jax.__version__ == project["version"]


def test_setup_cfg_holds_tool_configuration_only():
  config = configparser.ConfigParser()
  config.read(ROOT / "setup.cfg")
  assert config.sections() == ["tool:pytest"]


def test_the_installed_package_is_typed_and_maps_kernels_and_configs():
  package = pathlib.Path(vla_jax.__file__).parent
  assert (package / "py.typed").is_file()
  assert pathlib.Path(vla_jax.kernels.__file__).parent == ROOT / "kernels"
  assert pathlib.Path(vla_jax.configs.base.__file__).parent == ROOT / "configs"


def unannotated(function):
  """The parameters (and "return") of `function` that have no annotation; self, cls and
  __init__'s return are left out."""
  signature = inspect.signature(function)
  missing = [name for name, p in signature.parameters.items()
             if name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
  if function.__name__ != "__init__" and signature.return_annotation is inspect.Signature.empty:
    missing.append("return")
  return missing


def public_functions(module):
  """The functions a module exports (`__all__`) and the public methods (with __init__ and
  __call__) of the nnx.Module classes it exports."""
  for name in module.__all__:
    obj = getattr(module, name)
    if inspect.isfunction(obj):
      yield f"{module.__name__}.{name}", obj
    elif inspect.isclass(obj) and issubclass(obj, nnx.Module):
      for attr, member in vars(obj).items():
        if inspect.isfunction(member) and (not attr.startswith("_")
                                           or attr in ("__init__", "__call__")):
          yield f"{module.__name__}.{name}.{attr}", member


def test_the_public_api_of_ops_layers_and_models_is_annotated():
  modules = (vla_jax, vla_jax.ops.vla, vla_jax.ops.delta_rule, vla_jax.layers, vla_jax.models)
  found = {name: missing for module in modules for name, f in public_functions(module)
           if (missing := unannotated(f))}
  assert not found, found
