#!/bin/bash
# verl's own drivers, whole, on one NVIDIA GPU: `verl-consistency run hybrid|colocate-async --device cuda`
# on the `next` pin set (verl 0.9.1's main_ppo, V1 trainer, vLLM 0.23.0 rollout, FSDP actor, GRPO), then
# `verl-consistency postprocess` and `verify`. Issue 25; the hand-made run it replaces is described in
# ../shared/tools/gpu-stage/README.md (its traps are kept here as comments where they are handled).
#
# How to repeat the run (the device tool's nvidia-h200: torch 2.11.0+cu130, Python 3.12, no registry):
#   1. here, with network to PyPI:   bash bench/gpu/verl_gpu.sh prepare [STAGE]
#      STAGE (default: .gpu-stage of the checkout that the device tool sends, listed in
#      .git/info/exclude) gets p1/ p2/ p3/ of at most ~60 MB each, plus this script and make_assets.py.
#   2. on the device, calls back to back (the machine stays warm 30 s between calls; each call's
#      working tree is a fresh copy, so `stage` copies its part to /tmp/vgpu); S=.gpu-stage:
#        run(carry=[S/p1, S/verl_gpu.sh]):                 bash .gpu-stage/verl_gpu.sh stage p1
#        run(carry=[S/p2, S/verl_gpu.sh]):                 bash .gpu-stage/verl_gpu.sh stage p2
#        run(carry=[S/p3, S/verl_gpu.sh, S/SHA256, S/make_assets.py, S/trim_run.py]):
#                                                          bash .gpu-stage/verl_gpu.sh run
#        run(carry=[S/verl_gpu.sh]):                       bash .gpu-stage/verl_gpu.sh run   (again)
#        ... until every run is done: one call holds what fits in its 600 s (a run is ~5 min: Ray,
#        TransferQueue, FSDP and the vLLM server start take ~3 of them); a run tried once is skipped.
#      `run` unpacks, installs, patches vLLM and verl with `verl-consistency patches apply --set next`,
#      builds a random bf16 Qwen2 (hidden 512, 4 layers, head_dim 64) and runs, for each MODE:PHASE
#      (default: hybrid and colocate-async, log_prob then update_actor), the real CLI:
#        VERL_CONSISTENCY_PIN_SET=next verl-consistency run MODE --device cuda --phase PHASE
#          --capture fraction:1 --dump-root /tmp/vgpu/dump model=... <sizes and GPU overrides below>
#      then postprocess + verify, and writes to $OUT one <run id>.tar.xz per run: logs/<run id>/ (the
#      run, postprocess and verify logs) and trim/<run id>/, the run folder trimmed by trim_run.py to
#      <= 6 MiB (the pairs with the shortest prompts). The bundles (30-40 MB) stay on the device.
#      Measured (issue 25, NOTE-25): a run 215-280 s, its postprocess 100-140 s; two runs side by side
#      (PARALLEL=1 GPU_UTIL=0.25) worked, so four runs fit in three calls.
#   3. here: unpack trim/<run id>/ as tests/postprocess/fixtures/h200-next/<run id>/
#      (tests/postprocess/test_compare_h200_next.py re-pairs them on CPU in `make test`; its recorded
#      pair counts and verdicts change with a new run).
#
# Issue 21's training cost (`cost`: bench/gpu/fsdp_cost.py, verl's FSDP log_prob pass with per-request
# dumps at micro batch 1 vs 8 and 16). Run the CHECKOUT's copy of this script: it runs the checkout's
# fsdp_cost.py and imports verl_consistency from the checkout (the bundle wheel in p3 may predate the
# lanes); only the stage's parts are carried. Three calls back to back, S=.gpu-stage (step 1 above):
#   run(carry=[S/p1]):            bash bench/gpu/verl_gpu.sh stage p1
#   run(carry=[S/p2]):            bash bench/gpu/verl_gpu.sh stage p2
#   run(carry=[S/p3, S/SHA256]):  bash bench/gpu/verl_gpu.sh cost
# `cost` unpacks and patches as `run` does (with this checkout's patch series), then runs
#   python3 -m bench.gpu.fsdp_cost --device cuda --requests 64 --micro-batches 1,8,16 --reps 3
# (a random bf16 Qwen2 of Qwen2-0.5B's shape, sdpa, nccl world 1) within what is left of BUDGET
# (575 s) and writes to $OUT: fsdp-cost.txt (the table: bench/results/fsdp-lanes-cost-h200-next.log),
# fsdp-cost.json, fsdp-cost.log (without msprobe's INFO lines) and fsdp-cost-full.log. Expected:
# ~6 min (set-up ~1 min; a dumped pass over 64 requests ~20-30 s). If it prints SKIP lines, repeat
# the last call with MBS=1,8. REQUESTS, MBS, REPS, DEVICE (cpu), COST_ARGS (e.g. --tiny) override.
# Since issue 32 the lanes are written in one pass (hooks/lanes/lane_collector.py; the table's first line says
# which path ran); COST_ARGS="--lanes-path fanout" times the path before it (one msprobe collector per lane).
# After the timed passes, one more dumped pass per micro batch above 1 runs with bench/support/host_clock.py's
# clocks: the table's `host split mbN` lines say where the added time went (the lanes' per-tensor step and
# write, automatic collections, msprobe's hook walk by difference; verl's own gc.collect() calls apart), no
# profiler needed (COST_ARGS=--no-split skips them, ~2 dumped passes' time).
# Since issue 43's lane writer the lanes' files are written by a helper process (hooks/lanes/lane_writer.py),
# and `cost` also times REPS dumped passes with them written in line (`dumps-inline` rows and a
# `ratio mbN dumps-inline/off` line: the A/B in one run; INLINE_TOO=0 leaves them out, ~2-4 s a pass).
#
# Since the H200 fixtures (~25 MB) travel with every call, p1/p2 (60 MB each) no longer fit a call's
# 64 MiB: `bash bench/gpu/verl_gpu.sh pack` (here, after `prepare`) cuts SHA256 + p1..p3 into chunks of
# 30 MB, .gpu-stage/packed/c0..c5, and the calls become (install() joins the chunks):
#   run(carry=[S/packed/cN]):     bash bench/gpu/verl_gpu.sh stage packed/cN      (each chunk, back to back)
#   run():                        bash bench/gpu/verl_gpu.sh check               (issue 22, ~5 min)
#   run():                        bash bench/gpu/verl_gpu.sh cost                (issue 21, ~6 min)
#   run():                        bash bench/gpu/verl_gpu.sh lanes               (issue 32, ~2 min)
#   run():                        bash bench/gpu/verl_gpu.sh setup               (unpack, patch, model)
#   run():                        bash bench/gpu/verl_gpu.sh fullyasync          (issue 33, bench/gpu/one_gpu/README.md)
# `check` runs `verl-consistency check --model <random bf16 Qwen2 of Qwen2-0.5B's shape, make_assets.py's
# tokenizer> --device cuda --dtype bfloat16 --num-prompts 8` and writes to $OUT check.log, report.html,
# summary.json and h200-next-check.tar.xz (the run folder, for tests/postprocess/fixtures/; CI re-pairs it).
# Measured 2026-12-01 (bench/results/check-h200-next.log, fsdp-lanes-cost-h200-next.log): staging 5 calls
# ~25 s held in all after a ~90 s start; check 302 s (set-up 61 s, vLLM 126 s, FSDP 42 s, postprocess 52 s);
# cost 360 s. Both fit one session's 30 device-minutes with a restart to spare.
#
# Issue 35's proofs, in one session (measured 2026-12-02: ride 254 s + postprocess 47 s, fault 180 s +
# 25 s, check on the assets model 116 s; ~20 of the 30 device-minutes with staging), back to back after
# the five stage calls; M8 = the user's micro batch of 8 on both sides:
#   M8="actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"
#   run():  bash bench/gpu/verl_gpu.sh setup                                   (unpack, patch, model)
#   run():  RIDE_ARGS="$M8" bash bench/gpu/verl_gpu.sh ride                    (8 steps, 128 requests)
#   run():  FAULT=1 STEPS=4 RIDE_ARGS="$M8" bash bench/gpu/verl_gpu.sh ride    (the planted sync fault)
#   run():  CHECK_MODEL=assets PROMPTS=16 bash bench/gpu/verl_gpu.sh check     (step 0 of the same model)
# Each ride writes $OUT/<run id>.tar.xz: trim/<run id>/ goes to tests/postprocess/fixtures/ as one
# .tar.xz of that one folder (as h200-next-check.tar.xz), re-paired in CI; the H100 runs of 2026-12-07
# with the weight check (RIDE_ID=h100-next-weights-ride / -fault, TRIM_PAIRS=24 TRIM_MIB=12; they replaced
# 2026-12-06's h100-next-ride-along{,-fault}): h100-next-weights-{ride,fault}.tar.xz
# (tests/postprocess/test_ride_along_h100_next.py; bench/results/gpu-2026-12-07/).
# The second session (main 493b466, bench/results/gpu-2026-12-06b/): h100-next-fully-async{,-fault}.tar.xz,
# h100-next-colocate-async.tar.xz (trim_run.py --max-pairs 40 --max-mib 16: every step kept;
# tests/postprocess/test_async_h100_next.py) and h100-next-check.tar.xz (test_check_h100_next.py).
# Issue 46, the same ride on verl 0.9.1's Megatron engine (ENGINE=megatron: MEGATRON_OVERRIDES below; TP = PP
# = 1, mbridge, bshd, the Transformer Engine stand-in bench/gpu/no_te/megatron_local_spec.py in verl's Megatron
# worker through VERL_USE_EXTERNAL_MODULES; megatron-core 0.16.1 and mbridge 0.15.1 from p4). Here first:
#   bash bench/gpu/verl_gpu.sh prepare-megatron && bash bench/gpu/verl_gpu.sh pack
# (p4 is 2.7 MB: the chunks are c0..c5 of 30 MB. The device tool counts a call's files as the disk holds
# them: ~33 MB of tracked files, so the earlier 33 MB chunks, 34.6 MB each, were refused on 2026-12-07 as
# "larger than 64 MiB"). Then, on one warm machine, back to back:
#   run(carry=[S/packed/cN]):  bash bench/gpu/verl_gpu.sh stage packed/cN                  (N = 0..5, ~2 min held)
#   run():  bash bench/gpu/verl_gpu.sh setup                                               (~1.5 min)
#   run():  ENGINE=megatron RIDE_ID=h100-next-megatron-ride TRIM_PAIRS=24 TRIM_MIB=12 RIDE_ARGS="$M8" \
#             bash bench/gpu/verl_gpu.sh ride                                              (8 steps, 128 requests)
#   run():  ENGINE=megatron RIDE_ID=h100-next-megatron-fault FAULT=1 STEPS=4 TRIM_PAIRS=24 TRIM_MIB=12 \
#             RIDE_ARGS="$M8" bash bench/gpu/verl_gpu.sh ride                              (the planted sync fault)
# Estimate (unmeasured; FSDP's ride was 310 s + postprocess 58 s on an H100, its fault ~205 s): the Megatron
# worker's start (megatron-core's parallel state, mbridge's HF load) adds ~30-60 s, its unfused local
# attention is slower than SDPA but the model is 4 x 512 at <= 528 tokens: ride ~6-7 min, fault ~4-5 min,
# ~16 device-minutes in all with staging. A ride that overruns the call (rc 124) stops Ray itself; then
# repeat it with STEPS=6. Expected: steps.json's actor/grad_norm > 0 at every step; the ride 128 of 128
# paired, all healthy, every sync's weight check exact (the export is mbridge's, in HF names); the fault step
# 1 healthy, steps 2-4 diverged first at layers.2.mlp, model.layers.2.mlp.down_proj.weight named by the weight
# check (bench/gpu/faults/skip-down-proj.patch edits vLLM's ServerAdapter.update_weights, which the Megatron
# engine's get_per_tensor_param stream reaches as the FSDP one does; mbridge names Megatron's
# decoder.layers.2.mlp.linear_fc2.weight so). Each $OUT/<RIDE_ID>.tar.xz: trim/<RIDE_ID>/ goes to
# tests/postprocess/fixtures/<RIDE_ID>.tar.xz, re-paired in CI by tests/postprocess/test_ride_along_megatron_next.py
# (skipped while absent); the rest of $OUT to bench/results/<date>/megatron-{ride,fault}/.
# A whole session for the three open GPU issues, in order of what each proves (2026-12-04 plan, from
# the walls measured above; ~26 of the 30 device-minutes): the five stage calls (~2 min held) and
# `setup` (~1.5 min); issue 35: `ride` (~5 min), `FAULT=1 STEPS=4 ride` (~3.5), `CHECK_MODEL=assets
# PROMPTS=16 check` (~2); issue 33: `fullyasync` (not yet run: budget a whole call); issue 32: `cost`
# (~6) last, as it only measures. Commit each $OUT tarball as soon as it is back: an earlier try lost
# its ride and fault folders with its machine.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}; shift || true

