"""`flashserve render -f CR.yaml`: the objects the operator would create, offline.

Invalid input prints each bad field and how to fix it on stderr, exits 2 and prints nothing on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from flashserve.api.kubevalues import NAMESPACE_NAME
from flashserve.api.validation import FieldError, SpecError, parse_serving
from flashserve.commands.kubectl_yaml import Dumper, Loader
from flashserve.render.renderer import render_serving

MAX_INPUT_BYTES = 4 * 1024 * 1024


def _read(path: str) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        with open(path, "rb") as fh:
            return fh.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise SpecError([FieldError(path, f"cannot read: {exc.strerror}")]) from None


def _load(path: str) -> list[dict]:
    data = _read(path)
    if len(data) > MAX_INPUT_BYTES:
        raise SpecError([FieldError(path, f"larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB: not a DeepSeekServing")])
    if b"\0" in data:
        raise SpecError([FieldError(path, "a binary file, not YAML")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([FieldError(path, f"not UTF-8 text (byte {exc.start}): save the file as UTF-8")]) from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=Loader) if d is not None]  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise SpecError([FieldError(path, f"not valid YAML: {exc}")]) from None
    if not docs:
        raise SpecError([FieldError(path, "no DeepSeekServing in the file")])
    return docs


def _objects(path: str, namespace: str | None) -> list[dict]:
    """Every object the file's servings render to: the one path of both `render` and `validate`, so a file
    `validate` passes is one `render` renders. Every document is checked; with several, each error names its
    document, and two servings of one name are refused (kubectl apply would keep only the last)."""
    if namespace is not None and not NAMESPACE_NAME.fullmatch(namespace):
        raise SpecError([FieldError("-n/--namespace", f"{namespace[:80]!r} is not a namespace name: lowercase "
                                                      "letters, digits and '-', at most 63")])  # fmt: skip
    docs = _load(path)
    out: list[dict] = []
    errors: list[FieldError] = []
    seen: dict[tuple, int] = {}
    for i, doc in enumerate(docs, 1):
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        if namespace and isinstance(doc, dict) and isinstance(meta, dict | None):
            meta = doc["metadata"] = {**(meta or {}), "namespace": namespace}
        name = meta.get("name") if isinstance(meta, dict) else None
        where = f"document {i}" + (f" ({name})" if isinstance(name, str) and name else "") if len(docs) > 1 else ""
        if isinstance(name, str) and name and isinstance(meta.get("namespace"), str | None):
            key = (meta.get("namespace") or "", name)
            if key in seen:
                errors.append(FieldError(f"{where}: metadata.name", f"{name!r} is also document {seen[key]}'s: kubectl "
                                         "apply would keep only the last; rename one or remove it"))  # fmt: skip
            seen.setdefault(key, i)
        try:
            out += render_serving(parse_serving(doc))
        except SpecError as exc:
            errors += [FieldError(_in_document(where, e.path), e.message) for e in exc.errors]
    if errors:
        raise SpecError(errors)
    return out


def _in_document(where: str, path: str) -> str:
    """An error's path, led by its document when the file has several (`document 2 (flash-b): spec.replicas`)."""
    if not where:
        return path
    return where if path == "(document)" else f"{where}: {path}"


ERROR_MAX_CHARS = 2000  # of one error line: a message that quotes a megabyte-long value quotes its start


def _fail(exc: SpecError) -> int:
    for err in exc.errors:
        text = str(err)
        if len(text) > ERROR_MAX_CHARS:
            text = f"{text[:ERROR_MAX_CHARS]}... ({len(text) - ERROR_MAX_CHARS} more characters)"
        print(f"error: {text}", file=sys.stderr)
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
        sys.stdout.write(yaml.dump_all(objs, Dumper=Dumper, sort_keys=False, width=120))
    return 0


def validate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="flashserve validate", description="Check DeepSeekServing files.")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    status = 0
    for path in args.files:
        try:
            _objects(path, None)
            print(f"{path}: valid")
        except SpecError as exc:
            print(f"{path}: invalid", file=sys.stderr)
            status = _fail(exc)
    return status
