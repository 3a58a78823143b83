"""Names and labels of a serving's children, kept within Kubernetes' length limits.

A DeepSeekServing name may be up to 253 characters, but a Service name is a 63-character DNS label, a label
value is at most 63 characters, and a StatefulSet's pods carry `controller-revision-hash: <name>-<10 chars>`,
which caps a StatefulSet name at 52. Long names are cut and given a hash suffix, so they stay unique.
"""

from __future__ import annotations

import hashlib
import re

STS_NAME_MAX = 52
DNS_LABEL_MAX = 63

SERVING_LABEL = "flashserve.io/serving"
GROUP_LABEL = "flashserve.io/group"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
MANAGED_BY = "flashserve-operator"


def _fit(base: str, suffix: str, limit: int) -> str:
    # Service names must start with a letter (RFC 1035); serving names may start with a digit.
    if not base[:1].isalpha():
        base = "s" + base
    if len(base) + len(suffix) <= limit:
        return base + suffix
    digest = hashlib.sha256(base.encode()).hexdigest()[:6]
    keep = limit - len(suffix) - len(digest) - 1
    return f"{base[:keep].rstrip('-.')}-{digest}{suffix}"


def serving_label_value(name: str) -> str:
    return name if len(name) <= DNS_LABEL_MAX and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) else _fit(
        name.replace(".", "-"), "", DNS_LABEL_MAX
    )


def group_name(serving: str, index: int) -> str:
    """StatefulSet and headless Service of replica group `index`."""
    return _fit(serving.replace(".", "-"), f"-g{index}", STS_NAME_MAX)


def service_name(serving: str) -> str:
    """The client Service: the serving's OpenAI endpoint."""
    return _fit(serving.replace(".", "-"), "", DNS_LABEL_MAX)


def pdb_name(serving: str) -> str:
    return _fit(serving.replace(".", "-"), "-pdb", DNS_LABEL_MAX)


def compute_domain_name(serving: str, index: int) -> str:
    return _fit(serving.replace(".", "-"), f"-g{index}-cd", DNS_LABEL_MAX)
