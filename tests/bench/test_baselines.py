"""Each baseline's arithmetic against a worked example from its source (see the module docstrings)."""

from __future__ import annotations

import pytest
from flashserve_testbed.bench.baselines import aibrix_apa, dynamo, hpa, kpa, wva

# ---------------------------------------------------------------------------------------------- HPA


def test_hpa_ratio_and_tolerance():
    # 2 pods at 200 running against a target of 100: desired = ceil(2 x 200/100) = 4
    assert hpa.plain_metric_replicas(2, [200.0, 200.0], 0, 100.0) == 4
    # within 10% of the target: no change, whatever ceil() would say
    assert hpa.plain_metric_replicas(3, [109.0, 108.0, 110.0], 0, 100.0) == 3
    assert hpa.plain_metric_replicas(3, [91.0, 90.0, 92.0], 0, 100.0) == 3
    # just outside: ceil(3 x 0.85) = 3, ceil(3 x 0.6) = 2
    assert hpa.plain_metric_replicas(3, [60.0, 60.0, 60.0], 0, 100.0) == 2
    assert hpa.plain_metric_replicas(4, [], 0, 100.0) == 4  # no metrics: the scale is left alone


def test_hpa_missing_pods_count_zero_up_and_target_down():
    # scale-up with one pod still loading weights: it counts as 0, (150 + 150 + 0) / 3 = 100% -> hold
    assert hpa.plain_metric_replicas(3, [150.0, 150.0], 1, 100.0) == 3
    # (300 + 300 + 0) / 3 = 200% -> ceil(2.0 x 3) = 6
    assert hpa.plain_metric_replicas(3, [300.0, 300.0], 1, 100.0) == 6
    # scale-down: the missing pod counts at the target, (50 + 50 + 100) / 3 = 66.7% -> ceil(2.0) = 2
    assert hpa.plain_metric_replicas(3, [50.0, 50.0], 1, 100.0) == 2
    # filling the gap may not reverse the direction: 95% without it, 105% with a missing pod at 100%...
    # ...can't happen (fill only moves towards 100%); but a ratio that crosses to the other side holds
    assert hpa.plain_metric_replicas(2, [80.0], 3, 100.0) == 2  # (80 + 300) / 4 = 95%: within tolerance


def test_hpa_scale_down_stabilization_takes_the_max_of_five_minutes():
    st = hpa.Stabilizer()
    assert st.normalize(0.0, 10, 10, 1, 100) == 10
    assert st.normalize(15.0, 10, 4, 1, 100) == 10  # the 10 of t=0 is still in the window
    assert st.normalize(299.0, 10, 4, 1, 100) == 10
    assert st.normalize(301.0, 10, 4, 1, 100) == 4  # t=0 has left the window; -100% per 15 s allows it


def test_hpa_scale_up_rate_limit_is_max_of_4_pods_and_100_percent():
    st = hpa.Stabilizer()
    assert st.normalize(0.0, 2, 20, 1, 100) == 6  # max(2 + 4, 2 x 2)
    assert st.normalize(10.0, 6, 20, 1, 100) == 6  # same 15 s period: 4 already added, start was 2
    assert st.normalize(16.0, 6, 20, 1, 100) == 12  # new period: max(6 + 4, 12)
    st2 = hpa.Stabilizer()
    assert st2.normalize(0.0, 10, 50, 1, 100) == 20  # 100% of 10 beats 4 pods
    assert st2.normalize(20.0, 20, 50, 1, 30) == 30  # maxReplicas


def test_hpa_external_average_value():
    assert hpa.external_average_replicas(5, 7.0, 1.0) == 7
    assert hpa.external_average_replicas(10, 10.9, 1.0) == 10  # 9% off: tolerated
    assert hpa.external_average_replicas(10, 12.0, 1.0) == 12


# ---------------------------------------------------------------------------------------------- KPA


def test_kpa_stable_mode_divides_by_target_times_utilization():
    k = kpa.KPA(target=100.0)  # Knative's container-concurrency-target-default, 70% utilization
    # 350 concurrent requests over the stable window on 5 ready pods: ceil(350 / 70) = 5
    assert k.scale(0.0, 5, 350.0, 350.0) == 5
    assert k.panic_time is None


def test_kpa_scale_down_at_most_halves():
    k = kpa.KPA(target=100.0)
    assert k.scale(0.0, 10, 70.0, 70.0) == 5  # wants 1, max scale-down rate 2


def test_kpa_panic_never_scales_down_and_ends_after_a_stable_window():
    k = kpa.KPA(target=100.0)
    # 2 ready pods, 6 s window sees 350: ceil(350/70) = 5 >= 2 x 2 -> panic at 5
    assert k.scale(0.0, 2, 140.0, 350.0) == 5
    assert k.panic_time == 0.0
    # still panicking: a lower panic reading does not scale down
    assert k.scale(2.0, 2, 140.0, 150.0) == 5
    # a higher one raises the panic ceiling
    assert k.scale(4.0, 2, 140.0, 500.0) == 8
    # below the threshold for less than the stable window: keep the panic scale
    assert k.scale(50.0, 8, 140.0, 140.0) == 8
    # a whole stable window (60 s) after the last over-threshold reading: back to the stable decision
    assert k.scale(65.0, 8, 140.0, 140.0) == 4  # ceil(140/70) = 2, but at most halved from 8
    assert k.panic_time is None


