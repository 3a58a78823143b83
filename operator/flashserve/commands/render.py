"""`flashserve render -f CR.yaml`: the objects the operator would create, offline.

Invalid input prints each bad field and how to fix it on stderr, exits 2 and prints nothing on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from flashserve.api.validation import FieldError, SpecError, parse_serving
from flashserve.render import render_serving


def _load(path: str) -> list[dict]:
    try:
        text = sys.stdin.read() if path == "-" else open(path).read()
    except OSError as exc:
        raise SpecError([FieldError(path, f"cannot read: {exc.strerror}")]) from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError([FieldError(path, f"not valid YAML: {exc}")]) from None
    if not docs:
        raise SpecError([FieldError(path, "no DeepSeekServing in the file")])
    return docs


def _objects(path: str, namespace: str | None) -> list[dict]:
    out: list[dict] = []
    for doc in _load(path):
        if namespace and isinstance(doc, dict):
            doc.setdefault("metadata", {})["namespace"] = namespace
        out += render_serving(parse_serving(doc))
    return out


def _fail(exc: SpecError) -> int:
    for err in exc.errors:
        print(f"error: {err}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="flashserve render", description=__doc__)
    parser.add_argument("-f", "--filename", required=True, help="DeepSeekServing YAML file, or - for stdin")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    parser.add_argument("-n", "--namespace", help="namespace to render into (default: the file's, else default)")
    args = parser.parse_args(argv)
    try:
        objs = _objects(args.filename, args.namespace)
    except SpecError as exc:
        return _fail(exc)
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objs}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(objs, sort_keys=False, width=120))
    return 0


def validate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="flashserve validate", description="Check DeepSeekServing files.")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    status = 0
    for path in args.files:
        try:
            for doc in _load(path):
                parse_serving(doc)
            print(f"{path}: valid")
        except SpecError as exc:
            print(f"{path}: invalid", file=sys.stderr)
            status = _fail(exc)
    return status
