"""What the controller sees of a serving's children, reduced to the few fields it decides on.

Children reach the controller through kopf's in-memory indexes (fed by one watch per kind), so a reconcile
reads nothing from the API server. The functions here turn raw objects into small, comparable values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flashserve.api import quantity
from flashserve.clock import parse_iso
from flashserve.render.naming import COMPONENT_LABEL, GROUP_LABEL, ROUTING_LABEL, SERVING_LABEL
from flashserve.render.renderer import TEMPLATE_HASH_ANNOTATION

# When the operator took a pod out of routing, on the pod itself: a drain's clock survives an operator restart.
DRAIN_SINCE_ANNOTATION = "flashserve.io/drain-since"
# The engine container of a group's pods (render/templates/statefulset.yaml.j2): its start is the group's
# "running", and its startupProbe the budget a start-up is measured against.
ENGINE_CONTAINER = "vllm"
ROUTER_CONTAINER = "router"  # the router Deployment's container (templates/router-deployment.yaml.j2)


@dataclass(frozen=True)
class PodView:
    name: str
    group: int
    template_hash: str
    ready: bool
    terminating: bool
    phase: str
    unschedulable: bool  # the scheduler found no node: the pool is exhausted or placement impossible
    restarts: int
    node: str
    routing: str = ""  # the routing label: serve, drain, or none (pods made before the label existed)
    drain_since: str = ""  # when the operator took the pod out of routing (RFC 3339), if it did
    ip: str = ""  # status.podIP
    uid: str = ""
    owner_uid: str = ""  # uid of the object that controls the pod (its StatefulSet)
    host_network: bool = False
    component: str = ""  # app.kubernetes.io/component: engine or router
    # The API's own times of a start-up, in seconds since the epoch (None: not there yet): PodScheduled=True,
    # state.running.startedAt of the engine container (a router pod's: the router container), Ready=True
    # (the condition's lastTransitionTime each)
    scheduled_at: float | None = None
    started_at: float | None = None
    ready_at: float | None = None


# The resources whose objects the operator makes (and so watches, controller/handlers.py): their kinds, and
# the Observed field that holds them.
@dataclass(frozen=True)
class Child:
    group: str
    version: str
    plural: str
    kind: str
    field: str  # of Observed

    @property
    def index(self) -> str:
        """The kopf index of this kind (kopf names an index by its handler's id)."""
        return f"fs_{self.field}"


CHILDREN = (
    Child("apps", "v1", "statefulsets", "StatefulSet", "statefulsets"),
    Child("", "v1", "services", "Service", "services"),
    Child("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", "pdbs"),
    Child("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", "netpols"),
    Child("", "v1", "pods", "Pod", "pods"),
    Child("apps", "v1", "deployments", "Deployment", "deployments"),
    Child("", "v1", "serviceaccounts", "ServiceAccount", "serviceaccounts"),
    Child("rbac.authorization.k8s.io", "v1", "roles", "Role", "roles"),
    Child("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", "rolebindings"),
    # The InferencePool CRD comes with an inference gateway and may be missing: kopf then serves no watch for
    # it (it logs that the resource is unresolved) and starts one when the CRD appears.
    Child("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool", "inferencepools"),
    Child("apps", "v1", "daemonsets", "DaemonSet", "daemonsets"),
    Child("batch", "v1", "jobs", "Job", "jobs"),
)

@dataclass
class Observed:
    statefulsets: dict[str, dict] = field(default_factory=dict)  # by name
    services: dict[str, dict] = field(default_factory=dict)
    pdbs: dict[str, dict] = field(default_factory=dict)
    netpols: dict[str, dict] = field(default_factory=dict)
    pods: list[PodView] = field(default_factory=list)
    # The router's children and the InferencePool, by name
    deployments: dict[str, dict] = field(default_factory=dict)
    serviceaccounts: dict[str, dict] = field(default_factory=dict)
    roles: dict[str, dict] = field(default_factory=dict)
    rolebindings: dict[str, dict] = field(default_factory=dict)
    inferencepools: dict[str, dict] = field(default_factory=dict)
    # spec.startup's weights prefetch and image pre-pull, by name
    daemonsets: dict[str, dict] = field(default_factory=dict)
    jobs: dict[str, dict] = field(default_factory=dict)
    # The prefetch and pre-pull pods (flashserve.io/startup-of): whether a node's weights copy was complete
    # when an engine pod was placed there
    startup_pods: list[PodView] = field(default_factory=list)
    # The router Deployment's pods (owned(): named after an observed Deployment of the serving)
    router_pods: list[PodView] = field(default_factory=list)

    def by_kind(self) -> dict[str, dict[str, dict]]:
        """The observed children of each kind the controller watches, by name (pods aside)."""
        return {c.kind: getattr(self, c.field) for c in CHILDREN if c.field != "pods"}
    # Not from the watches: what the reconciler gathered before planning, so that the plan stays pure.
    now: float = 0.0  # wall clock, seconds since the epoch (drain times are wall-clock annotations)
    in_flight: dict[str, int | None] = field(default_factory=dict)  # pod -> running + waiting requests it
    # reported (None: it did not answer); only pods of draining groups are asked
    # When every router pod of the serving last confirmed its workers (the observation time the workers were
    # computed from), where the operator keeps them; None: not since the operator started
    routers_synced_at: float | None = None


def controller_uid(child: dict) -> str | None:
    """UID of the object that controls a child (its ownerReference with controller: true), if any."""
    for ref in (child.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref.get("uid")
    return None


def statefulset_of(pod_name: str) -> str:
    """A StatefulSet's pods are named `<statefulset>-<ordinal>`."""
    return pod_name.rsplit("-", 1)[0]


def owned(observed: Observed, uid: str | None, label_value: str) -> Observed:
    """The children that are this serving's: controlled by its uid, or carrying its (injective) label value
    and controlled by nothing (orphans it may adopt). Children of another object that happen to carry the
    same label (earlier label values were not unique) are left out, so the plan never touches them."""
    if not uid:
        return observed  # offline (no uid): everything observed is ours

    def mine(child: dict) -> bool:
        owner = controller_uid(child)
        if owner is not None:
            return owner == uid
        return ((child.get("metadata") or {}).get("labels") or {}).get(SERVING_LABEL) == label_value

    sts = {n: s for n, s in observed.statefulsets.items() if mine(s)}
    daemonsets = {n: s for n, s in observed.daemonsets.items() if mine(s)}
    jobs = {n: s for n, s in observed.jobs.items() if mine(s)}
    workers = {((s.get("metadata") or {}).get("uid")) for s in [*daemonsets.values(), *jobs.values()]} - {None}
    deployments = {n: s for n, s in observed.deployments.items() if mine(s)}
    return Observed(
        statefulsets=sts,
        services={n: s for n, s in observed.services.items() if mine(s)},
        pdbs={n: s for n, s in observed.pdbs.items() if mine(s)},
        netpols={n: s for n, s in observed.netpols.items() if mine(s)},
        pods=[p for p in observed.pods if controlled_by(p, sts.get(statefulset_of(p.name)))],
        deployments=deployments,
        serviceaccounts={n: s for n, s in observed.serviceaccounts.items() if mine(s)},
        roles={n: s for n, s in observed.roles.items() if mine(s)},
        rolebindings={n: s for n, s in observed.rolebindings.items() if mine(s)},
        inferencepools={n: s for n, s in observed.inferencepools.items() if mine(s)},
        daemonsets=daemonsets,
        jobs=jobs,
        startup_pods=[p for p in observed.startup_pods if p.owner_uid in workers],
        # A Deployment's pods are `<deployment>-<ReplicaSet hash>-<suffix>`.
        router_pods=[p for p in observed.pods if p.component == "router" and p.name.rsplit("-", 2)[0] in deployments],
        now=observed.now,
        in_flight=dict(observed.in_flight),
    )


def controlled_by(pod: PodView, sts: dict | None, strict: bool = False) -> bool:
    """Whether the pod is one of the StatefulSet's: named after it and controlled by it. Anyone who may create
    pods in the namespace can give one a group's name and labels; such a pod must not be registered with the
    routers, probed by a drain or counted in the group. A StatefulSet known without its uid (offline) is
    matched by name, unless `strict` (before the operator connects to the pod)."""
    if sts is None:
        return False
    uid = (sts.get("metadata") or {}).get("uid")
    return pod.owner_uid == uid if uid or strict else True


def pods_missing(observed: Observed) -> dict[str, int]:
    """StatefulSets with fewer pods than they ask for: name -> pods missing. A pod counts as soon as it exists,
    in the watch or in the StatefulSet's status.replicas (whichever shows more), so lag of one watch does not
    make a shortage; a pod the API server refused exists in neither."""
    have: dict[str, int] = {}
    for p in observed.pods:
        sts = statefulset_of(p.name)
        have[sts] = have.get(sts, 0) + 1
    out = {}
    for name, sts in observed.statefulsets.items():
        want = (sts.get("spec") or {}).get("replicas", 1)
        created = (sts.get("status") or {}).get("replicas") or 0
        if isinstance(want, int) and want > max(have.get(name, 0), created if isinstance(created, int) else 0):
            out[name] = want - max(have.get(name, 0), created)
    return out


def serving_key(namespace: str, labels: dict) -> tuple[str, str] | None:
    serving = (labels or {}).get(SERVING_LABEL)
    return (namespace, serving) if serving else None


RBAC_FIELDS = ("rules", "roleRef", "subjects")


def slim(body: dict) -> dict:
    """The parts of a child the controller compares against what it renders."""
    meta = body.get("metadata", {})
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": list(meta.get("ownerReferences") or []),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            # When a replica group began: the first phase of its start-up (startup_phases.py)
            "creationTimestamp": meta.get("creationTimestamp"),
        },
        "spec": body.get("spec", {}),
        "status": body.get("status", {}),
        # What RBAC objects hold instead of a spec
        **{k: body[k] for k in RBAC_FIELDS if k in body},
    }


