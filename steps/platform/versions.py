"""Fail fast when the installed SDK cannot talk to the training-session API.

sagemaker-train < 1.27 has no ``sagemaker.train.training_session``; a botocore
older than 1.44 has no ``CreateTrainingSession`` operation and no
``sagemakertrainingsessionruntime`` service model. Either one otherwise shows
up much later as an AttributeError or UnknownServiceError deep inside a run
that may already have billed resources, so every entry point calls
:func:`require_training_session_sdk` before its first AWS call.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import sys
from dataclasses import dataclass
from typing import Any, Callable

FIX = "pip install 'sagemaker-train>=1.27' 'botocore>=1.44.8,<1.45' 'boto3>=1.44.8,<1.45'"
#: Where the SDK is on a workstation: the project's venv, which `make install` creates and every make target uses.
#: A shell without it active (`python -m local.run` in the shell `make local-run` was typed in) has no SDK, and
#: the fix there is the venv, not a pip install into the system's Python.
VENV_FIX = "use the project's venv: `make install` once, then the make targets or `.venv/bin/python -m MODULE`"


@dataclass(frozen=True)
class SdkProblem:
    what: str


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def find_sdk_problems(import_module: Callable[[str], Any] = importlib.import_module,
                      botocore_session: Any = None) -> list[SdkProblem]:
    """Return what is missing; an empty list means the SDK is usable.

    The import function and botocore session are parameters so tests can point
    the check at an older SDK layout without uninstalling anything.
    """
    problems: list[SdkProblem] = []
    try:
        import_module("sagemaker.train.training_session")
    except ImportError as exc:
        problems.append(SdkProblem(f"sagemaker.train.training_session cannot be imported ({exc})"))
    try:
        import botocore.session

        session = botocore_session or botocore.session.get_session()
        if "sagemakertrainingsessionruntime" not in session.get_available_services():
            problems.append(SdkProblem("botocore has no 'sagemakertrainingsessionruntime' service model"))
        try:
            operations = session.get_service_model("sagemaker").operation_names
        except Exception:  # no sagemaker model at all
            operations = []
        if "CreateTrainingSession" not in operations:
            problems.append(SdkProblem("botocore's 'sagemaker' model has no CreateTrainingSession operation"))
    except ImportError as exc:
        problems.append(SdkProblem(f"botocore cannot be imported ({exc})"))
    return problems


def describe_installed() -> str:
    return ", ".join(f"{dist} {_version(dist)}" for dist in ("sagemaker-train", "botocore", "boto3"))


def require_training_session_sdk(problems: list[SdkProblem] | None = None) -> None:
    """Exit with an actionable message unless the training-session API is usable: the project's venv first (a
    workstation's usual cause is a shell without it), a pip install for an image or another environment."""
    problems = find_sdk_problems() if problems is None else problems
    if not problems:
        return
    lines = [f"  - {p.what}" for p in problems]
    sys.stderr.write(
        "error: the installed AWS SDK cannot use SageMaker training sessions:\n"
        + "\n".join(lines)
        + f"\n  installed: {describe_installed()} (for {sys.executable})"
        + f"\n  fix: {VENV_FIX};\n    elsewhere (an image, another environment): {FIX}\n"
    )
    raise SystemExit(2)
