"""Status per Kubernetes API conventions, computed purely from the plan's view of the groups.

Conditions: Ready, Progressing, Degraded (plus MetricsAvailable and ScalingLimited from the autoscaler).
A condition's lastTransitionTime changes only when its status does; reason and message may change freely.
Messages are capped (MESSAGE_MAX_BYTES): a status patch with an oversized message is refused by the API
server, and then no status at all would be written. Conditions of types this operator does not own (written
by other tools) are kept as they are.
"""

from __future__ import annotations

from flashserve.api.v1alpha1 import CONDITION_TYPES
from flashserve.autoscaling.policy import ConditionHint as Cond  # one condition type for the policy and us
from flashserve.controller.plan import GroupState

MESSAGE_MAX_BYTES = 4096
REASON_MAX = 1024


def cap(text: str, limit: int = MESSAGE_MAX_BYTES) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, on a character boundary, marked with an ellipsis."""
    data = text.encode()
    if len(data) <= limit:
        return text
    marker = "…"
    return data[: limit - len(marker.encode())].decode(errors="ignore") + marker


def join_capped(parts: list[str], sep: str = "; ", limit: int = MESSAGE_MAX_BYTES) -> str:
    """The parts joined while they fit `limit` bytes, then `… and N more` for the ones left out."""
    out: list[str] = []
    size = 0
    for i, part in enumerate(parts):
        rest = len(parts) - i - 1
        tail = f"{sep}… and {rest} more" if rest else ""
        piece = (sep if out else "") + part
        if size + len(piece.encode()) + len(tail.encode()) <= limit:
            out.append(piece)
            size += len(piece.encode())
            continue
        left = len(parts) - i
        more = f"{sep if out else ''}… and {left} more"
        if not out:  # not even the first part fits: cut it rather than say nothing
            return cap(part, limit - len(f"{sep}… and {left - 1} more".encode())) + (f"{sep}… and {left - 1} more" if left > 1 else "")
        return "".join(out) + more
    return "".join(out)


def previous_conditions(last_written: list[dict] | None, on_object: list[dict] | None) -> list[dict]:
    """The conditions to merge into: ours as this operator last wrote them (newer than an object whose watch
    event has not arrived yet), other tools' as the object has them now."""
    ours = [c for c in last_written or [] if isinstance(c, dict) and c.get("type") in CONDITION_TYPES]
    theirs = [c for c in on_object or [] if isinstance(c, dict) and c.get("type") not in CONDITION_TYPES]
    return ours + theirs


def merge_conditions(previous: list[dict] | None, new: list[Cond], now: str, generation: int | None,
                     gone: frozenset[str] = frozenset()) -> list[dict]:  # fmt: skip
    """`gone`: our condition types that no longer apply (the autoscaler's, once it is turned off)."""
    old = {c.get("type"): c for c in previous or [] if isinstance(c, dict) and c.get("type") not in gone}
    out = []
    for c in new:
        prev = old.pop(c.type, None)
        changed = prev is None or prev.get("status") != c.status
        cond = {
            "type": c.type,
            "status": c.status,
            "reason": cap(c.reason, REASON_MAX),
            "message": cap(c.message),
            "lastTransitionTime": now if changed else prev.get("lastTransitionTime", now),
        }
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    # Ours that this round did not report keep their last value; other tools' conditions are theirs to keep.
    out += [c for t, c in old.items() if t not in {n.type for n in new}]
    return sorted(out, key=lambda c: CONDITION_TYPES.index(c["type"]) if c.get("type") in CONDITION_TYPES else 99)


