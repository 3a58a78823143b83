"""`flashserve run`: the operator process.

Of several replicas only the Lease holder runs the controller (see leader.py); the others stand by. kopf is
set up with its finalizer and annotations under flashserve.io, server- and client-side watch timeouts (a
silent watch is dropped and re-established instead of stalling the operator), and a liveness endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import ssl
import sys
import time
from urllib.parse import urlsplit

import kopf
from kubernetes import client

from flashserve.autoscaling.allowlist import PrometheusAllowList, parse_entries
from flashserve.controller.drain import parse_networks
from flashserve.controller import kubeconfig as kubeconfig_loader
from flashserve.controller.autoscale import Autoscaler
from flashserve.controller.kube import WriteGate
from flashserve.controller.leader import LeaseElector
from flashserve.controller.reconciler import Controller
from flashserve.render.renderer import OPERATOR_NAMESPACE

log = logging.getLogger("flashserve")


def _api_client(kubeconfig: str | None, retries: int | None = None) -> client.ApiClient:
    kubeconfig_loader.load(kubeconfig)
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 16
    if retries is not None:
        cfg.retries = retries
    return client.ApiClient(cfg)


def _networks(text: str) -> tuple:
    try:
        return parse_networks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(kind: type, env_name: str | None = None):
    def check(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            also = f" (also read from ${env_name})" if env_name else ""
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {kind.__name__}{also}")
        return value

    return check


def split_address(text: str) -> tuple[str, int]:
    """host:port or [IPv6]:port as (host, port); ValueError names what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not host:port with a port of 0-65535 (IPv6: [::]:8082)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::]:8082")
    return host, int(port)


def _address(text: str) -> str:
    if text:
        try:
            split_address(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _liveness(text: str) -> str:
    if text:
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme != "http" or not parts.hostname:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not http://host[:port]/path (IPv6: http://[::]:8081/healthz)"
            )
    return text




