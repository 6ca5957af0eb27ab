# Load CANN's environment when the image has it; installed as /etc/profile.d/verl-consistency-cann.sh.
#
# The Ascend base images install CANN under /usr/local/Ascend and expect its set_env.sh to be
# sourced. Two kinds of process start in this image without an interactive shell: the bundle's
# own command (docker/entrypoint.sh sources this file) and the Ray nodes that KubeRay starts
# with a login shell (`bash -lc`, which reads /etc/profile.d/). Files that are absent (the CPU
# stand-in base used by CI) are skipped.
for _vc_env in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh; do
    if [ -f "$_vc_env" ]; then
        # shellcheck disable=SC1090
        . "$_vc_env"
    fi
done
unset _vc_env
