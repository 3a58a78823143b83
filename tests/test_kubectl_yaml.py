"""YAML read as kubectl reads it (flashserve.commands.kubectl_yaml). The expected texts are what
sigs.k8s.io/yaml (go-yaml v2) wrote for each input: facts of the real reader, checked here against ours, and
e2e/test_smoke_cluster.py has the real kubectl read every input of these tables (and 500 random ones) again. Where kubectl refuses a file, ours refuses it with the place and a reason; where ours is
stricter (two equal keys), the test says so."""

from __future__ import annotations

import math
import struct

import pytest
import yaml

from flashserve.commands.kubectl_yaml import Loader, go_float32_text, go_yaml_scalar


def load(text: str) -> object:
    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader


# (plain or tagged key, the JSON key sigs.k8s.io/yaml writes)
KEYS = [
    ("on", "true"), ("No", "false"), ("y", "true"), ("1", "1"), ("-0", "0"), ("-0.0", "-0"), ("08", "8"),
    ("0o17", "15"), ("0X1F", "31"), ("0b101", "5"), ("1_000.5", "1000.5"), ("-_1", "-1"), (".5_7", "0.57"),
    ("1e6", "1e+06"), ("123456", "123456"), ("1.5", "1.5"), ("2.0", "2"), ("0.00001", "1e-05"),
    ("0.000244140625", "0.00024414063"), ("1.5474250491067253e+26", "1.5474251e+26"),
    ("1.262177448353619e-29", "1.2621775e-29"), ("100000000000000000000", "1e+20"),
    ("-9223372036854775809", "-9.223372e+18"), ("1e39", ".inf"), ("3.5e38", ".inf"), ("-.inf", "-.inf"),
    (".NaN", ".nan"), ("1e400", "1e400"), ("0x_", "0x_"), ("0b_", "0b_"), ("2001-01-01", "2001-01-01"),
    ("15:00", "15:00"), ("!!binary aGVsbG8=", "hello"), ("!!timestamp 2001-01-01", "2001-01-01"),
    ("!!float 0x1F", "31"), ("!!float 1e6", "1e+06"), ("!!str 1", "1"), ("'1e6'", "1e6"),
]  # fmt: skip

# keys kubectl refuses ("unsupported map key"), and tags that cannot decode ("cannot decode !!str `abc`")
REFUSED_KEYS = [("~", "not one JSON can hold"), ("!!int 2.0", "'2.0' is not an integer"),
                ("9223372036854775808", "not one JSON can hold"),
                ("0x8000000000000000", "not one JSON can hold"), ("[a]", "not a list or a map"),
                ("!!float abc", "'abc' is not a number"), ("!!int 1.5", "'1.5' is not an integer"),
                ("!!bool 1", "'1' is not a boolean")]  # fmt: skip

# (plain or tagged value, what kubectl sends for it in JSON)
VALUES = [("0x_", "0x_"), ("0b-101", -5), ("0b+11", 3), ("-0b-1", "-0b-1"), ("! 2", "2"), ("!!int 0x1f", 31),
          ("123e4567-e89b-12d3-a456-426614174000-123e4567-e89b-12d3-a456-426614174000",
           "123e4567-e89b-12d3-a456-426614174000-123e4567-e89b-12d3-a456-426614174000"),
          ("9" * 5000, "9" * 5000), ("0X1F", 31), ("1e400", "1e400"), ("!!binary aGVsbG8=", "hello"), ("1e3", 1000),
          ("!!timestamp 2001-01-01", "2001-01-01"), ("15:00", "15:00"), ("Y", True), ("off", False), ("6.0", 6),
          ("1_000", 1000), ("0o17", 15), ("010", 8), ("18446744073709551615", 1.8446744073709552e19),
          ("-_56", -56), ("5_e_98", 5e98), ("", None)]  # fmt: skip


@pytest.mark.parametrize("key, text", KEYS, ids=[k for k, _ in KEYS])
def test_a_map_key_is_the_text_kubectl_writes(key, text):
    assert load(f"{key}: v\n") == {text: "v"}


@pytest.mark.parametrize("key, words", REFUSED_KEYS, ids=[k for k, _ in REFUSED_KEYS])
def test_a_key_kubectl_refuses_is_refused_naming_its_place(key, words):
    with pytest.raises(yaml.YAMLError) as err:
        load(f"a: 1\n{key}: v\n")
    assert words in str(err.value) and "line 2, column 1" in str(err.value), err.value


