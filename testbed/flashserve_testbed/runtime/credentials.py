"""A pod's own API credentials for the processes the runtime starts: a token of the pod's ServiceAccount from
the TokenRequest API (bound to the pod, so it dies with it), in a token file that a kubeconfig with the local
API server's URL and CA names (`tokenFile`). What a kubelet would mount at
/var/run/secrets/kubernetes.io/serviceaccount, as files that a process outside a pod reads through KUBECONFIG;
never the admin credentials the runtime itself uses.

Like the kubelet's projected token, it is requested again before it expires (at REFRESH_AT of its lifetime)
and the token file rewritten in place. vllm-router 0.1.17 (kube-client 1.1.0) reads a kubeconfig's
`tokenFile` again at least once a minute, so a running router picks the new token up without a restart; an
inline `token` it would read only once.
"""

from __future__ import annotations

import base64
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import yaml

# The kubelet's own default for projected tokens; the API server refuses less than 10 minutes and may shorten
# or lengthen it (the answer's expirationTimestamp says).
TOKEN_SECONDS = 3600
# A token is requested again once this share of its lifetime has passed (the kubelet's 80 %), so a failed
# request has the rest of it to succeed in.
REFRESH_AT = 0.8


def token_request(pod: dict, seconds: int = TOKEN_SECONDS) -> tuple[str, dict]:
    """(path, body) of the TokenRequest for the pod's ServiceAccount, bound to the pod."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    ns = meta.get("namespace", "default")
    sa = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    path = f"/api/v1/namespaces/{quote(ns)}/serviceaccounts/{quote(sa)}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": int(seconds),
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                        "uid": meta.get("uid", "")}}}
    return path, body


def kubeconfig(server: str, ca_pem: bytes | None, token_file: str, namespace: str, user: str) -> dict:
    """A kubeconfig whose only credential is a bearer token read from `token_file` (no client certificate),
    with the pod's namespace as default."""
    cluster: dict = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": user, "user": {"tokenFile": token_file}}],
            "contexts": [{"name": "pod", "context": {"cluster": "local", "user": user, "namespace": namespace}}],
            "current-context": "pod"}


def write_private(path: Path, text: str) -> None:
    """Atomically, readable by this user only (it holds a token)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def token_path(kubeconfig_path: Path) -> Path:
    """The token file beside a pod's kubeconfig."""
    return kubeconfig_path.with_name(kubeconfig_path.name + ".token")


def refresh_due(requested: float, answer: dict, seconds: int = TOKEN_SECONDS) -> float:
    """When (time.time()) to request the token of a TokenRequest `answer` again: REFRESH_AT of the lifetime
    the API server gave it (status.expirationTimestamp), else of the one asked for."""
    lifetime = float(seconds)
    stamp = (answer.get("status") or {}).get("expirationTimestamp")
    if isinstance(stamp, str):
        try:
            lifetime = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - requested
        except ValueError:
            pass
    return requested + REFRESH_AT * max(0.0, lifetime)


async def write_pod_token(api, pod: dict, path: Path) -> float:
    """Request a token for the pod's ServiceAccount and write it to the token file of the kubeconfig at `path`
    (atomically: a reader sees the old token or the new one). Returns when to request the next."""
    req_path, body = token_request(pod)
    requested = time.time()
    answer = await api.post(req_path, body)
    token = (answer.get("status") or {}).get("token")
    if not token:
        raise RuntimeError(f"TokenRequest {req_path} answered without a token")
    write_private(token_path(path), token)
    return refresh_due(requested, answer)


async def write_pod_kubeconfig(api, pod: dict, path: Path, server: str | None = None) -> float:
    """Request a token for the pod's ServiceAccount, write it and the kubeconfig naming it to `path`, with
    `server` as the API server's URL (default: the one `api` talks to). Returns when to request the next token
    (write_pod_token)."""
    due = await write_pod_token(api, pod, path)
    meta = pod["metadata"]
    ns = meta.get("namespace", "default")
    sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    doc = kubeconfig(server or api.host, api.ca_pem(), str(token_path(path)), ns, f"system:serviceaccount:{ns}:{sa}")
    write_private(path, yaml.safe_dump(doc, sort_keys=False))
    return due
