# Kubernetes targets (k8s/README.md). Included by the top-level Makefile.

KUBECTL ?= kubectl
# Where downloaded bundles land.
BUNDLE_DIR ?= out/bundles

.PHONY: download-bundle
download-bundle: ## Copy bundle-$(RUN).tar.zst from the dump volume to $(BUNDLE_DIR) (RUN=<run id> [NAMESPACE=...]).
	@test -n "$(RUN)" || { echo "usage: make download-bundle RUN=<run id> [NAMESPACE=<ns>] [BUNDLE_DIR=out/bundles]" >&2; exit 2; }
	@KUBECTL="$(KUBECTL)" NAMESPACE="$(NAMESPACE)" k8s/download-bundle.sh "$(RUN)" "$(BUNDLE_DIR)"

.PHONY: k8s-render
k8s-render: ## Print the fully-async manifests as an overlay renders them (OVERLAY=a3-16npu, hami, cce, volcano, ...).
	@$(KUBECTL) kustomize k8s/$(if $(OVERLAY),overlays/$(OVERLAY),base/fully-async)