def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="flashserve run", description=__doc__)
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: $KUBECONFIG; in a pod, its service account; else ~/.kube/config)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=None,
                       help="watch only this namespace (repeatable); default: all namespaces")  # fmt: skip
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces (the default)")
    p.add_argument("--resync-seconds", type=_positive(float, "FLASHSERVE_RESYNC_SECONDS"),
                   default=env("FLASHSERVE_RESYNC_SECONDS", "30"),
                   help="reconcile every serving at least this often (default 30)")  # fmt: skip
    p.add_argument("--prometheus-url", default=env("FLASHSERVE_PROMETHEUS_URL"),
                   help="Prometheus for autoscaling when a serving does not name one")  # fmt: skip
    p.add_argument("--prometheus-allow", action="append",
                   default=[env("FLASHSERVE_PROMETHEUS_ALLOW")] if env("FLASHSERVE_PROMETHEUS_ALLOW") else None,
                   help="further Prometheus a serving's spec.autoscaling.prometheusUrl may name: a URL prefix "
                   "(https://host:port/path) or a host pattern (prometheus.monitoring.svc, *.monitoring.svc); "
                   "repeatable and comma-separated. Always allowed: --prometheus-url and Services of the "
                   "serving's own namespace")  # fmt: skip
    p.add_argument("--prometheus-allow-own-namespace", action=argparse.BooleanOptionalAction,
                   default=env("FLASHSERVE_PROMETHEUS_ALLOW_OWN_NAMESPACE", "true").lower() != "false",
                   help="allow a serving's prometheusUrl to name a Service of its own namespace (default on)")  # fmt: skip
    p.add_argument("--engine-networks", type=_networks, default=_networks(env("FLASHSERVE_ENGINE_NETWORKS", "")),
                   help="comma-separated CIDRs of the pod IPs the operator may ask for their load while their group "
                   "drains (GET /metrics on the engine port); default: any pod IP of a serving's own StatefulSets. "
                   "The local cluster sets its loopback pod range")  # fmt: skip
    p.add_argument("--liveness", type=_liveness, default=env("FLASHSERVE_LIVENESS", "http://127.0.0.1:8081/healthz"),
                   help="liveness endpoint URL to serve (empty to disable)")  # fmt: skip
    p.add_argument("--metrics-address", type=_address, default=env("FLASHSERVE_METRICS_ADDRESS", "127.0.0.1:8082"),
                   help="host:port of the operator's own Prometheus metrics, [::]:port for IPv6 and IPv4 "
                   "(empty to disable)")  # fmt: skip
    p.add_argument("--metrics-auth", choices=("none", "token"), default=env("FLASHSERVE_METRICS_AUTH", "none"),
                   help="token: a scrape must carry a bearer token that a TokenReview accepts and that may `get` "
                        "the non-resource URL /metrics (SubjectAccessReview)")  # fmt: skip
    p.add_argument("--metrics-cert-file", default=env("FLASHSERVE_METRICS_CERT_FILE"),
                   help="serve metrics over TLS with this certificate (PEM); with --metrics-key-file")
    p.add_argument("--metrics-key-file", default=env("FLASHSERVE_METRICS_KEY_FILE"),
                   help="the private key (PEM) of --metrics-cert-file")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                   help="hold a Lease so only one replica acts (default on)")  # fmt: skip
    p.add_argument("--lease-namespace", default=env("POD_NAMESPACE", "default"),
                   help="namespace of the leader Lease (default $POD_NAMESPACE, else default)")
    p.add_argument("--operator-namespace", default=env("POD_NAMESPACE", OPERATOR_NAMESPACE),
                   help="namespace of the operator's pods, which the engines' NetworkPolicy lets reach their API "
                   f"port (/metrics, read while draining); default $POD_NAMESPACE, else {OPERATOR_NAMESPACE}")  # fmt: skip
    p.add_argument("--lease-name", default="flashserve-operator", help="name of the leader Lease")
    p.add_argument("--watch-timeout", type=_positive(int, "FLASHSERVE_WATCH_TIMEOUT"),
                   default=env("FLASHSERVE_WATCH_TIMEOUT", "300"),
                   help="server-side watch timeout in seconds; the client gives up 30 s later")  # fmt: skip
    p.add_argument("--watch-client-timeout", type=_positive(int), default=None,
                   help="client-side watch timeout: a watch silent this long is dropped and re-established "
                   "(default: --watch-timeout + 30)")  # fmt: skip
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _configure_kopf(settings: kopf.OperatorSettings, args: argparse.Namespace) -> None:
    settings.persistence.finalizer = "flashserve.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="flashserve.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="flashserve.io", key="last-handled-configuration"
    )
    settings.watching.server_timeout = args.watch_timeout
    settings.watching.client_timeout = args.watch_client_timeout or args.watch_timeout + 30
    settings.watching.connect_timeout = 10
    settings.watching.reconnect_backoff = 1.0
    settings.networking.request_timeout = 30
    settings.posting.level = logging.WARNING  # only warnings from logs become Events; the rest are explicit
    settings.peering.standalone = True  # the Lease decides who acts
    settings.execution.max_workers = 4
    # Server-side: the API server sends only the operator's own children, not every Pod and Service of the
    # watched namespaces (the handlers' `labels=` filter alone is applied by kopf after receiving them).
    from flashserve.controller.handlers import CHILD_RESOURCES, MANAGED_SELECTOR

    for resource in CHILD_RESOURCES:
        settings.watching.label_selectors[resource] = MANAGED_SELECTOR


