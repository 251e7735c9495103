"""The absl mains' shared pieces (`lab.cli`): a user's mistake and a full disk
are one line and exit status 1; other errors keep their traceback."""

import errno

import pytest

from lab import cli


def test_user_errors_are_one_line():
  with pytest.raises(SystemExit) as stopped:
    with cli.user_errors("train.py"):
      raise ValueError("bad setting")
  assert stopped.value.code == "train.py: error: bad setting"


@pytest.mark.parametrize("code, message", [(errno.ENOSPC, "No space left on device"),
                                           (errno.EDQUOT, "Disk quota exceeded")])
def test_a_full_disk_is_one_line_naming_the_file(code, message):
  with pytest.raises(SystemExit) as stopped:
    with cli.user_errors("train.py"):
      raise OSError(code, message, "/runs/a/metrics.jsonl")
  assert stopped.value.code == (
      f"train.py: error: /runs/a/metrics.jsonl: {message} (the disk is full): free space "
      "there or use a folder on another disk, then rerun (a training run resumes from its "
      "last complete checkpoint)")


def test_other_os_errors_keep_their_traceback():
  with pytest.raises(PermissionError):
    with cli.user_errors("train.py"):
      raise PermissionError(errno.EACCES, "Permission denied", "/runs/a")
