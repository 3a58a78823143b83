"""`flashserve status [NAME]`: what the operator reports of servings, read from their status.

Without a name, one line per serving of the namespace (or of every namespace with -A); with one, that serving
in full: groups, router, SLA readings, what the autoscaler learned and did last, drains, the last start-up and
every condition with its message. It reads the API server only (get and list on deepseekservings), so anyone
who may `kubectl get dss` may run it. A serving that does not exist exits 2 naming it; an API server that
cannot be reached, or a cluster without the CRD, exits 1 saying which.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone

from flashserve.api.kubevalues import NAMESPACE_NAME, OBJECT_NAME
from flashserve.api.v1alpha1 import GROUP, PLURAL, VERSION


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashserve status", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("name", nargs="?", help="a DeepSeekServing; without it, every serving of the namespace")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="servings of every namespace")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text",
                   help="json: the status as the API server holds it")  # fmt: skip
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: $KUBECONFIG; in a pod, its service account; else ~/.kube/config)")
    return p


# -- formatting: pure functions of the objects and the time --------------------------------------------------

def ago(stamp: str | None, now: datetime) -> str:
    """`4m10s ago` from an RFC 3339 time; `-` when absent or unreadable."""
    if not stamp:
        return "-"
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return f"{duration((now - then).total_seconds())} ago"


def duration(seconds: float | None) -> str:
    """Seconds as kubectl shows ages: 45s, 3m20s, 2h5m, 3d4h."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "-" if seconds is None else safe(seconds)
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m" if s % 3600 // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    if value is None:
        return "-"
    return fmt.format(value) if isinstance(value, int | float) and not isinstance(value, bool) else safe(value)


def _pct(value: float | None) -> str:
    return _num(100 * value, "{:.1f}%") if isinstance(value, int | float) else "-"


def safe(value: object) -> str:
    """A value from the API as text a terminal shows as it is: anyone who may write a serving's status could put
    escape sequences or line breaks into a message, which would repaint the reader's terminal or forge a line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


# the state of each condition type that asks for a look (Progressing is news, not trouble)
_TROUBLE = {"Ready": "False", "Degraded": "True", "MetricsAvailable": "False", "ScalingLimited": "True"}


def _unhealthy(conditions: list[dict]) -> list[str]:
    """`Type=Reason` of each condition in the state that needs a look (an unknown Ready counts too)."""
    out = []
    for c in conditions:
        kind, status = c.get("type"), c.get("status")
        if _TROUBLE.get(kind) == status or (kind == "Ready" and status != "True"):
            out.append(f"{kind}={c.get('reason') or status}")
    return out


def _desired(serving: dict) -> object:
    """The groups the operator aims at; the spec's count until it has said."""
    desired = (serving.get("status") or {}).get("desiredReplicas")
    return desired if desired is not None else (serving.get("spec") or {}).get("replicas")