if [ "$cmd" = prepare ]; then
  set -euo pipefail
  REPO=$(cd "$HERE/../.." && pwd)
  STAGE=$(readlink -f "${1:-$REPO/.gpu-stage}")
  PY=${PY:-$REPO/.venv/bin/python}   # needs pip and wheel (the bundle is built --no-build-isolation)
  pin() { "$PY" "$REPO/patches/contracts/pins.py" --set next "$1"; }
  VLLM=$(pin upstream.vllm); VERL=$(pin upstream.verl); RAY=$(pin image.ray); MSP=$(pin upstream.mindstudio_probe)
  W=${WORK:-$(mktemp -d)}; mkdir -p "$W"
  DL=("$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_26_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux_2_31_x86_64
      --platform any)
  [ -f "$W"/wheel/vllm-"$VLLM"-*.whl ] 2>/dev/null || "${DL[@]}" -d "$W/wheel" "vllm==$VLLM"
  wheel=$(ls "$W"/wheel/vllm-"$VLLM"-*.whl)
  # What vLLM imports for a dense bf16 model on Hopper and the device image lacks. Version traps:
  # xgrammar 0.2.9 fails with apache-tvm-ffi 0.1.9 (load_lib_module extra_lib_paths) -> 0.2.5.post1;
  # openai 3.x needs httpx2 -> 2.54.0; vLLM needs fastapi < 0.137.
  "${DL[@]}" -d "$W/deps" pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 msgspec==0.23.0 pyzmq==27.3.0 gguf==0.19.0 pybase64==1.5.1 cbor2==6.3.0 \
    cachetools==8.0.2 openai-harmony==0.0.8 openai==2.54.0 distro==1.9.0 sniffio==1.3.1 llguidance==1.7.6 \
    xgrammar==0.2.5.post1 apache-tvm-ffi==0.1.9 fastapi==0.136.3 starlette==0.52.1 opentelemetry-api==1.45.2 \
    partial-json-parser==0.2.1.1.post7
  "${DL[@]}" -d "$W/vdeps" "verl==$VERL" "ray==$RAY" jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 \
    jsonschema-specifications==2025.9.1 tensordict==0.10.0 pyvers==0.1.0 importlib-metadata==10.2.0 \
    omegaconf==2.4.0 codetiming==1.4.0 torchdata==0.11.0 orjson==3.13.0 datasets==5.2.0 multiprocess==0.70.19 \
    dill==0.4.1 uvicorn==0.54.0
  # What verl's main_ppo (V1 trainer, vLLM server, TransferQueue) imports beyond the above, and this
  # bundle's own needs there: mindstudio-probe (imports pytz) and zstandard (the bundle archive).
  "${DL[@]}" -d "$W/xdeps" hydra-core==1.3.8 transferqueue==0.1.11 watchfiles==1.3.0 ijson==3.6.0 \
    mistral_common==1.13.1 pydantic-extra-types==2.11.1 pycountry==26.2.16 model-hosting-container-standards==0.1.16 \
    jmespath==1.1.0 prometheus-fastapi-instrumentator==8.1.0 "mindstudio-probe==$MSP" zstandard pytz
  "$PY" -m pip wheel -q --no-deps -w "$W/xdeps" antlr4-python3-runtime==4.9.3     # an sdist only
  rm -f "$W"/xdeps/verl_consistency-*.whl
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$W/xdeps" "$REPO"        # this bundle
  # vLLM: the wheel unzipped, minus what a dense bf16 model on Hopper never loads (FlashAttention 2,
  # MoE kernels, deep_gemm for other Pythons); xz -9 packs the CUDA libraries ~10x (minutes on 2 cores).
  if [ ! -f "$W/site.tar.xz" ]; then
    rm -rf "$W/site" && mkdir -p "$W/site" && (cd "$W/site" && unzip -q "$wheel" &&
      rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs vllm/_moe_C.abi3.so \
            vllm/third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so &&
      rm -rf vllm/third_party/deep_gemm/include &&
      for w in "$W"/deps/*.whl; do unzip -q -o "$w"; done && rm -f xgrammar/lib/libxgrammar.a)
    (cd "$W" && tar -cf - site | xz -T2 -9 >site.tar.xz.tmp && mv site.tar.xz.tmp site.tar.xz)
  fi
  rm -rf "$STAGE/p1" "$STAGE/p2" "$STAGE/p3" "$STAGE/parked" && mkdir -p "$STAGE/p1" "$STAGE/p2" "$STAGE/p3"
  (cd "$W" && sha256sum site.tar.xz >"$STAGE/SHA256" && split -n 2 -d -a 1 site.tar.xz "$STAGE/site.tar.xz.part-" &&
    mv "$STAGE/site.tar.xz.part-0" "$STAGE/p1/" && mv "$STAGE/site.tar.xz.part-1" "$STAGE/p2/")
  # verl + Ray (Ray minus its Java jars, dashboard web build and rllib)
  rm -rf "$W/vsite" && mkdir -p "$W/vsite" && (cd "$W/vsite" && for w in "$W"/vdeps/*.whl; do unzip -q -o "$w"; done &&
    rm -rf ray/jars ray/dashboard/client/build ray/rllib)
  (cd "$W" && tar -cf - vsite | xz -T2 -6 >"$STAGE/p3/vsite.tar.xz")    # -6: 4x faster, ~10% larger
  # TransferQueue ships top-level recipe/ scripts/ tests/ tutorial/ folders: dropped.
  rm -rf "$W/extra" && mkdir -p "$W/extra" && (cd "$W/extra" && for w in "$W"/xdeps/*.whl; do unzip -q -o "$w"; done &&
    rm -rf recipe scripts tests tutorial)
  (cd "$W" && tar -cf - extra | xz -T2 -6 >"$STAGE/p3/extra.tar.xz")
  cp "$HERE/verl_gpu.sh" "$HERE/make_assets.py" "$HERE/trim_run.py" "$STAGE/"
  du -sh "$STAGE"/p*
  exit 0
fi

if [ "$cmd" = prepare-megatron ]; then
  # Here, with network to PyPI (issue 46): STAGE/p4/ gets the py3.12 wheels of megatron-core and mbridge at
  # the next set's pins (install.megatron_core, install.mbridge; ~2.7 MB) and their SHA256.p4; `pack` then
  # carries p4 in the last chunk. Needs no other part of `prepare` (the stage's p1-p3 stay as they are).
  set -euo pipefail
  REPO=$(cd "$HERE/../.." && pwd)
  STAGE=$(readlink -f "${1:-$REPO/.gpu-stage}")
  PY=${PY:-$REPO/.venv/bin/python}
  pin() { "$PY" "$REPO/patches/contracts/pins.py" --set next "$1"; }
  MC=$(pin install.megatron_core); MB=$(pin install.mbridge)   # (an assignment: set -e stops on a failed pin)
  rm -rf "$STAGE/p4" && mkdir -p "$STAGE/p4"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$STAGE/p4" \
    "megatron-core==$MC" "mbridge==$MB"
  (cd "$STAGE/p4" && sha256sum ./*.whl >SHA256.p4)
  du -sh "$STAGE/p4"; ls -la "$STAGE/p4"
  exit 0
fi

G=/tmp/vgpu
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if [ "$cmd" = pack ]; then
  # Here, after `prepare`: the stage's parts as one tar cut into chunks of CHUNK_MB (default 30)
  # under STAGE/packed/c0, c1, ... A device call carries the checkout's tracked files too (~33 MB as
  # the device tool counts them, on disk) and at most 64 MiB in all, so p1/p2 (60 MB each) no longer fit a call.
  set -euo pipefail
  STAGE=$(readlink -f "${1:-$HERE/../../.gpu-stage}")
  rm -rf "$STAGE/packed" && mkdir -p "$STAGE/packed"
  # p4 (prepare-megatron), when there, goes last: the chunks before the last are the same bytes as without it
  parts=(SHA256 p1 p2 p3); [ -d "$STAGE/p4" ] && parts+=(p4)
  (cd "$STAGE" && tar -cf - "${parts[@]}") | split -b "${CHUNK_MB:-30}m" -d -a 1 - "$STAGE/packed/stage.tar.part-"
  for f in "$STAGE"/packed/stage.tar.part-*; do d=$STAGE/packed/c${f##*-}; mkdir -p "$d" && mv "$f" "$d/"; done
  du -sh "$STAGE"/packed/*
  exit 0
fi

if [ "$cmd" = stage ]; then
  # run from the stage folder (S/verl_gpu.sh) or from the checkout (bench/gpu/verl_gpu.sh: $STAGE);
  # PART is p1|p2|p3, or packed/cN (a chunk of `pack`: install() joins the chunks)
  src=$HERE/$1; [ -d "$src" ] || src=${STAGE:-$HERE/../../.gpu-stage}/$1
  mkdir -p "$G/parts" && cp "$src"/* "$G/parts/" && ls -la "$G/parts" && df -h /tmp | tail -1
  exit 0
fi

# Unpack the carried parts once (stage p1, stage p2, then this with p3 and SHA256), take a fixed script
# or bundle wheel that a later call carries, put the bundle on PYTHONPATH with its `verl-consistency`
# command, and patch vLLM and verl once. Used by `run` and `cost`.
#   FROM: holds p3/ and SHA256; SCRIPTS: holds make_assets.py, trim_run.py and any
#   verl_consistency-*.whl; OVERLAY (may be empty): a folder put before the bundle on PYTHONPATH.
install() {  # FROM SCRIPTS OVERLAY
  local from=$1 scripts=$2 overlay=$3 a f w
  if [ ! -f "$G/.installed" ] && [ -f "$G/parts/stage.tar.part-0" ]; then
    # the chunks of `pack`, staged call by call: one tar of SHA256 and p1..p3
    mkdir -p "$G/staged" && cat "$G"/parts/stage.tar.part-* | tar -xf - -C "$G/staged" || exit 3
    cp "$G"/staged/p1/* "$G"/staged/p2/* "$G/parts/" && rm -f "$G"/parts/stage.tar.part-* && from=$G/staged
  fi
  if [ ! -f "$G/.installed" ]; then
    cp "$from"/p3/* "$from/SHA256" "$scripts/make_assets.py" "$scripts/trim_run.py" "$G/parts/" || exit 3
    (cd "$G/parts" && cat site.tar.xz.part-0 site.tar.xz.part-1 >"$G/site.tar.xz" && cd "$G" && sha256sum -c parts/SHA256) || exit 3
    for a in "$G/site.tar.xz" "$G/parts/vsite.tar.xz" "$G/parts/extra.tar.xz"; do tar -xJf "$a" -C "$G" || exit 3; done
    rm -f "$G/site.tar.xz" "$G"/parts/site.tar.xz.part-*
    touch "$G/.installed"; stamp unpacked
  fi
  # A later call may carry a fixed script or bundle wheel (S/verl_consistency-*.whl): it replaces the old.
  for f in make_assets.py trim_run.py; do [ -f "$scripts/$f" ] && cp "$scripts/$f" "$G/parts/"; done
  for w in "$scripts"/verl_consistency-*.whl; do [ -f "$w" ] && (cd "$G/extra" && unzip -q -o "$w") && echo "bundle: $w"; done
  # The bundle's wheel is unpacked into extra/ (no registry there, no console script): this is the
  # `verl-consistency` command, the same entry point.
  export PYTHONPATH=${overlay:+$overlay:}$G/extra:$G/vsite:$G/site
  mkdir -p "$G/bin" && printf '#!/bin/sh\nexec python3 -c "import sys; from verl_consistency.entrypoints.cli import main; sys.argv[0] = \\"verl-consistency\\"; sys.exit(main())" "$@"\n' >"$G/bin/verl-consistency" && chmod +x "$G/bin/verl-consistency"
  export PATH=$G/bin:$PATH VERL_CONSISTENCY_PIN_SET=next
  if [ ! -f "$G/.patched" ]; then
    { verl-consistency patches apply --set next -c vllm --root "$G/site" &&
      verl-consistency patches apply --set next -c verl --root "$G/vsite"; } 2>&1 | tee "$OUT/patch.log" || exit 4
    touch "$G/.patched"; stamp patched
  fi
}

# What every verl driver run here needs in its environment (run and token): no telemetry, no hub, the
# runtime traps of ../shared/tools/gpu-stage/README.md (flashinfer not carried, fork after torch use).
verl_env() {
  export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn RAY_USAGE_STATS_ENABLED=0 HYDRA_FULL_ERROR=1 \
    WANDB_MODE=disabled
}
# make_assets.py's random bf16 Qwen2 and its tokenizer, once per machine (run, check, token; needs OUT, stamp).
assets() {
  if [ ! -d "$G/assets/model" ]; then
    python3 "$G/parts/make_assets.py" "$G/assets" 2>&1 | tail -3 | tee "$OUT/assets.log" || exit 5; stamp assets
  fi
}

# The one-GPU sizes every verl run here takes (run and token): 16-token responses, sdpa (no flash-attn
# here), vLLM at GPU_UTIL of the GPU, two agent and reward workers, TransferQueue at two storage units.
model_05b() {  # a random bf16 Qwen2 of Qwen2-0.5B's shape with make_assets.py's tokenizer, at $G/assets/model-0.5b
  local m=$G/assets/model-0.5b f
  if [ ! -f "$m/config.json" ]; then
    rm -rf "$m.tmp" && (cd "$REPO" && python3 -c "import sys; from pathlib import Path; from bench.gpu.fsdp_cost import build_model; build_model(Path(sys.argv[1]), '0.5b', 'cuda')" "$m.tmp") || exit 5
    for f in "$G"/assets/model/*; do  # the tokenizer's files (vocab, merges, config, chat template)
      case $f in *.safetensors|*/config.json|*/generation_config.json) ;; *) cp "$f" "$m.tmp/" ;; esac
    done
    mv "$m.tmp" "$m"; stamp model-0.5b
  fi
}

