"""Child names and label values stay valid for any serving name the API server accepts."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from flashserve.naming import group_name, pdb_name, serving_label_value, service_name

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
names = st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,250}[a-z0-9])?\Z", fullmatch=True)


@given(names, st.integers(0, 999))
def test_child_names_are_valid(name, index):
    g = group_name(name, index)
    assert len(g) <= 52 and DNS_1035.match(g), g
    assert len(service_name(name)) <= 63 and DNS_1035.match(service_name(name))
    assert len(pdb_name(name)) <= 63 and DNS_1035.match(pdb_name(name))
    v = serving_label_value(name)
    assert len(v) <= 63 and LABEL_VALUE.match(v)


def test_short_names_are_kept_and_long_ones_stay_distinct():
    assert group_name("flash", 3) == "flash-g3"
    a, b = "a" * 200 + "x", "a" * 200 + "y"
    assert group_name(a, 0) != group_name(b, 0)
    assert serving_label_value(a) != serving_label_value(b)
