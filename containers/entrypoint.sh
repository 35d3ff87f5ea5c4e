#!/bin/sh
# Image entrypoint. SageMaker training starts the container as `IMAGE train`;
# anything else (a processing step's own entrypoint bypasses this script) runs
# as given, so `docker run IMAGE python -m steps.validate ...` works too.
set -eu

case "${1:-}" in
    train)
        shift
        exec python -m steps.train "$@"
        ;;
    "")
        echo "usage: IMAGE train | IMAGE python -m steps.<validate|evaluate|approve> ARGS" >&2
        exit 64
        ;;
    *)
        exec "$@"
        ;;
esac
