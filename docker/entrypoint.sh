#!/bin/sh
# The image's ENTRYPOINT: load CANN's environment, then run the bundle's command.
#
# The Ascend base images install CANN under /usr/local/Ascend and expect its set_env.sh to be
# sourced (an interactive shell does that through ~/.bashrc). A container started straight into
# `verl-consistency` would otherwise launch verl, vLLM and torch_npu without the ASCEND_* and
# library paths. Files that are absent (the CPU stand-in base used by CI) are skipped.
for f in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh; do
    if [ -f "$f" ]; then
        # shellcheck disable=SC1090
        . "$f"
    fi
done
exec verl-consistency "$@"
