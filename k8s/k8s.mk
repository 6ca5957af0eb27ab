# Kubernetes targets (k8s/README.md). Included by the top-level Makefile.

KUBECTL ?= kubectl
# Where downloaded bundles land.
BUNDLE_DIR ?= out/bundles

.PHONY: download-bundle
download-bundle: ## Copy bundle-$(RUN).tar.zst from the dump volume to $(BUNDLE_DIR) (RUN=<run id> [NAMESPACE=...]).
	@test -n "$(RUN)" || { echo "usage: make download-bundle RUN=<run id> [NAMESPACE=<ns>] [BUNDLE_DIR=out/bundles]" >&2; exit 2; }
	@KUBECTL="$(KUBECTL)" NAMESPACE="$(NAMESPACE)" k8s/download-bundle.sh "$(RUN)" "$(BUNDLE_DIR)"

.PHONY: upload-prompts
upload-prompts: ## Put a prompts file on the dump volume at /dump/inputs/<name>, for CAPTURE=prompts:/dump/inputs/<name> (FILE=<file> [NAME=<name>] [NAMESPACE=...]).
	@test -n "$(FILE)" || { echo "usage: make upload-prompts FILE=<prompts file> [NAME=<name on the volume>] [NAMESPACE=<ns>]" >&2; exit 2; }
	@KUBECTL="$(KUBECTL)" NAMESPACE="$(NAMESPACE)" IMAGE="$(IMAGE)" k8s/upload-prompts.sh "$(FILE)" $(NAME)

.PHONY: k8s-render
k8s-render: ## Write k8s/{fully-async,hybrid}-rayjob.yaml, k8s/check-job.yaml and k8s/model-loader-job.yaml from k8s/base/<name>; OVERLAY=<name> prints k8s/overlays/<name> instead.
ifdef OVERLAY
	@$(KUBECTL) kustomize k8s/overlays/$(OVERLAY)
else
	@set -e; for name in fully-async:fully-async-rayjob hybrid:hybrid-rayjob check:check-job model-loader:model-loader-job; do \
	  base=$${name%%:*}; file=k8s/$${name#*:}.yaml; \
	  KUBECTL="$(KUBECTL)" k8s/render.sh $$base > k8s/.$${name#*:}.yaml.tmp; \
	  mv k8s/.$${name#*:}.yaml.tmp $$file; echo "wrote $$file"; \
	done
endif