def pod_view(body: dict) -> PodView:
    meta, status = body.get("metadata", {}), body.get("status", {})
    labels = meta.get("labels") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready", {}).get("status") == "True"
    sched = conditions.get("PodScheduled", {})
    unschedulable = sched.get("status") == "False" and sched.get("reason") == "Unschedulable"
    restarts = sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or [])
    own = ROUTER_CONTAINER if labels.get(COMPONENT_LABEL) == "router" else ENGINE_CONTAINER
    container = next((c for c in status.get("containerStatuses") or [] if c.get("name") == own), {})
    started = ((container.get("state") or {}).get("running") or {}).get("startedAt")
    try:
        group = int(labels.get(GROUP_LABEL, "-1"))
    except ValueError:
        group = -1
    return PodView(
        name=meta.get("name", ""),
        group=group,
        template_hash=(meta.get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION, ""),
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        phase=status.get("phase", "Pending"),
        unschedulable=unschedulable,
        restarts=restarts,
        node=(body.get("spec") or {}).get("nodeName") or "",
        routing=str(labels.get(ROUTING_LABEL, "")),
        drain_since=str((meta.get("annotations") or {}).get(DRAIN_SINCE_ANNOTATION, "")),
        ip=str(status.get("podIP") or ""),
        uid=str(meta.get("uid") or ""),
        owner_uid=controller_uid(body) or "",
        host_network=bool((body.get("spec") or {}).get("hostNetwork")),
        component=str(labels.get(COMPONENT_LABEL, "")),
        scheduled_at=parse_iso(sched.get("lastTransitionTime")) if sched.get("status") == "True" else None,
        started_at=parse_iso(started),
        ready_at=parse_iso(conditions.get("Ready", {}).get("lastTransitionTime")) if ready else None,
    )


# Where a rendered object holds resource quantities: the maps of container resources (and a claim's), whose
# every value is one, and an emptyDir's size limit.
_QUANTITY_MAPS = frozenset({"requests", "limits"})
_QUANTITY_KEYS = frozenset({"sizeLimit"})


def is_subset(want: object, have: object, quantities: bool = False) -> bool:
    """True when every field we set has the value we set. The API server adds defaults (superset is fine) and
    never drops what an applier set; the one thing it rewrites is a quantity's spelling (`1024Gi` is stored as
    `1Ti`, `1.5` as `1500m`), so quantities compare by the amount. This tells whether an apply would change
    anything."""
    if isinstance(want, dict):
        # Empty maps and lists are dropped by the API server (omitempty): absent is what we asked for.
        return isinstance(have, dict) and all(
            is_subset(v, have[k], quantities or k in _QUANTITY_KEYS or k in _QUANTITY_MAPS)
            if k in have else v in ({}, [], None)
            for k, v in want.items()
        )
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    if quantities and want != have and (amount := quantity.amount(want)) is not None:
        return amount == quantity.amount(have)
    if isinstance(want, (int, float)) and isinstance(have, str) or isinstance(want, str) and isinstance(have, int):
        return str(want) == str(have)
    return want == have
