"""The held-out protocol (`flashserve bench autoscale --heldout`): scenarios no policy was developed on.

A generator draws scenarios from six families (a step of 1.5-20x, a ramp of random speed, bursts of random
rate and size, a diurnal cycle of random depth, a different session model, a mix), each with a median
replica start-up from 30 s to 20 minutes. Scenario and run are functions of (family, seed); the train seeds
(TRAIN_BASE + 1 ...) and the test seeds (TEST_BASE + 1 ...) never meet.

The protocol tunes nothing of FlashServe's policy: it runs it as shipped, or with the PolicyConfig fields
`--flashserve-set` names (`ours`). The train set is where its constants are chosen (`run_train`, the
`--train-only` mode: the policy alone on the train set); here it is used only to tune the baselines, each
with the same budget (BUDGET settings of its main knob, `GRIDS`). On the test set it reports the policy, the oracle, the start-up-aware bound and
every baseline at its default, its published tuned setting and its "equal attainment" setting: the
cheapest of its swept settings that reaches the policy's train-set attainment (median over the train
runs), chosen on the train set and scored on the test set. Then it checks the targets of issue 21.

With `--frontier` the two clairvoyants (the oracle and the bound) also run sized at other utilizations
(FRONTIER): more headroom, more attainment, more GPU-hours. Read at the policy's own attainment, that frontier
is the least any policy could spend there, without start-ups (the oracle) and with them (the bound), so it
says whether a GPU-hours target is within reach at all, and how far the policy is from it per family.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass

from flashserve_testbed.bench.measures import Result, median
from flashserve_testbed.bench.policies import PolicySpec
from flashserve_testbed.bench.runner import CLAIRVOYANTS
from flashserve_testbed.bench.scenario_file import ScenarioSpec
from flashserve_testbed.bench.workloads import Scenario

GEN_FAMILIES = ("step", "ramp", "bursts", "diurnal", "sessions", "mixed")
TRAIN_BASE = 1000
TEST_BASE = 2000
MAX_SEEDS = TEST_BASE - TRAIN_BASE
"""Seeds per set at most: train seeds stay below every test seed."""
STARTUP_RANGE_S = (30.0, 1200.0)
BASELINES = ("hpa", "kpa", "aibrix-apa", "dynamo", "wva", "static")
BUDGET = 6
GRIDS: dict[str, tuple[float, ...]] = {
    "hpa": (0.5, 0.6, 0.7, 0.85, 1.0, 1.15),  # target, share of the SLA concurrency (default 1.0)
    "kpa": (0.4, 0.5, 0.6, 0.7, 0.85, 1.0),  # target x utilization, share of it (default 0.7)
    "aibrix-apa": (0.5, 0.6, 0.7, 0.85, 1.0, 1.15),  # target, share of the SLA concurrency (default 1.0)
    "dynamo": (0.6, 0.7, 0.8, 0.9, 1.0, 1.1),  # ITL target, share of 1 / SLA (default 1.0)
    "wva": (0.0, 0.05, 0.10, 0.20, 0.35, 0.55),  # kvCacheThreshold - KV at the SLA concurrency (default 0.80 - ~0.23)
    "static": (0.6, 0.7, 0.85, 1.0, 1.15, 1.3),  # replicas, share of the run's peak need (default 1.0)
}
"""The baselines' main knob (policies.build's `share`), BUDGET settings each, their defaults among them."""
FRONTIER = (1.3, 1.15, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)
"""`--frontier`: the utilizations (share of the SLA capacity per replica) the clairvoyants also size at,
besides their own 1: what knowing the future costs at each attainment, with and without start-ups. The
cheapest of them reaching the policy's attainment is the floor under the equal-attainment target; those
above 1 (less headroom than the SLA capacity) reach down to the attainments of the cheaper baselines."""


def train_seeds(n: int) -> list[int]:
    if not 0 < n <= MAX_SEEDS:
        raise ValueError(f"--train-seeds: give 1 to {MAX_SEEDS}")
    return [TRAIN_BASE + i for i in range(1, n + 1)]


def held_out_seeds(n: int) -> list[int]:
    if not 0 < n <= MAX_SEEDS:
        raise ValueError(f"--test-seeds: give 1 to {MAX_SEEDS}")
    return [TEST_BASE + i for i in range(1, n + 1)]


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def generate(family: str, seed: int) -> Scenario:
    """The scenario of `family` for `seed`: the same for the same pair, whatever else runs."""
    if family not in GEN_FAMILIES:
        raise ValueError(f"unknown scenario family {family!r}: choose from {', '.join(GEN_FAMILIES)}")
    rng = random.Random(f"flashserve-heldout/{family}/{seed}")
    startup = round(_log_uniform(rng, *STARTUP_RANGE_S))
    duration = round(rng.uniform(60.0, 90.0), 1)
    doc: dict = {"name": f"{family}-{seed}", "duration_min": duration, "startup_median_s": startup}
    if family == "step":
        factor = _log_uniform(rng, 1.5, 20.0)
        base = min(rng.uniform(0.6, 2.0), 16.0 / factor)  # the peak stays <= 16 replicas (CPU time)
        at = rng.uniform(10.0, 25.0)
        doc |= {"base_replicas": round(max(0.3, base), 3), "description": f"a {factor:.1f}x step",
                "shape": {"step": {"at_min": round(at, 2), "factor": round(factor, 3),
                                   "rise_min": round(rng.uniform(0.5, 5.0), 2),
                                   "hold_min": round(rng.uniform(10.0, 30.0), 2),
                                   "decay_min": round(rng.uniform(0.0, 15.0), 2)}}}  # fmt: skip
    elif family == "ramp":
        to = rng.uniform(2.0, 6.0)
        ramp = _log_uniform(rng, 5.0, 60.0)
        doc |= {"base_replicas": round(min(rng.uniform(0.8, 2.0), 14.0 / to), 3),
                "description": f"a ramp to {to:.1f}x over {ramp:.0f} min",
                "shape": {"ramp": {"start_min": round(rng.uniform(5.0, 15.0), 2), "ramp_min": round(ramp, 2),
                                   "to": round(to, 3), "hold_min": round(rng.uniform(5.0, 20.0), 2),
                                   "down_min": round(rng.uniform(5.0, 20.0), 2)}}}  # fmt: skip
    elif family == "bursts":
        per_hour, size = rng.uniform(1.0, 10.0), rng.uniform(0.5, 4.0)
        doc |= {"base_replicas": round(rng.uniform(1.0, 3.0), 3),
                "description": f"{per_hour:.1f} bursts an hour of {size:.1f} minutes' sessions",
                "bursts": {"per_hour": round(per_hour, 3), "minutes": round(size, 3),
                           "spread_s": round(rng.uniform(20.0, 180.0), 1)},
                "drift": {"amplitude": round(rng.uniform(0.0, 0.2), 3), "period_min": 60}}  # fmt: skip
    elif family == "diurnal":
        trough = rng.uniform(0.2, 0.8)
        doc |= {"base_replicas": round(rng.uniform(1.5, 4.0), 3), "duration_min": round(rng.uniform(60, 150), 1),
                "description": f"a compressed day, trough at {trough:.0%} of the peak"}
        doc["shape"] = {"diurnal": {"period_min": doc["duration_min"], "trough": round(trough, 3)}}
    elif family == "sessions":
        lo = rng.randint(8_000, 60_000)
        hi = min(120_000, int(lo * rng.uniform(1.5, 4.0)))
        out, gap = rng.uniform(80.0, 600.0), _log_uniform(rng, 1.0, 30.0)
        doc |= {"base_replicas": round(rng.uniform(1.0, 2.5), 3),
                "description": f"sessions to {lo // 1000}-{hi // 1000}K tokens, outputs ~{out:.0f}, tool gaps ~{gap:.0f} s",
                "shape": {"step": {"at_min": 15, "factor": round(rng.uniform(1.5, 3.0), 3), "rise_min": 2,
                                   "hold_min": 20, "decay_min": 10}},
                "sessions": {"context_limit": [lo, hi],
                             "output_tokens": {"median": round(out, 1), "sigma": 0.8, "min": 1, "max": 4000},
                             "tool_gap_s": {"median": round(gap, 2), "sigma": 1.0, "min": 0.3, "max": 180}}}  # fmt: skip
    else:  # mixed: a day with bursts and a wander
        doc |= {"base_replicas": round(rng.uniform(1.5, 3.5), 3), "description": "a compressed day with bursts",
                "shape": {"diurnal": {"period_min": duration, "trough": round(rng.uniform(0.3, 0.7), 3)}},
                "bursts": {"per_hour": round(rng.uniform(1.0, 5.0), 3), "minutes": round(rng.uniform(0.5, 2.0), 3)},
                "drift": {"amplitude": round(rng.uniform(0.0, 0.15), 3), "period_min": 45}}  # fmt: skip
    doc["description"] = f"{doc['description']}, start-up median {startup} s (generated, family {family})"
    return ScenarioSpec.model_validate(doc).to_scenario()


def family_of(scenario_name: str) -> str:
    return scenario_name.rsplit("-", 1)[0]


# ------------------------------------------------------------------------------------------------ the plan


@dataclass
class Tasks:
    """A fixed list of runs in runner.execute's shape (each generated scenario runs with its own seed)."""

    items: list

    def tasks(self) -> list:
        return self.items


