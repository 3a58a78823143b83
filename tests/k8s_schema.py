"""Validation of rendered objects against the pinned Kubernetes version's OpenAPI schema."""

from __future__ import annotations

import kubernetes_validate

KUBE_VERSION = "1.35.0"
BUILTIN_GROUPS = {"v1", "apps/v1", "policy/v1", "batch/v1", "rbac.authorization.k8s.io/v1",
                  "networking.k8s.io/v1", "apiextensions.k8s.io/v1", "admissionregistration.k8s.io/v1",
                  "coordination.k8s.io/v1", "autoscaling/v2"}  # fmt: skip


def validate(obj: dict) -> None:
    """Raise if a built-in object does not match the schema (strict: unknown fields are errors)."""
    if obj["apiVersion"] not in BUILTIN_GROUPS:
        return  # CRD-defined kinds (e.g. ComputeDomain) have no schema here
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
