.PHONY: check-patches
check-patches: venv ## Download the pinned verl, vllm-ascend and vllm, apply every patch to fresh copies, byte-compile.
	VERL_CONSISTENCY_CACHE=$(CACHE) $(PY) -m verl_consistency.patches check