async def _run(args: argparse.Namespace) -> int:
    import flashserve.controller.handlers  # noqa: F401  (registers the handlers)

    api = _api_client(args.kubeconfig)
    elector = None
    if args.leader_elect:
        # Its own client (connection pool): the reconciler's slow or stuck requests never delay a renewal. No
        # retries inside a request: each attempt is bounded by its own timeout, and the elector retries.
        elector = LeaseElector(_api_client(args.kubeconfig, retries=0), args.lease_namespace, args.lease_name)
        # A standby is alive too: answer the liveness probe while waiting, or the kubelet would restart it
        # forever. kopf serves the same endpoint once this replica leads.
        standby = await _standby_liveness(args.liveness) if args.liveness else None
        try:
            await elector.acquire()
        finally:
            if standby is not None:
                await standby.cleanup()
    # Renewing from the moment the lease is held: the set-up below may take a while against a slow API server.
    lost = asyncio.create_task(elector.hold()) if elector else None

    controller = Controller(api=api, resync_seconds=args.resync_seconds, prometheus_url=args.prometheus_url,
                            operator_namespace=args.operator_namespace,
                            engine_networks=args.engine_networks)  # fmt: skip
    if elector is not None:
        writes = WriteGate(elector.leading)
        controller.kube.gate = controller.router_workers.gate = writes
    allow = PrometheusAllowList(operator_url=args.prometheus_url, entries=parse_entries(args.prometheus_allow),
                                own_namespace=args.prometheus_allow_own_namespace)  # fmt: skip
    controller.autoscaler = Autoscaler(default_prometheus_url=args.prometheus_url, allow=allow)
    if args.metrics_address:
        from flashserve.controller.metrics import serve_metrics

        gate = None
        if args.metrics_auth == "token":
            from flashserve.controller.metrics_auth import Gate, KubeReviewer

            gate = Gate(KubeReviewer(_api_client(args.kubeconfig)))
        host, port = split_address(args.metrics_address)
        serve_metrics(host or "127.0.0.1", port, controller, gate=gate, certfile=args.metrics_cert_file,
                      keyfile=args.metrics_key_file)

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_: object) -> None:
        _configure_kopf(settings, args)

    @kopf.on.login()
    def login(**kwargs: object) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs) if (args.kubeconfig or os.environ.get("KUBECONFIG")) else (
            kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
        )

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    # Before the first reconcile, so that no router policy is first written without its egress rule.
    refresh = asyncio.ensure_future(asyncio.to_thread(controller.api_server.refresh))
    await asyncio.wait({refresh, *([lost] if lost else [])}, return_when=asyncio.FIRST_COMPLETED)
    if lost is not None and lost.done():
        log.error("leadership lost while starting: stopping so that the new leader acts alone")
        return 1
    refresher = asyncio.create_task(controller.api_server.keep_fresh())
    stop = asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace or [],
            liveness_endpoint=args.liveness or None,
            memo=kopf.Memo(controller=controller),
            stop_flag=stop,
        )
    )
    tasks = {operator}
    if lost:
        tasks.add(lost)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        done = set()
    if lost is not None and lost in done:
        log.error("leadership lost: stopping so that the new leader acts alone")
        stop.set()
        refresher.cancel()
        await asyncio.wait({operator}, timeout=10)
        return 1
    stop.set()
    refresher.cancel()
    await asyncio.wait({operator}, timeout=10)
    if elector is not None:
        # No write passes the gate from here on; those that already did land before the lease is given up (the
        # standby takes it at once). Bounded by a request's timeout, and within the chart's grace period.
        elector.step_down()
        deadline = time.monotonic() + 16.0
        while writes.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if writes.in_flight:
            log.warning("%d writes still in flight after 16 s: releasing the lease anyway", writes.in_flight)
        if lost is not None:
            lost.cancel()
        await asyncio.get_running_loop().run_in_executor(elector._threads, elector.release)
    if operator.done() and operator.exception():
        raise operator.exception()  # type: ignore[misc]
    return 0


async def _standby_liveness(url: str):
    from urllib.parse import urlparse

    from aiohttp import web

    parsed = urlparse(url)
    app = web.Application()
    app.router.add_get(parsed.path or "/healthz", lambda _: web.json_response({"standby": True}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, parsed.hostname or "127.0.0.1", parsed.port or 80).start()
    return runner


def preflight(args: argparse.Namespace) -> str | None:
    """What keeps the operator from starting, found before it starts, else None."""
    for flag, path in (("--kubeconfig", args.kubeconfig), ("--metrics-cert-file", args.metrics_cert_file),
                       ("--metrics-key-file", args.metrics_key_file)):  # fmt: skip
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            return f"{flag} {path}: no such readable file"
    if args.metrics_key_file and not args.metrics_cert_file:
        return "--metrics-key-file needs --metrics-cert-file (a certificate file may also hold its key)"
    if args.metrics_cert_file:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(args.metrics_cert_file, args.metrics_key_file)
        except (ssl.SSLError, OSError) as exc:
            return f"--metrics-cert-file/--metrics-key-file: not a PEM certificate and its key ({exc})"
    try:
        kubeconfig_loader.load(args.kubeconfig)
    except Exception as exc:  # noqa: BLE001 - the kubernetes client raises several kinds for one cause
        where = args.kubeconfig or os.environ.get("KUBECONFIG") or "the service account or ~/.kube/config"
        return f"cannot load a kubeconfig from {where}: {exc}"
    return None


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    problem = preflight(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if not args.verbose:  # kopf logs every handler call at INFO; our own messages that matter are warnings
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        return asyncio.run(_run(args))
    except KeyboardInterrupt:
        return 0