@pytest.mark.parametrize("value, json_value", VALUES, ids=[v or "empty" for v, _ in VALUES])
def test_a_value_is_what_kubectl_sends(value, json_value):
    got = load(f"x: {value}\n")["x"]
    assert got == json_value and type(got) is type(json_value), (got, json_value)


def test_on_and_1_are_two_keys_though_python_has_true_equal_1():
    assert load("{on: a, 1: b}\n") == {"true": "a", "1": "b"}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'true'"):
        load("{on: a, true: b}\n")


def test_two_keys_of_one_text_are_refused_where_kubectl_keeps_one():
    """kubectl keeps the last of `{a: p, a: q}`, and either of `{1: p, 1.0: q}`: which one the user meant is
    not known, so the file is refused."""
    for text in ("{a: p, a: q}\n", "{1: p, 1.0: q}\n"):
        with pytest.raises(yaml.YAMLError, match="duplicate key"):
            load(text)


def test_merge_keys_are_refused():
    """Without aliases a merge only repeats keys, and go-yaml and PyYAML let different ones win
    (`<<: [{n: 64}, {n: 128}]` is 64 to kubectl)."""
    for text in ("{<<: {a: p, b: r}, a: q}\n", "e: {<<: [{n: 64}, {n: 128}]}\n", "{<<: {a: 1}}\n"):
        with pytest.raises(yaml.YAMLError, match=r"merge keys \(<<\) are not accepted"):
            load(text)


def test_a_float32_is_written_in_the_fewest_digits_go_writes():
    # every power of two and its neighbours, both signs: the ends of the rounding interval are where a
    # shortest-digits printer goes wrong (expected values: the exact definition, checked by reading back)
    for exponent in range(1, 254):
        for fraction in (0, 1, 0x7FFFFF):
            (value,) = struct.unpack("<f", struct.pack("<I", exponent << 23 | fraction))
            text = go_float32_text(value)
            mantissa = text.split("e")[0].replace("-", "").replace(".", "").lstrip("0")
            assert struct.unpack("<f", struct.pack("<f", float(text)))[0] == value, (value, text)
            shorter = float(f"{value:.{max(len(mantissa) - 2, 0)}e}")
            assert len(mantissa) == 1 or struct.unpack("<f", struct.pack("<f", shorter))[0] != value, (value, text)
    assert go_float32_text(-0.0) == "-0" and go_float32_text(math.nan) == ".nan" and go_float32_text(-1e300) == "-.inf"


def test_scalars_that_only_look_like_numbers_stay_text():
    for text in ("0x", "0x_", "1.2.3", "1e", "+", ".", "0b2", "12:30", "1-2", "inf", "Infinity"):
        assert go_yaml_scalar(text) == text


@pytest.mark.parametrize("text, words", [
    ("x: !!int [1]\n", "a !!int tag on a list or a map"),
    ("x: !!bool {a: 1}\n", "a !!bool tag on a list or a map"),
    ('x: "\\udfff"\n', "an invalid Unicode escape"),
    ("x: !!int 1e3\n", "'1e3' is not an integer"),
    ("x: !!null x\n", "'x' is not null"),
    ("x: !!timestamp hello\n", "'hello' is not a timestamp"),
    ("x: !!float 18446744073709551615\n", "is not a number"),
])  # fmt: skip
def test_what_kubectl_refuses_is_an_error_with_its_place_not_a_traceback(text, words):
    with pytest.raises(yaml.YAMLError) as err:
        load(text)
    assert words in str(err.value) and "line 1" in str(err.value), err.value


def test_rendered_yaml_reads_back_the_same_through_kubectl_s_reader():
    """`flashserve render` output goes to `kubectl apply`: a string go-yaml would read as a number or a boolean
    is written quoted."""
    from flashserve.commands.kubectl_yaml import Dumper

    strings = ["0812345", "1e3", "y", "0o17", "0X1F", "08", "-_1", "0b-101", "on", "1_000", "12:30", "plain", ""]
    text = yaml.dump({"args": strings}, Dumper=Dumper)
    assert load(text) == {"args": strings}, text
    assert "- plain" in text and '- "0812345"' in text
