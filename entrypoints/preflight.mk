# `make preflight`: what will fail on the cluster, before anything is submitted
# (`verl-consistency preflight`, k8s/README.md "Preflight"). It only reads (GET).
#   make preflight                                  # k8s/fully-async-rayjob.yaml; current context and namespace
#   make preflight OVERLAY=hami NAMESPACE=vc        # what `kubectl apply -k k8s/overlays/hami -n vc` would run
#   make preflight MANIFEST=my-run.yaml IMAGE=registry.example.com/ml/verl-consistency:0.1.0
#   make preflight PREFLIGHT_ARGS="--json --context prod"
# Exit 0: nothing will fail; 1: something will fail; 2: the cluster could not be reached or read.
# The cluster is found as kubectl finds it (KUBECONFIG, the current context); OVERLAY renders with
# $(KUBECTL) kustomize. IMAGE is passed only when you set it (else the preflight compares the
# pods' image with the one `make image-name` and its -a3/-cuda siblings name).

PREFLIGHT_ARGS ?=
PREFLIGHT_CMD ?= $(PY) -m verl_consistency.entrypoints preflight

.PHONY: preflight
preflight: $(VENV)/.installed ## Say what will fail on the cluster before submission, reading only ([OVERLAY=<name>|MANIFEST=<file>] [NAMESPACE=<ns>] [MODE=hybrid] [IMAGE=...]).
	@KUBECTL="$(KUBECTL)" $(PREFLIGHT_CMD) \
		$(if $(OVERLAY),--overlay $(OVERLAY)) $(if $(MANIFEST),--manifest $(MANIFEST)) \
		$(if $(MODE),--mode $(MODE)) $(if $(NAMESPACE),--namespace $(NAMESPACE)) \
		$(if $(filter command line environment,$(origin IMAGE)),--image $(IMAGE)) $(PREFLIGHT_ARGS)
