# Benchmarks: never run by `make test`. Each bench/bench_*.py prints ratio lines against a
# baseline measured in the same run, absolute numbers, and the hardware. Each runs as a module from
# the repository root (`python -m bench.bench_x`), so it imports this bundle as installed and the
# stand-ins and drivers it shares with the tests as the package `bench.support` (never `tests`).

.PHONY: bench
bench: venv demo-venv ## Run every benchmark (bench/bench_*.py): ratios, absolute numbers, hardware.
	@for b in $(sort $(basename $(notdir $(wildcard bench/bench_*.py)))); do echo "== bench/$$b.py"; VERL_CONSISTENCY_DEMO_VENV=$(abspath $(DEMO_VENV)) $(PY) -m bench.$$b || exit 1; done

.PHONY: bench-postprocess
bench-postprocess: venv ## Postprocess benchmark only; scale with BENCH_POSTPROCESS_ARGS="--dispatch-records N ...".
	$(PY) -m bench.bench_postprocess $(BENCH_POSTPROCESS_ARGS)