def table(servings: list[dict], now: datetime, namespaces: bool) -> str:
    """One line per serving, as `kubectl get` shows a list."""
    head = (["NAMESPACE"] if namespaces else []) + ["NAME", "READY", "SLA", "TOK/S/USER", "ATTAINMENT",
                                                     "LAST SCALING", "NEEDS A LOOK"]  # fmt: skip
    rows = [head]
    for s in servings:
        meta, st = s.get("metadata", {}), s.get("status") or {}
        sla = st.get("sla") or {}
        last = st.get("lastScaling")
        scaled = f"{last.get('from')}->{last.get('to')} {ago(last.get('time'), now)}" if last else "-"
        look = ",".join(_unhealthy(st.get("conditions") or [])) or "-"
        desired = _desired(s)
        ready = f"{_num(st.get('readyReplicas'))}/{_num(desired)}"
        row = [meta.get("name", "?"), ready, st.get("slaState") or "-", _num(sla.get("perUserTokensPerSecondP90")),
               _pct(sla.get("attainment")), scaled, look]  # fmt: skip
        rows.append([safe(c) for c in ([meta.get("namespace", "")] if namespaces else []) + row])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def describe(serving: dict, now: datetime) -> str:
    """One serving in full: every status field the operator writes, in words."""
    meta, st = serving.get("metadata", {}), serving.get("status") or {}
    lines = [safe(f"{meta.get('name')} (namespace {meta.get('namespace')}), generation {meta.get('generation')}"
                  f" (observed {_num(st.get('observedGeneration'))})")]  # fmt: skip

    def field(label: str, text: str) -> None:
        lines.append(f"  {label:<14}{safe(text)}")

    field("endpoint", st.get("endpoint") or "- (not reported yet)")
    field("groups", f"{_num(st.get('readyReplicas'))} ready of {_num(_desired(serving))} "
                    f"desired ({_num(st.get('replicas'))} exist, {_num(st.get('updatedReplicas'))} on the current "
                    "template)")  # fmt: skip
    router = st.get("router")
    if router:
        since = router.get("unavailableSince")
        down = f", none available since {ago(since, now)}" if since else ""
        field("router", f"{router.get('readyReplicas', 0)} of {router.get('replicas', 0)} pods ready, "
                        f"{router.get('availableReplicas', 0)} available{down}")  # fmt: skip
    sla = st.get("sla") or {}
    if st.get("slaState") or sla:
        p90 = _num(sla.get("perUserTokensPerSecondP90"))
        field("SLA", f"{st.get('slaState') or 'Unknown'}: per-user speed p90 {p90} "
                     f"tok/s (p50 {_num(sla.get('perUserTokensPerSecondP50'))}), attainment "
                     f"{_pct(sla.get('attainment'))}, {_num(sla.get('tokensPerSecond'))} tok/s in all")  # fmt: skip
    learned = []
    if st.get("learnedCapacity") is not None:
        learned.append(f"capacity {_num(st['learnedCapacity'])} users per group at the SLA")
    if st.get("learnedStartupSeconds") is not None:
        by_state = st.get("learnedStartupSecondsByCacheState") or {}
        states = ", ".join(f"{k} {duration(v)}" for k, v in sorted(by_state.items()))
        learned.append(f"start-up {duration(st['learnedStartupSeconds'])}" + (f" ({states})" if states else ""))
    if learned:
        field("learned", "; ".join(learned))
    last = st.get("lastScaling")
    if last:
        when = ago(last.get("time"), now)
        field("last scaling", f"{last.get('from')} -> {last.get('to')}, {when}: {last.get('reason')}")
    for d in st.get("drainingGroups") or []:
        since = ago(d.get("since"), now)
        field("draining", f"group {d.get('group')} ({d.get('reason')}), out of routing since {since}")
    for d in st.get("lastDrains") or []:
        left = d.get("requestsInFlight")
        field("drained", f"group {d.get('group')} ({d.get('reason')}): ended {d.get('endedBy')} after "
                         f"{duration(d.get('seconds'))}, {ago(d.get('time'), now)}"
                         + ("" if left is None else f", {left} requests in flight"))  # fmt: skip
    start = (st.get("startup") or {}).get("last")
    if start:
        sec = start.get("seconds") or {}
        field("last start-up", f"group {start.get('group')} ({start.get('cacheState')}): scheduled "
                               f"{duration(sec.get('scheduled'))}, running {duration(sec.get('running'))}, ready "
                               f"{duration(sec.get('ready'))}")  # fmt: skip
    conditions = st.get("conditions") or []
    if conditions:
        lines.append("  conditions")
        width = max(len(c.get("type", "")) for c in conditions)
        for c in conditions:
            line = f"{c.get('type', ''):<{width}}  {c.get('status', ''):<8}{c.get('reason', '')}"
            lines.append(f"    {safe(line)} ({ago(c.get('lastTransitionTime'), now)})")
            if c.get("message"):
                lines.append(f"    {'':<{width}}  {safe(c['message'])}")
    else:
        lines.append("  conditions    none yet: is the operator running? (`kubectl get pods -A -l "
                     "app.kubernetes.io/name=flashserve`)")  # fmt: skip
    return "\n".join(lines)


# -- the API server ------------------------------------------------------------------------------------------

class StatusError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10.0, 30.0


