# `make check-model`: the one-node consistency check (`verl-consistency check`, README.md "Which to
# run") to a verified bundle. Not `make check`: by GNU convention that target runs the tests.
#   make check-model                              # CPU, the demo's tiny random Qwen2, in the demo venv
#   make check-model MODEL=/path/to/hf-folder     # your model on this machine's stack (the image)
#   make check-model MODEL=... DEVICE=cuda CHECK_ARGS="--tp 2 --dtype bfloat16"
# With MODEL it runs the `verl-consistency` of the current environment (vLLM, verl and msprobe in
# one Python: the image) and builds nothing; without MODEL it needs only the demo venv, so it runs
# on any x86 Linux machine.

MODEL ?=
# The device of a MODEL check: npu (the image's), cuda or cpu. Without MODEL it is cpu.
DEVICE ?= npu
CHECK_ROOT ?= out/check
# One run id per make invocation (`:=`: evaluated once), so that the bundle to verify is known.
CHECK_RUN ?= $(shell date -u +check-%Y%m%d-%H%M%S)
override CHECK_RUN := $(CHECK_RUN)
CHECK_ARGS ?=
# The command with MODEL: the installed one (override to point at another install).
VERL_CONSISTENCY ?= verl-consistency

CHECK_CMD = $(if $(MODEL),$(VERL_CONSISTENCY),$(DEMO_PY) -m verl_consistency.entrypoints)
CHECK_BUNDLE = $(CHECK_ROOT)/bundles/bundle-$(CHECK_RUN).tar.zst
# Without MODEL the demo's random model runs on CPU only: a DEVICE given on the command line (or
# in the environment) other than cpu is refused before anything is built.
CHECK_REFUSED = $(if $(MODEL),,$(and $(filter-out file,$(origin DEVICE)),$(filter-out cpu,$(DEVICE))))

.PHONY: check-model
check-model: $(if $(MODEL),,$(if $(CHECK_REFUSED),check-model-refused,demo-venv)) ## One-node check: vLLM batched + alone vs the training engine -> verified bundle (MODEL=<hf folder> [DEVICE=npu|cuda|cpu] [CHECK_ARGS=...]; no MODEL: CPU demo model).
	$(CHECK_CMD) check $(if $(MODEL),--model $(MODEL) --device $(DEVICE),--device cpu) \
		--dump-root $(CHECK_ROOT) --run-id $(CHECK_RUN) $(CHECK_ARGS)
	$(CHECK_CMD) verify $(CHECK_BUNDLE)
	@echo "bundle: $(CHECK_BUNDLE)"

.PHONY: check-model-refused
check-model-refused:
	@echo "make check-model: DEVICE=$(DEVICE) needs MODEL=<hf folder>; without MODEL the check runs the demo's random model on CPU only" >&2
	@exit 2
