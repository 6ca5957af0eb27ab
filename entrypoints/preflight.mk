# `make preflight`: what will fail on the cluster, before anything is submitted
# (`verl-consistency preflight`, k8s/README.md "Preflight"). It only reads (GET).
#   make preflight                                  # k8s/fully-async-rayjob.yaml; current context and namespace
#   make preflight OVERLAY=hami NAMESPACE=vc        # what `kubectl apply -k k8s/overlays/hami -n vc` would run
#   make preflight MANIFEST=my-run.yaml IMAGE=registry.example.com/ml/verl-consistency:0.1.0
#   make preflight PREFLIGHT_ARGS="--json --context prod"
# Exit 0: nothing will fail; 1: something will fail; 2: the cluster could not be reached or read
# (or a usage error), the CLI's own codes.
# The cluster is found as kubectl finds it (KUBECONFIG, the current context); OVERLAY renders with
# $(KUBECTL) kustomize. IMAGE is passed only when you set it (else the preflight compares the
# pods' image with the one `make image-name` and its -a3/-cuda siblings name).
#
# Its own small venv, .venv-preflight: this package with pyproject's `preflight` extra (the
# kubernetes client, PyYAML; no torch, verl, msprobe or Ray), built on first use in seconds, so
# that a laptop with kubectl answers without the development environment. `make preflight-venv`
# builds it alone.
#
# Why question mode (-q) when `preflight` is the only goal: GNU make exits 2 whenever a recipe
# fails, so "something will fail" (1) and "unreachable" (2) would look alike to a script. In
# question mode make runs only the recipe lines marked `+` (as for a recursive make) and passes
# a line's exit 1 through as its own exit status (a sub-make's "not up to date"); 0 and 2 stay
# 0 and 2. So every line of the target is `+`, and the venv step turns its own failure into 2.
# `make preflight` beside other goals exits 2 on any failure, as make does.

PREFLIGHT_ARGS ?=
PREFLIGHT_VENV ?= .venv-preflight
PREFLIGHT_CMD ?= $(PREFLIGHT_VENV)/bin/verl-consistency preflight

ifeq ($(MAKECMDGOALS),preflight)
MAKEFLAGS += -q
endif

# The venv, rebuilt when pyproject.toml changes (editable: it follows the checkout's code).
define preflight_venv
test $(PREFLIGHT_VENV)/.installed -nt pyproject.toml || { \
	echo "make preflight: building $(PREFLIGHT_VENV) (the kubernetes client and this CLI, no torch)" >&2 \
	&& rm -rf $(PREFLIGHT_VENV) && $(PYTHON) -m venv $(PREFLIGHT_VENV) \
	&& $(PREFLIGHT_VENV)/bin/pip install -q --disable-pip-version-check -e ".[preflight]" \
	&& touch $(PREFLIGHT_VENV)/.installed; } || exit 2
endef

.PHONY: preflight-venv
preflight-venv: ## Build .venv-preflight, the small venv `make preflight` runs in (kubernetes client + this CLI, no torch).
	@$(preflight_venv)

.PHONY: preflight
preflight: ## Say what will fail on the cluster before submission, reading only ([OVERLAY=<name>|MANIFEST=<file>] [NAMESPACE=<ns>] [MODE=hybrid] [IMAGE=...]); exit 0 ready, 1 will fail, 2 unreachable.
	$(if $(filter file,$(origin PREFLIGHT_CMD)),+@$(preflight_venv))
	+@KUBECTL="$(KUBECTL)" $(PREFLIGHT_CMD) \
		$(if $(OVERLAY),--overlay $(OVERLAY)) $(if $(MANIFEST),--manifest $(MANIFEST)) \
		$(if $(MODE),--mode $(MODE)) $(if $(NAMESPACE),--namespace $(NAMESPACE)) \
		$(if $(filter command line environment,$(origin IMAGE)),--image $(IMAGE)) $(PREFLIGHT_ARGS)
