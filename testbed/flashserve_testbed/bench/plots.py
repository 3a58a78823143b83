"""The benchmark's figures (matplotlib, the `plot` extra): attainment versus GPU-hours for every policy and
its knob sweep, replicas and demand over time for one scenario, and the start-up time sweep."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from flashserve_testbed.bench.measures import Result, median
from flashserve_testbed.bench.report import _order, curves
from flashserve_testbed.bench.report import startup_sweep as sweep_runs

COLORS = {
    "oracle": "black", "bound": "dimgray", "flashserve": "tab:red", "hpa": "tab:blue", "kpa": "tab:orange",
    "aibrix-apa": "tab:green", "dynamo": "tab:purple", "wva": "tab:brown", "static": "tab:gray",
}  # fmt: skip


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def attainment_vs_gpu_hours(results: list[Result], path: Path) -> Path:
    plt = _plt()
    scenarios = sorted({r.scenario for r in results if r.kind in ("table", "sweep")})
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5.2 * len(scenarios), 4.6), squeeze=False)
    for ax, sc in zip(axes[0], scenarios):
        for fam, pts in sorted(curves(results, sc).items()):
            color = COLORS.get(fam, None)
            xs, ys = [p[0] for p in pts], [p[1] * 100 for p in pts]
            ax.plot(xs, ys, "-", color=color, alpha=0.5, lw=1)
            for x, y, label in pts:
                marker = "o" if label == fam else "s" if label.endswith("-tuned") else "."
                ax.plot([x], [y * 100], marker, color=color, ms=7 if marker != "." else 6)
            ax.plot([], [], "-o", color=color, label=fam)
        sweep_seeds = {r.seed for r in results if r.scenario == sc and r.kind == "sweep"}
        oracle = [r for r in results if r.scenario == sc and r.policy == "oracle" and r.kind == "table"
                  and (not sweep_seeds or r.seed in sweep_seeds)]  # fmt: skip
        if oracle:
            ax.plot([1.0], [median([r.attainment for r in oracle]) * 100], "*", color="black", ms=12,
                    label="oracle (bound)")  # fmt: skip
        ax.axhline(99, color="black", lw=0.6, ls=":")
        ax.axvline(1.15, color="black", lw=0.6, ls=":")
        ax.set_title(sc)
        ax.set_xlabel("GPU-hours / oracle")
        ax.set_ylabel("token-weighted SLA attainment (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Attainment versus cost (o default, s tuned, . knob sweep; on the sweep's seed where there is "
                 "a sweep, else medians over seeds)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline(results: list[Result], path: Path) -> Path | None:
    runs = [r for r in results if r.timeline and r.kind == "table" and "@" not in r.policy]
    if not runs:
        return None
    plt = _plt()
    runs.sort(key=lambda r: _order(r.policy))
    cols = 2
    rows = (len(runs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.3 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, r in zip(axes.flat, runs):
        tl = r.timeline
        t = [x / 60.0 for x in tl["t"]]
        ax.plot(t, tl["demand"], color="tab:gray", lw=0.7, label="demand (replicas at the SLA)")
        ax.step(t, tl["oracle"], where="post", color="black", lw=0.8, ls="--", label="oracle")
        ax.step(t, tl["desired"], where="post", color=COLORS.get(r.policy.removesuffix("-tuned"), "tab:red"),
                lw=1.4, label="replicas (spec)")  # fmt: skip
        ax.step(t, tl["ready"], where="post", color="tab:green", lw=0.8, alpha=0.8, label="ready")
        ax.set_title(f"{r.policy}: {r.attainment:.1%} attainment, {r.gpu_hours:.1f} GPU-h", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(runs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("minutes")
    fig.suptitle(f"{runs[0].scenario}, seed {runs[0].seed}: demand and replicas", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def startup_sweep(results: list[Result], path: Path) -> Path | None:
    # the profile's own start-up time is the table's run of the same scenario and seeds
    by = sweep_runs(results)
    if not by:
        return None
    runs = [r for pts in by.values() for rs in pts.values() for r in rs]
    seeds = sorted({r.seed for r in runs})
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for label in by:
        points = sorted(by[label].items())  # medians over the seeds at each start-up time
        xs = [s / 60.0 for s, _ in points]
        fam = label.removesuffix(" (learning off)")
        color = COLORS.get(fam.removesuffix("-tuned"))
        style = "--" if fam.endswith("-tuned") else (":" if fam != label else "-")
        a1.plot(xs, [statistics.median(r.attainment * 100 for r in rs) for _, rs in points], style, marker="o",
                color=color, label=label)  # fmt: skip
        a2.plot(xs, [statistics.median(r.gpu_hours / r.oracle_gpu_hours for r in rs) for _, rs in points], style,
                marker="o", color=color, label=label)  # fmt: skip
    a1.set_ylabel("token-weighted SLA attainment (%)")
    a2.set_ylabel("GPU-hours / oracle")
    ticks = sorted({(r.startup_median_s or 0) / 60.0 for r in runs})
    for a in (a1, a2):
        a.set_xscale("log")
        a.set_xticks(ticks)
        a.set_xticklabels([f"{t:g}" for t in ticks])
        a.minorticks_off()
        a.set_xlabel("median replica start-up (minutes)")
        a.grid(alpha=0.3)
    a2.legend(fontsize=7)
    fig.suptitle(f"start-up time sweep: {runs[0].scenario}, median of seeds {', '.join(map(str, seeds))}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def agreement(pairs: list[tuple[Result, Result]], path: Path, a_label: str, b_label: str) -> Path:
    """Run by run: attainment and GPU-hours of one set of runs against another (e.g. fluid vs engine model)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.8))
    for ax, get, name in ((axes[0], lambda r: r.attainment * 100, "token-weighted attainment (%)"),
                          (axes[1], lambda r: r.gpu_hours, "GPU-hours")):  # fmt: skip
        seen = set()
        for x, y in pairs:
            fam = x.policy.removesuffix("-tuned")
            ax.plot([get(y)], [get(x)], "o" if x.policy == fam else "s", color=COLORS.get(fam, "tab:cyan"),
                    ms=4, alpha=0.75, label=None if fam in seen else fam)  # fmt: skip
            seen.add(fam)
        lo = min(min(get(x), get(y)) for x, y in pairs)
        hi = max(max(get(x), get(y)) for x, y in pairs)
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.7, ls=":")
        ax.set_xlabel(f"{name}, {b_label}")
        ax.set_ylabel(f"{name}, {a_label}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{a_label} against {b_label}, run by run (o default, s tuned)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
