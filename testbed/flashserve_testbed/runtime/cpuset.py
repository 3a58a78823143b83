"""The kubelet's static CPU manager policy (`--cpu-manager-policy=static`), as the mock runtime plays it for the
pods it runs: a container of a Guaranteed pod whose CPU request is a whole number of cores gets that many cores
of its own; every other container runs on the shared pool, the cores no container holds. This is what
`spec.routing.resources.dedicatedCpus` asks of a real node pool (docs/routing.md, "Cores of its own").

Every KWOK node of the local cluster is the same host, so the cores are the host's, one pool for all nodes: a
core given to one pod is taken from the pods of every node. The shared pool never shrinks below
`min_shared` cores (the kubelet's reserved CPUs), and a pod whose cores are not free is refused at its start,
as the kubelet refuses its admission, and started once they are."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

POLICIES = ("none", "static")


class NotEnoughCpus(Exception):
    pass


def whole_cpus(pod: dict, container: dict) -> int:
    """Cores the static policy gives `container` for itself: its CPU request when the API server classed the pod
    Guaranteed (`status.qosClass`) and the request is whole cores (`2`, `2000m`), else 0 (the shared pool)."""
    if ((pod.get("status") or {}).get("qosClass")) != "Guaranteed":
        return 0
    cpu = str(((container.get("resources") or {}).get("requests") or {}).get("cpu", ""))
    if re.fullmatch(r"[0-9]+", cpu):
        return int(cpu)
    m = re.fullmatch(r"([0-9]+)m", cpu)
    return int(m.group(1)) // 1000 if m and int(m.group(1)) % 1000 == 0 else 0


class CpuManager:
    """Which cores each pod holds, and the shared pool the rest run on."""

    def __init__(self, cpus: Iterable[int], min_shared: int = 1) -> None:
        self.cpus = frozenset(cpus)
        self.min_shared = min_shared
        self.held: dict[str, frozenset[int]] = {}

    @property
    def shared(self) -> frozenset[int]:
        return self.cpus.difference(*self.held.values())

    def allocate(self, key: str, n: int) -> frozenset[int]:
        """`n` cores for `key` (the same ones again if it holds them): the highest-numbered free ones, so the
        low cores the host's own processes favour stay shared. Raises NotEnoughCpus, naming what is free."""
        if key in self.held:
            return self.held[key]
        free = sorted(self.shared)
        if n > len(free) - self.min_shared:
            raise NotEnoughCpus(f"not enough cpus available to satisfy request: {n} asked, {len(free)} shared of "
                                f"{len(self.cpus)}, {self.min_shared} of them reserved for the shared pool")
        self.held[key] = frozenset(free[len(free) - n:])
        return self.held[key]

    def release(self, key: str) -> bool:
        """Give `key`'s cores back to the shared pool; whether it held any."""
        return self.held.pop(key, None) is not None

    def cpus_for(self, key: str) -> frozenset[int]:
        return self.held.get(key) or self.shared


def _groups_of(pgids: set[int], proc: Path) -> list[int]:
    """The processes of the sessions the runtime started (`start_new_session`: a group is its leader's pid),
    from one pass over /proc."""
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after its last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) in pgids:
            pids.append(int(entry.name))
    return pids


def pin_groups(pgids: set[int], cpus: frozenset[int], proc: Path = Path("/proc")) -> int:
    """Move every thread of every process in the groups onto `cpus` (affinity is per thread, and a running
    process's threads keep theirs); returns the threads moved."""
    moved = 0
    for pid in _groups_of(pgids, proc) if pgids else []:
        try:
            tids = [int(t.name) for t in (proc / str(pid) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
                moved += 1
            except OSError:
                pass  # the thread ended meanwhile
    return moved


def allowed_cpus(pid: int) -> list[int]:
    """The cores `pid` may run on, as the status server reports them."""
    return sorted(os.sched_getaffinity(pid))
