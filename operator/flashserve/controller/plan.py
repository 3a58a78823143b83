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
  created beside the old one, and the old one (StatefulSet, headless Service, ComputeDomain) is drained once
  the new one is ready and in routing, and deleted once drained. Shared objects under old names go once no old
  group is left.
- The observed children are the serving's own (observe.owned): another object's children are never planned.
- A group is drained before it goes (controller/drain.py): its pods are taken out of routing, and its
  StatefulSet is deleted (scale-down) or its pods are replaced (rollout) only once its engines are idle or
  rollout.drainSeconds has passed. A draining group counts against rollout.maxUnavailable. A pod out of
  routing whose group no longer has to go (replicas back up, spec reverted) is put back into routing.
- A serving of one group rolls out through a surge group (rollout.surge): group 1 is made on the new template
  beside the old group 0, which serves until group 1 is ready; then group 0 is drained and replaced, and once
  it is ready again group 1 is beyond the desired count and drained and removed like any scale-down.

Rendering is the costly part (seconds for hundreds of groups): plan takes the rendered objects from a
RenderCache, so a plan of an unchanged serving renders nothing. plan stays a pure function of its inputs; the
reconciler runs it in a worker thread so that the event loop never waits on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from flashserve.api.v1alpha1 import DeepSeekServing
from flashserve.controller.drain import RENAME, ROLLOUT, SCALE_DOWN, Drain, DrainStep, drain_step
from flashserve.controller.observe import Observed, PodView, is_subset, statefulset_of
from flashserve.facts.layout import layout
from flashserve.render.cache import CACHE, RenderCache, spec_digest
from flashserve.render.naming import (
    GROUP_LABEL,
    ROUTING_DRAIN,
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
from flashserve.render.renderer import (
    OPERATOR_NAMESPACE,
    TEMPLATE_HASH_ANNOTATION,
    ApiServer,
    serve_selector,
    template_hash,
)

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
    # Ready and in routing: it takes new requests (a ready group drained before its pods are replaced does not),
    # under its current name, an earlier one, or (group 0 in a one-group rollout) through the surge group.
    # What status' readyReplicas and the autoscaler count.
    serving: bool = False


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
    drain_pods: list[tuple[str, str, str]] = field(default_factory=list)  # (pod, uid, since) out of routing
    undrain_pods: list[tuple[str, str]] = field(default_factory=list)  # (pod, uid) back into routing
    draining: list[Drain] = field(default_factory=list)  # drains in progress after this plan
    drained: list[Drain] = field(default_factory=list)  # drains that ended in this plan (their groups go now)
    drain_started: list[int] = field(default_factory=list)
    drain_cancelled: list[int] = field(default_factory=list)
    surge: int | None = None  # the surge group of a one-group rollout, while it is kept
    surge_unschedulable: bool = False  # the surge group's pods find no node: the old group keeps serving

    @property
    def writes(self) -> int:
        return (len(self.apply) + len(self.patch_replicas) + len(self.delete) + len(self.delete_first)
                + len(self.delete_pods) + len(self.drain_pods) + len(self.undrain_pods))  # fmt: skip

    def step(self, s: DrainStep) -> bool:
        """Record one group's drain step; True when the group may go now."""
        self.drain_pods += s.label
        if s.drain is not None:
            if s.started:
                self.drain_started.append(s.drain.group)
            (self.drained if s.done else self.draining).append(s.drain)
        return s.done


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
        serving=ready and not _out_of_routing(live),
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
        serving=any(o.serving for o in olds),
    )


def _stand_in(states: list[GroupState], surge: GroupState | None) -> list[GroupState]:
    """Group 0 of a one-group rollout serves through the surge group while that one is ready and in routing:
    the serving still takes requests on one group while group 0 drains and is replaced."""
    if surge is None or not surge.serving or not states or states[0].serving:
        return states
    return [replace(states[0], serving=True), *states[1:]]


