"""Kubernetes' own grammars for the values the API copies into child objects (apimachinery's validation of
label keys and values, Secret keys, tolerations), as field types and rules of the API itself.

A value the API admitted but the API server then refused in a StatefulSet would stop the reconcile half way;
so each grammar is a pattern of the field's schema, which the CRD (the API server) and pydantic (the operator,
`flashserve validate`) both apply, and each cross-field rule of a toleration is a CEL rule with its Python twin
below. The patterns are RE2, the one dialect both sides speak.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

# apimachinery IsQualifiedName: an optional DNS-1123 subdomain prefix and "/", then a name of at most 63
# characters, alphanumeric at both ends with "-", "_" and "." inside.
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN = rf"{DNS_LABEL}(\.{DNS_LABEL})*"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED_NAME = rf"^({DNS_SUBDOMAIN}/)?{_NAME}$"
PREFIX_MAX = 253
# apimachinery IsValidLabelValue: empty, or a name as above.
LABEL_VALUE = rf"^({_NAME})?$"
# apimachinery IsConfigMapKey (Secret and ConfigMap data keys): not `.` or `..` and no `..` at the start, which a
# volume's file name would read as a path out of the mount.
SECRET_KEY = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"

# apimachinery IsDNS1123Label (a namespace) and IsDNS1123Subdomain (an object's name), lengths included: for the
# names the commands and the validation check before they reach the API server.
NAMESPACE_NAME = re.compile(rf"(?=.{{1,{DNS_LABEL_MAX}}}$){DNS_LABEL}")
OBJECT_NAME = re.compile(rf"(?=.{{1,253}}$){DNS_SUBDOMAIN}")

SECRET_KEY_HINT = "a Secret key: letters, digits, '-', '_' or '.' only, not '.' or '..' and not starting with '..'"
QUALIFIED_HINT = ("a Kubernetes qualified name: an optional DNS prefix and '/', then at most 63 letters, digits, "
                  "'-', '_' or '.', starting and ending with a letter or digit (e.g. nvidia.com/gpu.clique)")  # fmt: skip
LABEL_VALUE_HINT = ("a Kubernetes label value: empty, or at most 63 letters, digits, '-', '_' or '.', starting and "
                    "ending with a letter or digit")  # fmt: skip

QualifiedName = Annotated[str, Field(min_length=1, max_length=PREFIX_MAX + 1 + 63, pattern=QUALIFIED_NAME)]
# A toleration's key may be empty (with operator: Exists it matches every taint).
TOLERATION_KEY = rf"^(({DNS_SUBDOMAIN}/)?{_NAME})?$"
TolerationKey = Annotated[str, Field(max_length=PREFIX_MAX + 1 + 63, pattern=TOLERATION_KEY)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]
SecretKey = Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY)]


def prefix_error(key: str) -> str | None:
    """The one part of IsQualifiedName a pattern cannot bound: the prefix's length."""
    if "/" in key and key.index("/") > PREFIX_MAX:
        return f"the prefix of {key[:40]!r}... is over {PREFIX_MAX} characters: shorten it"
    return None


def cel_prefix(var: str) -> str:
    """CEL: the qualified name in `var` has a prefix of at most PREFIX_MAX characters."""
    return f"(!{var}.contains('/') || {var}.indexOf('/') <= {PREFIX_MAX})"

# Pod validation of a toleration (ValidateTolerations), as CEL on the toleration object, each with its message.
TOLERATION_RULES: list[dict[str, str]] = [
    {
        "rule": "has(self.key) && size(self.key) > 0 || (has(self.operator) && self.operator == 'Exists')",
        "message": "a toleration without a key matches every taint only with operator: Exists: set the key or "
        "operator: Exists",
        "fieldPath": ".operator",
    },
    {
        "rule": "!(has(self.operator) && self.operator == 'Exists') || !has(self.value) || size(self.value) == 0",
        "message": "operator: Exists takes no value: remove the value or use operator: Equal",
        "fieldPath": ".value",
    },
    {
        "rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        "message": "tolerationSeconds applies only to effect: NoExecute: set that effect or remove tolerationSeconds",
        "fieldPath": ".tolerationSeconds",
    },
    {"rule": f"!has(self.key) || {cel_prefix('self.key')}", "message": f"the key's prefix must be at most {PREFIX_MAX} characters",
     "fieldPath": ".key"},  # fmt: skip
]


def toleration_errors(key: str | None, operator: str | None, value: str | None, effect: str | None,
                      toleration_seconds: int | None) -> list[tuple[str, str]]:  # fmt: skip
    """(field, message) for each TOLERATION_RULES rule the toleration breaks, in the same order."""
    errors = []
    if not key and operator != "Exists":
        errors.append(("operator", TOLERATION_RULES[0]["message"]))
    if operator == "Exists" and value:
        errors.append(("value", TOLERATION_RULES[1]["message"]))
    if toleration_seconds is not None and effect != "NoExecute":
        errors.append(("tolerationSeconds", TOLERATION_RULES[2]["message"]))
    if key and (msg := prefix_error(key)):
        errors.append(("key", msg))
    return errors


# A container image reference as the kubelet passes it on: printable ASCII, no space (the API server admits
# anything in a pod; the pull then fails on the node, far from the field that caused it). Spelled out, not `\s`:
# pydantic's regex reads `\s` as Unicode whitespace and the API server's RE2 as ASCII only.
IMAGE = r"^[!-~]+$"
IMAGE_HINT = "an image reference: printable ASCII, no spaces (e.g. vllm/vllm-openai:v0.33.0)"

HINTS = {QUALIFIED_NAME: QUALIFIED_HINT, TOLERATION_KEY: "empty or " + QUALIFIED_HINT, LABEL_VALUE: LABEL_VALUE_HINT,
         SECRET_KEY: SECRET_KEY_HINT, IMAGE: IMAGE_HINT}  # fmt: skip


def cel_matches(var: str, pattern: str) -> str:
    """`var` matches `pattern`, as CEL (a raw string, so the pattern's backslashes stay as they are)."""
    assert "'" not in pattern
    return f"{var}.matches(r'{pattern}')"
