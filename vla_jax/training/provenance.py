"""Which code made a result: the git commit of the checkout vla_jax is imported from."""

import functools
import os
import subprocess

import vla_jax


# Names the commit of a copy of the tree that is not a git checkout (a cluster job's copy of
# the code, say), e.g. `VLA_JAX_GIT_COMMIT=$(git rev-parse HEAD)` where the copy was made.
COMMIT_ENV = "VLA_JAX_GIT_COMMIT"


@functools.cache
def git_commit():
  """The commit hash of the git checkout that holds the imported vla_jax package, with
  "-dirty" appended when tracked files differ from it; outside a git checkout (an installed
  wheel, a copy of the tree) or without git, the COMMIT_ENV environment variable's value, else
  None. Computed once per process."""
  return _checkout_commit() or os.environ.get(COMMIT_ENV) or None


def _checkout_commit():
  root = os.path.dirname(os.path.dirname(os.path.abspath(vla_jax.__file__)))

  def git(*args):
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()

  try:
    if os.path.realpath(git("rev-parse", "--show-toplevel")) != os.path.realpath(root):
      return None   # vla_jax lies in some other repository (site-packages inside one, say)
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return None
  return commit + ("-dirty" if dirty else "")