GPU_OVERRIDES=(data.max_response_length=16 data.dataloader_num_workers=0
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  "actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_UTIL:-0.3}"
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.agent.num_workers=2 reward.num_workers=2
  transfer_queue.backend.SimpleStorage.num_data_storage_units=2 ray_kwargs.ray_init.num_cpus=16
  trainer.n_gpus_per_node=1 trainer.nnodes=1 "trainer.total_training_steps=${STEPS:-8}" trainer.test_freq=-1)

# ENGINE=megatron (issue 46): verl 0.9.1's Megatron engine for the actor, as tests/patches/megatron_driver.py
# ran it on the H200 (bench/results/megatron-engine-h200-next.log): verl's engine group (model_engine, as
# ppo_megatron_trainer.yaml selects it), TP = PP = 1, mbridge (vanilla_mbridge: verl 0.9.1's default
# Megatron-Bridge needs Transformer Engine), the bshd layout (the stand-in's local attention refuses packed
# rows, and Megatron's lanes are cut in bshd only; the run then sets actor_rollout_ref.model.use_remove_padding
# =false itself: entrypoints/run/megatron.py), no sequence parallelism (megatron-core's torch RMSNorm
# refuses it). tests/entrypoints/test_verl_validation.py plans these with GPU_OVERRIDES and runs verl's checks.
MEGATRON_OVERRIDES=(model_engine=megatron actor_rollout_ref.actor.strategy=megatron
  actor_rollout_ref.actor.megatron.use_remove_padding=False actor_rollout_ref.actor.megatron.vanilla_mbridge=True
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1
  actor_rollout_ref.actor.megatron.sequence_parallel=False
  +actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel=False)
