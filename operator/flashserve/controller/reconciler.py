"""One reconcile of one serving: validate, plan, write what differs, report status and events.

Writes happen only when the plan or the status differs from what is observed, so a serving in steady state
costs no API requests at all (children are observed through watches).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field

import kopf
from kubernetes import client

from flashserve.api.v1alpha1 import DeepSeekServing
from flashserve.api.validation import SpecError, parse_spec
from flashserve.controller.kube import Kube
from flashserve.controller.observe import Observed
from flashserve.controller.plan import Plan, plan
from flashserve.controller.status import (
    Cond,
    group_conditions,
    group_counts,
    invalid_spec_conditions,
    merge_conditions,
    transitions,
)
from flashserve.naming import GROUP_LABEL
from flashserve.render import endpoint, selector_string

# Watch events for our own writes arrive after a moment (seconds on a busy API server). Within this window an
# identical write is not repeated just because the mirror of the cluster has not caught up; a real outside
# change is still restored once the window has passed (well within one resync).
RECENT_WRITE_S = 10.0


log = logging.getLogger(__name__)


def _digest(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass
class Stats:
    reconciles: int = 0
    writes: int = 0
    status_writes: int = 0


@dataclass
class Controller:
    api: client.ApiClient
    resync_seconds: float = 30.0
    debounce_seconds: float = 0.2
    prometheus_url: str | None = None
    stats: Stats = field(default_factory=Stats)
    autoscaler: object | None = None  # flashserve.controller.autoscale.Autoscaler, when enabled

    def __post_init__(self) -> None:
        self.kube = Kube(self.api)
        self._recent: dict[tuple[str, str, str], tuple[str, float]] = {}  # (kind, ns, name) -> (what, when)
        self._status: dict[tuple[str, str], dict] = {}  # the status this operator last wrote, per serving

    def forget(self, namespace: str, name: str) -> None:
        """A serving is gone: a new one of the same name starts from its own (empty) status."""
        self._status.pop((namespace, name), None)

    def _first(self, key: tuple[str, str, str], what: str, now: float) -> bool:
        """False for a write identical to one made in the last RECENT_WRITE_S; otherwise record it."""
        prev = self._recent.get(key)
        if prev is not None and prev[0] == what and now - prev[1] < RECENT_WRITE_S:
            return False
        self._recent[key] = (what, now)
        return True

    def _skip_repeats(self, namespace: str, p: Plan) -> None:
        """Drop writes identical to ones made moments ago (the watch has not shown them yet)."""
        now = time.monotonic()
        p.apply = [o for o in p.apply if self._first((o["kind"], namespace, o["metadata"]["name"]), _digest(o), now)]
        applied_groups = {o["metadata"]["labels"].get(GROUP_LABEL) for o in p.apply if o["kind"] == "StatefulSet"}
        p.created_groups = [g for g in p.created_groups if str(g) in applied_groups]
        p.rolling = [g for g in p.rolling if str(g) in applied_groups]
        applied = {f"{o['kind']}/{o['metadata']['name']}" for o in p.apply}
        p.restored = [r for r in p.restored if r in applied]
        p.delete_pods = [n for n in p.delete_pods if self._first(("Pod", namespace, n), "delete", now)]
        p.delete = [(k, n) for k, n in p.delete if self._first((k, namespace, n), "delete", now)]
        if len(self._recent) > 10000:  # forget old entries so memory stays flat
            self._recent = {k: v for k, v in self._recent.items() if now - v[1] < RECENT_WRITE_S}

    def next_evaluation_in(self, body: dict) -> float:
        if self.autoscaler is None:
            return self.resync_seconds
        return self.autoscaler.next_evaluation_in(body)

    async def reconcile(self, body: dict, observed: Observed, logger: logging.Logger) -> None:
        self.stats.reconciles += 1
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        # This operator is the only writer of status: what it last wrote is newer than a body whose watch event
        # has not arrived yet, so conditions keep their transition times and an unchanged status is not rewritten.
        status = self._status.get((namespace, name)) or body.get("status") or {}
        generation = meta.get("generation")
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError as exc:
            message = "; ".join(str(e) for e in exc.errors)
            new_status = {"observedGeneration": generation}
            conds = merge_conditions(status.get("conditions"), invalid_spec_conditions(message), now_iso(), generation)
            await self._write_status(body, status, {**new_status, "conditions": conds}, logger)
            return
        obj = DeepSeekServing(metadata=dict(meta), spec=spec)

        extra_conds: list[Cond] = []
        if self.autoscaler is not None and spec.autoscaling.enabled:
            extra_conds, scaled = await self.autoscaler.evaluate(body, obj, observed, self.kube, logger)
            if scaled is not None:
                obj.spec.replicas = scaled  # act on the new count now; the watch brings the same value back

        p = plan(obj, observed)
        self._skip_repeats(namespace, p)
        if p.writes:
            log.info("%s/%s: apply %s; patch %s; delete %s; delete pods %s", namespace, name,
                     [f"{o['kind']}/{o['metadata']['name']}" for o in p.apply], p.patch_replicas, p.delete,
                     p.delete_pods)  # fmt: skip
            await asyncio.to_thread(self._execute, namespace, p)
            self.stats.writes += p.writes
            self._report(body, p, logger)

        counts = group_counts(p.groups)
        extra_groups = len(p.deleted_groups)
        conds = group_conditions(p.groups, spec.replicas, extra_groups) + extra_conds
        new_status = {
            "observedGeneration": generation,
            **counts,
            "desiredReplicas": spec.replicas,
            "selector": selector_string(name),
            "endpoint": endpoint(name, namespace, spec),
            "conditions": merge_conditions(status.get("conditions"), conds, now_iso(), generation),
        }
        if self.autoscaler is not None and spec.autoscaling.enabled:
            new_status.update(self.autoscaler.status_fields(body))
        await self._write_status(body, status, new_status, logger)

    def _execute(self, namespace: str, p: Plan) -> None:
        for obj in p.apply:
            self.kube.apply(obj)
        for sts, replicas in p.patch_replicas:
            self.kube.patch_replicas(namespace, sts, replicas)
        for pod in p.delete_pods:
            self.kube.delete(namespace, "Pod", pod)
        for kind, name in p.delete:
            self.kube.delete(namespace, kind, name)

    def _report(self, body: dict, p: Plan, logger: logging.Logger) -> None:
        if p.created_groups:
            kopf.event(body, type="Normal", reason="GroupsCreated", message=f"created replica groups {p.created_groups}")
        if p.deleted_groups:
            kopf.event(body, type="Normal", reason="GroupsDeleted", message=f"deleted replica groups {p.deleted_groups}")
        for g in p.rolling:
            kopf.event(body, type="Normal", reason="GroupUpdating",
                       message=f"replacing all pods of group {g} with the new template")  # fmt: skip
        if p.restored:
            msg = "restored to the operator's intent after an outside change: " + ", ".join(sorted(set(p.restored)))
            kopf.event(body, type="Warning", reason="DriftCorrected", message=msg)
            logger.warning(msg)

    async def _write_status(self, body: dict, old: dict, new: dict, logger: logging.Logger) -> None:
        merged = {**old, **{k: v for k, v in new.items()}}
        if merged == old:
            return
        meta = body["metadata"]
        changed = sorted(k for k in new if old.get(k) != new[k])
        log.info("%s/%s: status %s", meta["namespace"], meta["name"], changed)
        await asyncio.to_thread(self.kube.patch_status, meta["namespace"], meta["name"], new)
        self._status[(meta["namespace"], meta["name"])] = merged
        self.stats.status_writes += 1
        for kind, reason, message in transitions(old.get("conditions"), new.get("conditions", [])):
            kopf.event(body, type=kind, reason=reason, message=message)
            if kind == "Warning":
                logger.warning("%s: %s", reason, message)
