#!/bin/sh
# Image entrypoint. SageMaker training starts the container as `IMAGE train`;
# anything else (a processing step's own entrypoint bypasses this script) runs
# as given, so `docker run IMAGE python -m steps.validate ...` works too.
# `train` runs under steps.supervise (PID 1): if the out-of-memory killer or any
# other signal kills the step's process, the supervisor stops its training
# session before the container exits, and exits with the step's code.
set -eu

case "${1:-}" in
    train)
        shift
        exec python -m steps.supervise -- python -m steps.train "$@"
        ;;
    "")
        echo "usage: IMAGE train | IMAGE python -m steps.<validate|evaluate|approve> ARGS" >&2
        exit 64
        ;;
    *)
        exec "$@"
        ;;
esac
