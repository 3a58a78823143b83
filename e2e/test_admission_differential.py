"""The API server and the operator agree on what a DeepSeekServing may be: every object of the seeded corpus
(tests/differential_corpus.py) goes to the real API server with server-side dry-run (the CRD's schema and CEL
rules, nothing stored) and to `parse_serving`, and both must admit it or both refuse it, except the classes
docs/api-validation.md lists. Prints the verdicts per class."""

from __future__ import annotations

import json
import time
from collections import Counter

from flashserve.api.v1alpha1 import GROUP, PLURAL, VERSION
from flashserve.api.validation import SpecError, parse_serving
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.differential_corpus import DOCUMENTED, corpus


def _api_server_admits(api: client.CustomObjectsApi, namespace: str, obj: dict) -> tuple[bool, str]:
    try:
        # Strict: an unknown field is refused, as kubectl does, instead of pruned with a warning.
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, obj, dry_run="All",
                                            field_validation="Strict")  # fmt: skip
        return True, ""
    except ApiException as exc:
        if exc.status not in (400, 422):
            raise
        return False, (json.loads(exc.body or "{}").get("message") or str(exc))[:300]


def _operator_admits(obj: dict) -> tuple[bool, str]:
    try:
        parse_serving(obj)
        return True, ""
    except SpecError as exc:
        return False, str(exc)[:300]


def test_api_server_and_operator_agree_on_every_object(kube, crd_installed, namespace):
    api = client.CustomObjectsApi(kube)
    cases = corpus()
    counts: Counter = Counter()
    disagree = []
    started = time.monotonic()
    for case in cases:
        server, why_server = _api_server_admits(api, namespace, case.obj)
        operator, why_operator = _operator_admits(case.obj)
        verdict = "agree" if server == operator else ("server-only" if server else "operator-only")
        counts[(case.klass, verdict, "admit" if operator else "refuse")] += 1
        if verdict != "agree" and case.klass not in DOCUMENTED:
            disagree.append((case.klass, case.obj.get("spec"), why_server, why_operator))
    elapsed = time.monotonic() - started
    print(f"\n{len(cases)} objects in {elapsed:.1f}s")
    for (klass, verdict, op), n in sorted(counts.items()):
        print(f"  {klass:28} {verdict:14} operator {op:6} {n}")
    assert disagree == [], json.dumps(disagree[:10], indent=1)
    # the corpus reaches every class on both sides: each rule class is refused at admission
    refused = {k for (k, v, op), n in counts.items() if v == "agree" and op == "refuse"}
    classes = {c.klass for c in cases if c.expect_admit is False} - DOCUMENTED
    assert classes <= refused
