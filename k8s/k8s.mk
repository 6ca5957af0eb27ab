# Kubernetes targets (k8s/README.md). Included by the top-level Makefile.

KUBECTL ?= kubectl
# Where downloaded bundles land.
BUNDLE_DIR ?= out/bundles

.PHONY: download-bundle
download-bundle: ## Copy bundle-$(RUN).tar.zst from the dump volume to $(BUNDLE_DIR) (RUN=<run id> [NAMESPACE=...]).
	@test -n "$(RUN)" || { echo "usage: make download-bundle RUN=<run id> [NAMESPACE=<ns>] [BUNDLE_DIR=out/bundles]" >&2; exit 2; }
	@KUBECTL="$(KUBECTL)" NAMESPACE="$(NAMESPACE)" k8s/download-bundle.sh "$(RUN)" "$(BUNDLE_DIR)"

.PHONY: k8s-render
k8s-render: ## Write k8s/fully-async-rayjob.yaml and k8s/hybrid-rayjob.yaml from k8s/base/<mode>; OVERLAY=<name> prints k8s/overlays/<name> instead.
ifdef OVERLAY
	@$(KUBECTL) kustomize k8s/overlays/$(OVERLAY)
else
	@set -e; for mode in fully-async hybrid; do \
	  KUBECTL="$(KUBECTL)" k8s/render.sh $$mode > k8s/.$$mode-rayjob.yaml.tmp; \
	  mv k8s/.$$mode-rayjob.yaml.tmp k8s/$$mode-rayjob.yaml; echo "wrote k8s/$$mode-rayjob.yaml"; \
	done
endif
