"""Tables, CSV and JSON from a benchmark's results: medians over seeds, one row per policy."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path

from flashserve_testbed.bench.measures import Result, median
from flashserve_testbed.bench.policies import FAMILIES
from flashserve_testbed.bench.routing import ROUTINGS

ORDER = ["oracle", "bound"] + [f for fam in FAMILIES for f in (fam, f"{fam}-tuned")]


REFERENCES = ("oracle", "bound")
"""Rows that are no autoscaler: the oracle (no start-up) and the start-up-aware bound (baselines/bound.py)."""


def _order(label: str) -> tuple[int, str]:
    return (ORDER.index(label) if label in ORDER else len(ORDER), label)


def _ratio(r: Result) -> float:
    return r.gpu_hours / r.oracle_gpu_hours if r.oracle_gpu_hours > 0 else math.nan


def summarize_runs(runs: list[Result]) -> dict:
    return {
        "attainment": median([r.attainment for r in runs]),
        "gpu_hours": median([r.gpu_hours for r in runs]),
        "gpu_hours_vs_oracle": median([_ratio(r) for r in runs]),
        "tokens_per_dollar": median([r.tokens_per_dollar for r in runs]),
        "output_tokens_per_dollar": median([r.output_tokens_per_dollar for r in runs]),
        "scale_actions": median([float(r.scale_actions) for r in runs]),
        "speed_p90": median([r.speed_p90 for r in runs]),
        "ttft_p90_s": median([r.ttft_p90_s for r in runs]),
        "step_attainment": median([r.step_attainment for r in runs if r.step_attainment is not None]),
        "prefix_hit_rate": median([r.prefix_hit_rate for r in runs if r.prefix_hit_rate is not None]),
        "replicas_mean": median([r.replicas_mean for r in runs]),
        "refused": median([float(r.refused) for r in runs]),
        "runs": len(runs),
    }


def records(results: list[Result]) -> list[dict]:
    """One record per policy setting and routing model of the table: medians over every (scenario, seed) run,
    except `gpu_hours`, the sum over scenarios of the per-scenario medians (the GPU-hours of the whole
    benchmark)."""
    table = [r for r in results if r.kind == "table"]
    by_policy: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in table:
        by_policy[(series_label(r), r.routing)].append(r)
    out = []
    for label, routing in sorted(by_policy, key=lambda k: (_order(k[0]), ROUTINGS.index(k[1])
                                                           if k[1] in ROUTINGS else len(ROUTINGS), k[1])):
        runs = by_policy[(label, routing)]
        rec = {"policy": label, "routing": routing, **summarize_runs(runs)}
        per_sc: dict[str, list[Result]] = defaultdict(list)
        for r in runs:
            per_sc[r.scenario].append(r)
        rec["per_scenario"] = {sc: summarize_runs(rs) for sc, rs in sorted(per_sc.items())}
        rec["gpu_hours"] = sum(v["gpu_hours"] for v in rec["per_scenario"].values())
        out.append(_clean(rec))
    return out


def _clean(obj):
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, float):
        return None if math.isnan(obj) else round(obj, 6) if math.isfinite(obj) else None
    return obj


COLUMNS = (
    ("policy", "policy", "{}"),
    ("attainment", "attainment", "{:.2%}"),
    ("step_attainment", "step att.", "{:.1%}"),
    ("speed_p90", "p90 tok/s", "{:.0f}"),
    ("ttft_p90_s", "p90 TTFT s", "{:.3f}"),
    ("gpu_hours", "GPU-h", "{:.1f}"),
    ("gpu_hours_vs_oracle", "x oracle", "{:.2f}"),
    ("tokens_per_dollar", "M tok/$", "{}"),
    ("scale_actions", "actions", "{:.0f}"),
    ("prefix_hit_rate", "prefix hits", "{:.0%}"),
    ("routing", "routing", "{}"),
)
# Shown only when some request was refused (prompt + output over max_model_len, as vLLM answers 400): such
# requests are neither served nor missed, so attainment alone would hide a workload the engines turned away.
REFUSED = ("refused", "refused", "{:.0f}")


def _columns(rows: list[dict]) -> tuple:
    return COLUMNS + (REFUSED,) if any((r or {}).get("refused") for r in rows) else COLUMNS


_LABELS = ("policy", "routing")  # the record's own labels, the same in every per-scenario row


def _cell(key: str, fmt: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if key == "tokens_per_dollar":
        return f"{value / 1e6:.0f}"
    return fmt.format(value)


def markdown_table(recs: list[dict], per_scenario: str | None = None) -> str:
    rows = [rec if per_scenario is None else rec.get("per_scenario", {}).get(per_scenario) for rec in recs]
    columns = _columns(rows)
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "|".join("---" if k in _LABELS else "---:" for k, _, _ in columns) + "|"
    lines = [head, sep]
    for rec, row in zip(recs, rows):
        if row is None:
            continue
        cells = [rec[k] if k in _LABELS else _cell(k, f, row.get(k)) for k, _, f in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def text_table(recs: list[dict]) -> str:
    columns = _columns(recs)
    rows = [[h for _, h, _ in columns]]
    for rec in recs:
        rows.append([rec[k] if k in _LABELS else _cell(k, f, rec.get(k)) for k, _, f in columns])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_csv(results: list[Result], path: str | Path) -> None:
    rows = [r.row() for r in results]
    if not rows:
        Path(path).write_text("")
        return
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})


def read_csv(path: str | Path) -> list[Result]:
    """The runs of a CSV that `write_csv` wrote (without timelines and decision logs)."""
    kinds = {f.name: str(f.type) for f in fields(Result) if f.name not in ("timeline", "decisions")}
    out = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        columns = reader.fieldnames or []
        missing = [k for k in ("policy", "scenario", "seed", "attainment", "gpu_hours") if k not in columns]
        if missing:
            raise ValueError(f"{path}: not a benchmark results CSV (no column {missing[0]!r})")
        for n, row in enumerate(reader, start=2):
            values: dict = {}
            for name, kind in kinds.items():
                if name not in columns:
                    continue  # a column added after the file was written (e.g. routing): the field's default
                raw = (row.get(name) or "").strip()
                try:
                    if kind.endswith("| None") and raw == "":
                        values[name] = None
                    elif kind.startswith("int"):
                        values[name] = int(float(raw))
                    elif kind.startswith("float"):
                        values[name] = float(raw)
                    else:
                        values[name] = raw
                except ValueError:
                    raise ValueError(f"{path}, line {n}: {name}={raw!r} is not a number") from None
            out.append(Result(**values))
    return out


def run_key(r: Result) -> tuple:
    """What identifies a run: the same key in a later file is a rerun of it."""
    return (r.policy, r.scenario, r.seed, r.kind, r.knob, r.knob_value, r.variant, r.startup_median_s, r.routing,
            r.startup_model, r.startup_learning, r.spec_startup_s)


def merge(*runs: list[Result]) -> list[Result]:
    """Runs of several benchmark invocations, later ones replacing earlier runs with the same key (e.g. one
    policy rerun after a change, over a full run whose other rows are unchanged: every run is a function of
    its seed)."""
    by_key: dict[tuple, Result] = {}
    for batch in runs:
        for r in batch:
            by_key[run_key(r)] = r  # a rerun takes the place (and the position) of the run it replaces
    return list(by_key.values())


def write_json(recs: list[dict], path: str | Path) -> None:
    Path(path).write_text(json.dumps(recs, indent=1) + "\n", encoding="utf-8")


def curves(results: list[Result], scenario: str) -> dict[str, list[tuple[float, float, str]]]:
    """Per policy family: (GPU-hours / oracle, attainment, label) of every setting run on `scenario`,
    medians over the seeds, sorted by cost."""
    groups: dict[str, list[Result]] = defaultdict(list)
    # where the knobs were swept (on a subset of seeds), compare every setting on those same seeds
    sweep_seeds = {r.seed for r in results if r.scenario == scenario and r.kind == "sweep"}
    for r in results:
        if r.scenario == scenario and r.kind in ("table", "sweep") and r.policy not in REFERENCES:
            if not sweep_seeds or r.seed in sweep_seeds:
                groups[r.policy].append(r)
    fam_points: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for label, runs in groups.items():
        fam = label.split("@")[0].removesuffix("-tuned")
        fam_points[fam].append((median([_ratio(r) for r in runs]), median([r.attainment for r in runs]), label))
    return {f: sorted(p) for f, p in fam_points.items()}


def cost_at(points: list[tuple[float, float, str]], attainment: float) -> float | None:
    """Cheapest cost at which a family's settings reach `attainment`, interpolating between settings along
    the lower-right frontier; None if no setting reaches it."""
    frontier = []
    best = -1.0
    for cost, att, _ in sorted(points):
        if att > best:
            frontier.append((cost, att))
            best = att
    for (c0, a0), (c1, a1) in zip(frontier, frontier[1:]):
        if a0 <= attainment <= a1:
            return c0 + (c1 - c0) * (attainment - a0) / (a1 - a0) if a1 > a0 else c0
    if frontier and frontier[0][1] >= attainment:
        return frontier[0][0]
    return None


def equal_attainment(results: list[Result], scenario: str, ours: str = "flashserve") -> list[tuple[str, float | None]]:
    """GPU-hours (x oracle) each family needs to match our default's attainment on `scenario`."""
    cv = curves(results, scenario)
    mine = [p for p in cv.get(ours, []) if p[2] == ours]
    if not mine:
        return []
    target = mine[0][1]
    return [(fam, cost_at(pts, target)) for fam, pts in sorted(cv.items())]