def group_states(obj: DeepSeekServing, observed: Observed, replicas: int | None = None) -> list[GroupState]:
    """State of groups 0..replicas-1 (default spec.replicas) as observed, as plan() reports them."""
    desired = obj.spec.replicas if replicas is None else replicas
    gs = _groups(obj.metadata["name"], observed)
    nodes, current = layout(obj.spec).nodes, template_hash(obj.spec)
    own = _own_states(obj, gs, desired)
    states = [_combined(g, gs.old.get(g.index, []), gs, nodes, current) for g in own]
    return _stand_in(states, _surge_state(obj, gs, own, desired, nodes, current)[1])


def _surge_state(obj: DeepSeekServing, gs: _Groups, own: list[GroupState], desired: int, nodes: int,
                 current: str) -> tuple[tuple[int | None, bool], GroupState | None]:  # fmt: skip
    """_surge_index's answer, and the surge group's state when there is one."""
    surge, hold0 = _surge_index(obj, gs, own, desired, current)
    if surge is None:
        return (None, hold0), None
    sts = gs.current.get(surge)
    return (surge, hold0), _group_state(surge, sts, gs.pods_of(sts), nodes, current)


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


def _out_of_routing(pods: list[PodView]) -> bool:
    return any(p.routing == ROUTING_DRAIN for p in pods)


def _surge_index(obj: DeepSeekServing, gs: _Groups, own: list[GroupState], desired: int,
                 current: str) -> tuple[int | None, bool]:  # fmt: skip
    """The surge group of a one-group rollout (index 1) when one is to be made or kept, else None; and whether
    group 0 is to wait for it."""
    spec = obj.spec
    if desired != 1 or not spec.rollout.surge or spec.rollout.drain_seconds == 0:
        return None, False
    if spec.autoscaling.enabled and spec.autoscaling.max_replicas < 2:
        return None, False  # no room for a second group within the GPU budget
    sts0, sts1 = gs.current.get(0), gs.current.get(1)
    if sts0 is None:
        return None, False
    old0 = sts0["metadata"]["annotations"].get(TEMPLATE_HASH_ANNOTATION, "") != current
    live0 = [p for p in gs.pods_of(sts0) if not p.terminating]
    # Group 0 is protected by a surge only while it serves on its old template and is not being replaced
    # already: a group that does not serve has nothing to protect, one drained for replacement is past that.
    protect = old0 and own[0].ready and not _out_of_routing(live0)
    if sts1 is not None:
        if sts1["metadata"]["annotations"].get(TEMPLATE_HASH_ANNOTATION, "") != current:
            # A group 1 on another template (scaled down in the same edit) is no surge: it is removed as a
            # scale-down, and group 0 serves meanwhile; the surge is made once it is gone.
            return None, protect
        # Kept until group 0 is on the new template and ready again.
        return (None, False) if own[0].updated and own[0].ready else (1, False)
    return (1, False) if protect else (None, False)


def router_available(observed: Observed, serving: str) -> bool:
    """Whether the serving's router Deployment has a pod that passes its readiness probe (which it does once
    it has found a healthy engine)."""
    dep = observed.deployments.get(router_name(serving))
    available = ((dep or {}).get("status") or {}).get("availableReplicas") or 0
    return isinstance(available, int) and available >= 1


def _behind_engines(obj: dict, serving: str) -> dict:
    """The client Service as routing off renders it (the engines that take traffic); other objects as they are."""
    if obj["kind"] != "Service" or obj["metadata"]["name"] != service_name(serving):
        return obj
    return {**obj, "spec": {**obj["spec"], "selector": serve_selector(serving)}}


def _moved(obj: dict, live: dict) -> bool:
    """A client Service that differs from the live one in its selector alone: moved between the engines and
    the router by design, not drift."""
    if obj["kind"] != "Service" or obj.get("spec", {}).get("selector") == (live.get("spec") or {}).get("selector"):
        return False
    same = {**obj, "spec": {**obj["spec"], "selector": (live.get("spec") or {}).get("selector")}}
    return not _needs_apply(same, live)


