"""The local Prometheus' scrape configuration: file_sd always, Kubernetes pod discovery only where the binary has
it, with the loopback guard as its first relabelling rule and the labels the autoscaler's PromQL selects on."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from flashserve.autoscaling import promql
from flashserve_testbed.localcluster import prometheus
from flashserve_testbed.localcluster.paths import Layout


def _jobs(text: str) -> dict[str, dict]:
    return {j["job_name"]: j for j in yaml.safe_load(text)["scrape_configs"]}


def test_without_discovery_only_file_sd(tmp_path):
    jobs = _jobs(prometheus.config(Layout(tmp_path), 9090))
    assert set(jobs) == {"prometheus", "file_sd"}


def test_pod_discovery_guards_loopback_first_and_labels_what_promql_selects(tmp_path):
    kubeconfig = tmp_path / "prometheus" / "kubeconfig"
    kubeconfig.parent.mkdir()
    kubeconfig.write_text("token: a")
    text = prometheus.config(Layout(tmp_path), 9090, kubeconfig)
    job = _jobs(text)[prometheus.PODS_JOB]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": str(kubeconfig)}]
    guard = job["relabel_configs"][0]
    assert guard["source_labels"] == ["__meta_kubernetes_pod_ip"] and guard["action"] == "keep"
    # Prometheus anchors relabel regexes: a full match
    for ip, kept in [("127.4.1.1", True), ("10.64.3.7", False), ("172.16.0.2", False), ("127.4.1.1.5", False)]:
        assert bool(re.fullmatch(guard["regex"], ip)) is kept, ip
    targets = {r["target_label"] for r in job["relabel_configs"] if "target_label" in r}
    assert {promql.NAMESPACE_LABEL, promql.SERVING_LABEL, promql.GROUP_LABEL, "pod", "job"} <= targets
    # a new token changes the file, so `ensure` reloads Prometheus
    kubeconfig.write_text("token: b")
    assert prometheus.config(Layout(tmp_path), 9090, kubeconfig) != text


def test_debian_prometheus_has_no_kubernetes_discovery_and_says_so(tmp_path):
    """The answer is asked of promtool; a stand-in that refuses the key stands for Debian's build."""
    binary = tmp_path / "prometheus"
    binary.write_text("")
    tool = tmp_path / "promtool"
    tool.write_text("#!/bin/sh\necho 'field kubernetes_sd_configs not found in type config.ScrapeConfig'; exit 1\n")
    tool.chmod(0o755)
    assert prometheus.supports_kubernetes_sd(Path(binary)) is False
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "prometheus").write_text("")
    (ok / "promtool").write_text("#!/bin/sh\ngrep -q kubernetes_sd_configs \"$3\"\n")
    (ok / "promtool").chmod(0o755)
    assert prometheus.supports_kubernetes_sd(ok / "prometheus") is True
