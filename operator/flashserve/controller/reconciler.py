"""One reconcile of one serving: validate, plan, write what differs, report status and events.

Writes happen only when the plan or the status differs from what is observed, so a serving in steady state
costs no API requests at all (children are observed through watches).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
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
from flashserve.render import endpoint, selector_string


log = logging.getLogger(__name__)


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

    def next_evaluation_in(self, body: dict) -> float:
        if self.autoscaler is None:
            return self.resync_seconds
        return self.autoscaler.next_evaluation_in(body)

    async def reconcile(self, body: dict, observed: Observed, logger: logging.Logger) -> None:
        self.stats.reconciles += 1
        meta, status = body["metadata"], body.get("status") or {}
        name, namespace = meta["name"], meta["namespace"]
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
        self.stats.status_writes += 1
        for kind, reason, message in transitions(old.get("conditions"), new.get("conditions", [])):
            kopf.event(body, type=kind, reason=reason, message=message)
            if kind == "Warning":
                logger.warning("%s: %s", reason, message)
