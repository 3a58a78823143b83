"""`flashserve bench`: the autoscaling benchmark (docs/autoscaling-benchmark.md).

A discrete-event simulator of a serving fleet in virtual time (sim.py, fleet.py) drives the engine performance
model (flashserve_testbed.engine.perfmodel) under synthetic agentic traffic or Mooncake trace replay (workloads.py),
scrapes it into a simulated Prometheus (prom.py), and lets each autoscaler (policies.py, baselines/) size the
fleet from the same delayed, windowed readings. measures.py scores a run, report.py and plots.py write it up.
"""
