#!/usr/bin/env bash
# A CIFAR-10 preset trained through the paper's whole schedule on a lent GPU,
# in calls of the device tool of at most 10 minutes each (docs/presets.md).
#
#   bash experiments/device_presets.sh NET [SECONDS] [keras-identity-train flags...]
#
# NET is a named configuration (resnet20, preact_resnet20, resnet56, resnet110,
# preact_resnet110, ...). The run trains on JAX into runs/presets/NET until it
# is complete or SECONDS (default 540) have passed; then SIGTERM makes the
# trainer save the step in progress and exit 75, and the next call, carrying
# runs/presets/NET back, resumes it. A complete run writes its model card.
# Either way the run directory comes back packed as $OUT/NET.tar.gz.
# Carry: .whl (Keras and what the image lacks), data_cifar (a copy of
# ../shared/data/cifar10-jpg.tar.gz: ../shared does not travel) and, from the
# second call on, runs/presets/NET.
set -uo pipefail
net=${1:?usage: device_presets.sh NET [SECONDS] [flags...]}
limit=${2:-540}
shift $(( $# < 2 ? $# : 2 ))
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p runs/presets
timeout -s TERM "$limit" python3 -m keras_identity_cli.train --backend=jax --model="$net" \
    --dataset=cifar10 --data_dir="${DATA_DIR:-data_cifar}" --model_dir="runs/presets/$net" \
    --verbose=2 "$@"
code=$?
tar czf "${OUT:-/tmp}/$net.tar.gz" -C runs/presets "$net"
echo "device_presets: $net exit status $code (0: complete, 75 or 124: stopped, resumable)"
