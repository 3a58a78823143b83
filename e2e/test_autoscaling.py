"""The SLA autoscaler closed-loop: real API server, real Prometheus, mock engines serving real requests.

Runs on a local cluster of its own (engines make pods Ready, as the mock runtime does), with the demo-scale
engine profile so a 2-core machine serves the load in real time. Times are short versions of production
settings: 5 s evaluations, 30 s metric windows, 30 s scale-down delay, a 40 s peak window, replicas loading
in ~15 s.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from flashserve.autoscaling.policy import PolicyConfig
from flashserve.autoscaling.steps import replicas_for
from flashserve_testbed.demo import Stack, Timeline, demo_serving

from e2e.support import wait_until

EVAL_S = 5
DOWN_DELAY_S = 30
PEAK_WINDOW_S = 40  # the recent peak holds the fleet this long after the load drops (then the delay runs)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from flashserve_testbed.localcluster import ToolchainMissing, toolchain_bin

    try:
        toolchain_bin()
    except ToolchainMissing as exc:
        pytest.skip(f"needs the local cluster toolchain: {exc}")
    # Its own directory each run: nothing another run (or a crashed one) left behind can interfere.
    s = Stack(cluster_dir=tmp_path_factory.mktemp("autoscaling") / "cluster", namespace="autoscale", startup_seconds=15,
              log_dir=tmp_path_factory.mktemp("autoscale-logs"))  # fmt: skip
    s.start(log=lambda m: print(m, flush=True))
    yield s
    s.stop(down=True, log=lambda m: print(m, flush=True))


def serving(name: str, **auto) -> dict:
    return demo_serving(name, evaluationIntervalSeconds=EVAL_S, metricsWindowSeconds=30,
                        scaleDown={"delaySeconds": DOWN_DELAY_S, "peakWindowSeconds": PEAK_WINDOW_S}, **auto)  # fmt: skip


def _load_in_thread(stack: Stack, name: str, schedule: str) -> tuple[threading.Thread, dict]:
    from flashserve_testbed.loadgen import Workload, run_load

    box: dict = {}

    def run() -> None:
        box["t0"] = time.monotonic()
        try:
            box["report"] = asyncio.run(run_load(stack.base_url(name), schedule=schedule, sla=100.0, seed=3,
                                                 workload=Workload.from_profile(stack.profile),
                                                 drain_seconds=15))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the test asserts on the box; a thread's exception would be lost
            box["error"] = repr(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, box


def _print_decisions(stack: Stack, name: str) -> None:
    """The operator's scaling decisions for the serving, shown with a failure (pytest prints captured output)."""
    log = stack.log_dir / "operator.log"
    if log.exists():
        mark = f"controller.autoscale: {stack.namespace}/{name}: "
        print("".join(line for line in log.read_text(errors="replace").splitlines(True) if mark in line))


def test_scale_up_on_breach_recovers_and_releases_the_surplus_after_the_delay(stack):
    name = "auto"
    stack.apply(serving(name, maxReplicas=6))
    tl = Timeline(stack, name, every=1.0).start()
    wait_until(lambda: (tl.last().get("ready") or 0) >= 1, 120, what="first replica ready")
    # 4 sessions, then a step to 28 (about three replicas' worth), held, then a drop to 2.
    th, box = _load_in_thread(stack, name, "hold 4 30s; step 28 150s; step 2 120s")
    th.join(timeout=420)
    tl.stop()
    _print_decisions(stack, name)
    # Its GB200 node is free for the tests after this one (the pool test fills all but one).
    stack.kubectl(["-n", stack.namespace, "delete", "dss", name, "--wait=false"])
    assert "report" in box, f"load generator did not finish: {box.get('error')}"
    t_load = box["t0"] - tl.t0
    rows = tl.rows
    step_at, drop_at = t_load + 30, t_load + 180

    # Scale-up decided within two evaluation intervals of the breach the operator saw.
    breach = next(r["t"] for r in rows if r["t"] >= step_at and r["sla"] in ("Breached", "AtRisk"))
    up = next(r["t"] for r in rows if r["t"] >= step_at and (r["desired"] or 0) > 1)
    assert up - breach <= 2 * EVAL_S + 2, f"breach seen at {breach:.0f}s, scale-up at {up:.0f}s"
    peak = max(r["desired"] for r in rows)
    assert peak >= 2

    # The SLA recovers once the new replicas are ready: requests finishing in the last minute of the hold.
    series = box["report"].timeseries(5.0)
    late = [b for b in series if 120 <= b["t"] < 175 and b["per_user_p50"] is not None]
    assert late and sum(b["per_user_p50"] >= 90 for b in late) >= 0.8 * len(late), late

    # No flapping under the steady hold: at most one change of direction.
    hold = [r["desired"] for r in rows if step_at + 60 <= r["t"] < drop_at]
    moves = [b - a for a, b in zip(hold, hold[1:]) if b != a]
    changes = sum(1 for a, b in zip(moves, moves[1:]) if (a > 0) != (b > 0))
    assert changes <= 1, f"desired replicas flapped during the steady hold: {hold}"

    # After the drop, scale-down waits the configured delay (counted once the hold has left the peak window),
    # then the first release after the scale-up takes the whole surplus of that moment: back to what 2
    # sessions need (1-2 groups with the release hysteresis) in one step, or two if part of the hold was
    # still remembered; not one group per settle time.
    after = [r for r in rows if r["t"] >= drop_at]
    downs = [(b["t"], a["desired"], b["desired"]) for a, b in zip(after, after[1:]) if b["desired"] < a["desired"]]
    assert downs, f"no scale-down within the window after the load dropped: {[r['desired'] for r in after]}"
    assert downs[0][0] - drop_at >= DOWN_DELAY_S - 2, f"first step down {downs[0][0] - drop_at:.0f}s after the drop"
    # ... counted from when the hold's peak left the peak window (its last bucket started before the drop)
    assert downs[0][0] - drop_at >= DOWN_DELAY_S + PEAK_WINDOW_S * 7 / 8 - 3, f"first step down {downs[0][0] - drop_at:.0f}s after the drop"
    # What 2 sessions need is counted at the capacity the operator had learned when it released: on a 2-core
    # host, six engines share the cores, so the learned users per replica (and with it this need) varies from run
    # to run between about 1 and 3.
    # (the status patch that carries it can land a sample after the replicas patch: the lower of the two)
    cap = min((r["capacity"] for r in after if downs[0][0] <= r["t"] <= downs[0][0] + EVAL_S and r["capacity"]),
              default=None)  # fmt: skip
    need = max(1, replicas_for(2, cap, PolicyConfig().scale_down_utilization)) if cap else 2
    removed = downs[0][1] - downs[-1][2]
    assert downs[-1][2] <= need and len(downs) <= 2, (downs, f"2 sessions at {cap} users/replica need {need}")
    assert max(frm - to for _, frm, to in downs) >= min(2, removed), downs


