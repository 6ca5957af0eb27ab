#!/bin/bash
# The patched verl Megatron engine on an NVIDIA GPU machine with no package registry.
#
#   bash bench/megatron_h200.sh prepare          # here (network to PyPI): fills build/dev16 (~32 MB)
#   bash build/dev16/megatron_h200.sh [func|bench|all]   # there, from the repository root, with
#                                                # build/dev16 carried; logs and runs.tgz land in $OUT
#
# The pin set in force (VERL_CONSISTENCY_PIN_SET) picks verl and its series: `current` (verl 0.8.0)
# fills build/dev16, `next` (verl 0.9.1, patches/next/verl/series) fills build/devnext and adds the
# transformers/tokenizers of .venv-next (verl 0.9.1 wants transformers <5.11; the machine has 5.17).
# Both use megatron-core 0.16.1 and mbridge 0.15.1 (verl 0.9.1's vanilla_mbridge flavour).
#
# What the device machine has: torch (CUDA), transformers, numpy, pandas, ... (no verl, no Megatron).
# `prepare` brings the rest as py3.12 wheels: megatron-core, mbridge, mindstudio-probe and verl's own
# import-time needs, this bundle as a wheel, the patched verl tree (patches/current/verl/series applied to the
# pinned wheel) and an import-only Ray: verl/protocol.py imports ray at the top, and Ray's 70 MB
# wheel is over one call's carry limit, so its server binaries (raylet, gcs_server, jars, dashboard
# client) are dropped; the engine never starts a Ray cluster.
#
# Runs (tests/patches/megatron_driver.py): tp1 (statistics, log_prob + update_actor,
# weights exported as mbridge hands them to vLLM), tensor1 (tensor mode, log_prob), tp2 (TP=2 over
# NCCL when 2 GPUs are present), padmax1 (next set only: statistics, log_prob, with verl 0.9.1's
# default pad_bshd_to_minibatch_max kept), bench05b (Qwen2-0.5B-shaped model, dump off/on per micro
# batch).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)

