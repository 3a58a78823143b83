"""The recent-peak memory that holds replicas after a burst (autoscaling/peak.py)."""

from __future__ import annotations

import json

import pytest
from flashserve.autoscaling.peak import BUCKETS, PeakMemory

WINDOW = 1600.0  # buckets of 200 s


def test_peak_is_the_highest_reading_within_the_window():
    m = PeakMemory()
    for t, v in [(0.0, 100.0), (50.0, 400.0), (250.0, 150.0), (900.0, 120.0)]:
        m = m.update(t, v, WINDOW)
    assert m.peak(900.0, WINDOW) == 400.0
    # one bucket per 200 s keeps the maximum of its readings
    assert [v for _, v in m.buckets] == [400.0, 150.0, 120.0]


def test_a_peak_is_forgotten_once_its_bucket_leaves_the_window():
    m = PeakMemory().update(10.0, 500.0, WINDOW)
    m = m.update(1500.0, 100.0, WINDOW)
    assert m.peak(1500.0, WINDOW) == 500.0
    m = m.update(1700.0, 100.0, WINDOW)  # the bucket starting at 0 is now older than the window
    assert m.peak(1700.0, WINDOW) == 100.0
    assert all(t > 1700.0 - WINDOW for t, _ in m.buckets)


def test_state_stays_small_over_a_long_run():
    m = PeakMemory()
    for i in range(10_000):
        m = m.update(i * 15.0, float(i % 97), WINDOW)
    assert len(m.buckets) <= BUCKETS + 1


def test_off_and_bad_readings_change_nothing():
    m = PeakMemory().update(0.0, 100.0, WINDOW)
    assert m.update(15.0, 900.0, 0.0) == m  # window 0: memory off
    assert m.update(15.0, float("nan"), WINDOW) == m
    assert m.update(15.0, -1.0, WINDOW) == m


def test_round_trips_through_json_and_tolerates_junk():
    m = PeakMemory()
    for t in range(0, 1200, 15):
        m = m.update(float(t), float(t % 300), WINDOW)
    again = PeakMemory.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.peak(1185.0, WINDOW) == pytest.approx(m.peak(1185.0, WINDOW))
    for junk in (None, "x", [[1, "nan"]], [["a", 2]], [[1]], [[0, -5]], {"buckets": []}):
        assert PeakMemory.from_dict(junk) == PeakMemory()
