"""`flashserve bench ...`: the autoscaling benchmark (docs/autoscaling-benchmark.md).

    flashserve bench autoscale [--quick] [--json PATH] [--csv PATH] [--out DIR] [--seeds N ...]
                               [--scenarios NAME ...] [--policies NAME ...] [--trace FILE ...] [--jobs N]
                               [--scenario-file FILE.yaml ...]
                               [--routing MODEL ...] [--sticky-ttl SECONDS]
                               [--startup-model lognormal|cold|cached-node|cached-shared]
                               [--startups SECONDS ...] [--spec-startup SECONDS] [--no-startup-learning]
    flashserve bench autoscale --heldout [--families NAME ...] [--train-seeds N] [--test-seeds N] [--out DIR]
                               [--train-only] [--frontier] [--flashserve-set FIELD=VALUE ...]
    flashserve bench report RUNS.csv [MORE.csv ...] --out DIR
    flashserve bench compare A.csv B.csv [--plot PNG | --equal-attainment [FAMILY]]
    flashserve bench speed [--hours 24] [--policy flashserve] [--peak-replicas 2] [--engine model|fluid]
    flashserve bench trace OUT.jsonl [--minutes 60] [--sessions-per-s 0.5] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashserve_testbed.bench.runner import Plan

USAGE = """usage: flashserve bench COMMAND [ARGS...]

