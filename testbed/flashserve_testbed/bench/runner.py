"""Runs the benchmark's plan: every (scenario, seed) with every policy setting, the oracle, the knob sweeps
and the start-up sweep, optionally over several worker processes. Each run depends only on its own inputs
(scenario, seed, policy, settings), so results do not depend on the number of workers or their order."""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from dataclasses import dataclass, field, replace

from flashserve_testbed.bench import fluid
from flashserve_testbed.bench.baselines import bound
from flashserve_testbed.bench.calibrate import Calibration
from flashserve_testbed.bench.fleet import CACHE_UNIT_TOKENS
from flashserve_testbed.bench.measures import Result
from flashserve_testbed.bench.policies import PolicySpec, build
from flashserve_testbed.bench.sim import Settings, Simulation, Workload, run_oracle
from flashserve_testbed.bench.workloads import Scenario
from flashserve_testbed.engine.profile import Profile

ORACLE = "oracle"
BOUND = "bound"
BOUND_SPEC = PolicySpec(BOUND)
"""The start-up-aware bound (baselines/bound.py): a run of every (scenario, seed) beside the oracle."""
CLAIRVOYANTS = (ORACLE, BOUND)
"""The policies that know the future; sized at another utilization (PolicySpec share), they draw the
frontier of what knowing it buys."""


@dataclass(frozen=True)
class Task:
    scenario: Scenario
    seed: int
    spec: PolicySpec | None  # None: the oracle
    settings: Settings
    kind: str = "table"  # table | sweep | startup

    @property
    def label(self) -> str:
        return ORACLE if self.spec is None else self.spec.label


@dataclass
class Plan:
    scenarios: list[Scenario]
    seeds: list[int]
    table: list[PolicySpec]
    sweep: list[PolicySpec] = field(default_factory=list)
    sweep_scenarios: list[str] = field(default_factory=list)
    sweep_seeds: list[int] = field(default_factory=list)
    startups: list[float] = field(default_factory=list)
    startup_specs: list[PolicySpec] = field(default_factory=list)
    startup_scenario: str | None = None
    startup_seeds: list[int] = field(default_factory=list)
    timeline_scenario: str | None = None
    timeline_seed: int | None = None
    settings: Settings = field(default_factory=Settings)
    bound: bool = True
    """Run the start-up-aware bound beside the oracle (table and start-up sweep)."""

    def tasks(self) -> list[Task]:
        out: list[Task] = []
        for sc in self.scenarios:
            for seed in self.seeds:
                tl = sc.name == self.timeline_scenario and seed == self.timeline_seed
                st = replace(self.settings, timeline=tl)
                out.append(Task(sc, seed, None, st))
                if self.bound:
                    out.append(Task(sc, seed, BOUND_SPEC, st))
                out.extend(Task(sc, seed, spec, st) for spec in self.table)
                if sc.name in self.sweep_scenarios and seed in self.sweep_seeds:
                    out.extend(Task(sc, seed, spec, self.settings, "sweep") for spec in self.sweep)
                if sc.name == self.startup_scenario and seed in self.startup_seeds:
                    for s in self.startups:
                        st = replace(self.settings, startup_median_s=s)
                        out.append(Task(sc, seed, None, st, "startup"))
                        if self.bound:
                            out.append(Task(sc, seed, BOUND_SPEC, st, "startup"))
                        out.extend(Task(sc, seed, spec, st, "startup") for spec in self.startup_specs)
        return out


_STATE: dict = {}


def _init(profile: Profile, calib: Calibration, curve: fluid.Curve | None = None) -> None:
    _STATE.clear()
    _STATE["profile"] = profile
    _STATE["calib"] = calib
    _STATE["curve"] = curve
    _STATE["workloads"] = {}


