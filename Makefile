# verl-consistency: `make help` lists every target with its one-line description.
#
# Targets of each stage live next to that stage (docker/*.mk, k8s/*.mk, ...) and are included
# below, so this file stays the map and not the territory.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Downloaded upstream distributions (never committed).
CACHE ?= .cache

# pin KEY: one value from patches/pins.toml, read with the host's Python (3.11+ has tomllib).
pin = $(shell $(PYTHON) -c 'import tomllib,sys;d=tomllib.load(open("patches/pins.toml","rb"))\
;[d:=d[k] for k in sys.argv[1].split(".")];print(" ".join(d) if isinstance(d,list) else d)' $(1))

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' \
		$(MAKEFILE_LIST)

.PHONY: pins
pins: ## Print the pinned upstream versions (from patches/pins.toml).
	@$(PYTHON) -c 'import tomllib,json;print(json.dumps(tomllib.load(open("patches/pins.toml","rb")),indent=2))'

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
venv: $(VENV)/.installed ## Create .venv: CPU torch, the pinned verl, mindstudio-probe and Ray, and this bundle.

.PHONY: test
test: sysdeps venv $(CHECKOV) demo-venv ## Run the whole test suite (what CI runs), the real-engine demo included.
	VERL_CONSISTENCY_CACHE=$(abspath $(CACHE)) VERL_CONSISTENCY_CHECKOV=$(abspath $(CHECKOV)) \
		VERL_CONSISTENCY_DEMO_VENV=$(abspath $(DEMO_VENV)) $(PY) -m pytest $(PYTEST_ARGS)

.PHONY: lint
lint: venv ## ruff (style and lint) over the whole tree.
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

.PHONY: clean
clean: ## Remove build outputs (keeps .venv and the upstream cache).
	rm -rf build dist *.egg-info .pytest_cache

-include $(sort $(wildcard */*.mk))
