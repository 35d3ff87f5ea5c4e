"""``python -m local.training_session``: serve the local training-session service.

Prints ``listening on http://HOST:PORT`` once it accepts connections (``--port 0``
picks a free port and prints the real one) and serves until SIGTERM or SIGINT.
Point the SDK at it with::

    export SAGEMAKER_TRAINING_SESSION_ENDPOINT=http://HOST:PORT
    export SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT=http://HOST:PORT

Fault and cost-model flags override the ``LOCAL_TS_*`` environment variables (see
``faults.py`` and ``costs.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading

from local.training_session import costs as cost_model
from local.training_session.costs import Costs
from local.training_session.faults import ENV_VARS, Faults
from local.training_session.server import start_service


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m local.training_session", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    p.add_argument("--state-dir", help="persist model packages here, so a restarted service still serves them")
    Faults.add_flags(p.add_argument_group("fault injection (default: none; env: " + ", ".join(ENV_VARS.values()) + ")"))
    Costs.add_flags(p.add_argument_group("cost model (default: off; env: " + ", ".join(cost_model.ENV_VARS.values())
                                         + ")"))
    return p


def _settings(kind: type[Faults] | type[Costs], args: argparse.Namespace) -> Faults | Costs:
    """Environment first, then the flags that were given."""
    return kind.overridden(kind.from_env(), {f.name: getattr(args, f.name, None) for f in dataclasses.fields(kind)})


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        faults, costs = _settings(Faults, args), _settings(Costs, args)
    except ValueError as e:
        parser.error(str(e))
    try:
        service = start_service(args.host, args.port, faults, costs=costs, state_dir=args.state_dir)
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
