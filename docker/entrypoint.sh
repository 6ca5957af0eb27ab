#!/bin/sh
# The image's ENTRYPOINT: load CANN's environment (docker/cann-env.sh), then run the bundle's command.
. /etc/profile.d/verl-consistency-cann.sh
exec verl-consistency "$@"
