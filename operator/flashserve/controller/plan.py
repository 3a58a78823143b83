"""The reconcile decision as a pure function: desired serving + observed children -> the writes to make.

Rules:
- Groups 0..replicas-1 exist; groups beyond are deleted, highest first; nothing unlabelled is touched.
- A child is written only when it differs from what we render (steady state makes no writes).
- Pod changes roll out one group at a time (rollout.maxUnavailable groups at once). StatefulSets use OnDelete,
  and all pods of an updating group are deleted together, so a multi-node group never runs mixed versions.
  A group that is already unavailable may always be updated: replacing it cannot cost availability, and
  waiting on it would deadlock the rollout.
- A group still under the name an earlier version gave it (naming.legacy_*) moves to its current name the
  way a rollout moves: at most rollout.maxUnavailable groups at a time, the group under the current name is
  created beside the old one, and the old one (StatefulSet, headless Service, ComputeDomain) is deleted only
  once the new one is ready. Shared objects under old names go once no old group is left.
- The observed children are the serving's own (observe.owned): another object's children are never planned.

Rendering is the costly part (seconds for hundreds of groups): plan takes the rendered objects from a
RenderCache, so a plan of an unchanged serving renders nothing. plan stays a pure function of its inputs; the
reconciler runs it in a worker thread so that the event loop never waits on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flashserve.api.v1alpha1 import DeepSeekServing
from flashserve.controller.observe import Observed, PodView, is_subset, statefulset_of
from flashserve.facts.layout import layout
from flashserve.render.cache import CACHE, RenderCache, spec_digest
from flashserve.render.naming import (
    GROUP_LABEL,
    compute_domain_name,
    group_name,
    legacy_compute_domain_name,
    legacy_serving_label_value,
    network_policy_name,
    pdb_name,
    router_name,
    service_name,
    serving_label_value,
)
from flashserve.render.renderer import OPERATOR_NAMESPACE, TEMPLATE_HASH_ANNOTATION, template_hash

CHANNEL_SUFFIX = "-channel"  # a ComputeDomain's channel ResourceClaimTemplate is `<computedomain>-channel`


@dataclass(frozen=True)
class GroupState:
    index: int
    exists: bool
    updated: bool  # StatefulSet and every live pod on the current template
    ready: bool  # every pod of the group ready on the StatefulSet's template
    unschedulable: int  # pods the scheduler could not place
    pending: int  # pods not yet running (scheduled or not)
    migrating: bool = False  # also exists under an earlier name, which serves until this one is ready


@dataclass
class Plan:
    apply: list[dict] = field(default_factory=list)
    patch_replicas: list[tuple[str, int]] = field(default_factory=list)  # (statefulset, replicas) of held groups
    delete: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)
    delete_first: list[tuple[str, str]] = field(default_factory=list)  # (kind, name), before anything is applied
    delete_pods: list[str] = field(default_factory=list)
    groups: list[GroupState] = field(default_factory=list)
    rolling: list[int] = field(default_factory=list)  # groups whose update started in this plan
    deleted_groups: list[int] = field(default_factory=list)
    created_groups: list[int] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # "Kind/name" of existing children put back in shape
    migrating: list[int] = field(default_factory=list)  # groups created under the current name in this plan
    migrated: list[int] = field(default_factory=list)  # groups whose old-named copy is deleted in this plan

    @property
    def writes(self) -> int:
        return (len(self.apply) + len(self.patch_replicas) + len(self.delete) + len(self.delete_first)
                + len(self.delete_pods))  # fmt: skip


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
    # metadata, and whatever holds the object's content: spec, or a Role's rules, a RoleBinding's roleRef and
    # subjects
    for part in [k for k in obj if k not in ("apiVersion", "kind", "status")]:
        want = obj.get(part, {})
        if part == "metadata":
            want = {k: v for k, v in want.items() if k in ("labels", "annotations", "ownerReferences")}
        if not is_subset(want, live.get(part, {})):
            return True
    return False


def _live(observed: Observed, obj: dict) -> dict | None:
    kind, name = obj["kind"], obj["metadata"]["name"]
    table = observed.by_kind()
    if kind not in table:
        return None  # kinds the controller does not watch (ComputeDomain) are applied when their group changes
    return table[kind].get(name)


@dataclass
class _Groups:
    """The observed StatefulSets of one serving by group index: under the current name, and under others."""

    current: dict[int, dict]
    old: dict[int, list[dict]]
    pods: dict[str, list[PodView]]  # by StatefulSet name

    def pods_of(self, sts: dict | None) -> list[PodView]:
        return self.pods.get(sts["metadata"]["name"], []) if sts else []


def _groups(name: str, observed: Observed) -> _Groups:
    current: dict[int, dict] = {}
    old: dict[int, list[dict]] = {}
    for sts_name, sts in sorted(observed.statefulsets.items()):
        i = _index_of(sts)
        if i < 0:
            continue
        if sts_name == group_name(name, i):
            current[i] = sts
        else:
            old.setdefault(i, []).append(sts)
    pods: dict[str, list[PodView]] = {}
    for p in observed.pods:
        pods.setdefault(statefulset_of(p.name), []).append(p)
    return _Groups(current, old, pods)


def _own_states(obj: DeepSeekServing, gs: _Groups, desired: int) -> list[GroupState]:
    nodes, current = layout(obj.spec).nodes, template_hash(obj.spec)
    return [_group_state(i, gs.current.get(i), gs.pods_of(gs.current.get(i)), nodes, current) for i in range(desired)]


def _combined(own: GroupState, old: list[dict], gs: _Groups, nodes: int, current: str) -> GroupState:
    """What a group offers while it also exists under an old name: the old copy serves until the new is ready."""
    if not old or own.ready:
        return own
    olds = [_group_state(own.index, s, gs.pods_of(s), nodes, current) for s in old]
    return GroupState(
        index=own.index,
        exists=True,
        updated=False,
        ready=any(o.ready for o in olds),
        unschedulable=own.unschedulable + sum(o.unschedulable for o in olds),
        pending=own.pending + sum(o.pending for o in olds),
        migrating=True,
    )


def group_states(obj: DeepSeekServing, observed: Observed, replicas: int | None = None) -> list[GroupState]:
    """State of groups 0..replicas-1 (default spec.replicas) as observed."""
    desired = obj.spec.replicas if replicas is None else replicas
    gs = _groups(obj.metadata["name"], observed)
    nodes, current = layout(obj.spec).nodes, template_hash(obj.spec)
    return [_combined(g, gs.old.get(g.index, []), gs, nodes, current) for g in _own_states(obj, gs, desired)]


def _compute_domains_of(name: str, sts: dict) -> list[str]:
    """ComputeDomains of this serving whose channel a live StatefulSet's pods claim."""
    i = _index_of(sts)
    ours = {compute_domain_name(name, i), legacy_compute_domain_name(name, i)}
    claims = ((sts.get("spec") or {}).get("template") or {}).get("spec", {}).get("resourceClaims") or []
    out = []
    for c in claims:
        template = (c or {}).get("resourceClaimTemplateName") or ""
        cd = template[: -len(CHANNEL_SUFFIX)] if template.endswith(CHANNEL_SUFFIX) else ""
        if cd in ours:
            out.append(cd)
    return out