@dataclass(frozen=True)
class Agreement:
    """How two sets of the same runs agree (e.g. the fluid model against the engine model): per run, the
    attainment difference in points and the GPU-hours ratio; summarized over a group of runs."""

    label: str
    runs: int
    attainment_median_pt: float
    attainment_p90_pt: float
    gpu_hours_median_pct: float
    gpu_hours_p90_pct: float


def paired(a: list[Result], b: list[Result]) -> list[tuple[Result, Result]]:
    """Runs present in both (same policy, scenario, seed and setting), in `a`'s order."""
    index = {run_key(r): r for r in b}
    return [(r, index[run_key(r)]) for r in a if run_key(r) in index]


def agreement(pairs: list[tuple[Result, Result]], label: str) -> Agreement | None:
    if not pairs:
        return None
    da = sorted(abs(x.attainment - y.attainment) * 100 for x, y in pairs)
    dg = sorted(abs(x.gpu_hours / y.gpu_hours - 1) * 100 for x, y in pairs if y.gpu_hours > 0)

    def p90(v: list[float]) -> float:
        return v[max(0, math.ceil(0.9 * len(v)) - 1)] if v else math.nan

    return Agreement(label, len(pairs), median(da), p90(da), median(dg) if dg else math.nan, p90(dg))


def series_label(r: Result) -> str:
    """A policy's label in the start-up sweep: FlashServe with its start-up learning off is its own series."""
    if r.startup_learning == "on" or not r.policy.startswith("flashserve"):
        return r.policy
    return f"{r.policy} (learning off)"