# ---------------------------------------------------------------------------------------------- AIBrix APA


def test_apa_bounds_and_tolerances():
    assert aibrix_apa.apa_replicas(4, 150.0, 100.0) == 6  # 1.5 > 1.1: ceil(4 x 1.5)
    assert aibrix_apa.apa_replicas(4, 500.0, 100.0) == 8  # capped at 2n
    assert aibrix_apa.apa_replicas(4, 105.0, 100.0) == 4  # inside [0.9, 1.1]
    assert aibrix_apa.apa_replicas(4, 95.0, 100.0) == 4
    assert aibrix_apa.apa_replicas(4, 50.0, 100.0) == 2  # ceil(4 x 0.5)
    assert aibrix_apa.apa_replicas(4, 10.0, 100.0) == 2  # floored at floor(n / 2)
    assert aibrix_apa.apa_replicas(5, 10.0, 100.0) == 2  # floor(5 / 2)


def test_apa_pending_replica_guard():
    # 6 replicas, 4 ready at 150: without the guard ceil(6 x 1.5) = 9; pending ones count as 0 -> 6
    assert aibrix_apa.pending_guard(6, 4, 9, 150.0, 100.0) == 6
    # scale-down with 2 pending: they count at the target, (4 x 40 + 2 x 100) / 6 = 60% -> ceil(3.6) = 4
    assert aibrix_apa.pending_guard(6, 4, 3, 40.0, 100.0) == 4
    assert aibrix_apa.pending_guard(6, 6, 9, 150.0, 100.0) == 9  # nothing pending: unchanged


# ---------------------------------------------------------------------------------------------- Dynamo

PROFILE = [(1000.0, 0.008), (2000.0, 0.010), (3000.0, 0.012)]


def test_dynamo_reverse_interpolation():
    assert dynamo.reverse_interpolate(PROFILE, 0.010) == pytest.approx(2000.0)
    assert dynamo.reverse_interpolate(PROFILE, 0.011) == pytest.approx(2500.0)
    assert dynamo.reverse_interpolate(PROFILE, 0.005) == 1000.0  # tighter than profiled: the lowest point
    assert dynamo.reverse_interpolate(PROFILE, 0.050) == 3000.0


def test_dynamo_decode_formula_with_itl_correction():
    # 100 req/s x 400 output tokens = 40k tok/s; 2000 tok/s per GPU at 10 ms; 4 GPUs per engine -> 5
    assert dynamo.decode_replicas(100.0, 400.0, 0.010, 1.0, PROFILE, 4) == 5
    # ITL observed 25% above the profile: target 10 ms / 1.25 = 8 ms -> 1000 tok/s per GPU -> 10
    assert dynamo.decode_replicas(100.0, 400.0, 0.010, 1.25, PROFILE, 4) == 10


def test_dynamo_prefill_formula():
    # 100 req/s x 10k input x (1 - 0.8 hit rate) = 200k tok/s; 50k tok/s per GPU x 4 GPUs -> 1
    assert dynamo.prefill_replicas(100.0, 10_000.0, 0.8, 1.0, 50_000.0, 4) == 1
    # no prefix cache and TTFT correction capped at 1: 1M / 200k -> 5
    assert dynamo.prefill_replicas(100.0, 10_000.0, 0.0, 3.0, 50_000.0, 4) == 5


def test_dynamo_arima_follows_a_trend_and_starts_constant():
    p = dynamo.ArimaPredictor()
    for v in (10.0, 12.0, 14.0):
        p.add(v)
    assert p.predict() == 14.0  # fewer than five points: last value
    for v in (16.0, 18.0, 20.0):
        p.add(v)
    assert p.predict() == pytest.approx(22.0)


# ---------------------------------------------------------------------------------------------- WVA

TH = wva.Thresholds()  # 0.80 KV, 5 queued, triggers 0.10 and 3


def test_wva_scale_up_on_low_average_spare_kv():
    up, down = wva.analyze([0.75, 0.72], [0.0, 0.0], TH)  # spare (0.05 + 0.08) / 2 = 0.065 < 0.10
    assert up and not down


def test_wva_scale_up_on_low_spare_queue_and_when_all_saturated():
    assert wva.analyze([0.1, 0.1], [4.0, 4.0], TH)[0]  # spare queue 1 < 3
    assert wva.analyze([0.85, 0.90], [0.0, 0.0], TH) == (True, False)  # every replica saturated


def test_wva_scale_down_simulates_redistribution():
    up, down = wva.analyze([0.3, 0.3, 0.3], [0.0, 0.0, 0.0], TH)
    assert not up and down  # 0.9 over 2 replicas = 0.45: spare 0.35 >= 0.10
    up, down = wva.analyze([0.5, 0.5], [0.0, 0.0], TH)
    assert not up and not down  # 1.0 on one replica: saturated
    assert wva.analyze([0.2], [0.0], TH) == (False, False)  # a single non-saturated replica never goes
