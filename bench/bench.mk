# Benchmarks: never run by `make test`. Each bench/bench_*.py prints ratio lines against a
# baseline measured in the same run, absolute numbers, and the hardware.

.PHONY: bench
bench: venv demo-venv ## Run every benchmark (bench/bench_*.py): ratios, absolute numbers, hardware.
	@for b in $(sort $(wildcard bench/bench_*.py)); do echo "== $$b"; VERL_CONSISTENCY_DEMO_VENV=$(abspath $(DEMO_VENV)) $(PY) $$b || exit 1; done

.PHONY: bench-postprocess
bench-postprocess: venv ## Postprocess benchmark only; scale with BENCH_POSTPROCESS_ARGS="--dispatch-records N ...".
	$(PY) bench/bench_postprocess.py $(BENCH_POSTPROCESS_ARGS)
