"""`flashserve status`: a serving's status in words, and clear errors (exit 2 for a bad or unknown name, 1 for an
API server it cannot use) against a stand-in API server on loopback."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler

import pytest

from flashserve.commands import status as cmd

NOW = datetime(2026, 12, 7, 12, 0, 0, tzinfo=timezone.utc)


def _serving(name: str = "flash", namespace: str = "prod", **status) -> dict:
    return {"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
            "metadata": {"name": name, "namespace": namespace, "generation": 3}, "spec": {"replicas": 2},
            "status": status}  # fmt: skip


FULL = _serving(
    observedGeneration=3, replicas=3, readyReplicas=2, updatedReplicas=3, desiredReplicas=3,
    endpoint="http://flash.prod.svc:8000/v1", slaState="AtRisk",
    sla={"perUserTokensPerSecondP50": 131.4, "perUserTokensPerSecondP90": 97.2, "tokensPerSecond": 5210.0,
         "attainment": 0.9712},
    lastScaling={"time": "2026-12-07T11:55:50Z", "from": 2, "to": 3, "reason": "AtRisk: 412 users need 3 groups"},
    learnedCapacity=141.6, learnedStartupSeconds=425.0,
    learnedStartupSecondsByCacheState={"cold": 905.0, "warm": 425.0},
    drainingGroups=[{"group": 3, "since": "2026-12-07T11:59:20Z", "reason": "ScaleDown"}],
    lastDrains=[{"group": 4, "reason": "ScaleDown", "endedBy": "Timeout", "seconds": 600.0, "requestsInFlight": 2,
                 "time": "2026-12-07T10:00:00Z"}],
    startup={"last": {"group": 2, "statefulSet": "flash-g2", "uid": "u", "cacheState": "warm",
                      "created": "2026-12-07T11:56:00Z",
                      "seconds": {"scheduled": 1.0, "running": 12.0, "ready": 424.6}}},
    router={"replicas": 2, "readyReplicas": 1, "availableReplicas": 1},
    conditions=[
        {"type": "Ready", "status": "False", "reason": "PartiallyReady", "message": "2/3 replica groups ready",
         "lastTransitionTime": "2026-12-07T11:56:00Z"},
        {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
         "lastTransitionTime": "2026-12-07T09:00:00Z"},
        {"type": "MetricsAvailable", "status": "False", "reason": "NotAllowed", "message": "not on the allow-list",
         "lastTransitionTime": "2026-12-07T11:00:00Z"},
    ],
)  # fmt: skip


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (59.4, "59s"), (60, "1m"), (200, "3m20s"), (3600, "1h"),
                                           (7500, "2h5m"), (86400 * 3 + 3600 * 4, "3d4h"), (None, "-")])  # fmt: skip
def test_durations_read_as_kubectl_shows_ages(seconds, text):
    assert cmd.duration(seconds) == text


def test_ages_of_absent_or_unreadable_times_are_a_dash():
    assert cmd.ago("2026-12-07T11:55:50Z", NOW) == "4m10s ago"
    assert cmd.ago(None, NOW) == cmd.ago("yesterday", NOW) == "-"


def test_one_serving_in_full_shows_every_field_the_operator_writes():
    text = cmd.describe(FULL, NOW)
    for words in ("flash (namespace prod), generation 3 (observed 3)",
                  "endpoint      http://flash.prod.svc:8000/v1",
                  "groups        2 ready of 3 desired (3 exist, 3 on the current template)",
                  "router        1 of 2 pods ready, 1 available",
                  "SLA           AtRisk: per-user speed p90 97 tok/s (p50 131), attainment 97.1%, 5210 tok/s in all",
                  "learned       capacity 142 users per group at the SLA; start-up 7m5s (cold 15m5s, warm 7m5s)",
                  "last scaling  2 -> 3, 4m10s ago: AtRisk: 412 users need 3 groups",
                  "draining      group 3 (ScaleDown), out of routing since 40s ago",
                  "drained       group 4 (ScaleDown): ended Timeout after 10m, 2h ago, 2 requests in flight",
                  "last start-up group 2 (warm): scheduled 1s, running 12s, ready 7m5s",
                  "Ready             False   PartiallyReady (4m ago)", "2/3 replica groups ready",
                  "MetricsAvailable  False   NotAllowed (1h ago)", "not on the allow-list"):  # fmt: skip
        assert words in text, (words, text)


def test_a_serving_the_operator_never_touched_says_so():
    text = cmd.describe(_serving(), NOW)
    assert "endpoint      - (not reported yet)" in text and "conditions    none yet: is the operator running?" in text
    assert "last scaling" not in text and "learned" not in text


def test_the_list_has_a_line_per_serving_and_names_what_needs_a_look():
    quiet = _serving("calm", readyReplicas=1, desiredReplicas=1, slaState="Met",
                     conditions=[{"type": "Ready", "status": "True", "reason": "AllReplicasReady"},
                                 {"type": "Degraded", "status": "False", "reason": "AsExpected"},
                                 {"type": "Progressing", "status": "True", "reason": "Scaling"}])  # fmt: skip
    lines = cmd.table([quiet, FULL], NOW, namespaces=True).splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "READY", "SLA", "TOK/S/USER", "ATTAINMENT", "LAST", "SCALING",
                                "NEEDS", "A", "LOOK"]  # fmt: skip
    assert lines[1].split() == ["prod", "calm", "1/1", "Met", "-", "-", "-", "-"]
    assert lines[2].split() == ["prod", "flash", "2/3", "AtRisk", "97", "97.1%", "2->3", "4m10s", "ago",
                                "Ready=PartiallyReady,MetricsAvailable=NotAllowed"]  # fmt: skip
    # columns line up: every row's SLA column starts where the header's does
    column = lines[0].index("SLA")
    assert all(line[column - 1] == " " and line[column] != " " for line in lines)


@pytest.mark.parametrize("argv, words", [
    (["BAD_name"], "NAME: 'BAD_name' is not a DeepSeekServing name"),
    (["flash", "-A"], "-A/--all-namespaces lists servings"),
    # `..` would make the client ask for the cluster-wide list, and `a/b` another path
    (["-n", ".."], "-n/--namespace: '..' is not a namespace name"),
    (["flash", "-n", "a/b"], "-n/--namespace: 'a/b' is not a namespace name"),
])  # fmt: skip
def test_bad_arguments_exit_2_before_any_request(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))  # a request would fail with exit 1, not 2
    assert cmd.main(argv) == 2
    assert words in capsys.readouterr().err


def _kubeconfig(tmp_path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "prod"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    return str(path)


class _APIServer(BaseHTTPRequestHandler):
    """Knows one serving, prod/flash; with `crd = False`, no deepseekservings at all; with `refuse` set, that
    status (401, 403) for everything."""

    crd = True
    refuse = 0
    paths: list[str] = []

    def do_GET(self):  # noqa: N802 - the handler's protocol
        type(self).paths.append(self.path)
        base = "/apis/flashserve.io/v1alpha1/namespaces/prod/deepseekservings"
        if self.refuse:
            return self._reply(self.refuse, json.dumps({"kind": "Status", "code": self.refuse}).encode())
        if self.path == "/apis/flashserve.io/v1alpha1/deepseekservings":
            return self._reply(200, json.dumps({"items": [FULL, _serving("other", "dev")]}).encode())
        if not self.crd:
            return self._reply(404, b"404 page not found\n", "text/plain")
        if self.path == base:
            return self._reply(200, json.dumps({"items": [FULL]}).encode())
        if self.path == f"{base}/flash":
            return self._reply(200, json.dumps(FULL).encode())
        name = self.path.rsplit("/", 1)[-1]
        return self._reply(404, json.dumps({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": f'deepseekservings.flashserve.io "{name}" not found',
            "details": {"name": name, "group": "flashserve.io", "kind": "deepseekservings"}}).encode())  # fmt: skip

    def _reply(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_against_an_api_server(serve_http, tmp_path, capsys):
    url, _ = serve_http(_APIServer)
    config = ["--kubeconfig", _kubeconfig(tmp_path, url)]
    assert cmd.main(config) == 0  # the context's namespace, prod
    assert "flash   2/3" in capsys.readouterr().out
    assert cmd.main(["flash", *config]) == 0
    assert "groups        2 ready of 3 desired" in capsys.readouterr().out
    assert cmd.main(["flash", "-o", "json", *config]) == 0
    assert json.loads(capsys.readouterr().out)["status"]["lastScaling"]["to"] == 3
    assert cmd.main(["other", *config]) == 2
    assert "no DeepSeekServing named 'other' in namespace 'prod'" in capsys.readouterr().err


def test_a_cluster_without_the_crd_is_named_as_such(serve_http, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_APIServer, "crd", False)
    url, _ = serve_http(_APIServer)
    assert cmd.main(["flash", "--kubeconfig", _kubeconfig(tmp_path, url)]) == 1
    assert "the API server has no deepseekservings.flashserve.io: is the CRD installed?" in capsys.readouterr().err


def test_an_api_server_that_does_not_answer_is_named(tmp_path, capsys):
    assert cmd.main(["--kubeconfig", _kubeconfig(tmp_path, "http://127.0.0.1:1")]) == 1
    assert "cannot reach the API server at http://127.0.0.1:1" in capsys.readouterr().err


def test_what_a_status_writer_put_in_cannot_repaint_the_terminal_or_forge_a_line():
    """Anyone who may patch a serving's status could write escape sequences or line breaks into it."""
    forged = _serving(slaState="Met\x1b[2J", lastScaling={"time": "x", "from": 1, "to": 2, "reason": "ok\nReady True"},
                      conditions=[{"type": "Ready", "status": "True", "reason": "Fine\x1b]0;owned\x07",
                                   "message": "line one\r\nDegraded False AsExpected"}])  # fmt: skip
    for text in (cmd.describe(forged, NOW), cmd.table([forged], NOW, namespaces=False)):
        assert "\x1b" not in text and "\x07" not in text and "\r" not in text, text
    text = cmd.describe(forged, NOW)
    assert "ok\\nReady True" in text and "line one\\r\\nDegraded False AsExpected" in text
    assert len(text.splitlines()) == len(cmd.describe(_serving(slaState="Met", lastScaling={
        "time": "x", "from": 1, "to": 2, "reason": "ok"}, conditions=[{"type": "Ready", "status": "True", "reason": "F",
        "message": "m"}]), NOW).splitlines())  # fmt: skip


