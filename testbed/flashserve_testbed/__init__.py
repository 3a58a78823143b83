"""FlashServe's test bed: the CPU mock of vLLM, the mock runtime for simulated nodes, the load generator,
the autoscaling benchmark and simulator, the local cluster and the demo. Never shipped in the operator image."""
