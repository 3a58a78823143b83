"""Agentic multi-turn load against an OpenAI-compatible endpoint (docs/load-generator.md).

    from flashserve_testbed.loadgen import run_load, replay_trace
    report = await run_load("http://127.0.0.1:8080/ns/flash/v1", schedule="ramp 0 16 30s; hold 16 60s", sla=100)
    report.summary()["per_user_tokens_per_s"]["p50"], report.timeseries()
"""

from flashserve_testbed.loadgen.report import LoadReport, RequestRecord
from flashserve_testbed.loadgen.runner import replay_trace, run_load
from flashserve_testbed.loadgen.schedule import Schedule
from flashserve_testbed.loadgen.workload import Workload

__all__ = ["LoadReport", "RequestRecord", "Schedule", "Workload", "replay_trace", "run_load"]