def test_numbers_of_an_unexpected_type_are_shown_not_a_crash():
    odd = _serving(readyReplicas="two", learnedCapacity="lots", learnedStartupSeconds=True,
                   sla={"attainment": "high", "perUserTokensPerSecondP90": None})  # fmt: skip
    text = cmd.describe(odd, NOW)
    assert "groups        two ready" in text and "capacity lots users" in text
    assert "attainment -" in cmd.describe(odd, NOW) and cmd.table([odd], NOW, namespaces=False)


def test_every_namespace_and_a_plain_namespace_flag(serve_http, tmp_path, capsys):
    url, _ = serve_http(_APIServer)
    config = ["--kubeconfig", _kubeconfig(tmp_path, url)]
    assert cmd.main(["-A", *config]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [["dev", "other"], ["prod", "flash"]]
    assert cmd.main(["-n", "prod", *config]) == 0 and "flash" in capsys.readouterr().out


@pytest.mark.parametrize("code, argv, words", [
    (403, ["-A"], "forbids you to list deepseekservings.flashserve.io in all namespaces (a cluster-wide permission)"),
    (403, ["flash"], "forbids you to get deepseekservings.flashserve.io 'flash' in namespace 'prod'"),
    (403, [], "forbids you to list deepseekservings.flashserve.io in namespace 'prod'"),
    (401, [], "did not accept the credentials (401 Unauthorized): log in again"),
])  # fmt: skip
def test_a_refusal_names_what_was_asked(serve_http, tmp_path, capsys, monkeypatch, code, argv, words):
    monkeypatch.setattr(_APIServer, "refuse", code)
    url, _ = serve_http(_APIServer)
    assert cmd.main([*argv, "--kubeconfig", _kubeconfig(tmp_path, url)]) == 1
    assert words in capsys.readouterr().err


def test_in_a_pod_it_uses_the_service_account_as_the_operator_does(monkeypatch, tmp_path):
    from kubernetes import config

    loaded = []
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setattr(config, "load_incluster_config", lambda: loaded.append("in-cluster"))
    monkeypatch.setattr(config, "load_kube_config", lambda **kw: loaded.append("kubeconfig"))
    (tmp_path / "namespace").write_text("flashserve-system\n")
    monkeypatch.setattr(cmd, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "namespace"))
    assert cmd._connect(None) == "flashserve-system" and loaded == ["in-cluster"]