# megatron-core and mbridge (p4, the wheels of `prepare-megatron`), unpacked once into $G/mcore and put on
# PYTHONPATH with the Transformer Engine stand-in (bench/gpu/no_te/megatron_local_spec.py), which verl imports
# in every process through its own VERL_USE_EXTERNAL_MODULES; the stand-in swaps in megatron-core's local
# layer spec only in a process that imports mbridge (verl's Megatron worker). Sets ENGINE_OVERRIDES.
ENGINE_OVERRIDES=()
megatron_env() {
  [ "${ENGINE:-fsdp}" = megatron ] || return 0
  local w d
  if [ ! -f "$G/.mcore" ]; then
    for d in "$G/staged/p4" "$G/parts"; do
      [ -f "$d/SHA256.p4" ] && { (cd "$d" && sha256sum -c SHA256.p4) || exit 3; }
    done
    rm -rf "$G/mcore" && mkdir -p "$G/mcore"
    for w in "$G"/staged/p4/*.whl "$G"/parts/megatron_core-*.whl "$G"/parts/mbridge-*.whl; do
      [ -f "$w" ] && (cd "$G/mcore" && unzip -q -o "$w")
    done
    [ -d "$G/mcore/megatron/core" ] && [ -d "$G/mcore/mbridge" ] ||
      { echo "ENGINE=megatron: no megatron-core/mbridge wheels staged (prepare-megatron, pack, stage)" >&2; exit 3; }
    touch "$G/.mcore"; stamp megatron-unpacked
  fi
  export PYTHONPATH=$REPO/bench/gpu/no_te:$PYTHONPATH:$G/mcore VERL_USE_EXTERNAL_MODULES=megatron_local_spec
  python3 -c 'import megatron.core, mbridge; print("megatron-core", megatron.core.__version__, "mbridge", mbridge.__version__)' \
    2>&1 | tail -1 | tee -a "$OUT/stages.txt"
  ENGINE_OVERRIDES=("${MEGATRON_OVERRIDES[@]}")
}

if [ "$cmd" = run ]; then
  # Each argument is MODE:PHASE (default: both modes' log_prob, then both modes' update_actor).
  RUNS=${*:-"hybrid:log_prob colocate-async:log_prob hybrid:update_actor colocate-async:update_actor"}
  OUT=${OUT:-$G/out}; mkdir -p "$OUT"
  t0=$(date +%s); stamp() { echo "STAGE $1 $(( $(date +%s) - t0 ))s" | tee -a "$OUT/stages.txt"; }
  set -o pipefail
  install "$HERE" "$HERE" ""
  assets
  # The runtime traps (each met on the way, ../shared/tools/gpu-stage/README.md): flashinfer is not
  # carried and vLLM's top-k/top-p check imports it; fork after torch use hung the engine; the machine
  # has no flash-attn (verl 0.9.1 defaults the actor to flash_attention_2); TransferQueue reserves one
  # Ray CPU per storage unit (8 by default) plus one for its controller.
  verl_env
  # One device call may run 600 s: a run starts only if ~EST s are left of BUDGET (from this call's
  # start), and a run tried in an earlier call is skipped, so the same command can be repeated call
  # after call until every run is done. PARALLEL=1 starts the runs of this call together (STAGGER s
  # apart; two Ray clusters and two vLLM servers share the GPU at GPU_UTIL each).
  BUDGET=${BUDGET:-575}; EST=${EST:-320}; mkdir -p "$G/done"
  one_run() {  # MODE PHASE TIMEOUT
    local mode=$1 phase=$2 id=h200-next-$1-${2/_/-} s rc; local log=$G/logs/$id; mkdir -p "$log"
    rm -rf "${G:?}/dump/$id"; s=$(date +%s)
    timeout -k 10 "$3" verl-consistency run "$mode" --device cuda --phase "$phase" \
      --capture fraction:1 --dump-root "$G/dump" --run-id "$id" model="$G/assets/model" "${GPU_OVERRIDES[@]}" \
      >"$log/run.log" 2>&1
    rc=$?; echo "RUN $id rc=$rc wall=$(( $(date +%s) - s ))s" | tee -a "$OUT/stages.txt"
    [ "$rc" = 0 ] && [ "${PARALLEL:-0}" != 1 ] && echo $(( $(date +%s) - s )) >"$G/last_wall"
    s=$(date +%s)
    verl-consistency postprocess "$G/dump/$id" >"$log/postprocess.log" 2>&1
    echo "POST $id rc=$? wall=$(( $(date +%s) - s ))s" | tee -a "$OUT/stages.txt"
    for b in "$G/dump/bundles"/bundle-"$id"*.tar.zst; do
      [ -f "$b" ] || continue
      verl-consistency verify "$b" >"$log/verify.log" 2>&1; echo "VERIFY $id rc=$?" | tee -a "$OUT/stages.txt"
      cp "$b" "$log/"
    done
    rm -rf "$G/trim/$id" && python3 "$G/parts/trim_run.py" "$G/dump/$id" "$G/trim/$id" --max-mib 6 --min-pairs 1 2>&1 | tee -a "$OUT/stages.txt"
    nvidia-smi --query-gpu=memory.used --format=csv >>"$log/postprocess.log" 2>&1
    # logs/<id>/ (run, postprocess, verify logs; the bundle stays there: 30-40 MB, over what $OUT
    # brings back) and trim/<id>/, the run folder as committed.
    tar -cf - --exclude='*.tar.zst' -C "$G" "logs/$id" "trim/$id" | xz -T4 -6 >"$OUT/$id.tar.xz"
    [ -f "$G/last_wall" ] && [ "${PARALLEL:-0}" != 1 ] && echo $(( $(cat "$G/last_wall") + $(date +%s) - s )) >"$G/last_wall"
    tail -30 "$log/postprocess.log"; grep -E "step:[0-9]+ |Traceback|Error|error" "$log/run.log" | tail -12
  }
  todo=()
  for r in $RUNS; do
    id=h200-next-${r%%:*}-${r#*:}; id=${id/_/-}
    [ -f "$G/done/$id" ] && { echo "SKIP $id (tried in an earlier call)"; continue; }
    todo+=("$r")
  done
  if [ "${PARALLEL:-0}" = 1 ]; then
    left=$(( BUDGET - ($(date +%s) - t0) ))
    for r in "${todo[@]}"; do
      id=h200-next-${r%%:*}-${r#*:}; touch "$G/done/${id/_/-}"
      one_run "${r%%:*}" "${r#*:}" $(( left - 60 )) &
      sleep "${STAGGER:-20}"; left=$(( left - ${STAGGER:-20} ))
    done
    wait
  else
    for r in "${todo[@]}"; do
      left=$(( BUDGET - ($(date +%s) - t0) ))
      [ -f "$G/last_wall" ] && EST=$(( $(cat "$G/last_wall") + 15 ))   # measured: the last run + postprocess
      [ "$left" -lt "$EST" ] && { echo "NEXT $r: ${left}s left of this call, a run takes ~${EST}s" | tee -a "$OUT/stages.txt"; break; }
      id=h200-next-${r%%:*}-${r#*:}; touch "$G/done/${id/_/-}"   # tried once: not retried blindly
      one_run "${r%%:*}" "${r#*:}" $(( left - 50 ))
    done
  fi
  ls -la "$OUT"
  stamp done
  exit 0
fi
# `cost` and `check` run THIS checkout (the device call's working tree): its bench/ scripts, and its
# verl_consistency first on PYTHONPATH (OVERLAY), since the bundle wheel in the stage may predate the
# code they run. Sets REPO, STAGE, OUT and stamp(), then installs (see install()).
from_checkout() {  # COMMAND
  REPO=$(cd "$HERE/../.." && pwd)
  [ -f "$REPO/bench/gpu/fsdp_cost.py" ] || { echo "$1: run the checkout's copy: bash bench/gpu/verl_gpu.sh $1" >&2; exit 2; }
  STAGE=${STAGE:-$REPO/.gpu-stage}
  OUT=${OUT:-$G/out}; mkdir -p "$OUT"
  t0=$(date +%s); stamp() { echo "STAGE $1 $(( $(date +%s) - t0 ))s" | tee -a "$OUT/stages.txt"; }
  set -o pipefail
  local ov=$G/vcrepo d; mkdir -p "$ov/verl_consistency"
  for d in entrypoints patches postprocess; do ln -sfn "$REPO/$d" "$ov/verl_consistency/$d"; done
  ln -sfn "$REPO/patches/contracts" "$ov/verl_consistency/contracts"   # pyproject's package-dir mapping
  [ -f "$G/.patched" ] && echo "$1: vLLM and verl were patched by an earlier call (that series is used as it is)"
  install "$STAGE" "$HERE" "$ov"
}

if [ "$cmd" = cost ]; then
  # Issue 21's training cost: bench/gpu/fsdp_cost.py of THIS checkout (the device call's working tree),
  # on the unpacked next set. verl_consistency is imported from the checkout too (OVERLAY): the bundle
  # wheel in the stage may predate the per-request lanes (hooks/lanes/msprobe_lanes.py).
  from_checkout cost
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HYDRA_FULL_ERROR=1 WANDB_MODE=disabled
  # The bench gets what is left of this call's BUDGET s (it skips a repetition that would overrun).
  left=$(( ${BUDGET:-575} - ($(date +%s) - t0) ))
  # DEVICE=cpu COST_ARGS=--tiny REQUESTS=16 MBS=1,8 REPS=1 checks this path without a GPU.
  # shellcheck disable=SC2086  # COST_ARGS: more options, split on spaces
  # PROFILE=1: the same run under cProfile ($OUT/fsdp-cost.prof, and the top of it in fsdp-cost-profile.txt):
  # where a dumped step's host time goes (the profiler slows Python, so read shares, not seconds)
  prof=(); [ -n "${PROFILE:-}" ] && prof=(-m cProfile -o "$OUT/fsdp-cost.prof")
  # PROFILE_PASSES=1: after the timed passes, one more dumped pass per micro batch above 1 under cProfile,
  # alone ($OUT/fsdp-cost-passes-profile.txt): a dumped step's host time without set-up and micro batch 1
  passes=(); [ -n "${PROFILE_PASSES:-}" ] && passes=(--profile "$OUT/fsdp-cost-passes-profile.txt")
  # issue 43's lane writer (a helper process writes the lanes' files) against the in-line write, in the
  # same run: REPS more dumped passes at each micro batch above 1 (INLINE_TOO=0 leaves them out)
  [ "${INLINE_TOO:-1}" = 1 ] && passes+=(--inline-write-too)
  (cd "$REPO" && timeout -k 10 $(( left - 5 )) python3 "${prof[@]}" -m bench.gpu.fsdp_cost --device "${DEVICE:-cuda}" \
    --requests "${REQUESTS:-64}" --micro-batches "${MBS:-1,8,16}" --reps "${REPS:-3}" --work "$G/cost" \
    --budget-s $(( left - 25 )) --out "$OUT/fsdp-cost.json" "${passes[@]}" ${COST_ARGS:-}) >"$OUT/fsdp-cost-full.log" 2>&1
  rc=$?; echo "COST rc=$rc" | tee -a "$OUT/stages.txt"; stamp cost
  if [ -f "$OUT/fsdp-cost.prof" ]; then
    python3 -c 'import pstats, sys; s = pstats.Stats(sys.argv[1]); s.sort_stats("tottime").print_stats(45); s.sort_stats("cumulative").print_stats(60)' \
      "$OUT/fsdp-cost.prof" >"$OUT/fsdp-cost-profile.txt" 2>&1
  fi
  # fsdp-cost.log: the run without msprobe's INFO lines; fsdp-cost.txt: the table (written by the bench)
  grep -v '\[INFO\]' "$OUT/fsdp-cost-full.log" >"$OUT/fsdp-cost.log"
  grep -E '^\[ *[0-9.]+s\]|SKIP|PROBLEM|FAILED|Error' "$OUT/fsdp-cost.log" | tail -40
  cat "$OUT/fsdp-cost.txt" 2>/dev/null || tail -40 "$OUT/fsdp-cost.log"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  exit $rc
fi
if [ "$cmd" = lanes ]; then
  # Issue 32's vLLM-side figure: bench/bench_lanes.py of THIS checkout, a dumped prefill step of LANES
  # (32) requests, each in a lane of its own, against the same step undumped, and against the fan-out
  # (one msprobe collector per lane: the path before issue 32), on the vLLM-layout Qwen2 stand-in at
  # Qwen2-0.5B's shape in bf16 (prompts of 64-512 tokens). It needs only torch and the stage's msprobe.
  # Writes to $OUT: lanes.log (without msprobe's INFO lines) and lanes-full.log. Expected ~2 min.
  from_checkout lanes
  export PYTHONUNBUFFERED=1
  left=$(( ${BUDGET:-575} - ($(date +%s) - t0) ))
  # shellcheck disable=SC2086  # LANES_ARGS: more options, split on spaces
  (cd "$REPO" && timeout -k 10 $(( left - 5 )) python3 -m bench.bench_lanes --part vllm --device "${DEVICE:-cuda}" \
    --lanes "${LANES:-32}" --reps "${REPS:-3}" ${LANES_ARGS:-}) >"$OUT/lanes-full.log" 2>&1
  rc=$?; echo "LANES rc=$rc" | tee -a "$OUT/stages.txt"; stamp lanes
  grep -v '\[INFO\]' "$OUT/lanes-full.log" >"$OUT/lanes.log"
  tail -20 "$OUT/lanes.log"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  exit $rc
fi
if [ "$cmd" = weightbench ]; then
  # Issue 42's fingerprint alone: bench/bench_weight_check.py of THIS checkout on the GPU, Qwen2-0.5B's
  # 291 tensors (fp32 as verl's FSDP engine exports them, bf16 as vLLM holds them): each side of the
  # check per sync against one bf16 copy of every tensor. Needs only torch; ~1 min. The check against a
  # real sync's own time is `synccost`. Writes $OUT/weight-check-gpu.txt.
  from_checkout weightbench
  (cd "$REPO" && python3 -m bench.bench_weight_check --shape 0.5b --device cuda --reps "${REPS:-5}") \
    2>&1 | tee "$OUT/weight-check-gpu.txt"
  rc=$?; stamp weightbench; exit $rc
fi
if [ "$cmd" = check ]; then
  # Issue 22: `verl-consistency check --device cuda` of THIS checkout on the unpacked next set (vLLM
  # 0.23.0 with FlashAttention 3, verl 0.9.1's FSDP engine with sdpa, bf16), on a random bf16 Qwen2 of
  # Qwen2-0.5B's shape (bench/gpu/fsdp_cost.py's SHAPES) with make_assets.py's tokenizer (ChatML).
  # Writes to $OUT: check.log, <id>.tar.xz (the run folder: CI re-pairs it), report.html, summary.
  from_checkout check
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
  assets
  m=$G/assets/model-0.5b
  # CHECK_MODEL=assets: make_assets.py's model, the one `run` and `ride` train (issue 35's fault: check's
  # step-0 comparison on the same model is healthy)
  [ "${CHECK_MODEL:-}" = assets ] && m=$G/assets/model
  model_05b
  id=${CHECK_ID:-h200-next-check}; rm -rf "$G/check/$id"
  left=$(( ${BUDGET:-575} - ($(date +%s) - t0) ))
  # shellcheck disable=SC2086  # CHECK_ARGS: more options, split on spaces
  (cd "$REPO" && timeout -k 10 $(( left - 40 )) verl-consistency check --model "$m" --device cuda --dtype bfloat16 \
    --num-prompts "${PROMPTS:-8}" --dump-root "$G/check" --run-id "$id" --gpu-memory-utilization 0.4 ${CHECK_ARGS:-}) \
    >"$OUT/check-full.log" 2>&1
  rc=$?; echo "CHECK $id rc=$rc" | tee -a "$OUT/stages.txt"; stamp check
  grep -v '\[INFO\]' "$OUT/check-full.log" >"$OUT/check.log"
  if [ -f "$G/check/bundles/bundle-$id.tar.zst" ]; then
    verl-consistency verify "$G/check/bundles/bundle-$id.tar.zst" 2>&1 | tail -3 | tee -a "$OUT/stages.txt"
    cp "$G/check/bundles/work-$id/results/report.html" "$OUT/" 2>/dev/null
    cp "$G/check/$id-summary.json" "$OUT/summary.json" 2>/dev/null
  fi
  tar -cf - -C "$G/check" "$id" | xz -T8 -9 >"$OUT/$id.tar.xz"; ls -la "$OUT"
  tail -25 "$OUT/check.log"
  exit $rc
fi
if [ "$cmd" = token ]; then
  # Issue 35's check of the defaults: `verl-consistency run hybrid --device cuda --token-level` of THIS
  # checkout as a user types it (no micro batch, rollout name or reward given: the run's defaults), on
  # make_assets.py's random bf16 Qwen2, STEPS steps. Writes to $OUT: token-run.log (the run), steps.json
  # (run.json's `steps`: grad_norm, reward mean, verl's mismatch figures per step).
  from_checkout token
  verl_env
  assets
  id=${TOKEN_ID:-h200-next-hybrid-token-level}; rm -rf "${G:?}/dump/$id"
  left=$(( ${BUDGET:-575} - ($(date +%s) - t0) ))
  (cd "$REPO" && timeout -k 10 $(( left - 30 )) verl-consistency run hybrid --device cuda --token-level \
    --dump-root "$G/dump" --run-id "$id" model="$G/assets/model" "${GPU_OVERRIDES[@]}") >"$OUT/token-run.log" 2>&1
  rc=$?; echo "TOKEN $id rc=$rc" | tee -a "$OUT/stages.txt"; stamp token
  python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1])).get("steps"), indent=1))' \
    "$G/dump/$id/run.json" >"$OUT/steps.json" 2>&1
  grep -E "step:[0-9]+ |Traceback|Error" "$OUT/token-run.log" | cut -c1-400 | tail -14; cat "$OUT/steps.json"
  exit $rc
fi
if [ "$cmd" = synccost ]; then
  # Issue 42: what the per-tensor weight check costs a weight sync. Two `verl-consistency run hybrid
  # --device cuda --token-level` runs of THIS checkout (no msprobe dump, so the steps are the sync's and
  # training's own), the same STEPS (default 8) and model (SYNC_MODEL=0.5b, Qwen2-0.5B's shape: 494M
  # parameters, ~1 GB a sync in bf16; =assets: make_assets.py's 4 x 512), back to back: A with
  # VERL_CONSISTENCY_WEIGHT_CHECK=0, B with the check on. verl times each step's sync itself
  # (timing_s/update_weights); the check's own seconds per sync come from B's records (the slowest
  # trainer rank + the slowest vLLM worker). Writes $OUT/synccost.txt and B's weight records.
  # SIDES=B: B alone (when device time is short): the check's seconds against the sync that holds them,
  # an upper bound (a record's seconds include waiting for the sync's own queued copies at its end).
  # Each side's log is kept on the machine ($G/synccost/<SYNC_MODEL>/: an A of another model is never
  # read against this B), so A and B can be two calls back to back
  # (SIDES=A, then SIDES=B: the report of the second reads both). Needed for SYNC_MODEL=0.5b: its run
  # starts in ~250 s on an H100 (vLLM's compile and CUDA graphs), so A and B of 4 steps do not fit
  # one call's 600 s (2026-12-07: both were cut off at their first step).
  from_checkout synccost
  verl_env
  assets
  m=$G/assets/model
  [ "${SYNC_MODEL:-0.5b}" = 0.5b ] && { model_05b; m=$G/assets/model-0.5b; }
  M8=(actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8)
  sides=${SIDES:-A B}; keep=$G/synccost/${SYNC_MODEL:-0.5b}; mkdir -p "$keep"
  for ab in $sides; do
    id=h100-next-synccost-${ab,,}; rm -rf "${G:?}/dump/$id" "$keep/synccost-$ab.log"; s=$(date +%s)
    left=$(( ${BUDGET:-575} - ($(date +%s) - t0) ))
    lim=$(( left - 20 )); [ "$ab" = A ] && [ "${sides// /}" = AB ] && lim=$(( left / 2 - 20 ))
    wc=1; [ "$ab" = A ] && wc=0
    (cd "$REPO" && VERL_CONSISTENCY_WEIGHT_CHECK=$wc timeout -k 10 "$lim" \
      verl-consistency run hybrid --device cuda --token-level --dump-root "$G/dump" --run-id "$id" model="$m" \
      "${GPU_OVERRIDES[@]}" "${M8[@]}") >"$keep/synccost-$ab.log" 2>&1
    echo "SYNCCOST $ab rc=$? wall=$(( $(date +%s) - s ))s" | tee -a "$OUT/stages.txt"
    cp "$keep/synccost-$ab.log" "$OUT/"
  done
  [ -f "$keep/synccost-B.log" ] || { echo "synccost: no B run yet (SIDES=B next)"; exit 0; }
  mkdir -p "$OUT/weights-B" && cp "$G/dump/h100-next-synccost-b/weights/"*.jsonl "$OUT/weights-B/" 2>/dev/null
  a_log=$keep/synccost-A.log; [ -f "$a_log" ] || a_log=-
  python3 "$REPO/bench/gpu/sync_cost_report.py" "$a_log" "$keep/synccost-B.log" "$OUT/weights-B" \
    --model "${SYNC_MODEL:-0.5b}" | tee "$OUT/synccost.txt"
  exit 0
fi
if [ "$cmd" = setup ]; then
  # Unpack, patch (this checkout's series) and build make_assets.py's model in a call of its own, so that
  # the calls after it (ride, check) spend their 600 s on the runs.
  from_checkout setup
  assets
  stamp setup; exit 0
fi
plant_fault() {
  # FAULT=1: bench/gpu/faults/skip-down-proj.patch applied to the staged verl for this run only (reversed
  # when the call ends): every weight sync after the first skips model.layers.2.mlp.down_proj.weight. It
  # edits vLLM's ServerAdapter.update_weights, which both paths reach: hybrid's colocated sync and the
  # separate pools' checkpoint engine (CheckpointEngineWorker.update_weights, one_gpu_shm here).
  fault=$REPO/bench/gpu/faults/skip-down-proj.patch
  if [ -n "${FAULT:-}" ]; then
    patch -p1 --fuzz=0 -d "$G/vsite" <"$fault" | tee -a "$OUT/stages.txt" || exit 6
    trap 'patch -R -p1 -d "$G/vsite" <"$fault" >/dev/null' EXIT
  fi
}
collect() {  # ID LOG_DIR
  # What `ride` and `fullyasync` do after the run: postprocess and verify on the device, run.json's
  # `steps` and the report's summary to $OUT, then the run folder trimmed by the checkout's trim_run.py
  # within what is left of the call (the first ride on the H200 overran 600 s here) and $OUT/<id>.tar.xz
  # of logs/<id>/ and trim/<id>/. TRIM_MIB, TRIM_PAIRS: the committed folder is an xz of statistics
  # dumps, so 64+ pairs fit in a few MiB.
  local id=$1 log=$2 s left b
  s=$(date +%s)
  verl-consistency postprocess "$G/dump/$id" >"$log/postprocess.log" 2>&1
  echo "POST $id rc=$? wall=$(( $(date +%s) - s ))s" | tee -a "$OUT/stages.txt"
  for b in "$G/dump/bundles"/bundle-"$id"*.tar.zst; do
    [ -f "$b" ] && { verl-consistency verify "$b" >"$log/verify.log" 2>&1; echo "VERIFY $id rc=$?" | tee -a "$OUT/stages.txt"; }
  done
  python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1])).get("steps"), indent=1))' \
    "$G/dump/$id/run.json" >"$OUT/steps.json" 2>&1
  cp "$G/dump/bundles/work-$id/results/summary.md" "$OUT/" 2>/dev/null
  left=$(( ${BUDGET:-575} - ($(date +%s) - t0) - 20 ))
  timeout -k 5 "$left" python3 "$HERE/trim_run.py" "$G/dump/$id" "$G/trim/$id" --max-mib "${TRIM_MIB:-48}" \
    --min-pairs 1 --max-pairs "${TRIM_PAIRS:-72}" 2>&1 | tail -3 | cut -c1-400 | tee -a "$OUT/stages.txt"
  timeout 30 tar -cf - -C "$G" "logs/$id" "trim/$id" | timeout 30 xz -T8 -6 >"$OUT/$id.tar.xz"
}
if [ "$cmd" = ride ]; then
  # Issue 35's proofs: `verl-consistency run MODE --device cuda` of THIS checkout as a user types it, a
  # ride-along collection (no --prompts-only: full responses, the run's varying reward, the weights move),
  # every request captured, then postprocess + verify on the device. MODE (default hybrid), STEPS (8).
  # FAULT=1: the same with bench/gpu/faults/skip-down-proj.patch applied to the staged verl for this run
  # only (reversed afterwards): every weight sync after the first skips model.layers.2.mlp.down_proj.weight.
  # Writes to $OUT: <id>.tar.xz (logs/<id>/ and trim/<id>/, as `run` does), ride.log, steps.json.
  # ENGINE=megatron (issue 46): the actor on verl's Megatron engine (MEGATRON_OVERRIDES, megatron_env).
  from_checkout ride
  verl_env
  assets
  megatron_env
  mode=${MODE:-hybrid}; eng=; [ "${ENGINE:-fsdp}" = megatron ] && eng=-megatron
  id=${RIDE_ID:-h200-next-$mode$eng-ride-along${FAULT:+-fault}}
  log=$G/logs/$id; mkdir -p "$log"; rm -rf "${G:?}/dump/$id" "${G:?}/trim/$id"
  plant_fault
  left=$(( ${BUDGET:-575} - ($(date +%s) - t0) ))
  s=$(date +%s)
  # shellcheck disable=SC2086  # RIDE_ARGS: more verl overrides, split on spaces
  (cd "$REPO" && timeout -k 10 $(( left - 150 )) verl-consistency run "$mode" --device cuda --capture fraction:1 \
    --dump-root "$G/dump" --run-id "$id" model="$G/assets/model" "${GPU_OVERRIDES[@]}" "${ENGINE_OVERRIDES[@]}" \
    ${RIDE_ARGS:-}) >"$log/run.log" 2>&1
  rc=$?; echo "RIDE $id rc=$rc wall=$(( $(date +%s) - s ))s" | tee -a "$OUT/stages.txt"
  # a run killed by timeout skips Ray's exit handlers: its cluster would keep the GPU for the next call
  case $rc in 124|137) ray stop --force >/dev/null 2>&1 ;; esac
  collect "$id" "$log"
  grep -E "step:[0-9]+ |FAULT|Traceback|Error" "$log/run.log" | cut -c1-300 | tail -14 | tee "$OUT/ride.log"
  # a failed run's last lines whole (a Megatron ride's first try may stop in a worker)
  [ "$rc" = 0 ] || tail -60 "$log/run.log" | cut -c1-400 >"$OUT/run-tail.log"
  tail -25 "$log/postprocess.log" | tee -a "$OUT/ride.log"
  exit $rc
fi
if [ "$cmd" = fullyasync ]; then
  # Issue 33: `verl-consistency run fully-async --device cuda` of THIS checkout (verl 0.9.1's V1
  # separate_async driver: a trainer pool and a standalone vLLM rollout pool) on the ONE GPU, through
  # the harness of bench/gpu/one_gpu/ (its README: what it relies on in verl and Ray, and what a
  # one-device run cannot show). A ride-along collection, every request captured, then postprocess +
  # verify on the device, as `ride` does. Two things differ from a two-GPU run, both test scaffolding:
  # - Ray is told of two GPUs (+ray_kwargs.ray_init.num_gpus=2) while the cluster's environment holds
  #   CUDA_VISIBLE_DEVICES=0,0: Ray maps each worker's GPU id through that list
  #   (ray/_private/worker.py:1061-1063), so the trainer (Ray GPU 0) and the rollout (Ray GPU 1) both
  #   get id "0" and CUDA_VISIBLE_DEVICES=0. RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES stays unset
  #   (with it verl's worker.py:281 sets device 1: "invalid device ordinal").
  # - The weights go from trainer to rollout through host shared memory: the stand-in checkpoint
  #   engine one_gpu_shm (bench/gpu/one_gpu/one_gpu_ckpt.py, on PYTHONPATH), which verl imports
  #   through checkpoint_engine.custom_backend_module (NCCL refuses two ranks on one device).
  # Since issue 41 each stale request's training forward is dumped again at its rollout's weights
# (patches/hooks/training/older_weights.py), so the run pairs every step, not only the first. FAULT=1 plants the
# sync fault (plant_fault). STEPS (8), PHASE (the run's default for fully-async: log_prob), FA_ARGS (more verl overrides,
  # e.g. actor_rollout_ref.rollout.free_cache_engine=False if vLLM's sleep asserts "Memory usage
  # increased after sleeping"). Writes to $OUT: <id>.tar.xz (logs/<id>/ and trim/<id>/, as `ride`),
  # fullyasync.log (steps, weight syncs, errors, the postprocess summary), steps.json, cuda00.txt.
  from_checkout fullyasync
  verl_env
  assets
  id=${FA_ID:-h200-next-fully-async-ride-along${FAULT:+-fault}}
  log=$G/logs/$id; mkdir -p "$log"; rm -rf "${G:?}/dump/$id" "${G:?}/trim/$id"
  # FAULT=1: the planted sync fault on the checkpoint-engine path (plant_fault). The standalone vLLM never
  # sleeps, so the skipped tensor keeps version 0's values and shows once the trainer's copy has moved past
  # bf16's resolution: give the actor a larger learning rate (FA_ARGS=actor_rollout_ref.actor.optim.lr=2e-3).
  plant_fault
  unset RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES RAY_ADDRESS
  # What a process that is not a Ray GPU worker sees with 0,0 (the driver; read, never used for work)
  CUDA_VISIBLE_DEVICES=0,0 timeout 60 python3 -c 'import torch; print("CUDA_VISIBLE_DEVICES=0,0: torch sees", torch.cuda.device_count(), "device(s)")' \
    >"$OUT/cuda00.txt" 2>&1; cat "$OUT/cuda00.txt"
  FA_OVERRIDES=(actor_rollout_ref.rollout.n_gpus_per_node=1 +ray_kwargs.ray_init.num_gpus=2
    actor_rollout_ref.rollout.checkpoint_engine.backend=one_gpu_shm
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=one_gpu_ckpt
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256)
  # Ray CPUs: the two pools' bundles (3 + 2), TransferQueue (3), agent and reward workers (2 + 2), the
  # task runner and vLLM's server (1 + 1) take 14 of GPU_OVERRIDES' 16: declare 24 so that a miscount
  # cannot leave an actor waiting for a CPU until the call's timeout (a logical count; 16 cores here)
  base=("${GPU_OVERRIDES[@]/#ray_kwargs.ray_init.num_cpus=16/ray_kwargs.ray_init.num_cpus=24}")
  phase=(); [ -n "${PHASE:-}" ] && phase=(--phase "$PHASE")
  left=$(( ${BUDGET:-575} - ($(date +%s) - t0) ))
  s=$(date +%s)
  # shellcheck disable=SC2086  # FA_ARGS: more verl overrides, split on spaces
  (cd "$REPO" && CUDA_VISIBLE_DEVICES=0,0 PYTHONPATH=$REPO/bench/gpu/one_gpu:$PYTHONPATH timeout -k 10 $(( left - 150 )) \
    verl-consistency run fully-async --device cuda "${phase[@]}" --capture fraction:1 --dump-root "$G/dump" --run-id "$id" \
    model="$G/assets/model" "${base[@]}" "${FA_OVERRIDES[@]}" ${FA_ARGS:-}) >"$log/run.log" 2>&1
  rc=$?; echo "FULLYASYNC $id rc=$rc wall=$(( $(date +%s) - s ))s" | tee -a "$OUT/stages.txt"
  # a run killed by timeout skips Ray's exit handlers: its cluster (the machine's only) would keep the GPU
  case $rc in 124|137) ray stop --force >/dev/null 2>&1 ;; esac
  collect "$id" "$log"
  # the evidence of the harness: vLLM's device, each weight sync's size through one_gpu_shm, errors
  grep -E "step:[0-9]+ |one_gpu_shm|CUDA_VISIBLE_DEVICES|invalid device|Traceback|Error" "$log/run.log" | cut -c1-300 | tail -24 |
    tee "$OUT/fullyasync.log"
  tail -25 "$log/postprocess.log" | tee -a "$OUT/fullyasync.log"
  exit $rc
fi
echo "usage: $0 prepare [STAGE] | prepare-megatron [STAGE] | pack [STAGE] | stage p1|p2|p3|packed/cN | run [MODE:PHASE ...] | cost | lanes | check | token | setup | ride | fullyasync | weightbench | synccost" >&2; exit 2
