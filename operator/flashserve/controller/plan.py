"""The reconcile decision as a pure function: desired serving + observed children -> the writes to make.

Rules:
- Groups 0..replicas-1 exist; groups beyond are deleted, highest first; nothing unlabelled is touched.
- A child is written only when it differs from what we render (steady state makes no writes).
- Pod changes roll out one group at a time (rollout.maxUnavailable groups at once). StatefulSets use OnDelete,
  and all pods of an updating group are deleted together, so a multi-node group never runs mixed versions.
  A group that is already unavailable may always be updated: replacing it cannot cost availability, and
  waiting on it would deadlock the rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flashserve.api.v1alpha1 import DeepSeekServing
from flashserve.controller.observe import Observed, PodView, is_subset
from flashserve.layout import layout
from flashserve.naming import GROUP_LABEL, compute_domain_name, group_name
from flashserve.render import TEMPLATE_HASH_ANNOTATION, render_group, render_shared, template_hash


@dataclass(frozen=True)
class GroupState:
    index: int
    exists: bool
    updated: bool  # StatefulSet and every live pod on the current template
    ready: bool  # every pod of the group ready on the StatefulSet's template
    unschedulable: int  # pods the scheduler could not place
    pending: int  # pods not yet running (scheduled or not)


@dataclass
class Plan:
    apply: list[dict] = field(default_factory=list)
    patch_replicas: list[tuple[str, int]] = field(default_factory=list)  # (statefulset, replicas) of held groups
    delete: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)
    delete_pods: list[str] = field(default_factory=list)
    groups: list[GroupState] = field(default_factory=list)
    rolling: list[int] = field(default_factory=list)  # groups whose update started in this plan
    deleted_groups: list[int] = field(default_factory=list)
    created_groups: list[int] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # "Kind/name" of existing children put back in shape

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.patch_replicas) + len(self.delete) + len(self.delete_pods)


def _index_of(sts: dict) -> int:
    try:
        return int(sts["metadata"]["labels"].get(GROUP_LABEL, "-1"))
    except (KeyError, ValueError):
        return -1


def _group_state(index: int, sts: dict | None, pods: list[PodView], nodes: int, current: str) -> GroupState:
    if sts is None:
        return GroupState(index, False, False, False, 0, 0)
    sts_hash = sts["metadata"]["annotations"].get(TEMPLATE_HASH_ANNOTATION, "")
    live = [p for p in pods if not p.terminating]
    on_template = [p for p in live if p.template_hash == sts_hash]
    ready = len(on_template) == nodes and all(p.ready for p in on_template) and len(live) == nodes
    updated = sts_hash == current and all(p.template_hash == current for p in live)
    return GroupState(
        index=index,
        exists=True,
        updated=updated,
        ready=ready,
        unschedulable=sum(p.unschedulable for p in live),
        pending=sum(p.phase == "Pending" for p in live),
    )


def _needs_apply(obj: dict, live: dict | None) -> bool:
    if live is None:
        return True
    for part in ("metadata", "spec"):
        want = obj.get(part, {})
        if part == "metadata":
            want = {k: v for k, v in want.items() if k in ("labels", "annotations", "ownerReferences")}
        if not is_subset(want, live.get(part, {})):
            return True
    return False


def _live(observed: Observed, obj: dict) -> dict | None:
    kind, name = obj["kind"], obj["metadata"]["name"]
    table = {"StatefulSet": observed.statefulsets, "Service": observed.services, "PodDisruptionBudget": observed.pdbs,
             "NetworkPolicy": observed.netpols}  # fmt: skip
    if kind not in table:
        return None  # kinds the controller does not watch (ComputeDomain) are applied when their group changes
    return table[kind].get(name)


def group_states(obj: DeepSeekServing, observed: Observed, replicas: int | None = None) -> list[GroupState]:
    """State of groups 0..replicas-1 (default spec.replicas) as observed."""
    desired = obj.spec.replicas if replicas is None else replicas
    nodes = layout(obj.spec).nodes
    current = template_hash(obj.spec)
    pods_by_group: dict[int, list[PodView]] = {}
    for p in observed.pods:
        pods_by_group.setdefault(p.group, []).append(p)
    sts_by_index = {_index_of(s): s for s in observed.statefulsets.values()}
    return [_group_state(i, sts_by_index.get(i), pods_by_group.get(i, []), nodes, current) for i in range(desired)]


def plan(obj: DeepSeekServing, observed: Observed, replicas: int | None = None) -> Plan:
    spec = obj.spec
    name = obj.metadata["name"]
    desired = spec.replicas if replicas is None else replicas
    nodes = layout(spec).nodes
    current = template_hash(spec)
    out = Plan()

    pods_by_group: dict[int, list[PodView]] = {}
    for p in observed.pods:
        pods_by_group.setdefault(p.group, []).append(p)
    sts_by_index = {_index_of(s): s for s in observed.statefulsets.values()}

    states = group_states(obj, observed, desired)
    unavailable = sum(1 for g in states if g.exists and not g.ready)
    budget = spec.rollout.max_unavailable

    for g in states:
        sts = sts_by_index.get(g.index)
        group_pods = [p for p in pods_by_group.get(g.index, []) if not p.terminating]
        objs = render_group(obj, g.index)
        sts_hash = sts["metadata"]["annotations"].get(TEMPLATE_HASH_ANNOTATION, "") if sts else current
        if sts is None:
            if group_name(name, g.index) in observed.services:
                out.restored.append(f"StatefulSet/{group_name(name, g.index)}")  # deleted by hand
            else:
                out.created_groups.append(g.index)
        elif sts_hash != current:
            if not g.ready or unavailable < budget:
                # Start this group's update: new template, then replace all its pods at once.
                out.rolling.append(g.index)
                out.delete_pods += [p.name for p in group_pods]
                if g.ready:
                    unavailable += 1
            else:
                # Held back by the rollout budget: keep its old template, but keep its size.
                if sts["spec"].get("replicas") != nodes:
                    out.patch_replicas.append((sts["metadata"]["name"], nodes))
                    out.restored.append(f"StatefulSet/{sts['metadata']['name']}")
                objs = [o for o in objs if o["kind"] != "StatefulSet"]
        else:
            # On the current template: finish a half-done update (e.g. the operator died between writing the
            # StatefulSet and deleting the pods) by replacing every stale pod of the group together.
            stale = [p.name for p in group_pods if p.template_hash != current]
            out.delete_pods += stale
        for o in objs:
            live = _live(observed, o)
            if _needs_apply(o, live):
                out.apply.append(o)
                if live is not None and g.index not in out.rolling:
                    out.restored.append(f"{o['kind']}/{o['metadata']['name']}")
    out.groups = states

    for o in render_shared(obj):
        live = _live(observed, o)
        if _needs_apply(o, live):
            out.apply.append(o)
            if live is not None:
                out.restored.append(f"{o['kind']}/{o['metadata']['name']}")

    if not spec.network_policy.enabled:
        out.delete += [("NetworkPolicy", n) for n in observed.netpols]

    # Groups beyond the desired count, highest first; their headless Services and ComputeDomains with them.
    extra = sorted((i for i in sts_by_index if i >= desired), reverse=True)
    for i in extra:
        out.deleted_groups.append(i)
        out.delete.append(("StatefulSet", sts_by_index[i]["metadata"]["name"]))
    group_svcs = {
        _index_of(s): s["metadata"]["name"]
        for s in observed.services.values()
        if s["metadata"]["labels"].get(GROUP_LABEL) is not None
    }
    for i in sorted((i for i in group_svcs if i >= desired), reverse=True):
        out.delete.append(("Service", group_svcs[i]))
        if spec.placement.compute_domain.enabled:
            out.delete.append(("ComputeDomain", compute_domain_name(name, i)))
    return out