if [ "${1:-}" = prepare ]; then
  REPO=$(cd "$HERE/.." && pwd)
  SET=${VERL_CONSISTENCY_PIN_SET:-current}
  if [ "$SET" = next ]; then B=$REPO/build/devnext; PY=${PY:-$REPO/.venv-next/bin/python}
  else B=$REPO/build/dev16; PY=${PY:-$REPO/.venv/bin/python}; fi
  export VERL_CONSISTENCY_PIN_SET=$SET
  rm -rf "$B"
  mkdir -p "$B/whl" "$B/wt/tests/patches" "$B/wt/bench/support"
  P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
  pin() { "$PY" -c "from verl_consistency.patches import pins; print(pins.get('$1'))"; }
  EXTRA=""
  if [ "$SET" = next ]; then
    for d in transformers tokenizers; do
      EXTRA="$EXTRA $d==$("$PY" -c "import importlib.metadata as m; print(m.version('$d'))")"
    done
  fi
  for p in "megatron-core==$(pin install.megatron_core)" "mbridge==$(pin install.mbridge)" \
      "mindstudio-probe==$(pin upstream.mindstudio_probe)" $EXTRA hydra-core==1.3.8 omegaconf==2.3.1 \
      tensordict==0.10.0 pydantic pydantic_core annotated-types typing-inspection orjson codetiming datasets \
      dill multiprocess jsonschema jsonschema-specifications referencing rpds-py cachetools pyvers zstandard \
      openpyxl et_xmlfile pytz; do
    "$PY" -m pip download -q $P -d "$B/whl" "$p" || exit 1
  done
  "$PY" -m pip wheel -q --no-deps -w "$B/whl" antlr4-python3-runtime==4.9.3 || exit 1  # sdist only
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$B/whl" "$REPO" || exit 1
  T=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$T" "ray==$(pin image.ray)" || exit 1
  (cd "$T" && unzip -q ray-*.whl && rm ray-*.whl \
    && rm -rf ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet ray/jars ray/dashboard/client/build \
    && tar -cJf "$B/ray-importonly.tar.xz" .)
  rm -rf "$T"
  (cd "$REPO" && "$PY" -c "
from pathlib import Path; import tempfile
from bench.support.verl_support import patched_verl
print(patched_verl(Path(tempfile.mkdtemp())))") > "$B/.verl-root" || exit 1
  tar -cJf "$B/verl.tar.xz" -C "$(cat "$B/.verl-root")" verl
  cp "$REPO/tests/__init__.py" "$B/wt/tests/"
  echo "$SET" > "$B/.pin-set"
  cp "$REPO/tests/patches/__init__.py" "$REPO/tests/patches/megatron_driver.py" "$B/wt/tests/patches/"
  # the driver imports bench.support.fsdp_driver from the folder above tests/ (wt/)
  cp "$REPO/bench/support/__init__.py" "$REPO/bench/support/fsdp_driver.py" "$B/wt/bench/support/"
  # and the Transformer Engine stand-in (bench/gpu/no_te/megatron_local_spec.py) from bench.gpu.no_te
  mkdir -p "$B/wt/bench/gpu/no_te" && cp "$REPO/bench/gpu/no_te/megatron_local_spec.py" "$B/wt/bench/gpu/no_te/"
  for t in statistics tensor; do
    "$PY" -c "import json,sys;t=sys.argv[1];s={'scope':[],'list':[],'data_mode':['all']}
if t=='statistics': s['summary_mode']='statistics'
print(json.dumps({'task':t,'dump_path':'/tmp/unused','rank':[],'step':[],'level':'L0','async_dump':False,t:s}))" \
      "$t" > "$B/$t.json"
  done
  cp "$0" "$B/megatron_h200.sh"
  du -sh "$B"
  exit 0
fi

# ---------------------------------------------------------------- on the device machine
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$HERE
STAGE=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$B"/whl/*.whl || exit 1
tar -xJf "$B/ray-importonly.tar.xz" -C /tmp/site
rm -rf /tmp/verlp && mkdir -p /tmp/verlp && tar -xJf "$B/verl.tar.xz" -C /tmp/verlp
export PYTHONPATH=/tmp/verlp:/tmp/site
nvidia-smi -L
NGPU=$(python3 -c "import torch;print(torch.cuda.device_count())")
python3 -c "import torch,ray,megatron.core,mbridge,msprobe,tensordict,verl
import transformers; print('imports ok', torch.__version__, megatron.core.__version__, verl.__version__, transformers.__version__)" 2>&1 | tail -3
W=/tmp/w; R=/tmp/runs; mkdir -p $W $R
run() {  # name tp env...
  local name=$1 tp=$2; shift 2
  local launch="python3"
  [ "$tp" = 1 ] || launch="python3 -m torch.distributed.run --nproc_per_node $tp --master_port 29611"
  local t0; t0=$(date +%s)
  env VC_TEST_DEVICE=cuda VC_TEST_WORK=$W VC_TEST_TP="$tp" "$@" $launch \
    "$B/wt/tests/patches/megatron_driver.py" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s"; grep -a VC_REPORT "$OUT/$name.log" | cut -c1-1500
  grep -a -E "Error|error:" "$OUT/$name.log" | grep -v Warning | tail -4
}
A=VERL_CONSISTENCY_ACTOR_CONFIG; D=VERL_CONSISTENCY_RUN_DIR
# run folders: <tag>-<date>-<time>-<seq>; the next set's get their own tag and sequence numbers
if [ "$(cat "$B/.pin-set" 2>/dev/null)" = next ]; then
  T1=mcorenextstats-20261201-000000-0041; T2=mcorenexttensor-20261201-000000-0042
  T3=mcorenexttp2-20261201-000000-0043; T4=benchnext-20261201-000000-0044
else
  T1=mcorestats-20261130-000000-0021; T2=mcoretensor-20261130-000000-0022
  T3=mcoretp2-20261130-000000-0023; T4=bench-20261130-000000-0024
fi
if [ "$STAGE" = all ] || [ "$STAGE" = func ]; then
  run tp1 1 DUMP_ON=1 DUMP_PHASE=all $A="$B/statistics.json" $D=$R/$T1 \
    VC_TEST_EXPORT=$R/weights.safetensors
  run tensor1 1 DUMP_ON=1 DUMP_PHASE=log_prob $A="$B/tensor.json" $D=$R/$T2
  if [ "$(cat "$B/.pin-set" 2>/dev/null)" = next ]; then  # verl 0.9.1's default bshd padding kept
    run padmax1 1 VC_TEST_PAD_BSHD_MAX=1 DUMP_ON=1 DUMP_PHASE=log_prob $A="$B/statistics.json" \
      $D=$R/mcorenextpadmax-20261201-000000-0045
  fi
  if [ "$NGPU" -ge 2 ]; then
    run tp2 2 DUMP_ON=1 DUMP_PHASE=all $A="$B/statistics.json" $D=$R/$T3
  fi
fi
if [ "$STAGE" = all ] || [ "$STAGE" = bench ]; then
  run bench05b 1 VC_TEST_MODEL=qwen2-0.5b VC_TEST_BENCH="${BENCH_N:-5}" VC_TEST_BENCH_TOKENS=512 DUMP_PHASE=all \
    $A="$B/statistics.json" $D=$R/$T4
  rm -rf $R/bench-*/actor/*/step*
fi
tar czf "$OUT/runs.tgz" -C $R . && ls -la "$OUT"