def plan(obj: DeepSeekServing, observed: Observed, replicas: int | None = None,
         cache: RenderCache | None = None, operator_namespace: str = OPERATOR_NAMESPACE,
         api_server: ApiServer = ()) -> Plan:  # fmt: skip
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
    # A ready group out of routing (draining before its pods are replaced) serves no one: it counts as down.
    unavailable = sum(1 for g in states if g.exists and not g.ready) + sum(
        1 for g in own if g.ready and _out_of_routing(gs.pods_of(gs.current.get(g.index)))
    )
    budget = spec.rollout.max_unavailable
    (surge, hold0), surge_state = _surge_state(obj, gs, own, desired, nodes, current)
    out.surge = surge
    in_drain: set[str] = set()  # pods whose group drains (or goes) in this plan: not put back into routing
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
            draining = _out_of_routing(group_pods)
            surge_waits = hold0 or (surge_state is not None and not surge_state.ready)
            if surge_waits and surge_state is not None:
                out.surge_unschedulable = surge_state.unschedulable > 0
            if not surge_waits and (draining or not g.ready or unavailable < budget):
                if g.ready and not draining:
                    unavailable += 1
                in_drain.update(p.name for p in group_pods)
                go = out.step(drain_step(g.index, ROLLOUT, group_pods, spec, observed))
            else:
                go = False
            if go:
                # Drained: new template, then replace all its pods at once.
                out.rolling.append(g.index)
                out.delete_pods += [p.name for p in group_pods]
                # A ComputeDomain the new template no longer claims (computeDomain turned off) goes with the
                # old pods. Deleted before the StatefulSet is rewritten: once it is, nothing observed names it.
                for cd in sorted(set(_compute_domains_of(name, sts)) - _claims(objs)):
                    out.delete_first.append(("ComputeDomain", cd))
            else:
                # Draining, waiting on the surge group, or held back by the rollout budget: keep its old
                # template, but keep its size.
                if sts["spec"].get("replicas") != nodes:
                    out.patch_replicas.append((sts["metadata"]["name"], nodes))
                    out.restored.append(f"StatefulSet/{sts['metadata']['name']}")
                objs = [o for o in objs if o["kind"] != "StatefulSet"]
        else:
            # On the current template: finish a half-done update (e.g. the operator died between writing the
            # StatefulSet and deleting the pods) by replacing every stale pod of the group together, drained.
            stale = [p for p in group_pods if p.template_hash != current]
            if stale:
                in_drain.update(p.name for p in stale)
                if out.step(drain_step(g.index, ROLLOUT, stale, spec, observed)):
                    out.delete_pods += [p.name for p in stale]
        draining_now = {d.group for d in out.draining + out.drained}
        if sts is not None and old and g.serving and g.index not in out.rolling and g.index not in draining_now:
            # The current copy serves: the old one is drained like any group that goes, then it and its headless
            # Service and ComputeDomain go.
            old_pods = [p for o in old for p in gs.pods_of(o) if not p.terminating]
            in_drain.update(p.name for p in old_pods)
            if out.step(drain_step(g.index, RENAME, old_pods, spec, observed)):
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
    out.groups = _stand_in(states, surge_state)

    if surge is not None:
        # The surge group: made (or kept in shape) on the current template like any group.
        sts = gs.current.get(surge)
        if sts is None:
            out.created_groups.append(surge)
        for o in cache.group(obj, surge, digest):
            live = _live(observed, o)
            if _needs_apply(o, live):
                out.apply.append(o)
                if live is not None:
                    out.restored.append(f"{o['kind']}/{o['metadata']['name']}")

    shared = cache.shared(obj, digest, operator_namespace, api_server)
    if spec.routing.enabled and not router_available(observed, name):
        # The client Service moves to the router only once a router pod is available: turning routing on (or
        # an operator upgrade that brings the router) never leaves the endpoint without a backend meanwhile.
        shared = [_behind_engines(o, name) for o in shared]
    for o in shared:
        live = _live(observed, o)
        if _needs_apply(o, live):
            out.apply.append(o)
            if live is not None and not _moved(o, live):
                out.restored.append(f"{o['kind']}/{o['metadata']['name']}")

    if not spec.network_policy.enabled:
        out.delete += [("NetworkPolicy", n) for n in observed.netpols]
    # The router's children and the InferencePool that are no longer rendered (routing or the pool turned
    # off, or the router's budget once replicas drop below two). Other budgets and policies are the engines'
    # (or of earlier names), handled below.
    wanted = {(o["kind"], o["metadata"]["name"]) for o in shared}
    router = router_name(name)
    # spec.startup's DaemonSets and Jobs likewise: a Job's pod template cannot change, so a changed prefetch
    # is a Job under a new name (renderer) and the old one goes here.
    for kind in ROUTER_KINDS + ("InferencePool", "DaemonSet", "Job"):
        out.delete += [(kind, n) for n in sorted(observed.by_kind()[kind]) if (kind, n) not in wanted]
    if ("PodDisruptionBudget", router) not in wanted and router in observed.pdbs:
        out.delete.append(("PodDisruptionBudget", router))
    if spec.network_policy.enabled and ("NetworkPolicy", router) not in wanted and router in observed.netpols:
        out.delete.append(("NetworkPolicy", router))

    # Groups beyond the desired count, highest first (under any name), each once drained; their headless
    # Services and ComputeDomains with them. The surge group is not among them while it is kept.
    extra = sorted(
        ((i, s) for i, s in [*gs.current.items(), *((i, s) for i, ss in gs.old.items() for s in ss)]
         if i >= desired and not (i == surge and s is gs.current.get(i))),
        key=lambda t: (-t[0], t[1]["metadata"]["name"]),
    )  # fmt: skip
    by_index: dict[int, list[dict]] = {}
    for i, s in extra:
        by_index.setdefault(i, []).append(s)
    staying: set[int] = {surge} if surge is not None else set()  # groups >= desired that are not deleted now
    for i, group in by_index.items():
        pods = [p for s in group for p in gs.pods_of(s) if not p.terminating]
        in_drain.update(p.name for p in pods)
        if not out.step(drain_step(i, SCALE_DOWN, pods, spec, observed)):
            staying.add(i)
            continue
        out.deleted_groups.append(i)
        for s in group:
            out.delete.append(("StatefulSet", s["metadata"]["name"]))
            removed_old.add(s["metadata"]["name"])
    extra = [(i, s) for i, s in extra if i not in staying]
    group_svcs = sorted(
        ((_index_of(s), n) for n, s in observed.services.items() if s["metadata"]["labels"].get(GROUP_LABEL) is not None),
        key=lambda t: (-t[0], t[1]),
    )
    cds: list[str] = []
    for i, s in extra:
        cds += [cd for cd in _compute_domains_of(name, s) if cd not in cds]
    for i, svc in group_svcs:
        if i >= desired and i not in staying:
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

    # Pods out of routing whose group no longer has to go: back into routing (a cancelled drain). Pods without
    # the label (made by an operator version before it existed) get it too: the router and the Service select
    # only labelled pods, and these still serve until their rollout replaces them.
    for sts_name, pods in sorted(gs.pods.items()):
        live = [p for p in pods if not p.terminating and p.name not in in_drain]
        back = [p for p in live if p.routing == ROUTING_DRAIN]
        out.undrain_pods += [(p.name, p.uid) for p in back]
        out.undrain_pods += [(p.name, p.uid) for p in live if not p.routing]
        for g in sorted({p.group for p in back}):
            if g not in out.drain_cancelled:
                out.drain_cancelled.append(g)
    return out


def _old_group_services(name: str, observed: Observed, index: int) -> list[str]:
    return sorted(
        n for n, s in observed.services.items()
        if s["metadata"]["labels"].get(GROUP_LABEL) == str(index) and n != group_name(name, index)
    )  # fmt: skip
