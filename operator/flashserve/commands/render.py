"""`flashserve render -f CR.yaml`: the objects the operator would create, offline.

Invalid input prints each bad field and how to fix it on stderr, exits 2 and prints nothing on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
import sys

import yaml

from flashserve.api.validation import FieldError, SpecError, parse_serving
from flashserve.render.renderer import render_serving

MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64  # far deeper than any DeepSeekServing; the YAML composer recurses once per level
# No field of a DeepSeekServing needs more; Python refuses to convert integers of over 4,300 digits (a
# ValueError from inside the YAML constructor), and converting long ones is quadratic.
MAX_INT_CHARS = 64
# YAML values (scalars, lists, maps) in one file. A sample DeepSeekServing has about 60; the pure-Python YAML
# composer takes seconds per 100,000, so a 4 MiB file of `[a, a, ...]` would hold each command for minutes.
MAX_NODES = 20_000


class _Loader(yaml.SafeLoader):
    """Safe YAML without aliases (`*name`): an alias is a pointer, and a few lines of nested aliases expand to
    billions of nodes. Nesting is capped too, so a deep document is an error instead of a RecursionError, and
    so is the number of values in the file, which bounds the time a file can take."""

    _depth = 0
    _nodes = 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted: write the value out",
                                              mark)  # fmt: skip
        self._depth += 1
        self._nodes += 1
        try:
            if self._nodes > MAX_NODES:
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_NODES} values in one file: split it",
                                                  self.peek_event().start_mark)  # fmt: skip
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)  # fmt: skip
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        # JSON has string keys only, so kubectl's reader (sigs.k8s.io/yaml) writes a boolean or number key out
        # as text: `on:` is the key "true", `1:` the key "1". Read keys the same way, so that `on` and `1` are two
        # keys (to Python True == 1) and a label key `yes` means here what it means to the API server.
        # PyYAML keeps the last of two equal keys; kubectl (strict field validation) refuses the file. Keeping
        # one silently would render what the user did not mean.
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        self.flatten_mapping(node)
        mapping: dict[str, object] = {}
        for key_node, value_node in node.value:
            key = None
            if isinstance(key_node, yaml.ScalarNode):
                # a float key keeps its type (Go writes `2.0:` as "2"; the value reader's integral-float-to-int
                # would give the same, but `1e6:` is "1e+06" to Go)
                key = (yaml.SafeLoader.construct_yaml_float(self, key_node) if key_node.tag == _FLOAT
                       else self.construct_object(key_node, deep=True))  # fmt: skip
            text = _key_text(key)
            if text is None:
                raise yaml.constructor.ConstructorError(
                    None, None, "a map key must be a string, number or boolean", key_node.start_mark)
            if text in mapping:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {text[:80]!r}: keep one of them", key_node.start_mark)
            mapping[text] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_yaml_int(self, node):  # type: ignore[no-untyped-def]
        if len(node.value) > MAX_INT_CHARS:
            raise yaml.constructor.ConstructorError(None, None, f"an integer {len(node.value)} characters long: "
                                                    f"no field takes more than {MAX_INT_CHARS}", node.start_mark)  # fmt: skip
        return super().construct_yaml_int(node)


    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}

    def construct_yaml_float(self, node):  # type: ignore[no-untyped-def]
        value = super().construct_yaml_float(node)
        # kubectl sends JSON, where 2.0 is written 2: an integral number is an integer to the API server
        return int(value) if math.isfinite(value) and value.is_integer() and abs(value) < 2**63 else value


def _key_text(key: object) -> str | None:
    """A map key as sigs.k8s.io/yaml writes it into JSON; None where it refuses one (null, a list, a map)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        if math.isnan(key):
            return ".nan"
        if math.isinf(key):
            return ".inf" if key > 0 else "-.inf"
        return _go_float32_text(key)
    return None


def _go_float32_text(value: float) -> str:
    """Go's strconv.FormatFloat(value, 'g', -1, 32): the fewest significant digits that read back as the same
    float32, in exponent form when the exponent is below -4 or at least 6 (`1e+06`)."""
    def as32(x: float) -> float:
        return struct.unpack("f", struct.pack("f", x))[0]

    single = as32(value)
    text = next(t for t in (f"{single:.{p}e}" for p in range(9)) if as32(float(t)) == single)
    mantissa, exponent = text.split("e")
    exp = int(exponent)
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    if exp < -4 or exp >= 6:
        return f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    digits = mantissa.lstrip("-").replace(".", "")
    sign = "-" if mantissa.startswith("-") else ""
    point = exp + 1  # digits before the decimal point
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
# Numbers and dates as kubectl's YAML reader (go-yaml v2, through sigs.k8s.io/yaml) reads them, not as PyYAML's
# YAML 1.1: no base-60 (`15:00` is a string there, 900 here), `1e3` and `1.5e3` are numbers (PyYAML wants a dot
# and a signed exponent), `y` and `n` are booleans, and a date stays a string (go-yaml keeps timestamps as
# strings unless the target is a time). A file must mean the same thing to `flashserve validate` as to
# `kubectl apply`.
_INT, _FLOAT, _TIMESTAMP = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT, _TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
# go-yaml v2's booleans include y, Y, n and N, which PyYAML reads as strings
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


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
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise SpecError([FieldError(path, f"not valid YAML: {exc}")]) from None
    if not docs:
        raise SpecError([FieldError(path, "no DeepSeekServing in the file")])
    return docs


_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _objects(path: str, namespace: str | None) -> list[dict]:
    """Every object the file's servings render to: the one path of both `render` and `validate`, so a file
    `validate` passes is one `render` renders. Every document is checked; with several, each error names its
    document, and two servings of one name are refused (kubectl apply would keep only the last)."""
    if namespace is not None and (len(namespace) > 63 or not _NAMESPACE.fullmatch(namespace)):
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
        sys.stdout.write(yaml.safe_dump_all(objs, sort_keys=False, width=120))
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