def sweep_spec(family: str, share: float) -> PolicySpec:
    return PolicySpec(family, "sweep", share)


OURS = PolicySpec("flashserve")


def train_tasks(scenarios: list[Scenario], settings, ours: PolicySpec = OURS, baselines: bool = True,
                frontier: bool = False) -> Tasks:  # fmt: skip
    """`baselines` False: only the policy (`--train-only`, for choosing its constants); the oracle's
    GPU-hours come with every run's workload, so no oracle run is needed then. `frontier`: the bound at
    every FRONTIER utilization too, to read the policy against it (`train_medians`)."""
    from flashserve_testbed.bench.runner import BOUND_SPEC, Task

    specs = [ours] + ([sweep_spec(f, v) for f in BASELINES for v in GRIDS[f]] if baselines else [])
    if frontier:
        specs += [BOUND_SPEC] + frontier_specs(("bound",))
    out = []
    for sc in scenarios:
        seed = int(sc.name.rsplit("-", 1)[1])
        if baselines:
            out.append(Task(sc, seed, None, settings, "train"))
        out += [Task(sc, seed, s, settings, "train") for s in specs]
    return Tasks(out)


def frontier_specs(clairvoyants: tuple[str, ...] = CLAIRVOYANTS) -> list[PolicySpec]:
    """The clairvoyants sized at every FRONTIER utilization (their own setting, at 1, is run beside them)."""
    return [PolicySpec(c, "sweep", u) for c in clairvoyants for u in FRONTIER]