def startup_sweep(results: list[Result]) -> dict[str, dict[float, list[Result]]]:
    """The start-up sweep's runs by series and median start-up, with the table's runs of the same scenario and
    seeds as the profile's own start-up (as the plot draws them)."""
    runs = [r for r in results if r.kind == "startup"]
    if not runs:
        return {}
    scenario, seeds = runs[0].scenario, {r.seed for r in runs}
    swept = {r.policy for r in runs}
    runs += [r for r in results
             if r.kind == "table" and r.policy in swept and r.scenario == scenario and r.seed in seeds]  # fmt: skip
    by: dict[str, dict[float, list[Result]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by[series_label(r)][r.startup_median_s or 0.0].append(r)
    return {k: dict(sorted(v.items())) for k, v in sorted(by.items(), key=lambda kv: _order(kv[0]))}


def monotonicity_gap(points: list[tuple[float, float]]) -> float:
    """Over (start-up, attainment) points: the most a point's attainment lies below that of a point with a
    longer start-up, in points (0 when attainment never rises with start-up time)."""
    gap = 0.0
    for i, (_, a) in enumerate(points):
        for _, b in points[i + 1 :]:
            gap = max(gap, (b - a) * 100.0)
    return gap


def startup_sweep_table(results: list[Result]) -> str:
    """Markdown: per series, median attainment / GPU-hours x oracle at each start-up, over the sweep's seeds,
    and the largest rise of attainment with start-up time (the target: at most 1 point)."""
    by = startup_sweep(results)
    if not by:
        return ""
    xs = sorted({s for pts in by.values() for s in pts})
    seeds = sorted({r.seed for pts in by.values() for rs in pts.values() for r in rs})
    head = ["series"] + [f"{s / 60:g} min" for s in xs] + ["rise pt"]
    lines = [f"start-up sweep, median of seeds {', '.join(map(str, seeds))} (attainment / GPU-h x oracle)", "",
             "| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]  # fmt: skip
    for label, pts in by.items():
        cells, att = [], []
        for s in xs:
            rs = pts.get(s)
            if not rs:
                cells.append("-")
                continue
            a = median([r.attainment for r in rs])
            att.append((s, a))
            cells.append(f"{a:.1%} / {median([_ratio(r) for r in rs]):.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {monotonicity_gap(att):.1f} |")
    return "\n".join(lines)


def equal_attainment_between(a: list[Result], b: list[Result], family: str = "flashserve") -> list[dict]:
    """Per scenario `a` swept `family` on and `b` ran it too: each set's default (attainment, GPU-hours x
    oracle) and the GPU-hours x oracle each set's settings need to reach the attainment of either default
    (interpolated along each set's frontier; None: none of its settings reaches it)."""
    out = []
    for sc in dict.fromkeys(r.scenario for r in a if r.kind == "sweep"):
        ca, cb = curves(a, sc).get(family, []), curves(b, sc).get(family, [])
        da = next((p for p in ca if p[2] == family), None)
        db = next((p for p in cb if p[2] == family), None)
        if not (ca and cb and da and db):
            continue
        targets = sorted({round(da[1], 4), round(db[1], 4)})
        out.append({"scenario": sc, "a_default": (da[1], da[0]), "b_default": (db[1], db[0]),
                    "at": [(t, cost_at(ca, t), cost_at(cb, t)) for t in targets]})  # fmt: skip
    return out
