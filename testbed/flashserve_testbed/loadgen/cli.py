"""`flashserve load`: agentic multi-turn load against an OpenAI endpoint, or a trace replay (Mooncake or aiperf)."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys

from flashserve_testbed.engine.profile import LogNormal


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashserve load",
        description="Closed-loop agentic sessions (growing, mostly cached context; short answers; tool-call gaps) "
                    "following an arrival schedule, or a trace replay (Mooncake open loop, aiperf multi-turn sessions "
                    "closed loop). Reports per-user "
                    "tok/s, TTFT and token-weighted SLA attainment. Times are engine seconds (wall x time scale).")
    p.add_argument("--base-url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:8080/NS/SERVING/v1")
    p.add_argument("--model", help="model name (default: the first of /models)")
    p.add_argument("--schedule", default="hold 4 60s",
                   help='sessions over time, e.g. "ramp 0 32 30s; hold 32 60s; step 8 30s", or a YAML file '
                        "(default: %(default)s)")
    p.add_argument("--duration", type=float, help="stop after this many engine seconds (default: the schedule's)")
    p.add_argument("--max-requests", type=int, help="stop after sending this many requests")
    p.add_argument("--sla", type=float, help="per-user tok/s target for SLA attainment")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="engine seconds per wall second of the engines under test "
                        "(the mock's FLASHSERVE_MOCK_TIME_SCALE)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the summary and the per-second time series as JSON")
    p.add_argument("--json-requests", action="store_true", help="with --json: include every request")
    p.add_argument("--bin-seconds", type=float, default=1.0, help="time-series bin width (engine seconds)")
    p.add_argument("--progress-interval", type=float, default=5.0, help="wall seconds between progress lines")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--api-key", help="sent as a bearer token")
    p.add_argument("--drain-seconds", type=float, default=30.0,
                   help="wall seconds requests still in flight at the end may take")
    w = p.add_argument_group("workload (defaults: the engine profile's agentic workload)")
    w.add_argument("--profile", help="engine profile whose workload to use (default gb200-4gpu)")
    w.add_argument("--system-tokens", type=int, help="shared system prompt")
    w.add_argument("--first-turn-tokens", type=float, help="median of the first turn's task")
    w.add_argument("--tool-tokens", type=float, help="median of each tool result")
    w.add_argument("--output-tokens", type=float, help="median answer length (long-tailed)")
    w.add_argument("--gap-seconds", type=float, help="median tool-call gap between turns (engine seconds)")
    w.add_argument("--context-limit", type=int, nargs=2, metavar=("MIN", "MAX"),
                   help="a session ends past this context")
    w.add_argument("--max-turns", type=int, help="a session ends after this many turns")
    w.add_argument("--session-prefix", default="s",
                   help="session n sends X-Session-ID (and `user`) PREFIX<n> (default %(default)s); runs that must "
                        "not reuse a router's key placement take different prefixes")
    w.add_argument("--prompt-scale", type=float, help="multiply every prompt size and the context limits")
    t = p.add_argument_group("trace replay")
    t.add_argument("--trace", help="trace to replay instead of sessions: Mooncake (open loop) or aiperf multi-turn "
                   "(sessions, closed loop), plain or gzipped, told apart by content")
    t.add_argument("--trace-session-gap", type=float, default=1.0, metavar="S",
                   help="aiperf sessions without a timestamp start this many seconds apart (default 1)")
    t.add_argument("--trace-speedup", type=float, default=1.0, help="replay the trace this many times faster")
    t.add_argument("--max-inflight", type=int, default=512, help="replay: most requests in flight")
    return p


def _with_median(d: LogNormal, median: float | None) -> LogNormal:
    if median is None:
        return d
    return LogNormal(median, d.sigma, min(d.minimum, median), max(d.maximum, median))


def workload_from_args(args):
    from dataclasses import replace

    from flashserve_testbed.loadgen.workload import Workload

    w = Workload.from_profile(args.profile)
    if args.prompt_scale:
        w = w.scaled(args.prompt_scale)
    changes = {}
    if args.system_tokens is not None:
        changes["system_tokens"] = args.system_tokens
    if args.context_limit:
        changes["context_limit"] = tuple(args.context_limit)
    if args.max_turns is not None:
        changes["max_turns"] = args.max_turns
    w = replace(w, first_turn_tokens=_with_median(w.first_turn_tokens, args.first_turn_tokens),
                tool_result_tokens=_with_median(w.tool_result_tokens, args.tool_tokens),
                output_tokens=_with_median(w.output_tokens, args.output_tokens),
                gap_seconds=_with_median(w.gap_seconds, args.gap_seconds), **changes)
    return w


def main(argv: list[str] | None = None) -> int:
    from flashserve_testbed.loadgen import replay_trace, run_load
    from flashserve_testbed.loadgen.schedule import load as load_schedule

    p = parser()
    args = p.parse_args(argv)
    # written so that NaN fails too: it compares false with everything
    if not (0 < args.time_scale < math.inf and 0 < args.trace_speedup < math.inf):
        p.error("--time-scale and --trace-speedup must be positive, finite numbers")
    if not 0 <= args.trace_session_gap < math.inf:
        p.error("--trace-session-gap must be a finite number of seconds >= 0")
    try:
        schedule = load_schedule(args.schedule)
        workload = workload_from_args(args)
    except ValueError as e:
        p.error(str(e))
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    common = dict(sla=args.sla, time_scale=args.time_scale, seed=args.seed, progress=not args.quiet,
                  progress_interval=args.progress_interval, headers=headers, drain_seconds=args.drain_seconds,
                  duration=args.duration, max_requests=args.max_requests)
    base = args.base_url.rstrip("/")
    trace = None
    if args.trace:
        from flashserve_testbed.traces import TraceError, read

        try:
            trace = read(args.trace, limit=args.max_requests, untimed_gap_ms=args.trace_session_gap * 1000.0)
        except TraceError as e:
            print(f"flashserve load: --trace {e}", file=sys.stderr)
            return 2
    try:
        if trace is not None:
            coro = replay_trace(base, trace, args.model, speedup=args.trace_speedup,
                                max_inflight=args.max_inflight, **common)
        else:
            coro = run_load(base, args.model, schedule, workload=workload, session_prefix=args.session_prefix,
                            **common)
        report = asyncio.run(coro)
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, RuntimeError) as e:
        print(f"flashserve load: {e}", file=sys.stderr)
        return 1
    print(report.format())
    if args.json:
        report.write_json(args.json, requests=args.json_requests, bin_seconds=args.bin_seconds)
    return 0 if report.ok else 1
