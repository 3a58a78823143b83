"""Baseline autoscalers, each implemented from its project's source and documented defaults
(docs/autoscaling-benchmark.md lists what every one reads and decides)."""