commands:
  autoscale  compare autoscalers on simulated agentic traffic (table, CSV, JSON, plots)
  report     rebuild the table, JSON and plots from saved runs (later files replace reruns)
  compare    how two sets of the same runs agree, run by run (e.g. --engine fluid against the engine model)
  speed      time a simulated day for one policy
  trace      write a synthetic agentic Mooncake-format trace"""


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def further_routing(plan: Plan, routing: str) -> Plan:
    """The table's runs again under another routing model: the oracle, the bound unless --no-bound, the
    policies; no sweeps and no timeline (those run once, under the first model)."""
    return replace(plan, settings=replace(plan.settings, routing=routing), sweep=[], startups=[],
                   timeline_scenario=None, timeline_seed=None)


def parse_startups(values: list[str] | None) -> list[float] | None:
    """--startups: None (not given: the default sweep), [] (`none` or no value: no sweep), or seconds > 0."""
    if values is None:
        return None
    if values == ["none"]:
        return []
    out = []
    for v in values:
        try:
            seconds = float(v)
        except ValueError:
            seconds = math.nan
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"--startups: {v!r} is not a start-up time; give seconds > 0 (e.g. 30 120 1200) "
                             "or `none` for no start-up sweep")
        out.append(seconds)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "autoscale":
        return autoscale(rest)
    if cmd == "report":
        return report_cmd(rest)
    if cmd == "compare":
        return compare_cmd(rest)
    if cmd == "speed":
        return speed(rest)
    if cmd == "trace":
        return trace(rest)
    print(f"flashserve bench: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------------------------------ autoscale


def _parser() -> argparse.ArgumentParser:
    from flashserve_testbed.bench.fleet import STARTUP_MODELS
    from flashserve_testbed.bench.policies import FAMILIES
    from flashserve_testbed.bench.routing import ROUTINGS
    from flashserve_testbed.bench.workloads import SCENARIOS

    p = argparse.ArgumentParser(prog="flashserve bench autoscale", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="CI mode: one short scenario, one seed, no sweeps (about a minute on two cores)")
    p.add_argument("--json", metavar="PATH", help="write one record per policy (medians) as JSON")
    p.add_argument("--csv", metavar="PATH", help="write one row per run as CSV")
    p.add_argument("--out", metavar="DIR", help="write results.{csv,json}, table.md and the plots here")
    p.add_argument("--seeds", type=int, nargs="+", help="run seeds (default 1 2 3; --quick: 1)")
    p.add_argument("--scenarios", nargs="+", metavar="NAME",
                   help=f"synthetic scenarios, or `none` (default: all of {', '.join(SCENARIOS)}; with --trace: none)")
    p.add_argument("--trace", action="append", default=[], metavar="FILE",
                   help="replay this trace as a scenario (repeatable): Mooncake (open loop) or aiperf multi-turn "
                   "(sessions, closed loop), plain or gzipped, told apart by content")
    p.add_argument("--scenario-file", action="append", default=[], metavar="FILE.yaml",
                   help="run the scenarios of this YAML file (repeatable; format in docs/autoscaling-benchmark.md); "
                   "only they run unless --scenarios names built-ins")
    p.add_argument("--heldout", action="store_true",
                   help="the train/test protocol: baselines tuned on generated train scenarios, every policy "
                   "scored on held-out test scenarios (fluid model unless --engine model)")
    p.add_argument("--families", nargs="+", metavar="NAME",
                   help="--heldout: generated scenario families (default: all six)")
    p.add_argument("--train-seeds", type=int, default=2, metavar="N", help="--heldout: seeds per family (default 2)")
    p.add_argument("--test-seeds", type=int, default=2, metavar="N", help="--heldout: seeds per family (default 2)")
    p.add_argument("--train-only", action="store_true",
                   help="--heldout: run only FlashServe's policy on the train set and print its medians per family "
                   "(for choosing its constants; the test set is not run)")
    p.add_argument("--frontier", action="store_true",
                   help="--heldout: also run the oracle and the start-up-aware bound sized at 1.3 down to 0.6 of "
                   "the SLA capacity on the test set, and print what knowing the future costs at each attainment "
                   "(with --train-only: the bound on the train set, and the policy's GPU-hours over it)")
    p.add_argument("--flashserve-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="run FlashServe's policy with this PolicyConfig field set (repeatable; e.g. "
                   "scale_down_utilization=0.7, peak_window_startups=2, learn_startup=false); shown in its label "
                   "(flashserve@FIELD=VALUE), in the table, the sweeps and --heldout alike")
    p.add_argument("--no-bound", action="store_true", help="skip the start-up-aware bound's runs")
    p.add_argument("--policies", nargs="+", metavar="NAME", choices=FAMILIES,
                   help=f"policy families (default all: {', '.join(FAMILIES)})")
    p.add_argument("--no-tuned", action="store_true", help="only the baselines' default settings")
    p.add_argument("--no-sweep", action="store_true", help="skip the knob sweeps")
    p.add_argument("--sweep-scenarios", nargs="+", metavar="NAME",
                   help="scenarios of the knob sweeps, on the first seed (default: the first scenario)")
    p.add_argument("--startups", nargs="*", metavar="SECONDS",
                   help="median start-up times of the start-up sweep, run on every seed (default 30 120 1200 "
                   "besides the profile's; runs with --no-sweep too when given; `none` or no value: no start-up "
                   "sweep)")
    p.add_argument("--startup-model", choices=STARTUP_MODELS, default="lognormal",
                   help="where replica start-ups come from: lognormal (default, the published tables: the profile's "
                   "cold-only lognormal), or the start-up model by phase with cold (no cache), cached-node (a "
                   "node-local weights cache and the kernel cache: a node that ran a replica starts the next one "
                   "warm) or cached-shared (a shared weights claim and the kernel cache); the cold start-up is the "
                   "run's median either way")
    p.add_argument("--spec-startup", type=float, metavar="SECONDS",
                   help="the replicaStartupSeconds FlashServe is given (and the tuned baselines are tuned for) "
                   "whatever the runs' start-ups are (default: each run's median start-up)")
    p.add_argument("--no-startup-learning", action="store_true",
                   help="FlashServe keeps the spec's start-up time instead of learning it from the start-ups it "
                   "sees complete")
    p.add_argument("--startup-policies", nargs="+", metavar="NAME", choices=FAMILIES,
                   help="families run in the start-up sweep (default flashserve hpa kpa)")
    p.add_argument("--minutes", type=float, help="override every scenario's duration (smoke tests)")
    p.add_argument("--profile", default=None, help="engine profile (default gb200-4gpu)")
    p.add_argument("--sla", type=float, default=100.0, help="per-user tokens/s target (default 100)")
    p.add_argument("--gpu-hour-price", type=float, default=None, help="USD per GPU-hour (default 2.30, TCO)")
    p.add_argument("--all-ranks", action="store_true",
                   help="simulate every data-parallel rank of a replica, not one representative (4x slower)")
    p.add_argument("--engine", choices=("model", "fluid"), default=None,
                   help="model: every request through the engine model (default; --heldout: fluid); fluid: the fluid model, "
                   "~100x faster, validated against the model in docs/autoscaling-benchmark.md")
    p.add_argument("--routing", nargs="+", choices=ROUTINGS, default=["affinity"], metavar="MODEL",
                   help="how a request picks its replica, one table row set per model (default affinity): "
                   "service (random per request, a plain Service), affinity (session affinity with bounded "
                   "load), router (vllm-router's consistent_hash on X-Session-ID over pods), router-rank (the "
                   "same over each pod's data-parallel ranks: the operator's default, dataParallelAware), "
                   "router-pod-vllm (router with vLLM's own load-only rank balancer in the pod), router-sticky "
                   "(vllm-router's sticky_least_loaded over ranks: offered, not the default), router-rendezvous "
                   "(its rendezvous_hash over ranks: in 0.1.17's library, not selectable); sweeps run with the "
                   "first")
    p.add_argument("--sticky-ttl", type=float, default=None, metavar="SECONDS",
                   help="router-sticky: the router's idle expiry of a session "
                   "(VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S; the binary's default is 7200); unset, an ended "
                   "session leaves its rank's count at once, as when clients call /finish_session")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--decision-log", metavar="DIR",
                   help="write FlashServe's decisions (reason, readings) per run as JSON lines here")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def autoscale(argv: list[str]) -> int:
    from flashserve_testbed.bench import report, scenario_file
    from flashserve_testbed.bench.calibrate import calibrate
    from flashserve_testbed.bench.measures import GPU_HOUR_PRICE_USD
    from flashserve_testbed.bench.policies import (
        FAMILIES,
        PolicySpec,
        check_flashserve,
        parse_overrides,
        sweep_specs,
        table_specs,
    )
    from flashserve_testbed.bench.runner import Plan, execute
    from flashserve_testbed.bench.sim import Settings
    from flashserve_testbed.bench.workloads import (
        QUICK_SCENARIO,
        SCENARIOS,
        Scenario,
    )
    from flashserve_testbed.engine.profile import load as load_profile
    from flashserve_testbed.traces import TraceError
    from flashserve_testbed.traces import read as read_trace

    args = _parser().parse_args(argv)
    progress = None if args.quiet else _progress
    try:
        args.overrides = parse_overrides(args.flashserve_set)
        args.startups = parse_startups(args.startups)
    except ValueError as exc:
        print(f"flashserve bench autoscale: {exc}", file=sys.stderr)
        return 2
    for flag, given in (("--train-only", args.train_only), ("--frontier", args.frontier)):
        if given and not args.heldout:
            print(f"flashserve bench autoscale: {flag} is a mode of --heldout: add --heldout", file=sys.stderr)
            return 2
    args.engine = args.engine or ("fluid" if args.heldout else "model")
    if args.engine == "fluid" and (args.trace or args.all_ranks):
        print("flashserve bench autoscale: --engine fluid replays synthetic sessions on one representative rank "
              "per replica; drop --trace/--all-ranks or use --engine model", file=sys.stderr)  # fmt: skip
        return 2
    routings = list(dict.fromkeys(args.routing))
    if args.engine == "fluid" and routings != ["affinity"]:
        print("flashserve bench autoscale: --routing: the fluid model keeps session affinity only; use "
              "--engine model for --routing service or router", file=sys.stderr)  # fmt: skip
        return 2
    if args.sticky_ttl is not None and (args.sticky_ttl <= 0 or "router-sticky" not in routings):
        print("flashserve bench autoscale: --sticky-ttl: give seconds above 0, with --routing router-sticky "
              "(the only model with a session table)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        profile = load_profile(args.profile)
    except ValueError as exc:
        print(f"flashserve bench autoscale: {exc}", file=sys.stderr)
        return 2
    if args.heldout:
        return heldout(args, profile, progress)
    if args.quick:
        if args.scenario_file or args.scenarios:  # refused rather than ignored: the user asked for them
            print(f"flashserve bench autoscale: --quick runs its own scenario ({QUICK_SCENARIO.name}): drop "
                  "--scenario-file/--scenarios, or drop --quick to run them", file=sys.stderr)  # fmt: skip
            return 2
        scenarios = [QUICK_SCENARIO]
        seeds = args.seeds or [1]
    else:
        names = args.scenarios or ([] if args.trace or args.scenario_file else list(SCENARIOS))
        if names == ["none"]:
            names = []
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            print(f"flashserve bench autoscale: --scenarios: unknown scenario {unknown[0]!r}: choose from "
                  f"{', '.join(SCENARIOS)}, or none", file=sys.stderr)  # fmt: skip
            return 2
        scenarios = [SCENARIOS[n] for n in names]
        seeds = args.seeds or [1, 2, 3]
        for path in args.scenario_file:
            try:
                scenarios += scenario_file.load(path)
            except scenario_file.ScenarioFileError as exc:
                print(f"flashserve bench autoscale: --scenario-file {exc}", file=sys.stderr)
                return 2
    for path in args.trace:
        try:
            tr = read_trace(path)
        except TraceError as exc:
            print(f"flashserve bench autoscale: --trace {exc}", file=sys.stderr)
            return 2
        span = tr.sessions[-1].start_ms / 1000.0
        if tr.closed_loop:  # sessions go on after the last one starts: give them their mean length
            span += sum(sum((t.delay_ms or 0.0) for t in s.turns) for s in tr.sessions) / 1000.0 / len(tr.sessions)
        warm = min(300.0, 0.1 * span)
        name = Path(path).name.removesuffix(".gz").removesuffix(".jsonl")
        scenarios.append(Scenario(name=f"trace-{name}", description=f"replay of {path} ({tr.format}, "
                                  f"{len(tr.sessions)} sessions, {tr.requests} requests)",
                                  duration_s=max(60.0, span - warm), base_replicas=0.0, warmup_s=warm,
                                  trace=str(path)))  # fmt: skip
    if not scenarios:
        print("flashserve bench autoscale: nothing to run: --scenarios none needs --trace FILE", file=sys.stderr)
        return 2
    # After the traces too: two traces of one file name (a/x.jsonl, b/x.jsonl.gz) would share a row and a median.
    names = [s.name for s in scenarios]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash:
        print(f"flashserve bench autoscale: scenario {clash!r} is given twice: rename one in its file, or give "
              "traces of different file names", file=sys.stderr)  # fmt: skip
        return 2
    for sc in scenarios:
        problem = scenario_file.unservable(sc, profile)
        if problem:
            print(f"flashserve bench autoscale: scenario {sc.name!r}: {problem}", file=sys.stderr)
            return 2
    if args.minutes:
        scenarios = [s.scaled(duration_s=args.minutes * 60.0) for s in scenarios]
    families = tuple(args.policies or FAMILIES)
    table = [_ours(s, args.overrides) for s in table_specs(families) if not (args.no_tuned and s.variant == "tuned")]
    settings = Settings(sla_tokens_per_s=args.sla, gpu_hour_price=args.gpu_hour_price or GPU_HOUR_PRICE_USD,
                        all_ranks=args.all_ranks, decisions=bool(args.decision_log),
                        engine=args.engine, routing=routings[0], startup_model=args.startup_model,
                        sticky_ttl_s=args.sticky_ttl,
                        learn_startup=not args.no_startup_learning, spec_startup_s=args.spec_startup)  # fmt: skip
    plan = Plan(scenarios=scenarios, seeds=seeds, table=table, settings=settings,
                timeline_scenario=scenarios[0].name, timeline_seed=seeds[0], bound=not args.no_bound)  # fmt: skip
    if not args.quick and not args.no_sweep:
        plan.sweep = [_ours(s, args.overrides) for s in sweep_specs(families)]
        plan.sweep_scenarios = args.sweep_scenarios or [scenarios[0].name]
        plan.sweep_seeds = [seeds[0]]
    if not args.quick and (not args.no_sweep or args.startups):
        # the start-up sweep: with the knob sweeps by default, and whenever --startups names start-ups
        startups = [30.0, 120.0, 1200.0] if args.startups is None else args.startups
        if startups:
            plan.startups = startups
            fams = args.startup_policies or [f for f in ("flashserve", "hpa", "kpa") if f in families]
            plan.startup_specs = [_ours(PolicySpec(f), args.overrides) for f in fams]
            plan.startup_scenario = scenarios[0].name
            plan.startup_seeds = list(seeds)
    try:
        # the table's and the start-up sweep's settings are --flashserve-set's alone, checked when parsed
        for spec in plan.sweep:
            if spec.family == "flashserve":
                check_flashserve(spec)
    except ValueError as exc:
        print(f"flashserve bench autoscale: --flashserve-set with the knob sweep: {exc}; change the set value "
              "or add --no-sweep", file=sys.stderr)  # fmt: skip
        return 2
    t0 = time.monotonic()
    further = [further_routing(plan, r) for r in routings[1:]]
    if progress:
        progress(f"calibrating {profile.name}: steady-state load test of one engine ...")
    calib = calibrate(profile, args.sla, quick=args.quick, progress=progress)
    if progress:
        progress(f"SLA capacity: {calib.capacity_per_replica:.0f} concurrent requests per replica "
                 f"({calib.capacity_per_rank:.1f} per GPU) at {calib.target_attainment:.0%} token-weighted "
                 f"attainment of {args.sla:g} tok/s; "
                 f"{sum(len(p.tasks()) for p in [plan, *further])} runs")  # fmt: skip
    curve = None
    if args.engine == "fluid":
        from flashserve_testbed.bench.fluid import build_curve

        curve = build_curve(profile, args.sla, progress=progress)
    results = execute(plan, profile, calib, jobs=max(1, args.jobs), progress=progress, curve=curve)
    for again in further:
        results += execute(again, profile, calib, jobs=max(1, args.jobs), progress=progress, curve=curve)
    if args.decision_log:
        _write_decisions(Path(args.decision_log), results)
    recs = report.records(results)
    print(report.text_table(recs))
    for sc in scenarios:
        if not any(r.kind == "sweep" and r.scenario == sc.name for r in results):
            continue
        cmp_ = report.equal_attainment(results, sc.name)
        if cmp_ and any(c is not None for _, c in cmp_):
            cells = ", ".join(f"{f} {c:.2f}" if c is not None else f"{f} never" for f, c in cmp_)
            print(f"{sc.name}: GPU-hours/oracle to match flashserve's attainment: {cells}")
    sweep_table = report.startup_sweep_table(results)
    if sweep_table:
        print("\n" + sweep_table)
    if progress:
        progress(f"done in {(time.monotonic() - t0) / 60:.1f} min")
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or (out / "results.json" if out else None)
    csv_path = args.csv or (out / "results.csv" if out else None)
    if json_path:
        report.write_json(recs, json_path)
    if csv_path:
        report.write_csv(results, csv_path)
    if out:
        _write_out_dir(out, recs, results, scenarios, seeds, calib, settings, profile, not args.no_plots, progress)
    return 0


def _ours(spec, overrides):
    """FlashServe's settings with --flashserve-set's fields (the baselines' unchanged)."""
    return replace(spec, overrides=overrides) if spec.family == "flashserve" and overrides else spec


def heldout(args, profile, progress) -> int:
    """`--heldout`: the train/test protocol (bench/protocol.py); table and checks on stdout."""
    from flashserve_testbed.bench import protocol, report
    from flashserve_testbed.bench.calibrate import calibrate
    from flashserve_testbed.bench.measures import GPU_HOUR_PRICE_USD
    from flashserve_testbed.bench.policies import PolicySpec
    from flashserve_testbed.bench.sim import Settings

    fams = args.families or list(protocol.GEN_FAMILIES)
    bad = next((f for f in fams if f not in protocol.GEN_FAMILIES), None)
    if bad or args.trace or args.scenario_file or args.scenarios or args.all_ranks:
        why = (f"--families: unknown family {bad!r}: choose from {', '.join(protocol.GEN_FAMILIES)}" if bad else
               "--heldout generates its scenarios: drop --trace/--scenario-file/--scenarios/--all-ranks")
        print(f"flashserve bench autoscale: {why}", file=sys.stderr)
        return 2
    try:
        protocol.train_seeds(args.train_seeds)
        protocol.held_out_seeds(args.test_seeds)
    except ValueError as exc:
        print(f"flashserve bench autoscale: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    settings = Settings(sla_tokens_per_s=args.sla, gpu_hour_price=args.gpu_hour_price or GPU_HOUR_PRICE_USD,
                        engine=args.engine, startup_model=args.startup_model,
                        learn_startup=not args.no_startup_learning,
                        decisions=bool(args.decision_log and args.train_only))  # fmt: skip
    if args.decision_log and not args.train_only:
        # the test set's decisions are what nothing may be developed on: logs come from the train set only
        print("flashserve bench autoscale: --heldout --decision-log needs --train-only", file=sys.stderr)
        return 2
    if progress:
        progress(f"calibrating {profile.name}: steady-state load test of one engine ...")
    calib = calibrate(profile, args.sla, progress=progress)
    curve = None
    if args.engine == "fluid":
        from flashserve_testbed.bench.fluid import build_curve

        curve = build_curve(profile, args.sla, progress=progress)
    ours = PolicySpec("flashserve", overrides=args.overrides)
    if args.train_only:
        return _train_only(args, profile, calib, settings, fams, curve, progress, ours, t0)
    train, test, goal, choices = protocol.run(profile, calib, settings, fams, args.train_seeds, args.test_seeds,
                                              max(1, args.jobs), curve, progress, ours, args.frontier)  # fmt: skip
    table, checks = protocol.markdown(test, goal, choices, ours.label)
    minutes = (time.monotonic() - t0) / 60
    print(table)
    if progress:
        progress(f"done in {minutes:.1f} min")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report.write_csv(train + test, out / "results.csv")
        head = (f"# Held-out protocol\n\n{len(fams)} families x {args.test_seeds} test seeds (train: "
                f"{args.train_seeds} seeds), engine `{args.engine}`, {minutes:.1f} min. Medians per family, "
                "attainment / GPU-hours x oracle.\n\n")
        (out / "protocol.md").write_text(head + table + "\n", encoding="utf-8")
        if not args.no_plots:
            try:
                protocol.plot(test, choices, out / "heldout.png", ours.label)
            except ImportError:
                if progress:
                    progress("matplotlib missing: no plot (pip install flashserve[plot])")
    if args.json:
        Path(args.json).write_text(json.dumps({"train_attainment": goal, "checks": asdict(checks),
                                               "choices": {f: c.spec.label for f, c in choices.items()}},
                                              indent=1) + "\n", encoding="utf-8")  # fmt: skip
    return 0


def _train_only(args, profile, calib, settings, fams, curve, progress, ours, t0) -> int:
    from flashserve_testbed.bench import protocol, report

    train = protocol.run_train(profile, calib, settings, fams, args.train_seeds, max(1, args.jobs), curve, progress,
                               ours, args.frontier)  # fmt: skip
    print(f"train set ({args.train_seeds} seeds per family), medians: attainment / GPU-hours x oracle")
    print(protocol.train_markdown(train, ours.label))
    if args.decision_log:
        _write_decisions(Path(args.decision_log), train)
    if progress:
        progress(f"done in {(time.monotonic() - t0) / 60:.1f} min")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report.write_csv(train, out / "results.csv")
    if args.csv:
        report.write_csv(train, Path(args.csv))
    if args.json:
        med, over = protocol.train_medians(train, ours.label), protocol.over_frontier(train, ours.label)
        Path(args.json).write_text(json.dumps({"setting": ours.label, "train": {
            k: {"attainment": a, "x_oracle": x, "runs": n, **({"over_frontier": over[k]} if over else {})}
            for k, (a, x, n) in med.items()}}, indent=1) + "\n", encoding="utf-8")  # fmt: skip
    return 0


def _write_out_dir(out: Path, recs, results, scenarios, seeds, calib, settings, profile, plots: bool,
                   progress) -> None:  # fmt: skip
    """What `--out` holds besides results.{csv,json}: table.md, calibration.json and the figures."""
    _write_markdown(out / "table.md", recs, results, scenarios, seeds, calib, settings, profile)
    (out / "calibration.json").write_text(json.dumps(_calib_dict(calib), indent=1) + "\n")
    if plots:
        _plots(results, out, progress)


def _write_decisions(folder: Path, results) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    seen: dict[str, int] = {}
    for r in results:
        if r.decisions:
            stem = f"{r.scenario}-seed{r.seed}-{r.policy}-startup{int(r.startup_median_s or 0)}-{r.routing}"
            # runs that differ only in what the name leaves out (a start-up model, say) keep a file each
            seen[stem] = seen.get(stem, 0) + 1
            name = stem + (f"-{seen[stem]}" if seen[stem] > 1 else "") + ".jsonl"
            with open(folder / name, "w", encoding="utf-8") as fh:
                for d in r.decisions:
                    fh.write(json.dumps(d, separators=(",", ":")) + "\n")


def _calib_dict(calib) -> dict:
    d = asdict(calib)
    d["capacity_per_replica"] = calib.capacity_per_replica
    return _round(d)


def _round(obj):
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round(v) for v in obj]
    if isinstance(obj, float):
        return float(f"{obj:.6g}")
    return obj


