"""YAML read the way kubectl reads it, so that a file means the same to `flashserve validate` and `render` as
to `kubectl apply`.

kubectl reads YAML with sigs.k8s.io/yaml: go-yaml v2 decodes it, then it is turned into JSON. PyYAML reads YAML
1.1, which differs in several places:
- go-yaml has no base-60 numbers: `15:00` is a string there, 900 in PyYAML.
- `1e3` is a number (PyYAML wants a dot and a signed exponent).
- `y` and `n` are booleans.
- A date stays a string.
- JSON writes 2.0 as 2.
- Every map key becomes text: a boolean or number key is written as Go prints it (`on:` is "true", `1e6:` is
  "1e+06"), and a key JSON cannot hold (null, a list, an integer of 2^63 or more) is refused.

The reader is also safe against hostile files. It takes no aliases, which expand to billions of nodes. It caps
nesting, the number of values and the length of integers, so a file takes bounded time. A value that cannot be
what its tag says is an error naming its place, never a traceback.
"""

from __future__ import annotations

import math
import re
import struct
from fractions import Fraction

import yaml

MAX_DEPTH = 64  # far deeper than any DeepSeekServing; the YAML composer recurses once per level
# Digits read as an integer at most (int64 needs 19 decimal or 64 binary digits): converting long integers is
# quadratic; a longer run of digits goes to the float reader, which is linear, as go-yaml's ParseInt fails it.
MAX_INT_CHARS = 64
# YAML values (scalars, lists, maps) in one file. A sample DeepSeekServing has about 60; the pure-Python YAML
# composer takes seconds per 100,000, so a 4 MiB file of `[a, a, ...]` would hold each command for minutes.
MAX_NODES = 20_000

_STR, _INT, _FLOAT, _BOOL, _MERGE = (f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "merge"))
_PLAIN = "tag:flashserve.io,2026:plain"  # a plain scalar: go_yaml_scalar says what it is
# the forms go-yaml v2 reads as a timestamp (its parseTimestamp): a date, with a time after `T`, `t` or spaces
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}"
                        r"(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::?[0-9]{2})?))?)?")


class Loader(yaml.SafeLoader):
    """Safe YAML as kubectl reads it (module docstring), without aliases and with bounded size."""

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

    def resolve(self, kind, value, implicit):  # type: ignore[no-untyped-def]
        # every plain scalar is read by go_yaml_scalar (below), not by PyYAML's YAML 1.1 resolvers
        if kind is yaml.ScalarNode and implicit[0]:
            return _MERGE if value == "<<" else _PLAIN
        return super().resolve(kind, value, implicit)

    def compose_scalar_node(self, anchor):  # type: ignore[no-untyped-def]
        nonspecific = self.peek_event().tag == "!"
        node = super().compose_scalar_node(anchor)
        # go-yaml refuses an escape of half a UTF-16 pair (`"\udfff"`); Python would carry it to the first
        # encode, far from the file
        if any("\ud800" <= c <= "\udfff" for c in node.value):
            raise yaml.composer.ComposerError(None, None, "an invalid Unicode escape (a lone surrogate): write the "
                                              "character itself", node.start_mark)  # fmt: skip
        if nonspecific:  # `! 2`: a string to go-yaml, whatever it looks like
            node.tag = _STR
        return node

    def construct_plain(self, node: yaml.ScalarNode) -> object:
        return _as_json_number(go_yaml_scalar(node.value))

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        # Keys as JSON text (module docstring), so `on` and `1` are two keys (to Python True == 1). Of two equal
        # keys kubectl keeps one (the last, or either where two keys read as the same text, `1` and `1.0`); the
        # file is refused instead, naming the key, since which one the user meant is not known. Merge keys
        # (`<<`) are refused too: without aliases they only repeat keys, and go-yaml and PyYAML order them
        # differently.
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        mapping: dict[str, object] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                raise yaml.constructor.ConstructorError(
                    None, None, "merge keys (<<) are not accepted: write the keys out", key_node.start_mark)
            text = self._key(key_node)
            if text in mapping:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {text[:80]!r}: keep one of them", key_node.start_mark)
            mapping[text] = self.construct_object(value_node, deep=deep)
        return mapping

    def _key(self, node: yaml.Node) -> str:
        if not isinstance(node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, "a map key must be a string, number or boolean, not a list or a map", node.start_mark)
        # before JSON's integral-float-to-int: a key `1e6` is "1e+06"
        if node.tag == _PLAIN:
            value = go_yaml_scalar(node.value)
        else:
            value = self._tagged_float(node) if node.tag == _FLOAT else self.construct_object(node)
        text = json_key(value)
        if text is None:
            raise yaml.constructor.ConstructorError(
                None, None, f"the map key {node.value[:80]!r} is not one JSON can hold (null, or an integer of "
                "2^63 or more): quote it", node.start_mark)  # fmt: skip
        return text

    # Explicit tags (`!!int 0x1f`, `!!float 1`): what the tag says where go-yaml decodes it so, else an error
    # naming the place, never a traceback.
    def construct_yaml_int(self, node):  # type: ignore[no-untyped-def]
        value = self._tagged(node)
        if not isinstance(value, int) or isinstance(value, bool | Uint64):
            raise self._not_a(node, "an integer")
        return value

    def construct_yaml_null(self, node):  # type: ignore[no-untyped-def]
        if self._tagged(node) is not None:
            raise self._not_a(node, "null")

    def _tagged(self, node: yaml.Node) -> object:
        if not isinstance(node, yaml.ScalarNode):
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise yaml.constructor.ConstructorError(None, None, f"a {tag} tag on a list or a map: remove the tag",
                                                    node.start_mark)  # fmt: skip
        return go_yaml_scalar(node.value)

    def construct_yaml_float(self, node):  # type: ignore[no-untyped-def]
        return _as_json_number(self._tagged_float(node))

    def _tagged_float(self, node: yaml.ScalarNode) -> float:
        value = self._tagged(node)
        if not isinstance(value, int | float) or isinstance(value, bool | Uint64):
            raise self._not_a(node, "a number")
        return float(value)

    def construct_yaml_bool(self, node):  # type: ignore[no-untyped-def]
        value = self._tagged(node)
        if not isinstance(value, bool):
            raise self._not_a(node, "a boolean")
        return value

    def construct_yaml_timestamp(self, node):  # type: ignore[no-untyped-def]
        if not isinstance(node, yaml.ScalarNode) or not _TIMESTAMP.fullmatch(node.value):
            raise self._not_a(node, "a timestamp")
        return node.value  # go-yaml keeps a timestamp as its text unless the target is a time

    def construct_yaml_binary(self, node):  # type: ignore[no-untyped-def]
        data = super().construct_yaml_binary(node)
        try:
            return data.decode("utf-8")  # kubectl's JSON carries it as a string
        except UnicodeDecodeError:
            raise self._not_a(node, "base64 of UTF-8 text") from None

    def _not_a(self, node: yaml.ScalarNode, what: str) -> yaml.constructor.ConstructorError:
        return yaml.constructor.ConstructorError(None, None, f"{node.value[:80]!r} is not {what}", node.start_mark)


