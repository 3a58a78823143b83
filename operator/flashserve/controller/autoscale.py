"""Runs the SLA autoscaling policy (flashserve.autoscaling.policy.decide) for each serving that enables it.

Each evaluation (spec.autoscaling.evaluationIntervalSeconds): read the serving's metrics from Prometheus off
the event loop, count its groups (ready, starting, pending), decide, and in Active mode write spec.replicas
guarded by resourceVersion (a concurrent edit makes the write fail; the next evaluation decides again). The
policy's learned state survives restarts in an annotation, written when the decision changes something and
otherwise at most every few minutes, so an autoscaled serving under steady load is not rewritten every 15 s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import kopf
from kubernetes.client.rest import ApiException
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from flashserve.api.v1alpha1 import DeepSeekServing
from flashserve.autoscaling.allowlist import PrometheusAllowList
from flashserve.autoscaling.metrics import fetch_async
from flashserve.autoscaling.policy import (
    Decision,
    PolicyConfig,
    PolicyInputs,
    PolicyState,
    decide,
)
from flashserve.autoscaling.reasons import METRICS_AVAILABLE, SCALING_LIMITED
from flashserve.autoscaling.replicas import (
    GroupReadiness,
    ReplicaCounts,
    count_replicas,
)
from flashserve.autoscaling.startup import StartupSample
from flashserve.clock import now_iso
from flashserve.controller.kube import Kube
from flashserve.controller.observe import Observed
from flashserve.controller.plan import group_states
from flashserve.controller.status import Cond
from flashserve.facts.layout import layout
from flashserve.render.naming import serving_label_value

STATE_ANNOTATION = "flashserve.io/autoscaler-state"
PERSIST_EVERY_S = 300.0
# What the autoscaler writes into status (status_fields) and its conditions: cleared when it is turned off.
STATUS_FIELDS = ("slaState", "learnedCapacity", "learnedStartupSeconds", "learnedStartupSecondsByCacheState", "sla",
                 "lastScaling")  # fmt: skip
CONDITIONS = frozenset({METRICS_AVAILABLE, SCALING_LIMITED})

log = logging.getLogger(__name__)


@dataclass
class _ServingState:
    policy: PolicyState
    next_at: float = 0.0
    """time.monotonic() of the next evaluation: a wall clock stepped back must not stop evaluations."""
    persisted_at: float = 0.0
    """time.monotonic() of the last state annotation write."""
    decision: Decision | None = None
    conditions: list[Cond] = field(default_factory=list)
    last_scaling: dict | None = None
    advised: int | None = None


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(float(v), digits)


def replica_counts(obj: DeepSeekServing, observed: Observed) -> ReplicaCounts:
    """The groups below spec.replicas as the policy counts them. Ready is what status' readyReplicas counts:
    taking new requests (GroupState.serving). A group drained before its pods are replaced is not (its
    requests went to the others, which the load per ready group must reflect): it counts as starting, since
    it comes back on the new template."""
    groups = [GroupReadiness(g.exists, g.serving, g.unschedulable > 0) for g in group_states(obj, observed)]
    return count_replicas(obj.spec.replicas, groups)


def startup_samples(body: dict) -> tuple[StartupSample, ...]:
    """The completed group start-ups the operator recorded in status.startup.recent (startup_phases.py), as
    the policy's learner takes them. Status is the one record: it survives operator restarts, and the learner
    skips uids it has already learned from."""
    recent = (((body.get("status") or {}).get("startup") or {}).get("recent")) or []
    out = []
    for r in recent:
        if not isinstance(r, dict):
            continue
        seconds = (r.get("seconds") or {}).get("ready")
        uid, state = r.get("uid"), r.get("cacheState")
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0 and uid and state:
            out.append(StartupSample(str(uid), float(seconds), str(state)))
    return tuple(out)


def service_refusal(kube: Kube, namespace: str, name: str) -> str | None:
    """Why the serving's own Service `name` may not be queried, else None: one that aliases another host
    (ExternalName) or has no selector (its endpoints are whatever was written into them) would take the
    operator's request wherever its author chose."""
    try:
        svc = kube.get(namespace, "Service", name)
    except ApiException as exc:
        return f"could not read Service {name} ({exc.status}): the operator checks what a Service points at first"
    if svc is None:
        return f"no Service {name} in namespace {namespace}"
    spec = svc.get("spec") or {}
    if spec.get("type") == "ExternalName":
        return f"Service {name} is an ExternalName alias of another host: name the Prometheus itself"
    if not spec.get("selector"):
        return f"Service {name} has no selector, so its endpoints can be any address: select the Prometheus pods"
    return None


def saved_state(body: dict) -> PolicyState | None:
    """The policy state the annotation holds; None when there is none, or it cannot be read: a hand-edited
    annotation (e.g. a number too big for a float) must not break every reconcile."""
    raw = (body["metadata"].get("annotations") or {}).get(STATE_ANNOTATION)
    if not raw:
        return None
    try:
        return PolicyState.from_dict(json.loads(raw))
    except (ValueError, TypeError, OverflowError, RecursionError):
        return None


