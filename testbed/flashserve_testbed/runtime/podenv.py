"""A container's environment and command line resolved from its pod, as the kubelet would, without a kubelet.

Only what a pod object holds is used: literal values, the downward API (fieldRef, resourceFieldRef) and
`$(VAR)` references. Secrets and ConfigMaps are never read: their variables get a placeholder value and a
note, so a mock engine still starts while nothing secret leaves the API server.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

PLACEHOLDER = "flashserve-mock-runtime-placeholder"

_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")
_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


class EnvError(ValueError):
    """A reference the kubelet would refuse too (the pod would not start)."""


@dataclass
class ResolvedEnv:
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def expand(text: str, values: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`, and anything else
    (unknown names, an unclosed `$(`) is kept as written."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "$" and i + 1 < n:
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end == -1:
                    out.append(text[i:])
                    break
                name = text[i + 2 : end]
                out.append(values[name] if name in values else text[i : end + 1])
                i = end + 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def field_ref(pod: dict, path: str) -> str:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    m = _LABEL_REF.fullmatch(path)
    if m:
        return str((meta.get(m[1]) or {}).get(m[2], ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(p.get("ip", "") for p in status.get("podIPs") or []),
        "status.hostIPs": ",".join(p.get("ip", "") for p in status.get("hostIPs") or []),
    }
    if path not in simple:
        raise EnvError(f"unsupported fieldRef fieldPath {path!r}")
    return str(simple[path] or "")


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity ("32", "256Gi", "500m", "1e3") as a number."""
    m = re.fullmatch(r"([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)", str(text).strip())
    if not m:
        raise EnvError(f"invalid quantity {text!r}")
    try:
        number = Decimal(m[1] + (m[2] or ""))
    except InvalidOperation:
        raise EnvError(f"invalid quantity {text!r}") from None
    return number * Decimal(_SUFFIX[m[3] or ""])


def resource_ref(container: dict, ref: dict) -> str:
    """resourceFieldRef: the value divided by the divisor, rounded up, as the kubelet writes it."""
    kind, _, name = str(ref.get("resource", "")).partition(".")
    if kind not in ("limits", "requests") or not name:
        raise EnvError(f"unsupported resourceFieldRef resource {ref.get('resource')!r}")
    res = container.get("resources") or {}
    raw = (res.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (res.get("limits") or {}).get(name)  # a request defaults to the limit
    if raw is None:
        return "0"  # unbounded: the kubelet would report node allocatable, which a mock node does not have
    divisor = quantity(ref.get("divisor") or "1")
    if divisor <= 0:
        raise EnvError(f"resourceFieldRef divisor {ref.get('divisor')!r} must be positive")
    return str(math.ceil(quantity(raw) / divisor))


def resolve_env(pod: dict, container: dict) -> ResolvedEnv:
    """The container's variables in order; each value may refer to the ones defined before it."""
    out = ResolvedEnv()
    for src in container.get("envFrom") or []:
        what = "secretRef" if "secretRef" in src else "configMapRef"
        name = (src.get(what) or {}).get("name", "?")
        out.notes.append(f"envFrom {what} {name!r} not read (the mock runtime reads no Secrets or ConfigMaps)")
    for item in container.get("env") or []:
        name = item["name"]
        source = item.get("valueFrom")
        if not source:
            out.env[name] = expand(str(item.get("value") or ""), out.env)
        elif "fieldRef" in source:
            out.env[name] = field_ref(pod, source["fieldRef"].get("fieldPath", ""))
        elif "resourceFieldRef" in source:
            out.env[name] = resource_ref(container, source["resourceFieldRef"])
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            what = "secretKeyRef" if "secretKeyRef" in source else "configMapKeyRef"
            ref = source[what]
            out.env[name] = PLACEHOLDER
            out.notes.append(f"{name}: {what} {ref.get('name')}/{ref.get('key')} not read; placeholder passed")
        else:
            raise EnvError(f"{name}: unsupported valueFrom {sorted(source)}")
    return out


def command_line(container: dict, env: dict[str, str], default_entrypoint: list[str]) -> list[str]:
    """command + args with `$(VAR)` expanded; an image's own entrypoint when the pod sets no command."""
    command = list(container.get("command") or default_entrypoint)
    return [expand(str(a), env) for a in command + list(container.get("args") or [])]