class Dumper(yaml.SafeDumper):
    """YAML that kubectl reads back as written: a string go-yaml would read as something else (`0812345` as
    812345, `1e3` as 1000, `y` as true, `0o17` as 15) is quoted. PyYAML quotes only what YAML 1.1 would misread."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        if data == "<<" or go_yaml_scalar(data) != data:
            return self.represent_scalar(_STR, data, style='"')
        return super().represent_str(data)


Dumper.add_representer(str, Dumper.represent_str)


def _as_json_number(value: object) -> object:
    """kubectl sends JSON, where 2.0 is written 2: an integral float is an integer to the API server."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    # as a value a uint64 is a number; kubectl's JSON decoding holds integers beyond int64 as float64
    return float(value) if isinstance(value, Uint64) else value


Loader.add_constructor(_PLAIN, Loader.construct_plain)
Loader.add_constructor(_INT, Loader.construct_yaml_int)
Loader.add_constructor(_FLOAT, Loader.construct_yaml_float)
Loader.add_constructor(_BOOL, Loader.construct_yaml_bool)
Loader.add_constructor("tag:yaml.org,2002:null", Loader.construct_yaml_null)
Loader.add_constructor("tag:yaml.org,2002:timestamp", Loader.construct_yaml_timestamp)
Loader.add_constructor("tag:yaml.org,2002:binary", Loader.construct_yaml_binary)


# -- plain scalars: go-yaml v2's resolve(), then sigs.k8s.io/yaml's key to text --------------------------------

_WORDS: dict[str, object] = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
}
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INT64 = 2**63


class Uint64(int):
    """An integer go-yaml reads as uint64 (2^63 to 2^64 - 1): a number as a value, refused as a map key."""


def go_yaml_scalar(text: str) -> object:
    """What go-yaml v2 reads a plain (unquoted, untagged) scalar as: a boolean, None, an int, a float (an
    infinity or NaN included) or the text itself. A date stays text (go-yaml keeps timestamps as strings where
    the target is not a time), and so does a number too large for a float64."""
    if text in _WORDS:
        return _WORDS[text]
    if not text or text[0] not in "+-0123456789.":
        return text  # go-yaml's hint table: only these first characters can start a number
    if text[0] == ".":
        # strconv.ParseFloat on the text as written: an underscore only between two digits (Go's syntax)
        if re.search(r"(?<![0-9])_|_(?![0-9])", text):
            return text
        value = _parse_float(text.replace("_", ""))
        return text if value is None else value
    plain = text.replace("_", "")
    number = _parse_int(plain)
    if number is None:
        value = _parse_float(plain)
        if value is not None:
            return value
        if plain.startswith(("0b", "-0b")):
            # go-yaml's last try: ParseInt(plain[2:], 2) for 0b..., ParseInt("-" + plain[3:], 2) for -0b..., so
            # the rest may carry a sign of its own
            number = _parse_int(plain[2:] if plain[0] == "0" else "-" + plain[3:], base=2)
    if number is None:
        return text
    return number if -_INT64 <= number < _INT64 else Uint64(number)