def test_an_api_server_that_accepts_and_never_answers_is_named_not_waited_for(tmp_path, capsys, monkeypatch):
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepted by the kernel, never answered
    monkeypatch.setattr(cmd, "READ_TIMEOUT_S", 0.5)
    try:
        t0 = time.monotonic()
        code = cmd.main(["--kubeconfig", _kubeconfig(tmp_path, f"http://127.0.0.1:{listener.getsockname()[1]}")])
        elapsed = time.monotonic() - t0
    finally:
        listener.close()
    assert code == 1 and elapsed < 5
    assert "cannot reach the API server" in capsys.readouterr().err


def test_an_unreadable_kubeconfig_is_one_clear_error(tmp_path, capsys):
    for text in ("- a list\n", "{not yaml", "apiVersion: v1\nkind: Config\ncurrent-context: none\n"):
        (tmp_path / "kc").write_text(text)
        assert cmd.main(["--kubeconfig", str(tmp_path / "kc")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: no usable kubeconfig at {tmp_path / 'kc'}:") and "Traceback" not in err, err


def test_an_unknown_condition_keeps_its_columns():
    text = cmd.describe(_serving(conditions=[{"type": "Ready", "status": "Unknown", "reason": "R"}]), NOW)
    assert "Ready  Unknown R (-)" in text, text


def test_every_namespace_does_not_need_the_context_namespace(serve_http, tmp_path, capsys):
    url, _ = serve_http(_APIServer)
    config = ["--kubeconfig", _kubeconfig(tmp_path, url)]
    path = tmp_path / "kubeconfig"
    path.write_text(path.read_text().replace('"namespace": "prod"', '"namespace": "Bad_NS"'))
    assert cmd.main(["-A", *config]) == 0
    assert cmd.main(config) == 1 and "configured namespace 'Bad_NS'" in capsys.readouterr().err