def group_conditions(groups: list[GroupState], desired: int, extra_groups: int,
                     refused: list[tuple[int, str, str]] = ()) -> list[Cond]:  # fmt: skip
    """Ready, Progressing and Degraded from the groups' states; `refused` holds (group, StatefulSet, the API
    server's message) for each StatefulSet whose pods the API server refuses to create."""
    ready = sum(g.serving for g in groups)  # a ready group drained for its replacement serves no one
    updated = sum(g.updated and g.ready for g in groups)
    unschedulable = [g.index for g in groups if g.unschedulable]
    conds = []
    if desired == 0:
        conds.append(Cond("Ready", "True", "ScaledToZero", "no replica groups requested"))
    elif ready >= desired:
        conds.append(Cond("Ready", "True", "AllReplicasReady", f"{ready}/{desired} replica groups ready"))
    elif ready > 0:
        conds.append(Cond("Ready", "False", "PartiallyReady", f"{ready}/{desired} replica groups ready"))
    else:
        conds.append(Cond("Ready", "False", "ReplicasNotReady", f"0/{desired} replica groups ready"))

    outdated = [g.index for g in groups if g.exists and not g.updated]
    missing = [g.index for g in groups if not g.exists]
    if outdated:
        conds.append(Cond("Progressing", "True", "RollingUpdate",
                          f"{updated}/{desired} groups updated; waiting on groups {_ids(outdated)}"))  # fmt: skip
    elif missing or extra_groups:
        conds.append(Cond("Progressing", "True", "Scaling",
                          f"creating groups {_ids(missing)}" if missing else f"removing {extra_groups} groups"))  # fmt: skip
    elif ready < desired:
        conds.append(Cond("Progressing", "True", "WaitingForReady", f"{ready}/{desired} replica groups ready"))
    else:
        conds.append(Cond("Progressing", "False", "Complete", "all replica groups updated and ready"))

    # Refused pods come first: they never reach the scheduler, and no capacity added would bring them.
    if refused:
        conds.append(pods_refused_condition(refused))
    elif unschedulable:
        conds.append(Cond("Degraded", "True", "PodsUnschedulable",
                          f"groups {_ids(unschedulable)} have pods no node can take (pool exhausted or placement "
                          "impossible)"))  # fmt: skip
    else:
        conds.append(Cond("Degraded", "False", "AsExpected", ""))
    return conds


def pods_refused_condition(refused: list[tuple[int, str, str]]) -> Cond:
    """Degraded because the API server refuses to create pods (Pod Security admission, a ResourceQuota, a
    LimitRange, a webhook): its own message per StatefulSet, as the StatefulSet controller recorded it."""
    parts = [f"group {g} (StatefulSet {sts}): the API server refuses its pods: {message}"
             for g, sts, message in sorted(refused)]  # fmt: skip
    return Cond("Degraded", "True", "PodsRefused", join_capped(parts))


def surge_unschedulable_condition(surge: int | None) -> Cond:
    """Degraded while the surge group of a one-group rollout finds no node: the old group keeps serving on the
    old template and the rollout waits for room (docs/drain.md)."""
    return Cond("Degraded", "True", "SurgeUnschedulable",
                f"surge group {surge} of the rollout has pods no node can take: group 0 keeps serving on the old "
                "template until it is scheduled; add room for one more group, or set spec.rollout.surge: false to "
                "drain and replace group 0 in place (the serving does not serve until its new pods are ready)")  # fmt: skip


def invalid_spec_conditions(errors: list[str]) -> list[Cond]:
    message = join_capped(errors)
    return [
        Cond("Ready", "False", "InvalidSpec", message),
        Cond("Progressing", "False", "InvalidSpec", "fix the spec; children are left as they are"),
        Cond("Degraded", "True", "InvalidSpec", message),
    ]


def _ids(indices: list[int]) -> str:
    return ",".join(map(str, indices[:10])) + ("..." if len(indices) > 10 else "")


def group_counts(groups: list[GroupState]) -> dict[str, int]:
    return {
        "replicas": sum(g.exists for g in groups),
        "readyReplicas": sum(g.serving for g in groups),
        "updatedReplicas": sum(g.updated for g in groups),
    }


def transitions(previous: list[dict] | None, current: list[dict]) -> list[tuple[str, str, str]]:
    """Events worth telling a user: (type, reason, message) for each condition that changed status or reason."""
    old = {c.get("type"): c for c in previous or []}
    # Not ready because of a rollout or scaling the user asked for is expected, not a warning.
    planned = any(c["type"] == "Progressing" and c["status"] == "True" for c in current)
    events = []
    for c in current:
        p = old.get(c["type"])
        if p is not None and p.get("status") == c["status"] and p.get("reason") == c["reason"]:
            continue
        if c["type"] == "Ready":
            kind = "Normal" if c["status"] == "True" or (planned and c["reason"] != "InvalidSpec") else "Warning"
            if p is None and c["status"] != "True" and c["reason"] != "InvalidSpec":
                continue  # a new serving is not ready yet: not news
            events.append((kind, c["reason"], c["message"]))
        elif c["type"] == "Degraded" and c["status"] == "True":
            events.append(("Warning", c["reason"], c["message"]))
        elif c["type"] == "Progressing" and c["reason"] in ("RollingUpdate", "Complete") and p is not None:
            events.append(("Normal", "RolloutStarted" if c["reason"] == "RollingUpdate" else "RolloutComplete",
                           c["message"]))  # fmt: skip
    # One cause can set two conditions (an invalid spec: Ready and Degraded): tell it once.
    return list(dict.fromkeys(events))
