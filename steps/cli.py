"""What the four step entry points share: one exit-code policy and one KEY=VALUE parser.

Exit codes (SageMaker shows the code and the log's last lines as the failure reason):

    0    done
    2    refused input (:class:`Refused`): the message names the file, row, field or
         setting and what to change; running again as it is will fail again
    1    failure: anything else (a bug, the machine, the service); the message says
         what running the step again does
    143  SIGTERM: SageMaker stopped the job (128 + 15)
"""
from __future__ import annotations

import logging
import signal
import sys
from typing import Any, Callable, Iterable

from steps.platform.versions import require_training_session_sdk

EXIT_DONE, EXIT_FAILED, EXIT_REFUSED, EXIT_TERMINATED = 0, 1, 2, 143


class Refused(Exception):
    """Input the step will not run on; the message says what is wrong and what to change."""


class Terminated(BaseException):
    """SIGTERM arrived (SageMaker stopping the job): unwind so that billed resources are stopped.

    A BaseException, like KeyboardInterrupt, so no ``except Exception`` on the way
    (a sample retry, say) mistakes it for a failed request and carries on."""


def parse_pairs(items: Iterable[str], flag: str, example: str = "batch_size=64") -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; a malformed item is refused, naming the flag."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise Refused(f"{flag} {item!r}: expected NAME=VALUE, e.g. {flag} {example}")
        pairs[key.strip()] = value.strip()
    return pairs


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def run_step(body: Callable[[], int], *, hint: Callable[[], str] = lambda: "running the step again starts it over",
             describe: Callable[[BaseException], str] = _describe) -> int:
    """Run an entry point's body under the exit-code policy; print one ``error:`` line on failure.

    ``hint`` is evaluated when the step fails (it may read a checkpoint written
    meanwhile); ``describe`` words an unexpected exception.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        require_training_session_sdk()
        return body()
    except SystemExit as exc:  # argparse's usage errors and --help, the SDK guard: already explained
        return exc.code if isinstance(exc.code, int) else EXIT_FAILED
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    except Terminated:
        print(f"error: SIGTERM received; {hint()}", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    except Exception as exc:  # noqa: BLE001 - the policy: anything not refused is a failure, with a hint
        logging.getLogger("steps").error("the step failed", exc_info=True)  # the traceback, for a bug
        print(f"error: {describe(exc)}; {hint()}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)