def _plots(results, out: Path, progress) -> None:
    try:
        from flashserve_testbed.bench import plots
    except ImportError:  # pragma: no cover - matplotlib is the `plot` extra
        if progress:
            progress("matplotlib missing: no plots (pip install flashserve[plot])")
        return
    try:
        written = [plots.attainment_vs_gpu_hours(results, out / "attainment-vs-gpu-hours.png"),
                   plots.timeline(results, out / "timeline.png"),
                   plots.startup_sweep(results, out / "startup-sweep.png")]  # fmt: skip
    except ImportError:
        if progress:
            progress("matplotlib missing: no plots (pip install flashserve[plot])")
        return
    if progress:
        progress("plots: " + ", ".join(str(p) for p in written if p))


def _write_markdown(path: Path, recs, results, scenarios, seeds, calib, settings, profile) -> None:
    from flashserve_testbed.bench import report

    lines = [
        "# Autoscaling benchmark results",
        "",
        f"Engine profile `{profile.name}`, SLA {settings.sla_tokens_per_s:g} tok/s per user, seeds "
        f"{', '.join(map(str, seeds))}, GPU-hour price ${settings.gpu_hour_price:.2f}. SLA capacity from the "
        f"load test: {calib.capacity_per_replica:.0f} concurrent requests per replica "
        f"({calib.capacity_per_rank:.1f} per GPU)."
        + (" Simulated with the fluid model (`--engine fluid`), not the engine model." if settings.engine == "fluid"
           else ""),
        "",
        "## All scenarios (medians over every run; GPU-h is the sum of the per-scenario medians)",
        "",
        report.markdown_table(recs),
    ]
    for sc in scenarios:
        lines += ["", f"## {sc.name}", "", sc.description, "", report.markdown_table(recs, sc.name)]
        swept = any(r.kind == "sweep" and r.scenario == sc.name for r in results)
        cmp_ = report.equal_attainment(results, sc.name) if swept else []
        if cmp_:
            cells = ", ".join(f"{f} {c:.2f}" if c is not None else f"{f} not reached" for f, c in cmp_)
            lines += ["", f"GPU-hours / oracle each family needs to match flashserve's attainment on the sweep's "
                          f"seed (its settings and knob sweep; 'not reached': none of them does): {cells}"]  # fmt: skip
    sweep_table = report.startup_sweep_table(results)
    if sweep_table:
        lines += ["", "## Start-up sweep", "", sweep_table]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------ report


