"""The package's metadata has one source, pyproject.toml: the installed version is its version,
setup.cfg holds tool configuration only, and the installed package ships py.typed (PEP 561)
with kernels/ and configs/ mapped into it."""

import configparser
import pathlib
import tomllib

import vla_jax
import vla_jax.configs.base
import vla_jax.kernels

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
