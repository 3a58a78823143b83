"""The Kubernetes Pod Security Standards (baseline and restricted, as of Kubernetes 1.35) as a pure check of a
pod spec, for tests: which rules a pod breaks at a level, and the strictest level it meets.

Covers the controls of https://kubernetes.io/docs/concepts/security/pod-security-standards/ that a pod spec
can break: host namespaces, privileged containers, capabilities, hostPath volumes, host ports, AppArmor,
SELinux, /proc mount, seccomp and sysctls (baseline); volume types, privilege escalation, non-root,
runAsUser, seccomp and capabilities (restricted). Windows HostProcess is checked; the AppArmor annotations
are not (the renderer sets none).
"""

from __future__ import annotations

LEVELS = ("restricted", "baseline", "privileged")  # strictest first

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def _containers(pod: dict) -> list[dict]:
    return [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]


def _bare(cap: str) -> str:
    return cap.upper().removeprefix("CAP_")


def baseline_violations(pod: dict) -> list[str]:
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"{key}: true")
    for v in pod.get("volumes", []):
        if "hostPath" in v:
            out.append(f"hostPath volume {v['name']}")
    contexts = [("pod", psc)] + [(c["name"], c.get("securityContext") or {}) for c in _containers(pod)]
    for where, sc in contexts:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}: windowsOptions.hostProcess")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{where}: seccompProfile Unconfined")
        if (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"{where}: appArmorProfile {sc['appArmorProfile']['type']}")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"{where}: seLinuxOptions {se}")
    for c in _containers(pod):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        added = {_bare(cap) for cap in (sc.get("capabilities") or {}).get("add", [])}
        if added - BASELINE_CAPABILITIES:
            out.append(f"{c['name']}: adds capabilities {sorted(added - BASELINE_CAPABILITIES)}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{c['name']}: procMount {sc['procMount']}")
        for p in c.get("ports", []):
            if p.get("hostPort"):
                out.append(f"{c['name']}: hostPort {p['hostPort']}")
    for s in psc.get("sysctls", []):
        if s["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {s['name']}")
    return out


def restricted_violations(pod: dict) -> list[str]:
    out = baseline_violations(pod)
    psc = pod.get("securityContext") or {}
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']} of type {sorted(kinds - RESTRICTED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        out.append("pod: runAsUser 0")
    for c in _containers(pod):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}, not RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in {_bare(cap) for cap in caps.get("drop", [])}:
            out.append(f"{name}: does not drop ALL capabilities")
        added = {_bare(cap) for cap in caps.get("add", [])} - {"NET_BIND_SERVICE"}
        if added:
            out.append(f"{name}: adds {sorted(added)}; restricted allows only NET_BIND_SERVICE")
    return out


def violations(pod: dict, level: str) -> list[str]:
    """The rules of `level` the pod spec breaks (none: the pod is admitted at that level)."""
    if level == "privileged":
        return []
    if level == "baseline":
        return baseline_violations(pod)
    if level == "restricted":
        return restricted_violations(pod)
    raise ValueError(f"unknown Pod Security level {level!r}; one of {LEVELS}")


def strictest_level(pod: dict) -> str:
    """The strictest Pod Security level whose namespace would admit the pod."""
    return next(level for level in LEVELS if not violations(pod, level))
