"""``python -m local.training_session``: serve the local training-session service.

Prints ``listening on http://HOST:PORT`` once it accepts connections (``--port 0``
picks a free port and prints the real one) and serves until SIGTERM or SIGINT, or, with
``--stop-when-stdin-closes``, until its stdin ends: the process that started it holds the other
end, so the service ends with that process however it ends (local/stack.py).
Point the SDK at it with::

    export SAGEMAKER_TRAINING_SESSION_ENDPOINT=http://HOST:PORT
    export SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT=http://HOST:PORT

Fault, cost-model and sickness flags override the ``LOCAL_TS_*`` environment variables
(see ``faults.py``, ``costs.py`` and ``sickness.py``).

Logs what an operator needs on stderr at INFO, one line each: where it listens,
each session created, stopped, failed or deleted, each operation that failed or
request that was refused (with its error), each fault injected and each change of
the fault or cost settings. No line per request.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading

from local.training_session import costs as cost_model
from local.training_session.costs import Costs
from local.training_session.faults import ENV_VARS, Faults
from local.training_session.server import start_service
from local.training_session.sickness import ENV_VARS as SICK_ENV_VARS
from local.training_session.sickness import Sickness


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m local.training_session", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    p.add_argument("--state-dir", help="persist model packages here, so a restarted service still serves them")
    p.add_argument("--stop-when-stdin-closes", action="store_true",
                   help="also stop when stdin reaches its end (the starting process died, or closed the pipe)")
    Faults.add_flags(p.add_argument_group("fault injection (default: none; env: " + ", ".join(ENV_VARS.values()) + ")"))
    Costs.add_flags(p.add_argument_group("cost model (default: off; env: " + ", ".join(cost_model.ENV_VARS.values())
                                         + ")"))
    Sickness.add_flags(p.add_argument_group("the toy driven sick, for the health guards (default: healthy; env: "
                                            + ", ".join(SICK_ENV_VARS.values()) + ")"))
    return p


def _settings(kind: type[Faults] | type[Costs] | type[Sickness], args: argparse.Namespace) -> Faults | Costs | Sickness:
    """Environment first, then the flags that were given."""
    return kind.overridden(kind.from_env(), {f.name: getattr(args, f.name, None) for f in dataclasses.fields(kind)})


log = logging.getLogger("local.training_session")


def main(argv: list[str] | None = None) -> int:
    _log_to_stderr()
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        faults, costs, sickness = _settings(Faults, args), _settings(Costs, args), _settings(Sickness, args)
    except ValueError as e:
        parser.error(str(e))
    try:
        service = start_service(args.host, args.port, faults, costs=costs, sickness=sickness,
                                state_dir=args.state_dir)
    except OSError as e:
        print(f"cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.stop_when_stdin_closes:
        threading.Thread(target=_stop_at_end_of_stdin, args=(stop,), name="stdin-watch", daemon=True).start()
    print(f"listening on {service.url}", flush=True)
    log.info("listening on %s (faults: %s; cost model: %s; sickness: %s)", service.url, _changed(faults),
             _changed(costs) if costs.enabled else "off", _changed(sickness))
    stop.wait()
    log.info("stopping: %d sessions", len(service.sessions()))
    service.stop()
    return 0


def _stop_at_end_of_stdin(stop: threading.Event) -> None:
    sys.stdin.buffer.read()  # nothing is ever written: this returns when every writer has closed its end
    if not stop.is_set():
        log.info("stdin closed: the process that started the service has ended or let it go")
        stop.set()


def _changed(settings: Faults | Costs | Sickness) -> str:
    """The settings that differ from the defaults, or "none"."""
    default = type(settings)()
    return ", ".join(f"{k}={v}" for k, v in settings.to_dict().items() if getattr(default, k) != v) or "none"


def _log_to_stderr() -> None:
    """One line per event, with a timestamp; the SDK's and botocore's own chatter stays at WARNING."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("local.training_session").setLevel(logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
