"""The operator's autoscaler wiring: metrics in, spec.replicas written (or not), status fields and conditions.
Prometheus is a fake HTTP server on 127.0.0.1; the Kubernetes writes are recorded, not sent."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException
from flashserve.controller.autoscale import STATE_ANNOTATION

from tests.builders import body_for, ready_observed
from tests.fakes import RecordingKube, evaluate, loopback_scaler


def test_breach_scales_up_at_once_and_reports(prometheus, events):
    url, fake = prometheus
    # 2 replicas, 900 users running: per-user speed far below 100 tok/s on the per-request reading (1 / 20 ms;
    # the per-step one, 1.6 tokens / 16 ms = 100 tok/s, would not show it).
    fake.values.update(running=900.0, running_avg=900.0, tpot_at_percentile=0.020, tpot_p50=0.015)
    scaler, kube = loopback_scaler(), RecordingKube()
    body = body_for(url)
    conds, scaled = evaluate(scaler, body, ready_observed(2), kube)
    assert scaled is not None and scaled > 2
    assert ("replicas", "team-a", "flash", scaled, "42") in kube.calls, "write guarded by resourceVersion"
    assert any(c[0] == "annotate" and c[1] == STATE_ANNOTATION for c in kube.calls), "state persisted on change"
    assert events and events[-1]["reason"] == "Scaled" and f"2 -> {scaled}" in events[-1]["message"]
    assert {c.type: c.status for c in conds}["MetricsAvailable"] == "True"
    status = scaler.status_fields(body)
    assert status["slaState"] in ("Breached", "AtRisk")
    assert status["lastScaling"]["from"] == 2 and status["lastScaling"]["to"] == scaled
    assert status["sla"]["tokensPerSecond"] > 0 and status["sla"]["tokensPerDollar"] > 0
    assert status["sla"]["perUserTokensPerSecondP90"] == pytest.approx(50.0)


def test_advisory_mode_reports_without_writing(prometheus, events):
    url, fake = prometheus
    fake.values.update(running=900.0, running_avg=900.0, tpot_at_percentile=0.020, tpot_p50=0.015)
    scaler, kube = loopback_scaler(), RecordingKube()
    conds, scaled = evaluate(scaler, body_for(url, mode="Advisory"), ready_observed(2), kube)
    assert scaled is None and not [c for c in kube.calls if c[0] == "replicas"]
    assert events and events[-1]["reason"] == "AdvisoryScale"


def test_prometheus_down_holds_with_metrics_unavailable(events):
    scaler, kube = loopback_scaler(), RecordingKube()
    conds, scaled = evaluate(scaler, body_for("http://127.0.0.1:9"), ready_observed(3), kube)
    assert scaled is None and not kube.calls
    metrics = {c.type: c for c in conds}["MetricsAvailable"]
    assert metrics.status == "False" and "Prometheus" in metrics.message


def test_evaluations_are_paced_by_the_interval(prometheus, events):
    url, fake = prometheus
    scaler, kube = loopback_scaler(), RecordingKube()
    body = body_for(url)
    evaluate(scaler, body, ready_observed(2), kube)
    seen = len(fake.seen)
    assert seen > 0, "the first evaluation queries"
    evaluate(scaler, body, ready_observed(2), kube)
    assert len(fake.seen) == seen, "a second evaluation inside the interval must not query again"
    assert 0 < scaler.next_evaluation_in(body) <= 15


def test_learned_state_is_restored_from_the_annotation(prometheus, events):
    url, fake = prometheus
    fake.values.update(running=900.0, running_avg=900.0, tpot_at_percentile=0.020, tpot_p50=0.015)
    scaler, kube = loopback_scaler(), RecordingKube()
    evaluate(scaler, body_for(url), ready_observed(2), kube)
    saved = [c for c in kube.calls if c[0] == "annotate"][-1][2]
    restarted = loopback_scaler()
    body = body_for(url)
    body["metadata"]["annotations"] = {STATE_ANNOTATION: json.dumps(saved)}
    assert restarted._state(body).policy.to_dict() == saved
    body["metadata"]["annotations"] = {STATE_ANNOTATION: "{not json"}
    assert loopback_scaler()._state(body).policy is not None, "a broken annotation falls back to defaults"


@pytest.mark.parametrize("saved", [
    {"lastDesired": 10**400},  # a float() of it raises OverflowError
    {"capacity": {"w": 10**400, "n": 1}},
    {"demand": {"level": 10**400, "trend": 0, "noise": 0, "t": 0}},
    {"peaks": [[0, 10**400]]},
    {"lastDesired": 1e308, "ready": 10**300},
])  # fmt: skip
def test_a_huge_number_in_the_state_annotation_falls_back_to_defaults(prometheus, events, saved):
    url, _ = prometheus
    body = body_for(url)
    body["metadata"]["annotations"] = {STATE_ANNOTATION: json.dumps(saved)}
    conds, _ = evaluate(loopback_scaler(), body, ready_observed(2), RecordingKube())
    assert {c.type for c in conds} >= {"MetricsAvailable"}


def test_a_deleted_serving_leaves_no_series(prometheus, events):
    url, _ = prometheus
    scaler = loopback_scaler()
    evaluate(scaler, body_for(url), ready_observed(2), RecordingKube())
    assert any(k[:2] == ("team-a", "flash") for k in scaler.decisions)
    scaler.forget("team-a", "flash")
    series = [s for family in scaler.collect() for s in family.samples]
    assert not [s for s in series if s.labels.get("serving") == "flash"], "the decision counter is pruned too"


def test_status_shows_the_learned_startup_from_the_persisted_state(prometheus, events):
    url, fake = prometheus
    scaler, kube = loopback_scaler(), RecordingKube()
    body = body_for(url)
    evaluate(scaler, body, ready_observed(2), kube)
    assert "learnedStartupSeconds" not in scaler.status_fields(body), "nothing learned: nothing shown"
    learned = {"startup": {"samples": {"cold": [1000.0], "warm": [150.0, 160.0, 170.0]},
                           "recent": ["warm", "warm", "cold", "warm"]}}  # fmt: skip
    body = body_for(url)
    body["metadata"]["name"] = "flash-2"
    body["metadata"]["annotations"] = {STATE_ANNOTATION: json.dumps(learned)}
    evaluate(scaler, body, ready_observed(2), kube)
    status = scaler.status_fields(body)
    assert status["learnedStartupSeconds"] == 160.0
    assert status["learnedStartupSecondsByCacheState"] == {"cold": 1000.0, "warm": 160.0}


def test_the_learner_reads_the_start_ups_the_operator_recorded_in_status(prometheus, events):
    url, _ = prometheus
    scaler, kube = loopback_scaler(), RecordingKube()
    body = body_for(url)
    rec = lambda uid, s, state: {"uid": uid, "cacheState": state, "seconds": {"scheduled": 1, "running": 5, "ready": s}}  # noqa: E731
    # A group still starting has no ready time (null in status): nothing to learn from it.
    body["status"] = {"startup": {"recent": [rec("u1", 480, "weights-cached"), rec("u2", 470, "weights-cached"),
                                             {"uid": "u3", "cacheState": "cold", "seconds": {"ready": None}}]}}  # fmt: skip
    evaluate(scaler, body, ready_observed(2), kube)
    status = scaler.status_fields(body)
    assert status["learnedStartupSecondsByCacheState"] == {"weights-cached": pytest.approx(475.0, abs=10.0)}
    assert status["learnedStartupSeconds"] == status["learnedStartupSecondsByCacheState"]["weights-cached"]
    # The same records again (status keeps the last few) are not learned twice.
    before = scaler._state(body).policy.startup.to_dict()
    scaler._state(body).next_at = 0.0
    evaluate(scaler, body, ready_observed(2), kube)
    assert scaler._state(body).policy.startup.to_dict() == before


def test_turning_autoscaling_off_forgets_what_it_asked_for_so_a_re_enable_keeps_the_users_count(events):
    # the autoscaler had asked for 3; autoscaling is turned off and a human scales to 6, then on again while
    # Prometheus is down: the human's 6 is where it starts, not an outside change to undo blind
    scaler, kube = loopback_scaler(), RecordingKube()
    body = body_for("http://127.0.0.1:9", replicas=6)
    body["metadata"]["annotations"] = {STATE_ANNOTATION: json.dumps({"lastDesired": 3, "capacity": {}})}
    body["spec"]["autoscaling"]["enabled"] = False
    asyncio.run(scaler.paused(body, kube))
    written = [c for c in kube.calls if c[0] == "annotate"]
    assert written and "lastDesired" not in written[-1][2], "the annotation forgets it too (one write)"
    body["metadata"]["annotations"] = {STATE_ANNOTATION: json.dumps(written[-1][2])}
    asyncio.run(scaler.paused(body, kube))
    assert len([c for c in kube.calls if c[0] == "annotate"]) == 1, "steady state writes nothing"
    body["spec"]["autoscaling"]["enabled"] = True
    _, scaled = evaluate(scaler, body, ready_observed(6), kube)
    assert scaled is None and not [c for c in kube.calls if c[0] == "replicas"]


def test_blind_an_outside_change_is_not_lowered(events):
    # the autoscaler asked for 3 and someone scaled to 6 while Prometheus is unreachable: holding means 6
    scaler, kube = loopback_scaler(), RecordingKube()
    body = body_for("http://127.0.0.1:9", replicas=6)
    body["metadata"]["annotations"] = {STATE_ANNOTATION: json.dumps({"lastDesired": 3})}
    _, scaled = evaluate(scaler, body, ready_observed(6), kube)
    assert scaled is None and not [c for c in kube.calls if c[0] == "replicas"]


def test_a_write_that_lost_a_race_is_not_remembered_as_asked_for(prometheus, events):
    url, fake = prometheus
    fake.values.update(running=900.0, running_avg=900.0, tpot_at_percentile=0.020, tpot_p50=0.015)
    scaler = loopback_scaler()

    class Conflicting(RecordingKube):
        def patch_spec_replicas(self, namespace, name, replicas, resource_version):
            raise ApiException(status=409)

    body = body_for(url)
    _, scaled = evaluate(scaler, body, ready_observed(2), Conflicting())
    assert scaled is None
    assert scaler._state(body).policy.last_desired is None, "2 is still the user's count, not an outside change"


def test_an_advisory_shortfall_is_news_again_after_the_fleet_caught_up(prometheus, events):
    url, fake = prometheus
    fake.values.update(running=900.0, running_avg=900.0, tpot_at_percentile=0.020, tpot_p50=0.015)
    scaler, kube = loopback_scaler(), RecordingKube()
    body = body_for(url, mode="Advisory")
    evaluate(scaler, body, ready_observed(2), kube)
    advised = [e for e in events if e["reason"] == "AdvisoryScale"]
    assert len(advised) == 1
    st = scaler._state(body)
    want = st.decision.desired
    st.next_at = 0.0
    body = body_for(url, mode="Advisory", replicas=want)
    evaluate(scaler, body, ready_observed(want), kube)  # a human took the advice (or load fell): no gap
    assert st.decision.desired == st.decision.current
    st.next_at, body = 0.0, body_for(url, mode="Advisory")
    evaluate(scaler, body, ready_observed(2), kube)
    assert len([e for e in events if e["reason"] == "AdvisoryScale"]) == 2


def test_readings_the_policy_cannot_use_hold_instead_of_stopping_the_reconcile(prometheus, events, monkeypatch):
    from flashserve.controller import autoscale

    url, _ = prometheus
    real = autoscale.decide

    def fragile(inputs, state):
        if inputs.metrics is not None:
            raise OverflowError(34, "Numerical result out of range")
        return real(inputs, state)

    monkeypatch.setattr(autoscale, "decide", fragile)
    conds, scaled = evaluate(loopback_scaler(), body_for(url), ready_observed(2), RecordingKube())
    metrics = {c.type: c for c in conds}["MetricsAvailable"]
    assert scaled is None and metrics.status == "False" and "OverflowError" in metrics.message


def test_a_wall_clock_stepped_back_does_not_stop_evaluations(prometheus, events, monkeypatch):
    from flashserve.controller import autoscale

    url, fake = prometheus
    scaler, body = loopback_scaler(), body_for(url)
    evaluate(scaler, body, ready_observed(2), RecordingKube())
    seen = len(fake.seen)
    wall, tick = time.time(), scaler._state(body).next_at + 1.0
    monkeypatch.setattr(autoscale, "time", SimpleNamespace(time=lambda: wall - 3600.0, monotonic=lambda: tick))
    evaluate(scaler, body, ready_observed(2), RecordingKube())
    assert len(fake.seen) > seen
