# The Helm chart and the plain install manifest rendered from it. Included from the top-level Makefile.
#
#   make manifests        render manifests/install.yaml from charts/flashserve with its default values
#   make check-manifests  fail if manifests/install.yaml or the chart's CRD copy drifted
#   make chart-lint       helm lint the chart for the main value combinations
#   make chart-crds       copy the generated CRD into the chart (after `make crds`)
#
# tests/chart/test_chart.py renders install.yaml with the same arguments (INSTALL_ARGS there) and compares.

# helm v3 from the pinned toolchain (built if missing), unless HELM names another binary.
HELM ?=
HELM_BIN = $(if $(HELM),$(HELM),$$(e2e/toolchain/build.sh | tail -n1)/helm)
CHART := charts/flashserve
INSTALL_NAMESPACE := flashserve-system
INSTALL_MANIFEST := manifests/install.yaml
INSTALL_HEADER := \# FlashServe operator: CRD, namespace $(INSTALL_NAMESPACE), RBAC, Deployment and metrics Service.\n\# Rendered from $(CHART) with its default values by `make manifests`; do not edit.\n\#   kubectl apply --server-side -f $(INSTALL_MANIFEST)\n
HELM_TEMPLATE_INSTALL := template flashserve $(CHART) --namespace $(INSTALL_NAMESPACE) --include-crds --set createNamespace=true

.PHONY: manifests check-manifests chart-lint chart-crds

chart-crds:
	cp $(CRD) $(CHART)/crds/

manifests: chart-crds
	helm="$(HELM_BIN)" && { printf '$(INSTALL_HEADER)'; "$$helm" $(HELM_TEMPLATE_INSTALL); } > $(INSTALL_MANIFEST).tmp
	mv $(INSTALL_MANIFEST).tmp $(INSTALL_MANIFEST)

check-manifests:
	cmp $(CRD) $(CHART)/crds/$(notdir $(CRD))
	helm="$(HELM_BIN)" && { printf '$(INSTALL_HEADER)'; "$$helm" $(HELM_TEMPLATE_INSTALL); } | diff -u $(INSTALL_MANIFEST) -

chart-lint:
	helm="$(HELM_BIN)" && "$$helm" lint --strict $(CHART) \
	  && "$$helm" lint --strict $(CHART) --set 'watchNamespaces={team-a,team-b}' \
	  && "$$helm" lint --strict $(CHART) --set monitoring.enabled=true
