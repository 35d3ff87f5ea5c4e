"""``python -m local.training_session``: serve the local training-session service.

Prints ``listening on http://HOST:PORT`` once it accepts connections (``--port 0``
picks a free port and prints the real one) and serves until SIGTERM or SIGINT.
Point the SDK at it with::

    export SAGEMAKER_TRAINING_SESSION_ENDPOINT=http://HOST:PORT
    export SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT=http://HOST:PORT

Fault flags override the ``LOCAL_TS_*`` environment variables (see ``faults.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading

from local.training_session.faults import ENV_VARS, Faults
from local.training_session.server import start_service


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m local.training_session", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    p.add_argument("--state-dir", help="persist model packages here, so a restarted service still serves them")
    faults = p.add_argument_group("fault injection (default: none; env: " + ", ".join(ENV_VARS.values()) + ")")
    faults.add_argument("--latency-ms", type=int, help="service time added to every runtime operation")
    faults.add_argument("--throttle-rate", type=float, help="fraction of runtime submits answered 429")
    faults.add_argument("--throttle-limit", type=int, help="most throttles of one request (default 2)")
    faults.add_argument("--fail-rate", type=float, help="fraction of operations that end Failed")
    faults.add_argument("--sampling-fail-rate", type=float, help="fraction of sampling operations that end Failed")
    faults.add_argument("--fail-session-after", type=int, help="a session fails after this many operations")
    faults.add_argument("--fault-seed", dest="seed", type=int, help="seed for the fault rates")
    return p


def _faults(args: argparse.Namespace) -> Faults:
    """Environment first, then the flags that were given."""
    values = Faults.from_env().to_dict()
    for field in dataclasses.fields(Faults):
        flag = getattr(args, field.name, None)
        if flag is not None:
            values[field.name] = flag
    return Faults(**values)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        faults = _faults(args)
    except ValueError as e:
        parser.error(str(e))
    try:
        service = start_service(args.host, args.port, faults, state_dir=args.state_dir)
    except OSError as e:
        print(f"cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"listening on {service.url}", flush=True)
    stop.wait()
    service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
