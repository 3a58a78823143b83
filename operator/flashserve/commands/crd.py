"""`flashserve crd`: print the CRD generated from the typed API."""

from __future__ import annotations

import argparse
import sys

from flashserve.api.crd import crd_yaml


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="flashserve crd", description=__doc__)
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    args = parser.parse_args(argv)
    text = crd_yaml()
    if args.output:
        try:
            with open(args.output, "w") as fh:
                fh.write(text)
        except OSError as exc:
            print(f"error: --output {args.output}: {exc.strerror or exc}: name a file in a directory that exists "
                  "and can be written", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0
