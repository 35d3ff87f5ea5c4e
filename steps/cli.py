"""What the four step entry points share: one exit-code policy, one KEY=VALUE parser, and how a message names a
setting: as the user typed it (:func:`option`, :func:`parameter`).

Exit codes (SageMaker shows the code and the log's last lines as the failure reason):

    0    done
    2    refused input (:class:`Refused`): the message names the file, row, field or
         setting and what to change; running again as it is will fail again
    1    failure: anything else (a bug, the machine, the service); the message says
         what running the step again does
    143  SIGTERM: SageMaker stopped the job (128 + 15)
    130  SIGINT: Ctrl-C (128 + 2); stopped as on SIGTERM
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

EXIT_DONE, EXIT_FAILED, EXIT_REFUSED, EXIT_TERMINATED = 0, 1, 2, 143
#: The signals that stop a step: SageMaker's SIGTERM, and a terminal's Ctrl-C. Both unwind the same way, and
#: whichever comes second finds the first unwinding: a Ctrl-C reaches a local run's step as SIGINT and, a moment
#: later, the runner's SIGTERM; that SIGTERM used to cut short the stop of the session the SIGINT had begun.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Refused(Exception):
    """Input the step will not run on; the message says what is wrong and what to change."""


class Terminated(BaseException):
    """SIGTERM (SageMaker stopping the job) or SIGINT arrived: unwind so that billed resources are stopped.

    A BaseException, like KeyboardInterrupt, so no ``except Exception`` on the way
    (a sample retry, say) mistakes it for a failed request and carries on."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Who the user typed the command to, so that a message names the setting as they typed it: ``make`` (the
#: Makefile's targets set it), ``local.run`` (``python -m local.run``, for the steps it runs); unset: the entry
#: point's own options.
ENV_CALLER = "DAPO_CALLER"
#: The make variable behind each option the Makefile's targets pass on (make local-run DATA=dir: --data dir).
MAKE_VARIABLES = {"--param": "PARAMS", "--data": "DATA", "--task": "TASK", "--config": "CONFIG", "--resume": "RESUME",
                  "--reevaluate": "REEVALUATE", "--eval-data": "EVAL_DATA", "--source": "SOURCE", "--model": "MODEL",
                  "--prompt": "PROMPT", "--n": "N", "--execution": "EXECUTION", "--verbose": "VERBOSE=1",
                  "--update-approval": "UPDATE_APPROVAL=1", "--wait": "WAIT=1"}


def caller() -> str:
    return os.environ.get(ENV_CALLER, "")


def option(flag: str, value: Any = None) -> str:
    """The option ``flag`` (given ``value``) as the user typed it: ``DATA=my-data`` under make, else
    ``--data my-data``; an option make has no variable for keeps its own spelling."""
    variable = MAKE_VARIABLES.get(flag) if caller() == "make" else None
    if variable:
        return variable if "=" in variable else f"{variable}={'' if value is None else value}"
    return flag if value is None else f"{flag} {value}"


def parameter(name: str, value: Any = "...", flag: str | None = None) -> str:
    """The pipeline parameter ``name`` set to ``value`` as the user typed it: ``PARAMS="BatchSize=8"`` under make,
    ``--param BatchSize=8`` under ``python -m local.run``. ``flag``: the entry point's own option it arrives as
    (``--batch-size``): what a step run by hand names, with the parameter it comes from in a pipeline."""
    if caller() == "make":
        return f'PARAMS="{name}={value}"'
    if caller() or flag is None:
        return f"--param {name}={value}"
    return f"{flag} {value}, the pipeline's {name} parameter"


def parse_pairs(items: Iterable[str], flag: str, example: str = "batch_size=64") -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; a malformed item is refused, naming the flag."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise Refused(f"{flag} {item!r}: expected NAME=VALUE, e.g. {flag} {example}")
        pairs[key.strip()] = value.strip()
    return pairs


@dataclass
class _SigtermHandler:
    """Raises :class:`Terminated` in the main thread, and again until it is seen to propagate (for SIGTERM and
    SIGINT alike: the second of the two finds the first propagating and does nothing).

    A signal handler runs wherever the main thread is, a garbage collector's weakref callback included, and an
    exception raised there is printed ("Exception ignored in ...") and dropped: the step would train on to its
    end. So after raising, the handler sends this process SIGTERM again every ``again_seconds`` until a repeat
    finds the exception on its way out (``sys.exc_info()`` shows it in the ``finally`` blocks that stop the
    session; that repeat does nothing, so the cleanup is never interrupted) or :func:`run_step` has it."""

    again_seconds: float = 0.2
    stop: threading.Event = field(default_factory=threading.Event)  # the exception is propagating or handled
    _repeating: bool = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():
            return
        if _unwinding(sys.exc_info()[1]):
            self.stop.set()
            return
        if not self._repeating:
            self._repeating = True
            threading.Thread(target=self._repeat, args=(signum,), name="sigterm-repeat", daemon=True).start()
        raise Terminated(signum)

    def _repeat(self, signum: int) -> None:
        while not self.stop.wait(self.again_seconds):
            os.kill(os.getpid(), signum)


def stopping() -> bool:
    """Whether a stop signal's :class:`Terminated` is propagating where this is called (a ``finally`` block): the
    cleanup then has a deadline (the supervisor's grace, SageMaker's SIGKILL), and nothing but the session's stop
    may wait long."""
    return _unwinding(sys.exc_info()[1])


def _unwinding(exc: BaseException | None) -> bool:
    """``exc`` is a Terminated, or was raised while one was being handled."""
    while exc is not None:
        if isinstance(exc, Terminated):
            return True
        exc = exc.__context__
    return False


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _error(line: str, terminal: bool) -> None:
    if terminal:
        from steps.terminal import say  # here: a step's container never needs it

        say(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


def run_step(body: Callable[[], int], *, hint: Callable[[], str] = lambda: "running the step again starts it over",
             describe: Callable[[BaseException], str] = _describe, terminal: bool = False) -> int:
    """Run an entry point's body under the exit-code policy; print one ``error:`` line on failure.

    ``hint`` is evaluated when the step fails (it may read a checkpoint written
    meanwhile); ``describe`` words an unexpected exception. ``terminal``: a command a person reads (make
    check-task, make sample), its refusal wrapped at 100 columns; a step's stays one line, for its log's reader.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    on_sigterm = _SigtermHandler()
    previous = {sig: signal.signal(sig, on_sigterm) for sig in STOP_SIGNALS}
    try:
        return body()
    except SystemExit as exc:  # argparse's usage errors and --help: already explained
        return exc.code if isinstance(exc.code, int) else EXIT_FAILED
    except Refused as exc:
        _error(f"error: {exc}", terminal)
        return EXIT_REFUSED
    except Terminated as exc:
        on_sigterm.stop.set()
        _error(f"error: {exc} received; {hint()}", terminal)
        return 128 + exc.signum  # EXIT_TERMINATED for SIGTERM, 130 for SIGINT
    except Exception as exc:  # noqa: BLE001 - the policy: anything not refused is a failure, with a hint
        logging.getLogger("steps").error("the step failed", exc_info=True)  # the traceback, for a bug
        _error(f"error: {describe(exc)}; {hint()}", terminal)
        return EXIT_FAILED
    finally:
        on_sigterm.stop.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