def frontier_labels(clairvoyant: str) -> list[str]:
    """A clairvoyant's own label and its labels at every FRONTIER utilization, in FRONTIER's order."""
    return [clairvoyant] + [s.label for s in frontier_specs((clairvoyant,))]


def held_out_tasks(scenarios: list[Scenario], settings, equal: dict[str, PolicySpec], ours: PolicySpec = OURS,
                   frontier: bool = False) -> Tasks:  # fmt: skip
    from flashserve_testbed.bench.runner import BOUND_SPEC, Task

    specs = [BOUND_SPEC, ours] + (frontier_specs() if frontier else [])
    for f in BASELINES:
        specs += [PolicySpec(f), PolicySpec(f, "tuned")]
        if equal.get(f) is not None and equal[f].label not in {s.label for s in specs}:
            specs.append(equal[f])
    out = []
    for sc in scenarios:
        seed = int(sc.name.rsplit("-", 1)[1])
        out.append(Task(sc, seed, None, settings, "test"))
        out += [Task(sc, seed, s, settings, "test") for s in specs]
    return Tasks(out)


# ------------------------------------------------------------------------------------------------ choosing


def _ratio(r: Result) -> float:
    return r.gpu_hours / r.oracle_gpu_hours if r.oracle_gpu_hours > 0 else math.nan