def report_cmd(argv: list[str]) -> int:
    from flashserve_testbed.bench import report
    from flashserve_testbed.bench.calibrate import Calibration
    from flashserve_testbed.bench.measures import GPU_HOUR_PRICE_USD
    from flashserve_testbed.bench.sim import Settings
    from flashserve_testbed.bench.workloads import QUICK_SCENARIO, SCENARIOS, Scenario
    from flashserve_testbed.engine.profile import load as load_profile

    p = argparse.ArgumentParser(
        prog="flashserve bench report",
        description="rebuild results.{csv,json}, table.md and the plots from the per-run CSVs of earlier "
        "`flashserve bench autoscale` runs; a run in a later file replaces the same run (policy, scenario, "
        "seed, setting) of an earlier one, so one policy can be rerun without rerunning the others",
    )
    p.add_argument("csv", nargs="+", metavar="RUNS.csv")
    p.add_argument("--out", metavar="DIR", required=True)
    p.add_argument("--calibration", metavar="PATH",
                   help="calibration.json of the runs (default: DIR/calibration.json)")  # fmt: skip
    p.add_argument("--profile", default=None, help="engine profile of the runs (default gb200-4gpu)")
    p.add_argument("--sla", type=float, default=100.0, help="per-user tokens/s target of the runs (default 100)")
    p.add_argument("--gpu-hour-price", type=float, default=None, help="USD per GPU-hour of the runs (default 2.30)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    calib_path = Path(args.calibration) if args.calibration else out / "calibration.json"
    try:
        batches = [report.read_csv(path) for path in args.csv]
        try:
            calib = Calibration.from_dict(json.loads(calib_path.read_text(encoding="utf-8")))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{calib_path}: not a benchmark calibration.json ({exc})") from None
        profile = load_profile(args.profile)
    except FileNotFoundError as exc:
        print(f"flashserve bench report: {exc.filename}: no such file"
              + (" (pass --calibration: the runs' calibration.json)" if exc.filename == str(calib_path) else ""),
              file=sys.stderr)  # fmt: skip
        return 2
    except (OSError, ValueError) as exc:
        print(f"flashserve bench report: {exc}", file=sys.stderr)
        return 2
    results = report.merge(*batches)
    known = {**SCENARIOS, QUICK_SCENARIO.name: QUICK_SCENARIO}
    names = list(dict.fromkeys(r.scenario for r in results if r.kind == "table"))
    scenarios = [known.get(n) or Scenario(name=n, description="", duration_s=0.0, base_replicas=0.0) for n in names]
    seeds = sorted({r.seed for r in results if r.kind == "table"})
    settings = Settings(sla_tokens_per_s=args.sla, gpu_hour_price=args.gpu_hour_price or GPU_HOUR_PRICE_USD)
    recs = report.records(results)
    print(report.text_table(recs))
    if report.startup_sweep_table(results):
        print("\n" + report.startup_sweep_table(results))
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(recs, out / "results.json")
    report.write_csv(results, out / "results.csv")
    _write_out_dir(out, recs, results, scenarios, seeds, calib, settings, profile, not args.no_plots, _progress)
    return 0


# ------------------------------------------------------------------------------------------ compare


def compare_cmd(argv: list[str]) -> int:
    from flashserve_testbed.bench import report

    p = argparse.ArgumentParser(
        prog="flashserve bench compare",
        description="how the runs of A agree with the same runs (policy, scenario, seed, setting) of B: "
        "attainment difference in points and GPU-hours difference in percent, medians and 90th percentiles "
        "over all runs and per policy setting",
    )
    p.add_argument("a", metavar="A.csv")
    p.add_argument("b", metavar="B.csv")
    p.add_argument("--plot", metavar="PNG", help="also draw A against B, run by run")
    p.add_argument("--equal-attainment", metavar="FAMILY", nargs="?", const="flashserve",
                   help="instead: per scenario both swept FAMILY's knobs on (default flashserve), the GPU-hours x "
                   "oracle its settings need in A and in B to reach either default's attainment (e.g. the same "
                   "runs under two --startup-model settings)")
    args = p.parse_args(argv)
    if args.equal_attainment:
        return _equal_attainment(args)
    runs = _read_both(args)
    if runs is None:
        return 2
    pairs = report.paired(*runs)
    if not pairs:
        print(f"flashserve bench compare: {args.a} and {args.b} have no run in common (same policy, scenario, "
              "seed and setting)", file=sys.stderr)  # fmt: skip
        return 2
    groups = [("all runs", pairs)]
    labels = sorted({x.policy for x, _ in pairs}, key=report._order)
    groups += [(label, [(x, y) for x, y in pairs if x.policy == label]) for label in labels]
    print(f"{'runs':<22} {'n':>4}  {'|d attainment| pt':>18} {'p90':>6}  {'|d GPU-h| %':>12} {'p90':>6}  "
          f"{'A median':>16}  {'B median':>16}")  # fmt: skip
    for label, group in groups:
        ag = report.agreement(group, label)
        ma = f"{report.median([x.attainment for x, _ in group]):.2%} {report.median([x.gpu_hours for x, _ in group]):.1f}"
        mb = f"{report.median([y.attainment for _, y in group]):.2%} {report.median([y.gpu_hours for _, y in group]):.1f}"
        print(f"{label:<22} {ag.runs:>4}  {ag.attainment_median_pt:>18.2f} {ag.attainment_p90_pt:>6.1f}  "
              f"{ag.gpu_hours_median_pct:>12.1f} {ag.gpu_hours_p90_pct:>6.1f}  {ma:>16}  {mb:>16}")  # fmt: skip
    if args.plot:
        try:
            from flashserve_testbed.bench import plots
        except ImportError:  # pragma: no cover - matplotlib is the `plot` extra
            print("matplotlib missing: no plot (pip install flashserve[plot])", file=sys.stderr)
            return 0
        plots.agreement(pairs, Path(args.plot), Path(args.a).parent.name or args.a, Path(args.b).parent.name or args.b)
    return 0


def _read_both(args) -> tuple[list, list] | None:
    """The runs of `bench compare`'s two CSVs; None (said on stderr) when either cannot be read."""
    from flashserve_testbed.bench import report

    try:
        return report.read_csv(args.a), report.read_csv(args.b)
    except FileNotFoundError as exc:
        print(f"flashserve bench compare: {exc.filename}: no such file", file=sys.stderr)
    except (OSError, ValueError) as exc:
        print(f"flashserve bench compare: {exc}", file=sys.stderr)
    return None


def _equal_attainment(args) -> int:
    from flashserve_testbed.bench import report

    runs = _read_both(args)
    if runs is None:
        return 2
    a, b = runs
    rows = report.equal_attainment_between(a, b, args.equal_attainment)
    if not rows:
        print(f"flashserve bench compare: {args.a} and {args.b} share no scenario with {args.equal_attainment}'s "
              "default and knob sweep in both (run them without --no-sweep)", file=sys.stderr)  # fmt: skip
        return 2

    def cell(x):
        return "not reached" if x is None else f"{x:.2f}"

    print(f"{args.equal_attainment}: A = {args.a}, B = {args.b}; attainment / GPU-h x oracle on the sweep's seed")
    print("| scenario | A default | B default | at attainment | A needs | B needs | B / A |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        for t, ca, cb in r["at"]:
            ratio = f"{cb / ca:.2f}" if ca and cb else "-"
            print(f"| {r['scenario']} | {r['a_default'][0]:.1%} / {r['a_default'][1]:.2f} | "
                  f"{r['b_default'][0]:.1%} / {r['b_default'][1]:.2f} | {t:.1%} | {cell(ca)} | {cell(cb)} | {ratio} |")
    return 0


# ------------------------------------------------------------------------------------------ speed


def speed(argv: list[str]) -> int:
    from flashserve_testbed.bench.calibrate import calibrate
    from flashserve_testbed.bench.fleet import CACHE_UNIT_TOKENS
    from flashserve_testbed.bench.policies import FAMILIES, PolicySpec, build
    from flashserve_testbed.bench.sim import Settings, Simulation, Workload
    from flashserve_testbed.bench.workloads import DAY_SCENARIO
    from flashserve_testbed.engine.profile import load as load_profile

    p = argparse.ArgumentParser(prog="flashserve bench speed", description="time a simulated day for one policy")
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--policy", default="flashserve", choices=FAMILIES)
    p.add_argument("--peak-replicas", type=float, default=2.0, help="demand at the daily peak, in replicas")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--engine", choices=("model", "fluid"), default="model",
                   help="model: every request through the engine model; fluid: the fluid model")
    args = p.parse_args(argv)
    if args.hours <= 0 or args.peak_replicas <= 0:
        print("flashserve bench speed: --hours and --peak-replicas must be > 0", file=sys.stderr)
        return 2
    profile = load_profile(None)
    calib = calibrate(profile, quick=True)
    sc = DAY_SCENARIO.scaled(duration_s=args.hours * 3600.0, base_replicas=args.peak_replicas)
    settings = Settings(engine=args.engine)
    policy = build(PolicySpec(args.policy), calib, profile.startup.median, 100.0)
    curve_s = 0.0
    if args.engine == "fluid":
        from flashserve_testbed.bench.fluid import (
            FluidSimulation,
            FluidWorkload,
            build_curve,
        )

        c0 = time.process_time()
        curve = build_curve(profile, settings.sla_tokens_per_s)
        curve_s = time.process_time() - c0
        t0 = time.process_time()
        w = FluidWorkload(sc, args.seed, profile, calib, CACHE_UNIT_TOKENS)
        t1 = time.process_time()
        res = FluidSimulation(w, policy, settings, curve).run()
    else:
        t0 = time.process_time()
        w = Workload(sc, args.seed, profile, calib, CACHE_UNIT_TOKENS, profile.max_model_len)
        t1 = time.process_time()
        res = Simulation(w, policy, settings).run()
    t2 = time.process_time()
    hours = (sc.duration_s + sc.warmup_s) / 3600.0
    out = {
        "policy": args.policy, "engine": args.engine, "simulated_hours": round(hours, 3),
        "peak_replicas": args.peak_replicas, "replicas_mean": round(res.replicas_mean, 3),
        "requests": res.requests, "workload_cpu_s": round(t1 - t0, 2), "simulation_cpu_s": round(t2 - t1, 2),
        "cpu_s_per_simulated_hour": round((t2 - t0) / hours, 2),
        "us_per_request": round((t2 - t1) / max(1, res.requests) * 1e6, 2),
        "cpu_s_per_replica_hour": round((t2 - t0) / max(1e-9, hours * res.replicas_mean), 3),
        "attainment": round(res.attainment, 4), "gpu_hours": round(res.gpu_hours, 2),
        "oracle_gpu_hours": round(w.oracle_gpu_hours, 2),
    }  # fmt: skip
    if args.engine == "fluid":
        out["load_test_cpu_s"] = round(curve_s, 2)  # one-off, shared by every run of an invocation
    print(json.dumps(out, indent=1))
    return 0


# ------------------------------------------------------------------------------------------ trace


def trace(argv: list[str]) -> int:
    from flashserve_testbed.bench.workloads import (
        Nominal,
        agentic_trace,
        write_mooncake,
    )
    from flashserve_testbed.engine.profile import load as load_profile

    p = argparse.ArgumentParser(prog="flashserve bench trace", description="write a synthetic Mooncake trace")
    p.add_argument("out")
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--sessions-per-s", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    profile = load_profile(None)
    # the SLA operating point of the default profile (calibrate.py measures it: ~113 tok/s, ~40 ms TTFT)
    nominal = Nominal(ttft_s=0.04, tokens_per_s=113.0)
    n = write_mooncake(args.out, agentic_trace(profile, args.sessions_per_s, args.minutes * 60.0, nominal, args.seed))
    print(f"wrote {n} requests to {args.out}")
    return 0
