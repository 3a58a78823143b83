# The local e2e/demo cluster: upstream control plane + KWOK Blackwell node pools + Prometheus, all on 127.0.0.1.
# See docs/local-cluster.md. Included from the top-level Makefile.
#
#   make cluster-up                                   build the toolchain if missing, then bring the cluster up
#   make cluster-up CLUSTER_ARGS="--pool gb200.racks=4 --pod-readiness=external"
#   make cluster-status
#   make cluster-down                                 stop everything and delete the cluster's files

FLASHSERVE ?= .venv/bin/flashserve
CLUSTER_ARGS ?=

.PHONY: cluster-up cluster-down cluster-status

cluster-up:
	@e2e/toolchain/build.sh >/dev/null
	$(FLASHSERVE) cluster up $(CLUSTER_ARGS)

cluster-down:
	$(FLASHSERVE) cluster down

cluster-status:
	$(FLASHSERVE) cluster status