@dataclass(frozen=True)
class Choice:
    """A baseline's equal-attainment setting, chosen on the train set."""

    family: str
    spec: PolicySpec
    train_attainment: float
    train_x_oracle: float
    reached: bool
    """False: no swept setting reached the policy's train attainment; `spec` is its best-attaining one."""


def choose_equal(train: list[Result], ours: str = "flashserve") -> tuple[float, dict[str, Choice]]:
    """The policy's median train attainment, and per baseline the cheapest swept setting (median x oracle
    over the train runs) whose median train attainment reaches it."""
    mine = [r.attainment for r in train if r.policy == ours]
    goal = median(mine)
    by: dict[str, list[Result]] = defaultdict(list)
    for r in train:
        by[r.policy].append(r)
    out: dict[str, Choice] = {}
    for fam in BASELINES:
        cands = []
        for v in GRIDS[fam]:
            spec = sweep_spec(fam, v)
            runs = by.get(spec.label, [])
            if runs:
                cands.append((median([_ratio(r) for r in runs]), median([r.attainment for r in runs]), spec))
        if not cands:
            continue
        ok = [c for c in cands if c[1] >= goal]
        if ok:
            cost, att, spec = min(ok, key=lambda c: (c[0], -c[1]))
            out[fam] = Choice(fam, spec, att, cost, True)
        else:
            cost, att, spec = max(cands, key=lambda c: (c[1], -c[0]))
            out[fam] = Choice(fam, spec, att, cost, False)
    return goal, out


# ------------------------------------------------------------------------------------------------ the report


def _row_label(r: Result, choices: dict[str, Choice]) -> str:
    for c in choices.values():
        if r.policy == c.spec.label:
            return f"{c.family}-equal"
    return r.policy


@dataclass
class Cell:
    attainment: float
    x_oracle: float
    gpu_hours: float
    runs: int


def held_out_table(test: list[Result], choices: dict[str, Choice], ours: str = "flashserve") -> tuple[list[str], list[str], dict]:
    """Rows (settings), columns ("all" and the families) and the cells: medians over the test runs."""
    cells: dict[tuple[str, str], Cell] = {}
    groups: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in test:
        labels = {r.policy}
        labels.add(_row_label(r, choices))
        for label in labels:
            groups[(label, "all")].append(r)
            groups[(label, family_of(r.scenario))].append(r)
    for key, runs in groups.items():
        cells[key] = Cell(median([r.attainment for r in runs]), median([_ratio(r) for r in runs]),
                          median([r.gpu_hours for r in runs]), len(runs))  # fmt: skip
    order = ["oracle", "bound", ours]
    for f in BASELINES:
        order += [f, f"{f}-tuned", f"{f}-equal"]
    order += [s.label for s in frontier_specs()]
    rows = [x for x in order if (x, "all") in cells]
    fams = [f for f in GEN_FAMILIES if any(family_of(r.scenario) == f for r in test)]
    return rows, ["all", *fams], cells


