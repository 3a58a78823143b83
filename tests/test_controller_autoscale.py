"""The operator's autoscaler wiring: metrics in, spec.replicas written (or not), status fields and conditions.
Prometheus is a fake HTTP server on 127.0.0.1; the Kubernetes writes are recorded, not sent."""

from __future__ import annotations

import json

import pytest
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
