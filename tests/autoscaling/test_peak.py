"""The recent-peak memory that holds replicas after a burst (autoscaling/peak.py)."""

from __future__ import annotations

import json

import pytest
from flashserve.autoscaling.peak import BUCKETS, FALL, RETURN, TROUGHS, PeakMemory, Recurrence

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


def test_with_full_s_a_peak_holds_in_full_then_tapers_to_nothing_at_the_window_end():
    m = PeakMemory().update(10.0, 800.0, WINDOW)  # the bucket [0, 200) ends at 200
    m = m.update(1590.0, 100.0, WINDOW)
    full = 400.0
    assert m.peak(200.0 + full, WINDOW, full) == 800.0  # still in full at full_s from the bucket's end
    # halfway from full_s to the window's end: half the high (above the later, lower bucket)
    halfway = 200.0 + (full + WINDOW) / 2
    assert m.peak(halfway, WINDOW, full) == pytest.approx(400.0)
    # the fall is steady: later is lower, never below the lower bucket still in full
    later = [m.peak(t, WINDOW, full) for t in (900.0, 1100.0, 1300.0, 1500.0)]
    assert later == sorted(later, reverse=True) and min(later) >= 100.0
    # without full_s, or with full_s as long as the window, the peak holds in full
    assert m.peak(halfway, WINDOW) == m.peak(halfway, WINDOW, WINDOW) == 800.0


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


def _memory(readings, window=WINDOW):
    m = PeakMemory()
    for t, v in readings:
        m = m.update(t, v, window)
    return m


def test_a_burst_inside_the_window_is_a_rise_and_a_decline_is_not():
    # a day's decline, with noise inside the crowd band: no rise
    decline = [(t, 1000.0 - 0.4 * t + (60.0 if (t // 15) % 2 else 0.0)) for t in range(0, 1600, 15)]
    assert not _memory(decline).rose(1585.0, WINDOW)
    # level load with its noise: no rise
    level = [(float(t), 400.0 + (80.0 if (t // 15) % 3 == 0 else 0.0)) for t in range(0, 1600, 15)]
    assert not _memory(level).rose(1585.0, WINDOW)
    # a burst to twice the load after the first bucket: a rise, for as long as a bucket before it is in the window
    burst = [(float(t), 800.0 if 500 <= t < 620 else 400.0) for t in range(0, 1600, 15)]
    assert _memory(burst).rose(1585.0, WINDOW)
    # once the window starts at the burst, what is left only fell
    later = _memory(burst + [(float(t), 400.0) for t in range(1600, 2200, 15)])
    assert not later.rose(2185.0, WINDOW)


def test_a_rise_within_the_noise_band_is_not_a_rise():
    just_below = [(0.0, 400.0), (300.0, 400.0 / FALL - 1.0)]
    assert not _memory(just_below).rose(300.0, WINDOW)
    assert _memory([(0.0, 400.0), (300.0, 400.0 / FALL + 1.0)]).rose(300.0, WINDOW)


# ------------------------------------------------------------------------------------------ recurrence

HORIZON = 3600.0


def _bursts(period: float, length: float, until: float, high=800.0, low=400.0, step=15.0):
    """Readings of bursts at `high` lasting `length` s every `period` s, over a base `low`."""
    t = 0.0
    while t < until:
        yield t, high if t % period < length else low
        t += step


def _feed(readings, rec=None, shortest=0.0):
    rec = rec or Recurrence()
    for t, v in readings:
        rec = rec.update(t, v, HORIZON, shortest)
    return rec, t


def test_the_gap_is_the_time_from_the_last_high_to_its_return():
    rec, now = _feed(_bursts(period=1200.0, length=180.0, until=4000.0))
    # readings every 15 s: the last high of a burst is at 165 s into it, the next burst starts at 1200
    assert rec.gap(now, HORIZON) == pytest.approx(1200.0 - 165.0)
    assert len(rec.troughs) == TROUGHS


def test_noise_within_a_burst_is_no_recurrence():
    # Within a crowd demand moves between FALL and RETURN of its high: no gap is recorded.
    readings = [(t * 15.0, 800.0 * ((FALL + RETURN) / 2 if t % 3 else 1.0)) for t in range(200)]
    rec, now = _feed(readings)
    assert rec.troughs == () and rec.gap(now, HORIZON) == 0.0


def test_gaps_shorter_than_the_memory_already_held_are_not_recorded():
    rec, now = _feed(_bursts(period=600.0, length=120.0, until=4000.0), shortest=900.0)
    assert rec.gap(now, HORIZON) == 0.0
    rec, now = _feed(_bursts(period=600.0, length=120.0, until=4000.0), shortest=300.0)
    assert rec.gap(now, HORIZON) == pytest.approx(600.0 - 105.0)


def test_a_step_up_or_a_single_crowd_is_no_recurrence():
    step = [(t * 15.0, 400.0 if t < 40 else 4000.0) for t in range(400)]
    crowd = [(t * 15.0, 4000.0 if 40 <= t < 120 else 400.0) for t in range(400)]
    for readings in (step, crowd):
        rec, now = _feed(readings)
        assert rec.gap(now, HORIZON) == 0.0


def test_bursts_that_stop_coming_back_are_forgotten_after_the_horizon():
    rec, now = _feed(_bursts(period=1200.0, length=180.0, until=4000.0))
    assert rec.gap(now, HORIZON) > 0
    last_return = rec.returned_at
    rec, now = _feed(((now + 15.0 * i, 400.0) for i in range(1, 400)), rec)
    assert now - last_return > HORIZON
    assert rec.gap(now, HORIZON) == 0.0
    # ... and a high older than the horizon is forgotten: a lower level's bursts count again
    rec, now = _feed(((now + t, v) for t, v in _bursts(1200.0, 180.0, 4000.0, high=500.0, low=250.0)), rec)
    assert rec.high == 500.0 and rec.gap(now, HORIZON) == pytest.approx(1200.0 - 165.0)


def test_recurrence_round_trips_and_tolerates_junk():
    rec, _ = _feed(_bursts(period=1200.0, length=180.0, until=3000.0))
    assert Recurrence.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
    for junk in (None, "x", {"high": "nan"}, {"high": -1}, {"troughs": ["a"]}, {"troughs": [-5]}, {"highAt": []}):
        assert Recurrence.from_dict(junk) == Recurrence()
    assert rec.update(1e6, float("nan"), HORIZON) == rec and rec.update(1e6, 1.0, 0.0) == rec
