"""Pod status patches a kubelet would write, for the runtime's engine processes.

The local cluster's contract (docs/local-cluster.md): conditions are merged by `type`, while
`containerStatuses` is replaced as a whole, so every entry is sent back as read with only the engine's changed.
"""

from __future__ import annotations

import copy

from flashserve.clock import now_iso

READY_TYPES = ("Ready", "ContainersReady")


def condition(pod: dict, ctype: str) -> dict:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return {}


def is_ready(pod: dict) -> bool:
    return condition(pod, "Ready").get("status") == "True"


def container_status(pod: dict, name: str) -> dict:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == name:
            return cs
    return {}


def _conditions(pod: dict, ready: bool, container: str, now: str) -> list[dict]:
    value = "True" if ready else "False"
    out = []
    for ctype in READY_TYPES:
        old = condition(pod, ctype)
        c: dict = {"type": ctype, "status": value,
                   "lastTransitionTime": now if old.get("status") != value else old.get("lastTransitionTime", now)}
        if ready:
            c.update(reason=None, message=None)  # null deletes the field in a strategic merge patch
        else:
            c.update(reason="ContainersNotReady", message=f"containers with unready status: [{container}]")
        out.append(c)
    return out


def _statuses(pod: dict, container: str, change) -> list[dict]:
    out = []
    found = False
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        cs = copy.deepcopy(cs)
        if cs.get("name") == container:
            change(cs)
            found = True
        out.append(cs)
    if not found:
        cs = {"name": container, "image": "", "restartCount": 0}
        change(cs)
        out.append(cs)
    return out


def readiness(pod: dict, container: str, ready: bool, now: str | None = None) -> dict:
    now = now or now_iso()

    def change(cs: dict) -> None:
        cs["ready"] = ready

    return {"status": {"conditions": _conditions(pod, ready, container, now),
                       "containerStatuses": _statuses(pod, container, change)}}


def started(pod: dict, container: str, container_id: str, started_at: str, restarted: bool,
            now: str | None = None) -> dict:
    """The engine process (re)started: running, not ready. A restart moves the previous state to lastState and
    counts it, as the kubelet does under restartPolicy Always."""
    now = now or now_iso()

    def change(cs: dict) -> None:
        if restarted:
            prev = cs.get("state") or {}
            if "terminated" in prev:
                cs["lastState"] = {"terminated": prev["terminated"]}
            cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
        cs.update(ready=False, started=True, containerID=container_id, state={"running": {"startedAt": started_at}})

    return {"status": {"conditions": _conditions(pod, False, container, now),
                       "containerStatuses": _statuses(pod, container, change)}}


def exit_details(returncode: int) -> tuple[int, str]:
    """(exitCode, reason) as a container runtime reports them: a signal N is exit code 128 + N."""
    if returncode < 0:
        return 128 - returncode, "Error"
    return returncode, "Completed" if returncode == 0 else "Error"


def terminated(pod: dict, container: str, container_id: str, returncode: int, started_at: str,
               message: str = "", now: str | None = None, reason: str | None = None) -> dict:
    now = now or now_iso()
    code, default_reason = exit_details(returncode)
    reason = reason or default_reason

    def change(cs: dict) -> None:
        term = {"exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now,
                "containerID": container_id}
        if returncode < 0:
            term["signal"] = -returncode
        if message:
            term["message"] = message[-1024:]
        cs.update(ready=False, started=False, state={"terminated": term})

    return {"status": {"conditions": _conditions(pod, False, container, now),
                       "containerStatuses": _statuses(pod, container, change)}}