@dataclass
class Checks:
    dominated: list[str]
    """'family: setting' where a baseline setting is better than the policy on both axes."""
    equal_saving: float | None
    """1 - policy x oracle / best equal-attainment baseline's x oracle (medians over the test set)."""
    equal_best: str | None
    bound_runs: int
    """Test runs where the bound reaches >= 99.5%."""
    bound_misses: list[str]
    """Of those, the runs where the policy is below 99%."""
    overshoot: list[str]
    """Runs where the policy's peak fleet is at least twice the bound's (maxReplicas is 2x peak + 2)."""
    floor: dict[str, Floor] | None = None
    """`--frontier`: per clairvoyant, where its settings bracket the policy's median test attainment."""
    goal: float = 0.0
    """The policy's median test attainment (what the floor is read at)."""
    target_x: float | None = None
    """The GPU-hours x oracle the equal-attainment target asks for: 0.8 x the best equal baseline's."""

    def lines(self) -> list[str]:
        def ok(passed: bool) -> str:
            return "PASS" if passed else "FAIL"

        out = [f"- {ok(not self.dominated)} no baseline better on both attainment and GPU-hours in any family"
               + (f": {', '.join(self.dominated)}" if self.dominated else "")]
        if self.equal_saving is None:
            out.append("- n/a >= 20% fewer GPU-hours than the best tuned baseline at equal attainment: no baseline "
                       "reached the policy's train attainment")
        else:
            out.append(f"- {ok(self.equal_saving >= 0.2)} >= 20% fewer GPU-hours than the best baseline at equal "
                       f"attainment ({self.equal_best}): {self.equal_saving:+.0%}")
        if not self.bound_runs:  # the bound holds the oracle's capacity: it rarely reaches 99.5%
            out.append("- n/a attainment >= 99% wherever the bound reaches >= 99.5%: no test run where it does")
        else:
            out.append(f"- {ok(not self.bound_misses)} attainment >= 99% wherever the bound reaches >= 99.5% "
                       f"({self.bound_runs} runs; {len(self.bound_misses)} below"
                       + (f": {', '.join(self.bound_misses)}" if self.bound_misses else "") + ")")
        out.append(f"- overshoot: the policy's peak fleet >= 2x the bound's on {len(self.overshoot)} runs"
                   + (f" ({', '.join(self.overshoot)})" if self.overshoot else ""))
        if self.floor is not None:
            out.append("- " + self.floor_line())
        return out

    def floor_line(self) -> str:
        """What knowing the future costs at the policy's attainment, against what the target asks."""
        text = (f"frontier at the policy's median test attainment ({self.goal:.1%}): "
                + "; ".join(self.floor[c].text() for c in CLAIRVOYANTS))
        if self.target_x is None:
            return text
        verdict = self.floor["bound"].verdict(self.target_x)
        return f"{text}; the 20% target asks <= {self.target_x:.2f} x oracle: {verdict}"


def checks(test: list[Result], choices: dict[str, Choice], rows: list[str], cols: list[str], cells: dict,
           ours: str = "flashserve") -> Checks:  # fmt: skip
    dominated = []
    for col in cols[1:]:
        me = cells.get((ours, col))
        if me is None:
            continue
        for row in rows:
            if row == ours or _clairvoyant_row(row):
                continue
            c = cells.get((row, col))
            if c and c.attainment > me.attainment and c.x_oracle < me.x_oracle:
                dominated.append(f"{col}: {row} ({c.attainment:.1%}/{c.x_oracle:.2f} vs "
                                 f"{me.attainment:.1%}/{me.x_oracle:.2f})")  # fmt: skip
    reached = [(cells[(f"{c.family}-equal", "all")].x_oracle, f"{c.family}-equal")
               for c in choices.values() if c.reached and (f"{c.family}-equal", "all") in cells]  # fmt: skip
    saving = best = None
    if reached and (ours, "all") in cells:
        x, best = min(reached)
        saving = 1.0 - cells[(ours, "all")].x_oracle / x
    by_run: dict[tuple[str, int], dict[str, Result]] = defaultdict(dict)
    for r in test:
        by_run[(r.scenario, r.seed)][r.policy] = r
    bound_runs, misses, over = 0, [], []
    for (sc, _seed), runs in sorted(by_run.items()):
        b, me = runs.get("bound"), runs.get(ours)
        if b is None or me is None:
            continue
        if b.attainment >= 0.995:
            bound_runs += 1
            if me.attainment < 0.99:
                misses.append(f"{sc} {me.attainment:.1%}")
        if me.replicas_max >= 2 * b.replicas_max:
            over.append(f"{sc} {me.replicas_max} vs {b.replicas_max}")
    ch = Checks(dominated, saving, best, bound_runs, misses, over)
    if (ours, "all") in cells and any(_frontier_label(label) for label, _ in cells):
        ch.goal = cells[(ours, "all")].attainment
        ch.floor = {c: _floor(cells, c, ch.goal) for c in CLAIRVOYANTS}
        if saving is not None:
            ch.target_x = 0.8 * cells[(best, "all")].x_oracle
    return ch


