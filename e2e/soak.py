"""Soak: varying autoscaled load for a while, watching the operator. Prints figures; exits 1 on a broken promise.

    .venv/bin/python -m e2e.soak --minutes 60          # on demand (about an hour)
    .venv/bin/python -m e2e.soak --minutes 3           # the short form CI runs (e2e/test_soak.py)

Figures: operator RSS at start and end and its trend (MiB per hour, least squares over samples), scaling
evaluations made versus expected from the interval (none may be missed), error-level log lines (each must have a
cause: none are expected), requests served and SLA attainment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
import time
from pathlib import Path

from flashserve_testbed.demo import Stack, Timeline, demo_serving

EVAL_S = 5


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def _slope_per_hour(samples: list[tuple[float, float]]) -> float:
    n = len(samples)
    if n < 3:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    return 0.0 if den == 0 else sum((t - mt) * (v - mv) for t, v in samples) / den * 3600


def schedule(minutes: float) -> str:
    """Cycles of ramp, burst, drop and quiet, repeated to fill the time (each cycle 3 minutes)."""
    cycle = "ramp 2 16 40s; step 30 30s; step 8 50s; step 2 60s"
    return "; ".join([cycle] * max(1, round(minutes / 3)))


def run(minutes: float, cluster_dir: Path | None = None, log=print) -> dict:
    from flashserve_testbed.loadgen import Workload, run_load

    root = cluster_dir or Path.home() / ".cache" / "flashserve" / "soak-cluster"
    stack = Stack(cluster_dir=root, namespace="soak", startup_seconds=15).start(log=log)
    try:
        stack.apply(demo_serving("soak", evaluationIntervalSeconds=EVAL_S, metricsWindowSeconds=30,
                                 scaleDown={"delaySeconds": 40}, maxReplicas=6))  # fmt: skip
        tl = Timeline(stack, "soak", every=2.0).start()
        deadline = time.monotonic() + 150
        while (tl.last().get("ready") or 0) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"soak serving not ready; logs in {stack.log_dir}")
            time.sleep(1)
        operator = stack.procs[1]
        rss: list[tuple[float, float]] = []
        stop = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not stop.is_set():
                rss.append((time.monotonic() - t0, _rss_mib(operator.pid)))
                stop.wait(10)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        evaluations_before = _decisions(stack)
        t_load = time.monotonic()
        log(f"[soak] {minutes:g} minutes of load: {schedule(minutes)}")
        report = asyncio.run(run_load(stack.base_url("soak"), schedule=schedule(minutes), sla=100.0, seed=5,
                                      workload=Workload.from_profile(stack.profile), progress=True,
                                      progress_interval=30, drain_seconds=15))  # fmt: skip
        elapsed = time.monotonic() - t_load
        evaluations = _decisions(stack) - evaluations_before
        stop.set()
        sampler.join(timeout=15)
        tl.stop()
        log_text = (stack.log_dir / "operator.log").read_text(errors="replace")
        errors = [line for line in log_text.splitlines() if re.search(r"\b(ERROR|CRITICAL|Traceback)\b", line)]
        summary = report.summary()
        return {
            "minutes": round(elapsed / 60, 2),
            "requests": summary["requests"],
            "request_errors": summary["errors"],
            "sla_attainment": summary["sla_attainment"],
            "replicas_max": max((r["desired"] or 0) for r in tl.rows),
            "scaling_changes": sum(1 for a, b in zip(tl.rows, tl.rows[1:]) if a["desired"] != b["desired"]),
            "evaluations": evaluations,
            "evaluations_expected": int(elapsed // EVAL_S),
            "operator_rss_mib_start": round(rss[0][1], 1) if rss else None,
            "operator_rss_mib_end": round(rss[-1][1], 1) if rss else None,
            "operator_rss_mib_peak": round(max(v for _, v in rss), 1) if rss else None,
            "operator_rss_trend_mib_per_hour": round(_slope_per_hour(rss[len(rss) // 4:]), 1),
            "operator_error_lines": errors[:20],
            "operator_alive": operator.poll() is None,
            # For the plot and the JSON record; not printed.
            "series": {"rss_mib": [(round(t, 1), round(v, 1)) for t, v in rss],
                       "replicas": [(round(r["t"] - (t_load - tl.t0), 1), r["desired"], r["ready"])
                                    for r in tl.rows]},  # fmt: skip
        }
    finally:
        stack.stop(down=True, log=log)


def _decisions(stack: Stack) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("flashserve_autoscaler_decisions_total{")))  # fmt: skip


def verdict(figures: dict) -> list[str]:
    problems = []
    if not figures["operator_alive"]:
        problems.append("the operator died")
    # One evaluation may straddle each end of the window; more missing means evaluations were skipped.
    if figures["evaluations"] < figures["evaluations_expected"] - 2:
        problems.append(f"missed evaluations: {figures['evaluations']} of {figures['evaluations_expected']}")
    if figures["operator_error_lines"]:
        problems.append(f"{len(figures['operator_error_lines'])} error-level operator log lines")
    if figures["minutes"] >= 20 and figures["operator_rss_trend_mib_per_hour"] > 20:
        problems.append(f"operator RSS grows {figures['operator_rss_trend_mib_per_hour']} MiB/hour")
    return problems


def plot(figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = figures["series"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1.plot([t / 60 for t, _ in series["rss_mib"]], [v for _, v in series["rss_mib"]], color="tab:purple")
    ax1.set_ylabel("operator RSS (MiB)")
    ax1.set_ylim(0, max((v for _, v in series["rss_mib"]), default=1.0) * 1.3)
    ax1.set_title(f"Soak: {figures['minutes']:g} min of varying load; RSS trend "
                  f"{figures['operator_rss_trend_mib_per_hour']:+g} MiB/h, evaluations "
                  f"{figures['evaluations']}/{figures['evaluations_expected']}")  # fmt: skip
    rows = [r for r in series["replicas"] if r[0] >= 0]
    ax2.step([r[0] / 60 for r in rows], [r[1] for r in rows], where="post", label="desired replicas")
    ax2.step([r[0] / 60 for r in rows], [r[2] for r in rows], where="post", label="ready replicas")
    ax2.set_ylabel("replica groups")
    ax2.set_xlabel("minutes of load")
    ax2.legend(loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--plot", metavar="PNG", help="operator RSS and replicas over time")
    args = ap.parse_args(argv)
    figures = run(args.minutes)
    for k, v in figures.items():
        if k != "series":
            print(f"{k:<34} {v}")
    if args.plot:
        plot(figures, Path(args.plot))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(figures, indent=2) + "\n")
    problems = verdict(figures)
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
