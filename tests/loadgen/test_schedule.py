"""Arrival schedules: the string and YAML forms and the sessions they ask for over time."""

from __future__ import annotations

import pytest
from flashserve_testbed.loadgen.schedule import from_doc, load, parse, seconds


def test_ramp_hold_burst_step_down():
    s = parse("ramp 0 64 60s; hold 64 2m; burst 128 10s; step 16 30s")
    assert s.duration == 60 + 120 + 10 + 30
    assert [s.users(t) for t in (0, 30, 59.9)] == [0, 32, 64]
    assert s.users(100) == 64 and s.users(185) == 128 and s.users(200) == 16
    assert s.users(220) == 0 and s.users(-1) == 0
    assert s.peak == 128


def test_diurnal_starts_low_and_peaks_at_half_period():
    s = parse("diurnal 8 64 10m 20m")
    assert s.users(0) == 8 and s.users(300) == 64 and s.users(600) == 8 and s.users(900) == 64
    assert s.peak == 64
    assert parse("diurnal 8 64 10m 2m").peak < 64  # cut before the peak


def test_yaml_forms(tmp_path):
    doc = {"schedule": [{"ramp": {"from": 0, "to": 10, "duration": "10s"}}, "hold 10 5s",
                        {"diurnal": {"low": 1, "high": 5, "period": 60, "duration": "1m"}}]}
    s = from_doc(doc)
    assert [seg.kind for seg in s.segments] == ["ramp", "hold", "diurnal"]
    f = tmp_path / "s.yaml"
    f.write_text("- hold 3 10s\n- step: {users: 1, duration: 5s}\n")
    assert str(load(str(f))) == "hold 3 10s; step 1 5s"
    assert load("hold 2 1m").duration == 60
    assert str(parse("ramp 1->4 10s")) == "ramp 1 4 10s"


@pytest.mark.parametrize("bad", ["", "hold 4", "jump 4 10s", "hold -1 5s", "ramp 0 4 0s", "hold x 5s",
                                 "diurnal 1 2 0s 10s", "hold 4 soon"])
def test_bad_schedules_are_refused(bad):
    with pytest.raises(ValueError):
        parse(bad)


def test_bad_yaml_segments_are_refused():
    for doc in ([], [{"ramp": {"from": 0, "duration": 5}}], [{"ramp": 3}], [{"hold": {}, "x": {}}], 7):
        with pytest.raises(ValueError):
            from_doc(doc)


def test_seconds():
    assert seconds("1h30m") == 5400 and seconds(2) == 2 and seconds("250ms") == 0.25 and seconds("7") == 7