def _workload(sc: Scenario, seed: int, settings: Settings) -> Workload | fluid.FluidWorkload:
    cache = _STATE["workloads"]
    key = (sc, seed, settings.all_ranks, settings.engine)
    w = cache.get(key)
    if w is None:
        cache.clear()  # tasks come grouped by (scenario, seed): keep one
        prof, calib = sc.profile_for(_STATE["profile"]), _STATE["calib"]
        if settings.engine == "fluid":
            w = fluid.FluidWorkload(sc, seed, prof, calib, CACHE_UNIT_TOKENS)
        else:
            w = Workload(sc, seed, prof, calib, CACHE_UNIT_TOKENS, prof.max_model_len, settings.all_ranks)
        cache[key] = w
    return w


def clairvoyant_utilization(spec: PolicySpec | None) -> float | None:
    """The utilization a clairvoyant's sweep setting sizes at (`--frontier`); None for every other setting,
    the clairvoyants' own (at 1) included."""
    if spec is None or spec.family not in CLAIRVOYANTS or spec.variant != "sweep":
        return None
    return spec.share


def run_task(task: Task) -> Result:
    st = task.settings
    w = _workload(task.scenario, task.seed, st)
    calib = _STATE["calib"]
    prof = _STATE["profile"]
    curve = _STATE["curve"]
    seen, u = w, clairvoyant_utilization(task.spec)
    if u is not None:
        seen = w.at_utilization(u)
    if task.spec is None or task.spec.family == ORACLE:
        res = fluid.run_oracle(seen, st, curve) if st.engine == "fluid" else run_oracle(seen, st)
        if task.spec is not None:
            res.policy, res.variant = task.spec.label, task.spec.variant
    else:
        startup = st.startup_median_s or task.scenario.startup_median_s or prof.startup.median
        if st.spec_startup_s is not None:
            startup = st.spec_startup_s
        if task.spec.family == BOUND:
            policy = bound.StartupAwareBound(seen.oracle_steps, task.scenario.warmup_s)
        else:
            policy = build(task.spec, calib, startup, st.sla_tokens_per_s, st.learn_startup)
        # `seen` has the same arrivals; a clairvoyant's initial fleet is its own need
        sim = fluid.FluidSimulation(seen, policy, st, curve) if st.engine == "fluid" else Simulation(seen, policy, st)
        if isinstance(policy, bound.StartupAwareBound):
            policy.attach(sim.fleet)  # it knows each order's start-up: the same stream the fleet draws from
        res = sim.run()
        res.policy = task.spec.label
        res.spec_startup_s = startup
        res.variant = task.spec.variant
    if u is not None:
        res.knob, res.knob_value = "utilization", u
    res.oracle_gpu_hours = w.oracle_gpu_hours
    res.kind = task.kind
    return res


def execute(plan: Plan, profile: Profile, calib: Calibration, jobs: int = 1, progress=None,
            curve: fluid.Curve | None = None) -> list[Result]:  # fmt: skip
    tasks = plan.tasks()
    n = len(tasks)
    results: list[Result | None] = [None] * n
    t0 = time.monotonic()

    def report(i: int, res: Result, done: int) -> None:
        if progress:
            eta = (time.monotonic() - t0) / done * (n - done)
            progress(
                f"[{done}/{n}] {res.scenario} seed {res.seed} {res.policy:<22} {res.routing:<8} "
                f"attainment {res.attainment:6.2%}  GPU-h {res.gpu_hours:7.2f}  prefix hits "
                f"{'-' if res.prefix_hit_rate is None else f'{res.prefix_hit_rate:.1%}'}  "
                f"actions {res.scale_actions:3d}  ({res.cpu_seconds:.1f} s CPU, ETA {eta / 60:.0f} min)"
            )

    if jobs <= 1:
        _init(profile, calib, curve)
        for i, task in enumerate(tasks):
            results[i] = run_task(task)
            report(i, results[i], i + 1)
    else:
        ctx = mp.get_context("fork" if sys.platform != "win32" else "spawn")
        with ctx.Pool(jobs, initializer=_init, initargs=(profile, calib, curve)) as pool:
            done = 0
            for i, res in pool.imap_unordered(_indexed, list(enumerate(tasks)), chunksize=1):
                results[i] = res
                done += 1
                report(i, res, done)
    return [r for r in results if r is not None]


def _indexed(item: tuple[int, Task]) -> tuple[int, Result]:
    i, task = item
    return i, run_task(task)
