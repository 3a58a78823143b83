"""Names and labels of a serving's children: distinct for distinct servings, within Kubernetes' length limits.

A DeepSeekServing name is a DNS-1123 subdomain of up to 253 characters; a Service name is a 63-character
DNS-1035 label, a label value is at most 63 characters, and a StatefulSet's pods carry
`controller-revision-hash: <name>-<10 chars>`, which caps a StatefulSet name at 52.

Every name here is injective in the serving's name within a namespace, for each kind, so one serving can
never write, select or delete another's children:
- Names that cannot simply be the serving's name are `<readable prefix>--<hash><suffix>`, where the hash is
  8 base32 characters of the SHA-256 of the exact serving name (40 bits) and the suffix is one of `-g<i>`,
  `-g<i>-cd`, `-router` or nothing. The hash has no `-`, so the suffix and the hash are read back unambiguously from
  the end of the name: two servings' names can only meet if their hashes do. The router's `-router` suffix
  is read back the same way.
- The client Service keeps the serving's own name when that is a DNS-1035 label without `--` (most names),
  so its endpoint stays `<serving>.<namespace>.svc`; otherwise it is hashed. A hashed name always contains
  `--`, a kept one never does, so the two sets are disjoint.
- The PodDisruptionBudget and NetworkPolicy take the serving's exact name (any DNS-1123 subdomain is valid
  for them, and there is one of each per serving).
- The router's Deployment, ServiceAccount, Role and RoleBinding are `<prefix>--<hash>-router` (one of each
  per serving, and the only objects of those kinds the operator makes). Its PodDisruptionBudget and
  NetworkPolicy take the same name; a serving whose own name were exactly that string would meet them with its
  engines' budget and policy, and created first it would leave the other serving's router without them. The API
  refuses serving names of that shape (api.v1alpha1.OPERATOR_ROUTER_NAME, in the CRD and in parse_serving).
- The InferencePool takes the serving's exact name (one per serving).
- The serving label value is the exact name when it fits 63 characters; a longer one becomes
  `<prefix>_<hash>`: a `_` cannot appear in a serving name, so it never equals one that is kept.

The `legacy_*` functions are the names earlier versions gave (not injective: `a.b` and `a-b`, `1abc` and
`s1abc`, `flash`'s group 0 and `flash-g0`'s client Service all met). The plan moves children from them to the
current names group by group, and the reconciler never writes an object another serving owns.
"""

from __future__ import annotations

import base64
import hashlib
import re

from flashserve.api.kubevalues import DNS_LABEL, DNS_LABEL_MAX

STS_NAME_MAX = 52
HASH_LEN = 8
GROUP_INDEX_MAX = 999  # spec.replicas <= 256

SERVING_LABEL = "flashserve.io/serving"
GROUP_LABEL = "flashserve.io/group"
GROUP_NAME_LABEL = "flashserve.io/group-name"  # the group's StatefulSet name
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
# Whether an engine pod takes new requests. The router's selector and the plain Service's require `serve`; the
# operator sets `drain` on a group it is about to remove or replace, so traffic leaves before the pods do.
ROUTING_LABEL = "flashserve.io/routing"
ROUTING_SERVE = "serve"
ROUTING_DRAIN = "drain"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY = "flashserve-operator"

_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def name_hash(serving: str) -> str:
    """8 lowercase base32 characters (a-z, 2-7) of the SHA-256 of the exact serving name."""
    digest = hashlib.sha256(serving.encode()).digest()
    return base64.b32encode(digest).decode().lower()[:HASH_LEN]


def _prefix(serving: str, room: int) -> str:
    """A readable start for a hashed name: letters, digits and single dashes, starting with a letter."""
    base = re.sub(r"-+", "-", serving.replace(".", "-"))
    if not base[:1].isalpha():
        base = "s" + base
    return base[:room].rstrip("-")


def _hashed(serving: str, suffix: str, limit: int) -> str:
    room = limit - len(suffix) - len("--") - HASH_LEN
    return f"{_prefix(serving, room)}--{name_hash(serving)}{suffix}"


def serving_label_value(name: str) -> str:
    """Value of the serving label on every child (and the `serving` label of its metrics)."""
    if len(name) <= DNS_LABEL_MAX:
        return name  # a DNS-1123 subdomain of <= 63 characters is a valid label value
    return f"{name[: DNS_LABEL_MAX - HASH_LEN - 1]}_{name_hash(name)}"


def group_name(serving: str, index: int) -> str:
    """StatefulSet and headless Service of replica group `index`."""
    return _hashed(serving, f"-g{index}", STS_NAME_MAX)


def service_name(serving: str) -> str:
    """The client Service: the serving's OpenAI endpoint."""
    if len(serving) <= DNS_LABEL_MAX and _DNS_1035.fullmatch(serving) and "--" not in serving:
        return serving
    return _hashed(serving, "", DNS_LABEL_MAX)


def pdb_name(serving: str) -> str:
    return serving


def network_policy_name(serving: str) -> str:
    return serving


def router_name(serving: str) -> str:
    """The router's Deployment, ServiceAccount, Role, RoleBinding, PodDisruptionBudget and NetworkPolicy."""
    return _hashed(serving, "-router", DNS_LABEL_MAX)


def inference_pool_name(serving: str) -> str:
    return serving


def compute_domain_name(serving: str, index: int) -> str:
    return _hashed(serving, f"-g{index}-cd", DNS_LABEL_MAX)


# ------------------------------------------------------------------------------ names of earlier versions


def _legacy_fit(base: str, suffix: str, limit: int) -> str:
    if not base[:1].isalpha():
        base = "s" + base
    if len(base) + len(suffix) <= limit:
        return base + suffix
    digest = hashlib.sha256(base.encode()).hexdigest()[:6]
    keep = limit - len(suffix) - len(digest) - 1
    return f"{base[:keep].rstrip('-.')}-{digest}{suffix}"


def legacy_serving_label_value(name: str) -> str:
    if len(name) <= DNS_LABEL_MAX and re.fullmatch(DNS_LABEL, name):
        return name
    return _legacy_fit(name.replace(".", "-"), "", DNS_LABEL_MAX)


def legacy_group_name(serving: str, index: int) -> str:
    return _legacy_fit(serving.replace(".", "-"), f"-g{index}", STS_NAME_MAX)


def legacy_compute_domain_name(serving: str, index: int) -> str:
    return _legacy_fit(serving.replace(".", "-"), f"-g{index}-cd", DNS_LABEL_MAX)


def legacy_service_name(serving: str) -> str:
    return _legacy_fit(serving.replace(".", "-"), "", DNS_LABEL_MAX)


def legacy_pdb_name(serving: str) -> str:
    return _legacy_fit(serving.replace(".", "-"), "-pdb", DNS_LABEL_MAX)