def _frontier_label(label: str) -> bool:
    """A clairvoyant sized at a FRONTIER utilization (a baseline's sweep setting is labelled alike)."""
    name, _, u = label.partition("@")
    return name in CLAIRVOYANTS and u != ""


def _clairvoyant_row(label: str) -> bool:
    """A clairvoyant's row, at its own setting or at a FRONTIER utilization: never a baseline to rank."""
    return label.partition("@")[0] in CLAIRVOYANTS


def _frontier_cells(cells: dict, clairvoyant: str, col: str) -> list[tuple[str, object]]:
    """(label, cell) of the clairvoyant's settings that have a cell in column `col`, in frontier_labels' order."""
    return [(label, c) for label in frontier_labels(clairvoyant) if (c := cells.get((label, col))) is not None]


def over_bound(cells: dict, row: str, col: str) -> float | None:
    """A setting's median x oracle over the bound's at the setting's median attainment (`frontier_at`)."""
    c = cells.get((row, col))
    at = None if c is None else frontier_at(cells, "bound", col, c.attainment)
    return None if at is None else c.x_oracle / at


@dataclass(frozen=True)
class Floor:
    """Where a clairvoyant's settings (itself and FRONTIER) bracket an attainment, by test-set medians: the
    cheapest setting that reaches it and the best-attaining one that does not (label, attainment, x oracle)."""

    clairvoyant: str
    reaching: tuple[str, float, float] | None
    short: tuple[str, float, float] | None
    at: float | None = None
    """Its x oracle at the attainment itself, interpolated between the two (`frontier_at`)."""

    def text(self) -> str:
        def one(p):
            return f"`{p[0]}` {p[1]:.1%} / {p[2]:.2f}"

        if self.reaching is None:
            return f"{self.clairvoyant}: no setting reaches it (best {one(self.short)})"
        return (f"{self.clairvoyant}: {one(self.reaching)}" + (f", short of it {one(self.short)}" if self.short else "")
                + ("" if self.at is None else f", interpolated {self.at:.2f}"))  # fmt: skip

    def verdict(self, target_x: float) -> str:
        """Whether this clairvoyant meets `target_x` at the attainment: a setting that reaches it at no more
        says yes; a setting short of it that already costs more says no (along the frontier GPU-hours rise
        with attainment); between the two, the interpolation decides, and says so."""
        if self.reaching is not None and self.reaching[2] <= target_x:
            return f"within what the {self.clairvoyant} reaches"
        if self.reaching is None or (self.short is not None and self.short[2] > target_x):
            return f"beyond what the {self.clairvoyant} reaches"
        if self.at is None:
            return f"between the {self.clairvoyant}'s settings: undecided at this grid"
        return (f"{'beyond' if self.at > target_x else 'within'} what the {self.clairvoyant} reaches "
                f"(interpolated: {self.at:.2f})")  # fmt: skip


def _floor(cells: dict, clairvoyant: str, goal: float) -> Floor:
    pts = [(label, c.attainment, c.x_oracle) for label, c in _frontier_cells(cells, clairvoyant, "all")]
    ok = [p for p in pts if p[1] >= goal]
    below = [p for p in pts if p[1] < goal]
    return Floor(clairvoyant, min(ok, key=lambda p: (p[2], -p[1])) if ok else None,
                 max(below, key=lambda p: (p[1], -p[2])) if below else None,
                 frontier_at(cells, clairvoyant, "all", goal))  # fmt: skip


