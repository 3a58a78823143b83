"""Draw docs/engine-speed-vs-concurrency.png: per-user speed and throughput per GPU versus concurrency for
each profile on its agentic workload, with the calibration points. Prints the table the docs quote.

    python -m flashserve_testbed.engine.plot_curve [--out docs/engine-speed-vs-concurrency.png] [--duration 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flashserve_testbed.engine import profile as profiles
from flashserve_testbed.engine.curve import CurvePoint, concurrency_at_speed, simulate

CONCURRENCY = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128)


def table(name: str, points: list[CurvePoint]) -> str:
    rows = [f"{name}", "  conc/GPU  tok/s/user(p50)  p10   Ktok/s/GPU  out tok/s/GPU  TTFT p50 ms  KV use  preempt"]
    for p in points:
        rows.append(
            f"  {p.concurrency:8d}  {p.per_user_tokens_per_s:15.1f}  {p.per_user_p10_tokens_per_s:5.1f}"
            f"  {p.throughput_per_gpu / 1e3:10.0f}  {p.output_tokens_per_s:13.0f}  {p.ttft_median_s * 1e3:11.0f}"
            f"  {p.kv_usage_mean:6.2f}  {p.preemptions:7d}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/engine-speed-vs-concurrency.png")
    ap.add_argument("--duration", type=float, default=200.0, help="measured engine seconds per point")
    ap.add_argument("--profiles", default=",".join(profiles.available()))
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in args.profiles.split(",") if n]
    names.sort(key=lambda n: n != profiles.DEFAULT_PROFILE)
    fig, (ax_speed, ax_thr) = plt.subplots(1, 2, figsize=(13, 5.2))
    for i, name in enumerate(names):
        prof = profiles.load(name)
        points = [simulate(prof, c, duration_s=args.duration, warmup_s=30) for c in CONCURRENCY]
        print(table(name, points), flush=True)
        cs = [p.concurrency for p in points]
        default = name == profiles.DEFAULT_PROFILE
        style = dict(lw=2.4 if default else 1.3, alpha=1.0 if default else 0.75, marker="o" if default else None,
                     ms=4)
        label = f"{name} ({prof.gpus_per_replica} GPUs/replica)" + (" - fitted" if prof.calibration.fitted else "")
        line = ax_speed.plot(cs, [p.per_user_tokens_per_s for p in points], label=label, **style)[0]
        if default:
            ax_speed.fill_between(cs, [p.per_user_p10_tokens_per_s for p in points],
                                  [p.per_user_tokens_per_s for p in points], color=line.get_color(), alpha=0.15,
                                  label=f"{name}: p10 to p50 of requests")
        ax_thr.plot(cs, [p.throughput_per_gpu / 1e3 for p in points], label=label, color=line.get_color(), **style)
        cal = prof.calibration
        c_sla = concurrency_at_speed(points, cal.sla_tokens_per_s)
        if default and c_sla is not None:
            print(f"  {name}: {cal.sla_tokens_per_s:g} tok/s per user at {c_sla:.1f} requests per GPU")
        sla_label = f"{cal.sla_tokens_per_s:g} tok/s/user"
        thr_label = f"{cal.throughput_per_gpu_at_sla / 1e3:.0f}K tok/s/GPU"
        if cal.fitted:
            ax_speed.plot([1], [cal.low_concurrency_tokens_per_s], "k*", ms=14, zorder=5,
                          label=f"public: {cal.low_concurrency_tokens_per_s:g} tok/s/user at low concurrency")
            if c_sla is not None:
                ax_speed.plot([c_sla], [cal.sla_tokens_per_s], "kD", ms=9, zorder=5,
                              label=f"public: {sla_label} at {thr_label}")
                ax_thr.plot([c_sla], [cal.throughput_per_gpu_at_sla / 1e3], "kD", ms=9, zorder=5,
                            label=f"public: {thr_label} at {sla_label}")
    ax_speed.axhline(100, color="grey", ls=":", lw=1)
    ax_speed.set_xlabel("concurrent requests per GPU (closed loop, agentic sessions)")
    ax_speed.set_ylabel("per-user decode speed, tok/s (median of requests)")
    ax_speed.set_title("Per-user speed vs concurrency")
    ax_speed.set_ylim(0, 170)
    ax_speed.grid(alpha=0.3)
    ax_speed.legend(fontsize=7.5, loc="lower left")
    ax_thr.set_xlabel("concurrent requests per GPU")
    ax_thr.set_ylabel("cached + new input + output tokens/s per GPU (thousands)")
    ax_thr.set_title("Throughput per GPU vs concurrency")
    ax_thr.grid(alpha=0.3)
    ax_thr.legend(fontsize=7.5, loc="lower right")
    fig.suptitle("FlashServe engine model: DeepSeek-V4.1-Flash, vLLM 0.33, MTP 1 draft, agentic traffic "
                 "(129 prompt tokens per output token, 86% cached)", fontsize=10)
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
