"""What status says of the router in front of the engines: its pods' counts, and what the conditions say while
no router pod is available.

The client Service moves to the router only while the router Deployment reports an available pod, and back to
the engines that take traffic when it reports none (controller/plan.py, router_available). So a serving whose
groups are ready still answers without a router, only without session affinity (and without the prefix-cache
hits it brings). Status says so rather than claim all is well:

- Ready stays True (the endpoint answers), with reason `ServingWithoutRouter` instead of `AllReplicasReady`.
- While the router Deployment is still rolling out its pods (a new serving, routing just turned on, a router
  image change), and for ROUTER_GRACE_S after the first group serves without a router, Progressing is True
  with reason `WaitingForRouter`: a router pod passes /readiness only once it has found a healthy engine, so
  for a new serving it comes a few seconds after the first ready group (also when the engines' start-up took
  longer than the Deployment's progress deadline, which then reads ProgressDeadlineExceeded).
- Past that, with the Deployment's rollout over (its Progressing condition says NewReplicaSetAvailable, or it
  passed its progress deadline) and still no pod available, Degraded is True with reason `RouterUnavailable`,
  unless another cause of Degraded is already reported.

Nothing is said while no group serves: a router pod cannot be ready before an engine is.
"""

from __future__ import annotations

from flashserve.autoscaling.policy import ConditionHint as Cond
from flashserve.clock import iso_at, parse_iso

# The Deployment controller's Progressing reason once every pod of its newest ReplicaSet is available; any
# other reason while Progressing is True means pods are still coming.
ROLLOUT_DONE = "NewReplicaSetAvailable"
# How long groups may serve without a router before status calls it degraded: a router pod's readiness probe
# (every 5 s) passes once its pod watch has shown it a ready engine, which takes a few seconds; a minute leaves
# room for a busy API server and a slow image pull.
ROUTER_GRACE_S = 60.0


def _count(status: dict, key: str) -> int:
    value = status.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def router_status(deployment: dict | None) -> dict[str, int]:
    """status.router from the router Deployment's own status (zeros while it has none)."""
    status = (deployment or {}).get("status") or {}
    return {key: _count(status, key) for key in ("replicas", "readyReplicas", "availableReplicas")}


def unavailable_since(previous: dict | None, routerless: bool, now: float) -> float | None:
    """Since when (epoch seconds) groups have served with no router pod: the time the last status recorded
    (status.router.unavailableSince), else now; None when a router pod is available or no group serves. Kept
    in status, not in memory, so that an operator restart neither restarts the grace nor cuts it short."""
    if not routerless:
        return None
    since = parse_iso((previous or {}).get("unavailableSince"))
    return since if since is not None and since <= now else now


def router_status_fields(deployment: dict | None, since: float | None, previous: dict | None) -> dict:
    """status.router: the Deployment's pod counts, and unavailableSince while groups serve without a router
    (null once they do not, where the last status had one: the status is written as a merge patch)."""
    fields: dict = router_status(deployment)
    if since is not None:
        fields["unavailableSince"] = iso_at(since)
    elif "unavailableSince" in (previous or {}):
        fields["unavailableSince"] = None
    return fields


def grace_left(previous: dict | None, now: float) -> float | None:
    """Seconds until RouterUnavailable is due by the status last written; None when no grace is running."""
    since = parse_iso((previous or {}).get("unavailableSince"))
    return None if since is None else since + ROUTER_GRACE_S - now


def router_rolling_out(deployment: dict | None) -> bool:
    """Whether the router Deployment is still bringing its pods up: not observed yet, its spec not yet seen by
    the Deployment controller, or its Progressing condition True for any reason but a finished rollout."""
    if deployment is None:
        return True
    meta, status = deployment.get("metadata") or {}, deployment.get("status") or {}
    generation, seen = meta.get("generation"), status.get("observedGeneration")
    if isinstance(generation, int) and (not isinstance(seen, int) or seen < generation):
        return True
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Progressing":
            return c.get("status") == "True" and c.get("reason") != ROLLOUT_DONE
    return False


def with_router(conds: list[Cond], deployment: dict | None, serving_groups: int, waited_s: float = 0.0) -> list[Cond]:
    """The group conditions amended for a router with no available pod (routing enabled); unchanged when the
    router has one, or when no group serves. `waited_s`: how long groups have served without a router pod."""
    counts = router_status(deployment)
    if counts["availableReplicas"] >= 1 or serving_groups == 0:
        return conds
    direct = "the client Service sends traffic to the engines directly, without session affinity"
    out: list[Cond] = []
    for c in conds:
        if c.type == "Ready" and c.status == "True" and c.reason == "AllReplicasReady":
            c = Cond("Ready", "True", "ServingWithoutRouter", f"{c.message}; no router pod is available: {direct}")
        out.append(c)
    degraded = any(c.type == "Degraded" and c.status == "True" for c in out)
    if router_rolling_out(deployment) or waited_s < ROUTER_GRACE_S:
        if not any(c.type == "Progressing" and c.status == "True" for c in out):
            out = [c for c in out if c.type != "Progressing"] + [
                Cond("Progressing", "True", "WaitingForRouter",
                     f"waiting for a router pod to pass its readiness probe ({counts['readyReplicas']}/"
                     f"{counts['replicas']} ready); meanwhile {direct}")]  # fmt: skip
    elif not degraded:
        out = [c for c in out if c.type != "Degraded"] + [
            Cond("Degraded", "True", "RouterUnavailable",
                 f"no router pod is available ({counts['readyReplicas']}/{counts['replicas']} ready): {direct}; "
                 "see the router Deployment's pods and events")]  # fmt: skip
    return out