def markdown(test: list[Result], train_goal: float, choices: dict[str, Choice],
             ours: str = "flashserve") -> tuple[str, Checks]:  # fmt: skip
    rows, cols, cells = held_out_table(test, choices, ours)
    lines = ["| setting | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for row in rows:
        out = []
        for col in cols:
            c = cells.get((row, col))
            out.append("-" if c is None else f"{c.attainment:.1%} / {c.x_oracle:.2f}")
        lines.append(f"| {row} | " + " | ".join(out) + " |")
    lines += ["", (f"Equal attainment: the policy's median train attainment is {train_goal:.2%}; chosen on the "
                   "train set (median attainment / x oracle there):")]  # fmt: skip
    for c in choices.values():
        lines.append(f"- {c.family}-equal = `{c.spec.label}`: {c.train_attainment:.2%} / {c.train_x_oracle:.2f}"
                     + ("" if c.reached else " (not reached: its best-attaining setting)"))
    ch = checks(test, choices, rows, cols, cells, ours)
    lines += ["", "Targets (on the test set):", *ch.lines()]
    if ch.floor is not None:
        lines += ["", ("Over the frontier: each setting's median GPU-hours over what the start-up-aware bound spends "
                       "at the same median attainment (interpolated between the bound's settings; - where it is "
                       "outside their range). 1.00 is what knowing the future buys; lower is better:"), "",
                  "| setting | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]  # fmt: skip
        for row in rows:
            if _clairvoyant_row(row):
                continue
            over = [over_bound(cells, row, col) for col in cols]
            lines.append(f"| {row} | " + " | ".join("-" if x is None else f"{x:.2f}" for x in over) + " |")
    return "\n".join(lines), ch


def frontier_at(cells: dict, clairvoyant: str, col: str, goal: float) -> float | None:
    """The clairvoyant's median x oracle at attainment `goal` in column `col`, linear between the two of its
    settings whose median attainments bracket it (sorted by attainment); None outside their range."""
    pts = sorted((c.attainment, c.x_oracle) for _, c in _frontier_cells(cells, clairvoyant, col))
    for (a0, x0), (a1, x1) in zip(pts, pts[1:]):
        if a0 <= goal <= a1:
            return x0 if a1 == a0 else x0 + (x1 - x0) * (goal - a0) / (a1 - a0)
    return None


def plot(test: list[Result], choices: dict[str, Choice], path, ours: str = "flashserve") -> object:
    from flashserve_testbed.bench.plots import COLORS, _plt

    rows, cols, cells = held_out_table(test, choices, ours)
    plt = _plt()
    fams = cols[1:]
    fig, axes = plt.subplots(1, len(fams), figsize=(3.3 * len(fams), 3.6), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for name, style in (("bound", "-"), ("oracle", ":")):
            line = sorted((c.x_oracle, c.attainment * 100) for _, c in _frontier_cells(cells, name, fam))
            if len(line) > 1:  # --frontier: what knowing the future buys at each utilization
                ax.plot(*zip(*line), style, color="gray", lw=1, label=f"{name} frontier" if fam == fams[0] else None)
        for row in rows:
            c = cells.get((row, fam))
            if c is None or row == "oracle" or _frontier_label(row):
                continue
            base = row.split("@")[0].removesuffix("-tuned").removesuffix("-equal")
            marker = "*" if row == "bound" else "s" if row.endswith("-tuned") else "^" if row.endswith("-equal") else "o"
            ax.plot([c.x_oracle], [c.attainment * 100], marker, color=COLORS.get(base, "tab:cyan"), ms=7,
                    label=row if fam == fams[0] else None)  # fmt: skip
        ax.axhline(99, color="black", lw=0.6, ls=":")
        ax.set_title(fam, fontsize=9)
        ax.set_xlabel("GPU-hours / oracle", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("attainment (%)", fontsize=8)
    fig.legend(fontsize=6, loc="lower center", ncol=10)
    fig.suptitle("held-out test set: medians per family (o default, s tuned, ^ equal attainment, * bound)", fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ the run


def train_medians(train: list[Result], ours: str = "flashserve") -> dict[str, tuple[float, float, int]]:
    """The policy's train runs: (median attainment, median GPU-hours x oracle, runs), over all and per
    family, keyed "all" and the family names (what `--train-only` prints, and the selection rule reads)."""
    groups: dict[str, list[Result]] = defaultdict(list)
    for r in train:
        if r.policy == ours:
            groups["all"].append(r)
            groups[family_of(r.scenario)].append(r)
    order = ["all"] + [f for f in GEN_FAMILIES if f in groups]
    return {k: (median([r.attainment for r in groups[k]]), median([_ratio(r) for r in groups[k]]),
                len(groups[k])) for k in order if groups[k]}  # fmt: skip


def over_frontier(runs: list[Result], ours: str = "flashserve") -> dict[str, float | None]:
    """Per column of `train_medians`, the policy's median x oracle over the bound's at the policy's median
    attainment (`frontier_at`; None outside the bound's settings). Empty without the bound's runs."""
    if not any(r.policy == "bound" for r in runs):
        return {}
    _, _, cells = held_out_table(runs, {}, ours)
    return {col: over_bound(cells, ours, col) for col in train_medians(runs, ours)}


def train_markdown(train: list[Result], ours: str = "flashserve") -> str:
    med, over = train_medians(train, ours), over_frontier(train, ours)
    cols = list(med)
    lines = ["| setting | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols),
             f"| {ours} | " + " | ".join(f"{med[c][0]:.2%} / {med[c][1]:.3f}" for c in cols) + " |"]
    if over:
        lines.append("| over the frontier | " + " | ".join("-" if over[c] is None else f"{over[c]:.3f}" for c in cols)
                     + " |")  # fmt: skip
    return "\n".join(lines)


def run_train(profile, calib, settings, families: list[str], n_train: int, jobs: int = 1, curve=None,
              progress=None, ours: PolicySpec = OURS, frontier: bool = False) -> list[Result]:  # fmt: skip
    """`--train-only`: the policy alone on the train set (never the test set), for choosing its constants;
    `frontier`: with the bound at every FRONTIER utilization, to read the policy against it."""
    from flashserve_testbed.bench.runner import execute

    scenarios = [generate(f, s) for f in families for s in train_seeds(n_train)]
    plan = train_tasks(scenarios, settings, ours, False, frontier)
    if progress:
        progress(f"held-out protocol, train set only: {len(plan.tasks())} runs of {ours.label}")
    return execute(plan, profile, calib, jobs=jobs, progress=progress, curve=curve)


def run(profile, calib, settings, families: list[str], n_train: int, n_test: int, jobs: int = 1, curve=None,
        progress=None, ours: PolicySpec = OURS, frontier: bool = False,
        ) -> tuple[list[Result], list[Result], float, dict[str, Choice]]:  # fmt: skip
    """Train runs, the choice of equal-attainment settings, then the test runs (`frontier`: with the
    clairvoyants at every FRONTIER utilization too; they choose nothing)."""
    from flashserve_testbed.bench.runner import execute

    train_sc = [generate(f, s) for f in families for s in train_seeds(n_train)]
    test_sc = [generate(f, s) for f in families for s in held_out_seeds(n_test)]
    plan = train_tasks(train_sc, settings, ours)
    if progress:
        progress(f"held-out protocol: train set {len(train_sc)} scenarios, {len(plan.tasks())} runs "
                 f"(every baseline's knob at {BUDGET} settings)")  # fmt: skip
    train = execute(plan, profile, calib, jobs=jobs, progress=progress, curve=curve)
    goal, choices = choose_equal(train, ours.label)
    plan = held_out_tasks(test_sc, settings, {f: c.spec for f, c in choices.items()}, ours, frontier)
    if progress:
        chosen = ", ".join(f"{c.spec.label}{'' if c.reached else ' (not reached)'}" for c in choices.values())
        progress(f"equal attainment ({goal:.2%} on the train set): {chosen}")
        progress(f"held-out protocol: test set {len(test_sc)} scenarios, {len(plan.tasks())} runs")
    test = execute(plan, profile, calib, jobs=jobs, progress=progress, curve=curve)
    return train, test, goal, choices
