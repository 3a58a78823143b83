"""A pod's own API credentials for the processes the runtime starts: a token of the pod's ServiceAccount from
the TokenRequest API (bound to the pod, so it dies with it), in a kubeconfig with the local API server's URL
and CA. What a kubelet would mount at /var/run/secrets/kubernetes.io/serviceaccount, as a file that a
process outside a pod reads through KUBECONFIG; never the admin credentials the runtime itself uses."""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from urllib.parse import quote

import yaml

# Long enough for a test run; the API server may shorten it. The token is not refreshed (see docs).
TOKEN_SECONDS = 24 * 3600


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


def kubeconfig(server: str, ca_pem: bytes | None, token: str, namespace: str, user: str) -> dict:
    """A kubeconfig holding only a bearer token (no client certificate), with the pod's namespace as default."""
    cluster: dict = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": user, "user": {"token": token}}],
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


async def write_pod_kubeconfig(api, pod: dict, path: Path) -> None:
    """Request a token for the pod's ServiceAccount and write its kubeconfig to `path`."""
    req_path, body = token_request(pod)
    answer = await api.post(req_path, body)
    token = (answer.get("status") or {}).get("token")
    if not token:
        raise RuntimeError(f"TokenRequest {req_path} answered without a token")
    meta = pod["metadata"]
    ns = meta.get("namespace", "default")
    sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    doc = kubeconfig(api.host, api.ca_pem(), token, ns, f"system:serviceaccount:{ns}:{sa}")
    write_private(path, yaml.safe_dump(doc, sort_keys=False))
