"""The `/metrics` exposition of the real vLLM 0.33 for a `vllm serve` command line.

Run with the contract venv's python (tools/vllm-contract/install.sh). Reads a JSON list of cases on stdin,
`{"id", "argv": [...], "env": {...}, "accelerator": "GB200", "requests": [[engine, output_tokens,
decode_seconds], ...]}` (argv and env: what follows `vllm serve` in the pod, and the pod's environment) and prints one JSON object mapping each id to `{"text",
"config"}`: what prometheus_client's `generate_latest` writes for vLLM's own `PrometheusStatLogger`, and the
config the logger was built on. That is the VllmConfig engine_check.py's path produces for the argv (vLLM's
parser, serve checks, AsyncEngineArgs and create_engine_config on the stubbed Blackwell platform), with the DP
ranks one API server manages (core_client's `engine_ranks_managed`) as engine indexes: `config` "engine".
Where vLLM refuses that engine config the case fails with vLLM's reason. Recorded through the
logger's API:

  * `log_engine_initialized` (the server does it at start-up: `vllm:cache_config_info`);
  * one SchedulerStats per engine (the gauges and prefix-cache counters);
  * per request, vLLM's own `IterationStats.update_from_finished_request` on a `RequestStateStats` with that
    many output tokens and that decode time (so `mean_time_per_output_token`, 0 for a request with at most
    one token, is vLLM's computation), a TTFT and ITL observation, then `record` for that engine.

Each case runs in a forked child, as in engine_check.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_check as harness  # noqa: E402


def engine_config(case: dict):
    """The VllmConfig of engine_check's `config` level for the case (raises with its verdict otherwise)."""
    verdict, vc = harness.check_case({k: case[k] for k in ("id", "argv", "env", "accelerator") if k in case})
    if vc is None:
        raise RuntimeError(f"vLLM refused the argv at {verdict['level']}: {verdict['error']}")
    return vc


def managed_ranks(vc) -> list[int]:
    """core_client: internal LB manages every DP rank, hybrid/external LB the local ones from the start rank."""
    pc = vc.parallel_config
    if pc.data_parallel_rank_local is not None:
        return [pc.data_parallel_index]
    count = pc.data_parallel_size_local if pc.local_engines_only else pc.data_parallel_size
    return list(range(pc.data_parallel_index, pc.data_parallel_index + count))


def exposition(case: dict) -> tuple[str, str]:
    """The exposition text, and which config it was built on ("engine": vLLM's create_engine_config; an argv
    vLLM refuses fails the case, with vLLM's reason)."""
    from prometheus_client import REGISTRY, generate_latest
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import IterationStats, RequestStateStats, SchedulerStats

    vc, source = engine_config(case), "engine"
    engines = managed_ranks(vc)
    logger = PrometheusStatLogger(vc, engines)  # unregisters any earlier vllm: collectors first
    logger.log_engine_initialized()
    for idx in engines:
        logger.record(SchedulerStats(num_running_reqs=1, kv_cache_usage=0.1), None, engine_idx=idx)
    t0 = 1000.0
    for n, (idx, tokens, decode_s) in enumerate(case.get("requests", [])):
        stats = IterationStats()
        stats.iteration_timestamp = t0 + 0.5 + decode_s
        req = RequestStateStats(
            num_generation_tokens=tokens,
            arrival_time=t0,
            queued_ts=t0 + 0.01,
            scheduled_ts=t0 + 0.02,
            first_token_ts=t0 + 0.5,
            last_token_ts=t0 + 0.5 + decode_s,
        )
        stats.time_to_first_tokens_iter.append(0.5)
        stats.num_generation_tokens = tokens
        if tokens > 1:
            stats.inter_token_latencies_iter.append(decode_s / (tokens - 1))
        stats.update_from_finished_request(FinishReason.STOP, f"req-{n}", 100, tokens, req)
        assert idx in engines, f"request on engine {idx}, but this API server manages {engines}"
        logger.record(None, stats, engine_idx=idx)
    return generate_latest(REGISTRY).decode(), source


def _forked(case: dict) -> dict:
    """{"text": ...} or {"error": ...}, from a forked child (engine_check.fork_call)."""

    def run(c):
        text, source = exposition(c)
        return {"text": text, "config": source}

    data, log = harness.fork_call(run, case)
    if data is None:
        return {"error": f"child died: {log[-3000:]}"}
    out = json.loads(data)
    if "error" in out:
        out["error"] += f"\n{log[-3000:]}"
    return out


def main() -> int:
    cases = json.load(sys.stdin)
    work = harness.prepare()
    try:
        results = {case["id"]: _forked(case) for case in cases}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    errors = {k: v["error"] for k, v in results.items() if "error" in v}
    if errors:
        for k, v in errors.items():
            print(f"{k}: {v}", file=sys.stderr)
        return 1
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