def json_key(value: object) -> str | None:
    """A decoded map key as sigs.k8s.io/yaml writes it into JSON (a boolean or number as Go prints it); None
    where it refuses the key (null, a uint64, anything but a string, boolean or number)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and not isinstance(value, Uint64):
        return str(value)
    if isinstance(value, float):
        return go_float32_text(value)
    return None


_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}


def _parse_int(text: str, base: int = 0) -> int | None:
    """strconv.ParseInt(text, base, 64), then ParseUint(text, base, 64): the value, or None where both refuse
    it. Base 0 reads the base from a prefix (0x, 0b, 0o, a leading 0), as Go does."""
    sign, body = (-1, text[1:]) if text[:1] == "-" else (1, text[1:] if text[:1] == "+" else text)
    prefixes = {"0x": 16, "0X": 16, "0b": 2, "0B": 2, "0o": 8, "0O": 8}
    if base:
        digits = body
    elif body[:2] in prefixes:
        base, digits = prefixes[body[:2]], body[2:]
    elif body[:1] == "0" and len(body) > 1:
        base, digits = 8, body[1:]
    else:
        base, digits = 10, body
    if not digits or len(digits) > MAX_INT_CHARS or not set(digits) <= set(_DIGITS[base]):
        return None
    value = sign * int(digits, base)
    if -_INT64 <= value < _INT64 or (text[:1] not in "+-" and value < 2**64):
        return value
    return None


def _parse_float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64) for the decimal forms go-yaml passes it; None where Go reports an error
    (out of range included)."""
    if not _GO_FLOAT.fullmatch(text):
        return None
    value = float(text)
    return None if math.isinf(value) else value


def go_float32_text(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 32) as sigs.k8s.io/yaml writes a float key: the value rounded to a
    float32, in the fewest digits that read back as it, in exponent form when the exponent is below -4 or at
    least 6; an infinity (a float32 overflows at 3.4e38) is ".inf" or "-.inf", NaN ".nan"."""
    if math.isnan(value):
        return ".nan"
    try:
        (bits,) = struct.unpack("<I", struct.pack("<f", value))
    except OverflowError:  # rounds beyond the largest float32, as Go's float32(x) does to an infinity
        bits = 0x7F800000 | (0x80000000 if value < 0 else 0)
    sign = "-" if bits >> 31 else ""
    if bits & 0x7FFFFFFF == 0x7F800000:
        return f"{sign}.inf"
    if bits & 0x7FFFFFFF == 0:
        return sign + "0"
    digits, exp = _shortest32(bits & 0x7FFFFFFF)
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    point = exp + 1  # digits before the decimal point
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _shortest32(bits: int) -> tuple[str, int]:
    """(digits, decimal exponent of the first digit) of the shortest decimal that reads back as this positive
    float32, computed exactly: the interval of reals that round to it (its ends included when its mantissa is
    even, as round-half-to-even reads them), the fewest digits with a number in it, and of those the nearest."""
    exponent, fraction = bits >> 23, bits & 0x7FFFFF
    if exponent == 0:
        mantissa, power = fraction, -149
    else:
        mantissa, power = fraction | 0x800000, exponent - 150
    value = Fraction(mantissa) * Fraction(2) ** power
    up = Fraction(2) ** power / 2
    down = up / 2 if fraction == 0 and exponent > 1 else up  # below a power of two the next float is closer
    low, high, inclusive = value - down, value + up, mantissa % 2 == 0
    first = math.floor(math.log10(value))
    while Fraction(10) ** first > value:
        first -= 1
    while Fraction(10) ** (first + 1) <= value:
        first += 1
    for count in range(1, 10):
        scale = Fraction(10) ** (first - count + 1)
        lowest = math.ceil(low / scale) if inclusive else math.floor(low / scale) + 1
        highest = math.floor(high / scale) if inclusive else math.ceil(high / scale) - 1
        if lowest > highest:
            continue
        # ties to even, except at a power of two, where Go's Ryu finds the centre inexact and rounds up
        nearest = math.floor(value / scale + Fraction(1, 2)) if fraction == 0 else round(value / scale)
        digits = str(min(max(nearest, lowest), highest))
        exp = first + len(digits) - count  # a carry (9.99 -> 10.0) adds a digit in front
        return digits.rstrip("0") or "0", exp
    raise AssertionError("a float32 needs at most 9 digits")