def _connect(kubeconfig: str | None) -> str | None:
    """Load the client's configuration as `flashserve run` does (a kubeconfig, else the pod's service account);
    the namespace it names, if any."""
    from kubernetes import config

    from flashserve.controller.kubeconfig import uses_kubeconfig

    if uses_kubeconfig(kubeconfig):
        try:
            config.load_kube_config(config_file=kubeconfig)
            _, context = config.list_kube_config_contexts(config_file=kubeconfig)
        except Exception as exc:  # noqa: BLE001 - a kubeconfig unreadable in any way is one error to the user
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise StatusError(f"no usable kubeconfig at {safe(where)[:200]}: {safe(exc)[:300]}", 1) from None
        namespace = ((context or {}).get("context") or {}).get("namespace")
        return namespace if isinstance(namespace, str) else None
    try:
        config.load_incluster_config()
    except config.ConfigException as exc:
        raise StatusError(f"no kubeconfig, and the pod's service account is not usable: {safe(exc)[:300]}", 1) from None
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _read(args: argparse.Namespace) -> tuple[list[dict] | dict, str]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    configured = _connect(args.kubeconfig)
    namespace = args.namespace or configured or "default"
    if not args.all_namespaces and not NAMESPACE_NAME.fullmatch(namespace):
        raise StatusError(f"the configured namespace {namespace[:80]!r} (kubeconfig context or service account) "
                          "is not a namespace name: give one with -n", 1)  # fmt: skip
    api = client.CustomObjectsApi()
    if args.name:
        asked = f"get {PLURAL}.{GROUP} {args.name!r} in namespace {namespace!r}"
    elif args.all_namespaces:
        asked = f"list {PLURAL}.{GROUP} in all namespaces (a cluster-wide permission)"
    else:
        asked = f"list {PLURAL}.{GROUP} in namespace {namespace!r}"
    # An API server that accepts the connection and never answers must not hang the command.
    timeout = (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
    try:
        if args.name:
            found = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, args.name,
                                                     _request_timeout=timeout)  # fmt: skip
        elif args.all_namespaces:
            found = api.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=timeout)
        else:
            found = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _request_timeout=timeout)
    except ApiException as exc:
        reason = f"{exc.status} {safe(exc.reason)}"
        if exc.status == 404 and _names_the_object(exc.body, args.name):
            raise StatusError(f"no DeepSeekServing named {args.name!r} in namespace {namespace!r} "
                              f"(`flashserve status -n {namespace}` lists them)", 2) from None  # fmt: skip
        if exc.status == 404:  # the resource itself is unknown: a plain "404 page not found"
            raise StatusError(f"the API server has no {PLURAL}.{GROUP}: is the CRD installed? "
                              "(`kubectl apply -f crds/` or `helm install` the chart)", 1) from None  # fmt: skip
        if exc.status == 401:
            raise StatusError(f"the API server did not accept the credentials ({reason}): log in again or "
                              "check the kubeconfig's user", 1) from None  # fmt: skip
        if exc.status == 403:
            raise StatusError(f"the API server forbids you to {asked} ({reason})", 1) from None
        raise StatusError(f"the API server answered {reason} to: {asked}", 1) from None
    except Exception as exc:  # noqa: BLE001 - urllib3's connection errors: name the server, not a traceback
        host = client.Configuration.get_default_copy().host
        raise StatusError(f"cannot reach the API server at {safe(host)}: {type(exc).__name__}", 1) from None
    if not isinstance(found, dict) or (not args.name and not isinstance(found.get("items"), list)):
        raise StatusError(f"the API server's answer to: {asked} is not a DeepSeekServing or a list of them", 1)
    return (found if args.name else found["items"]), namespace


def _names_the_object(body: object, name: str | None) -> bool:
    """Whether a 404 is the API server's Status for this object (NotFound, details.name), not an unknown
    resource."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        return False
    return isinstance(status, dict) and status.get("reason") == "NotFound" and name is not None and (
        (status.get("details") or {}).get("name") == name)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.name is not None and not OBJECT_NAME.fullmatch(args.name):
        print(f"error: NAME: {args.name[:80]!r} is not a DeepSeekServing name (lowercase letters, digits, '-' "
              "and '.')", file=sys.stderr)  # fmt: skip
        return 2
    if args.namespace is not None and not NAMESPACE_NAME.fullmatch(args.namespace):
        print(f"error: -n/--namespace: {args.namespace[:80]!r} is not a namespace name (lowercase letters, digits "
              "and '-', at most 63)", file=sys.stderr)  # fmt: skip
        return 2
    if args.name is not None and args.all_namespaces:
        print("error: -A/--all-namespaces lists servings; with a NAME give its namespace (-n)", file=sys.stderr)
        return 2
    try:
        found, namespace = _read(args)
    except StatusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    if args.output == "json":
        print(json.dumps(found, indent=2, sort_keys=True))
        return 0
    now = datetime.now(timezone.utc)
    if isinstance(found, dict):
        print(describe(found, now))
    elif not found:
        where = "any namespace" if args.all_namespaces else f"namespace {namespace!r}"
        print(f"no DeepSeekServing in {where}")
    else:
        print(table(sorted(found, key=lambda s: (s["metadata"].get("namespace", ""), s["metadata"]["name"])), now,
                    namespaces=args.all_namespaces))  # fmt: skip
    return 0