def test_prometheus_down_holds_replicas_and_reports_metrics_unavailable(stack):
    from flashserve_testbed.localcluster import ensure_up, prometheus

    name = "holdme"
    stack.apply(serving(name, minReplicas=2, maxReplicas=4))
    tl = Timeline(stack, name, every=1.0).start()
    try:
        wait_until(lambda: (tl.last().get("ready") or 0) >= 2 and tl.last().get("metrics") == "True", 150,
                   what="2 ready replicas with metrics")  # fmt: skip
        prometheus.stop(stack.layout)
        wait_until(lambda: tl.last().get("metrics") == "False", 90, what="MetricsAvailable=False")
        held_since = time.monotonic()
        while time.monotonic() - held_since < 20:
            assert tl.last()["desired"] == 2, "replicas must be held while metrics are missing"
            time.sleep(1)
        for attempt in range(3):  # Prometheus back on its port (replaying its WAL can be slow on a busy machine)
            try:
                ensure_up(layout=stack.layout, quiet=True)
                break
            except prometheus.PrometheusError:
                log = stack.layout.logs / "prometheus.log"
                print(log.read_text(errors="replace")[-3000:] if log.exists() else "no prometheus log")
                if attempt == 2:
                    raise
        wait_until(lambda: tl.last().get("metrics") == "True", 120, what="MetricsAvailable=True again")
    finally:
        tl.stop()
        stack.kubectl(["-n", stack.namespace, "delete", "dss", name, "--wait=false"])


def test_pool_exhausted_sets_scaling_limited_without_runaway(stack):
    # Take all but one GB200 node with a serving's objects applied directly in another namespace (neither the
    # operator nor the mock runtime watch it, so its pods just hold their nodes).
    import yaml
    from flashserve.render.renderer import render

    # The servings of the tests before this one must be gone with their pods: a GB200 node one of them still
    # held would leave none for this serving's first group, which would pend instead of its second.
    def no_other_pods() -> bool:
        names = stack.kubectl(["-n", stack.namespace, "get", "pods", "-l", "app.kubernetes.io/name=deepseek-serving",
                               "-o", "name"]).split()  # fmt: skip
        assert not names, f"still there: {names}"
        return True

    wait_until(no_other_pods, 180, what="the earlier servings' pods gone")
    stack.kubectl(["create", "namespace", "filler"])
    filler = render({"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
                     "metadata": {"name": "filler", "namespace": "filler"},
                     "spec": {"replicas": 35, "placement": {"accelerator": "GB200"}}})  # fmt: skip
    stack.kubectl(["apply", "-f", "-"], input=yaml.safe_dump_all(filler))

    def placed() -> int:
        out = stack.kubectl(["-n", "filler", "get", "pods", "-o", "jsonpath={.items[*].spec.nodeName}"])
        return len(out.split())

    wait_until(lambda: placed() >= 35, 120, what="filler pods placed")
    name = "greedy"
    # A tiny capacity estimate makes a little load look like many replicas' worth.
    stack.apply(serving(name, maxReplicas=20, initialCapacity=0.5))
    tl = Timeline(stack, name, every=1.0).start()
    th, box = _load_in_thread(stack, name, "hold 6 90s")
    try:
        # PendingPods once it asked for more: a group's pods are also Pending for a moment while they are placed.
        wait_until(lambda: tl.last().get("limited_reason") == "PendingPods" and (tl.last().get("desired") or 0) > 1,
                   180, what="ScalingLimited PendingPods after a scale-up")  # fmt: skip
        asked = tl.last()["desired"]
        time.sleep(30)
        assert tl.last()["desired"] <= asked + 1, "kept adding replicas while pods could not be scheduled"
        assert tl.last()["desired"] < 20
    finally:
        th.join(timeout=150)
        tl.stop()
        _print_decisions(stack, name)
        stack.kubectl(["delete", "namespace", "filler", "--wait=false"])
    assert not th.is_alive() and "report" in box, f"load generator did not finish: {box.get('error')}"
    assert box["report"].summary()["ok"] > 0, "no request reached the serving through its router"