def _claims(objs: list[dict]) -> set[str]:
    """ComputeDomains the rendered StatefulSet of a group claims."""
    return {cd for o in objs if o["kind"] == "StatefulSet" for cd in _compute_domains_of_rendered(o)}


def _compute_domains_of_rendered(sts: dict) -> list[str]:
    claims = sts["spec"]["template"]["spec"].get("resourceClaims") or []
    return [c["resourceClaimTemplateName"][: -len(CHANNEL_SUFFIX)] for c in claims
            if c.get("resourceClaimTemplateName", "").endswith(CHANNEL_SUFFIX)]  # fmt: skip


# The router's children, deleted when routing is turned off.
ROUTER_KINDS = ("Deployment", "RoleBinding", "Role", "ServiceAccount")


def plan(obj: DeepSeekServing, observed: Observed, replicas: int | None = None,
         cache: RenderCache | None = None, operator_namespace: str = OPERATOR_NAMESPACE) -> Plan:
    cache = CACHE if cache is None else cache
    digest = spec_digest(obj)
    spec = obj.spec
    name = obj.metadata["name"]
    desired = spec.replicas if replicas is None else replicas
    nodes = layout(spec).nodes
    current = template_hash(spec)
    out = Plan()

    gs = _groups(name, observed)
    own = _own_states(obj, gs, desired)
    states = [_combined(g, gs.old.get(g.index, []), gs, nodes, current) for g in own]
    unavailable = sum(1 for g in states if g.exists and not g.ready)
    budget = spec.rollout.max_unavailable
    # Groups whose move to the current name is under way: the new copy exists and is not ready yet.
    moving = sum(1 for g in own if g.exists and not g.ready and gs.old.get(g.index))
    removed_old: set[str] = set()  # old-named StatefulSets deleted by this plan

    for g in own:
        sts = gs.current.get(g.index)
        old = gs.old.get(g.index, [])
        group_pods = [p for p in gs.pods_of(sts) if not p.terminating]
        objs = cache.group(obj, g.index, digest)
        sts_hash = sts["metadata"]["annotations"].get(TEMPLATE_HASH_ANNOTATION, "") if sts else current
        if sts is None and old:
            # Under an old name only: create the current one beside it (the old one keeps serving), as many
            # at a time as a rollout would replace.
            if moving >= budget:
                continue
            moving += 1
            out.migrating.append(g.index)
        elif sts is None:
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
                # A ComputeDomain the new template no longer claims (computeDomain turned off) goes with the
                # old pods. Deleted before the StatefulSet is rewritten: once it is, nothing observed names it.
                for cd in sorted(set(_compute_domains_of(name, sts)) - _claims(objs)):
                    out.delete_first.append(("ComputeDomain", cd))
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
        if sts is not None and old and g.ready and g.index not in out.rolling:
            # The current copy serves: the old one and its headless Service and ComputeDomain go.
            out.migrated.append(g.index)
            for o in old:
                out.delete.append(("StatefulSet", o["metadata"]["name"]))
                removed_old.add(o["metadata"]["name"])
                out.delete += [("ComputeDomain", cd) for cd in _compute_domains_of(name, o)]
            out.delete += [("Service", n) for n in _old_group_services(name, observed, g.index)]
        for o in objs:
            live = _live(observed, o)
            if _needs_apply(o, live):
                out.apply.append(o)
                if live is not None and g.index not in out.rolling:
                    out.restored.append(f"{o['kind']}/{o['metadata']['name']}")
    out.groups = states

    shared = cache.shared(obj, digest, operator_namespace)
    for o in shared:
        live = _live(observed, o)
        if _needs_apply(o, live):
            out.apply.append(o)
            if live is not None:
                out.restored.append(f"{o['kind']}/{o['metadata']['name']}")

    if not spec.network_policy.enabled:
        out.delete += [("NetworkPolicy", n) for n in observed.netpols]
    # The router's children and the InferencePool that are no longer rendered (routing or the pool turned
    # off, or the router's budget once replicas drop below two). Other budgets and policies are the engines'
    # (or of earlier names), handled below.
    wanted = {(o["kind"], o["metadata"]["name"]) for o in shared}
    router = router_name(name)
    for kind in ROUTER_KINDS + ("InferencePool",):
        out.delete += [(kind, n) for n in sorted(observed.by_kind()[kind]) if (kind, n) not in wanted]
    if ("PodDisruptionBudget", router) not in wanted and router in observed.pdbs:
        out.delete.append(("PodDisruptionBudget", router))
    if spec.network_policy.enabled and ("NetworkPolicy", router) not in wanted and router in observed.netpols:
        out.delete.append(("NetworkPolicy", router))

    # Groups beyond the desired count, highest first (under any name); their headless Services and
    # ComputeDomains with them.
    extra = sorted(
        ((i, s) for i, s in [*gs.current.items(), *((i, s) for i, ss in gs.old.items() for s in ss)] if i >= desired),
        key=lambda t: (-t[0], t[1]["metadata"]["name"]),
    )
    for i, s in extra:
        if i not in out.deleted_groups:
            out.deleted_groups.append(i)
        out.delete.append(("StatefulSet", s["metadata"]["name"]))
        removed_old.add(s["metadata"]["name"])
    group_svcs = sorted(
        ((_index_of(s), n) for n, s in observed.services.items() if s["metadata"]["labels"].get(GROUP_LABEL) is not None),
        key=lambda t: (-t[0], t[1]),
    )
    cds: list[str] = []
    for i, s in extra:
        cds += [cd for cd in _compute_domains_of(name, s) if cd not in cds]
    for i, svc in group_svcs:
        if i >= desired:
            out.delete.append(("Service", svc))
            cd = compute_domain_name(name, i)
            if spec.placement.compute_domain.enabled and svc == group_name(name, i) and cd not in cds:
                cds.append(cd)
    out.delete += [("ComputeDomain", cd) for cd in cds]

    # Shared objects under old names, once no group under an old name is left.
    old_left = [s for ss in gs.old.values() for s in ss if s["metadata"]["name"] not in removed_old]
    same_pods = legacy_serving_label_value(name) == serving_label_value(name)
    for n, s in sorted(observed.pdbs.items()):
        # Two budgets over the same pods make every eviction fail: drop the old one at once when the new one
        # covers the same pods.
        if n not in (pdb_name(name), router) and (same_pods or not old_left):
            out.delete.append(("PodDisruptionBudget", n))
    if not old_left:
        for n, s in sorted(observed.services.items()):
            if s["metadata"]["labels"].get(GROUP_LABEL) is None and n != service_name(name):
                out.delete.append(("Service", n))
        if spec.network_policy.enabled:
            out.delete += [("NetworkPolicy", n) for n in sorted(observed.netpols)
                           if n not in (network_policy_name(name), router)]  # fmt: skip
    return out


def _old_group_services(name: str, observed: Observed, index: int) -> list[str]:
    return sorted(
        n for n, s in observed.services.items()
        if s["metadata"]["labels"].get(GROUP_LABEL) == str(index) and n != group_name(name, index)
    )  # fmt: skip