class Autoscaler:
    def __init__(self, default_prometheus_url: str | None = None, allow: PrometheusAllowList | None = None):
        self.default_prometheus_url = default_prometheus_url
        self.allow = allow or PrometheusAllowList(operator_url=default_prometheus_url)
        self.servings: dict[tuple[str, str], _ServingState] = {}
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (namespace, serving, reason)

    def next_evaluation_in(self, body: dict) -> float:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        st = self.servings.get(key)
        auto = (body.get("spec") or {}).get("autoscaling") or {}
        if not auto.get("enabled"):
            return float("inf")
        return max(0.5, (st.next_at - time.monotonic()) if st else 0.5)

    def _state(self, body: dict) -> _ServingState:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key not in self.servings:
            policy = saved_state(body) or PolicyState()
            self.servings[key] = _ServingState(policy, persisted_at=time.monotonic())
        return self.servings[key]

    def config(self, obj: DeepSeekServing) -> PolicyConfig:
        return PolicyConfig.from_spec(obj.spec.autoscaling, gpus_per_replica=layout(obj.spec).gpus_per_replica)

    async def evaluate(
        self, body: dict, obj: DeepSeekServing, observed: Observed, kube: Kube, logger: logging.Logger
    ) -> tuple[list[Cond], int | None]:
        """Conditions to report, and the replica count to act on now (None: unchanged)."""
        st = self._state(body)
        now, tick = time.time(), time.monotonic()
        if tick < st.next_at:
            return st.conditions, None
        cfg = self.config(obj)
        st.next_at = tick + cfg.evaluation_interval_s
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        url = obj.spec.autoscaling.prometheus_url or self.default_prometheus_url

        counts = replica_counts(obj, observed)
        chosen = url if url and url != self.default_prometheus_url else None  # the operator's own needs no check
        refusal = self.allow.refusal(chosen, namespace) if chosen else None
        service = self.allow.own_service(chosen, namespace) if chosen and not refusal else None
        if service:
            refusal = await asyncio.to_thread(service_refusal, kube, namespace, service)
        if refusal:
            snapshot, error = None, f"NotAllowed: spec.autoscaling.prometheusUrl {url}: {refusal}"
        elif url:
            res = await fetch_async(url, namespace, serving_label_value(name), cfg.metrics_window_s, cfg.percentile)
            snapshot, error = res.snapshot, res.error
        else:
            snapshot, error = None, "no Prometheus: set spec.autoscaling.prometheusUrl or the operator's --prometheus-url"
        startups = startup_samples(body)
        try:
            d = decide(PolicyInputs(now, snapshot, counts, cfg, error, startups=startups), st.policy)
        except Exception as exc:  # noqa: BLE001 - readings the policy cannot use are missing readings
            log.exception("%s/%s: the policy failed on these readings; holding", namespace, name)
            error = f"the policy could not use these readings ({type(exc).__name__}); holding"
            d = decide(PolicyInputs(now, None, counts, cfg, error, startups=startups), st.policy)
        if st.decision is None or (st.decision.reason, st.decision.desired) != (d.reason, d.desired):
            # Why it holds is as much an answer as why it scaled: logged when the reason changes, not per
            # evaluation (the module logger: kopf's per-object one would post an Event for each).
            log.info("%s/%s: %s (%d -> %d): %s", namespace, name, d.reason, d.current, d.desired, d.message)
        log.debug("%s/%s: %s (%d -> %d): %s; readings %s", namespace, name, d.reason, d.current, d.desired, d.message,
                  d.readings)
        # What it asked for stands only once written: a write that failed must not make spec.replicas look like
        # an outside change at the next evaluation.
        st.policy, st.decision = replace(d.state, last_desired=st.policy.last_desired) if d.apply else d.state, d
        st.conditions = list(d.conditions)
        self.decisions[(namespace, name, d.reason)] += 1

        scaled = None
        persist = tick - st.persisted_at >= PERSIST_EVERY_S
        if d.apply and obj.spec.autoscaling.mode == "Active":
            try:
                await asyncio.to_thread(kube.patch_spec_replicas, namespace, name, d.desired, meta.get("resourceVersion"))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                logger.info("spec.replicas changed concurrently; deciding again next evaluation")
                st.next_at = tick + 1.0
                return st.conditions, None
            st.policy = d.state
            scaled = d.desired
            persist = True
            st.last_scaling = {"time": now_iso(), "from": d.current, "to": d.desired, "reason": d.reason}
            kind = "Warning" if d.overrode_outside_change else "Normal"
            note = " (overriding an outside change of spec.replicas: the autoscaler owns it)" if d.overrode_outside_change else ""
            kopf.event(body, type=kind, reason="Scaled", message=f"{d.current} -> {d.desired} replicas: {d.reason}: {d.message}{note}")
        elif obj.spec.autoscaling.mode == "Advisory" and d.desired != d.current and st.advised != d.desired:
            st.advised = d.desired
            kopf.event(body, type="Normal", reason="AdvisoryScale",
                       message=f"would scale {d.current} -> {d.desired} replicas: {d.reason}: {d.message}")  # fmt: skip
        if d.desired == d.current:
            st.advised = None  # the advice was taken or is void: the next shortfall is news again
        if persist:
            st.persisted_at = tick
            await asyncio.to_thread(kube.annotate, namespace, name, STATE_ANNOTATION, json.dumps(d.state.to_dict(), separators=(",", ":")))
        return st.conditions, scaled

    async def paused(self, body: dict, kube: Kube) -> None:
        """Autoscaling is off: spec.replicas is the user's, so what the autoscaler last asked for no longer
        stands. Forgotten here and in the annotation (one write), so that turning it back on starts from
        spec.replicas as set, instead of taking the user's count for an outside change to undo. What it
        learned (capacity, start-up time) is kept."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        st = self.servings.pop(key, None)
        saved = saved_state(body)
        # What it learned since the last save (up to PERSIST_EVERY_S) is saved too, or it would be lost here.
        policy = st.policy if st else saved
        if policy is None:
            return
        kept = replace(policy, last_desired=None)
        if saved is not None and kept.to_dict() == saved.to_dict():
            return
        text = json.dumps(kept.to_dict(), separators=(",", ":"))
        await asyncio.to_thread(kube.annotate, key[0], key[1], STATE_ANNOTATION, text)

    def status_fields(self, body: dict) -> dict:
        st = self._state(body)
        d = st.decision
        if d is None:
            return {}
        out: dict = {"slaState": d.sla_state, "learnedCapacity": _round(d.capacity) if d.capacity_learned else None}
        if d.startup_learned and d.startup_s is not None:
            out["learnedStartupSeconds"] = _round(d.startup_s)
            out["learnedStartupSecondsByCacheState"] = d.startup_by_cache_state or None
        r = d.readings or {}
        sla = {
            "perUserTokensPerSecondP50": _round(r.get("speedP50")),
            "perUserTokensPerSecondP90": _round(r.get("speedAtPercentile")),
            "tokensPerSecond": _round(r.get("tokensPerSecond")),
        }
        spec = body.get("spec") or {}
        cost = ((spec.get("autoscaling") or {}).get("gpuHourlyCost"))
        tps, ready = r.get("tokensPerSecond"), r.get("ready")
        if cost and tps and ready:
            from flashserve.api.validation import parse_spec

            gpus = layout(parse_spec(spec)).gpus_per_replica * ready
            sla["tokensPerDollar"] = round(tps * 3600.0 / (gpus * cost))
        out["sla"] = {k: v for k, v in sla.items() if v is not None} or None
        if st.last_scaling:
            out["lastScaling"] = st.last_scaling
        return {k: v for k, v in out.items() if v is not None}

    def collect(self):
        desired = GaugeMetricFamily("flashserve_autoscaler_desired_replicas", "Replicas the policy wants",
                                    labels=["namespace", "serving"])  # fmt: skip
        current = GaugeMetricFamily("flashserve_autoscaler_current_replicas", "spec.replicas when evaluated",
                                    labels=["namespace", "serving"])  # fmt: skip
        speed = GaugeMetricFamily("flashserve_sla_per_user_tokens_per_second",
                                  "Per-user decode speed at the SLA percentile", labels=["namespace", "serving"])  # fmt: skip
        met = GaugeMetricFamily("flashserve_sla_met", "1 when the SLA is met, 0 when at risk or breached",
                                labels=["namespace", "serving"])  # fmt: skip
        for (ns, name), st in self.servings.items():
            d = st.decision
            if d is None:
                continue
            desired.add_metric([ns, name], d.desired)
            current.add_metric([ns, name], d.current)
            s = (d.readings or {}).get("speedAtPercentile")
            if s is not None:
                speed.add_metric([ns, name], s)
            if d.sla_state in ("Met", "AtRisk", "Breached"):
                met.add_metric([ns, name], 1.0 if d.sla_state == "Met" else 0.0)
        decisions = CounterMetricFamily("flashserve_autoscaler_decisions", "Decisions by reason",
                                        labels=["namespace", "serving", "reason"])  # fmt: skip
        for (ns, name, reason), n in self.decisions.items():
            decisions.add_metric([ns, name, reason], n)
        yield from (desired, current, speed, met, decisions)

    def forget(self, namespace: str, name: str) -> None:
        """A serving is gone: its state and its series (the decision counter included) go with it."""
        self.servings.pop((namespace, name), None)
        for key in [k for k in self.decisions if k[:2] == (namespace, name)]:
            del self.decisions[key]
