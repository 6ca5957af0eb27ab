# Kubernetes targets (k8s/README.md). Included by the top-level Makefile.

KUBECTL ?= kubectl
# Where downloaded bundles land.
BUNDLE_DIR ?= out/bundles
# An image pull Secret for every pod of the plain files (`make manifests PULL_SECRET=regcred`).
PULL_SECRET ?=
# The plain files' renderer (k8s/helpers/render.py) needs PyYAML only: a small tool venv, so
# that `make manifests` takes seconds on a machine without the project's .venv.
K8S_VENV := $(CACHE)/k8s-venv
K8S_PY := $(K8S_VENV)/bin/python
$(K8S_PY):
	$(PYTHON) -m venv $(K8S_VENV)
	$(K8S_VENV)/bin/pip install -q pyyaml

.PHONY: download-bundle
download-bundle: ## Copy bundle-$(RUN).tar.zst from the dump volume to $(BUNDLE_DIR) (RUN=<run id> [NAMESPACE=...] [IMAGE=...]).
	@test -n "$(RUN)" || { echo "usage: make download-bundle RUN=<run id> [NAMESPACE=<ns>] [BUNDLE_DIR=out/bundles] [IMAGE=<reader image>]" >&2; exit 2; }
	@KUBECTL="$(KUBECTL)" NAMESPACE="$(NAMESPACE)" \
		$(if $(filter command line,$(origin IMAGE)),READER_IMAGE="$(IMAGE)") \
		k8s/download-bundle.sh "$(RUN)" "$(BUNDLE_DIR)"

# The claims' storage class (default: the cluster's default class, which must give ReadWriteMany)
# and sizes (default: the sources' 100Gi dump, 50Gi models), for the plain files and, through
# k8s/site, every overlay.
STORAGE_CLASS ?=
DUMP_SIZE ?=
MODELS_SIZE ?=

.PHONY: manifests
manifests: $(K8S_PY) ## Write k8s/*.yaml and k8s/site (every overlay's): IMAGE=<registry/name:tag> on every pod (default: `make -s image-name`), [PULL_SECRET=<name>] [STORAGE_CLASS=<class>] [DUMP_SIZE=100Gi] [MODELS_SIZE=50Gi].
	@test "$(PINS)" = current || { echo "make manifests: the plain files are the current pin set's;" \
		"for PINS=$(PINS) apply its overlay (kubectl apply -k k8s/overlays/next) with your image" >&2; exit 2; }
	@$(K8S_PY) k8s/helpers/render.py --image "$(IMAGE)" --kubectl "$(KUBECTL)" \
		$(if $(filter command line environment,$(origin IMAGE)),,--default-image) \
		$(if $(PULL_SECRET),--pull-secret "$(PULL_SECRET)") \
		$(if $(STORAGE_CLASS),--storage-class "$(STORAGE_CLASS)") \
		$(if $(DUMP_SIZE),--dump-size "$(DUMP_SIZE)") $(if $(MODELS_SIZE),--models-size "$(MODELS_SIZE)")

.PHONY: upload-prompts
upload-prompts: ## Put a prompts file on the dump volume at /dump/inputs/<name>, for CAPTURE=prompts:/dump/inputs/<name> (FILE=<file> [NAME=<name>] [NAMESPACE=...]).
	@test -n "$(FILE)" || { echo "usage: make upload-prompts FILE=<prompts file> [NAME=<name on the volume>] [NAMESPACE=<ns>]" >&2; exit 2; }
	@KUBECTL="$(KUBECTL)" NAMESPACE="$(NAMESPACE)" IMAGE="$(IMAGE)" k8s/upload-prompts.sh "$(FILE)" $(NAME)

.PHONY: k8s-render
k8s-render: ## `make manifests` (the same knobs); OVERLAY=<name> prints what k8s/overlays/<name> renders instead.
ifdef OVERLAY
	@$(KUBECTL) kustomize k8s/overlays/$(OVERLAY)
else
	@$(MAKE) --no-print-directory manifests
endif
