"""``python -m local.sample RUN_ID --prompt TEXT [--n N]``: try a finished local run's adapter.

``make sample MODEL=<run id> PROMPT="..."``: the local form of ``pipeline.sample``, the same code. The run's
model.json names the adapter's model package and the config it was trained with; the local training-session
service is started on the run's ``service-state/`` (its model packages, as a resume starts it) on 127.0.0.1,
the SDK is pointed at it through its own endpoint overrides, and the service is stopped at the end, however this
ends. moto is not needed: the packages, the Hub record of the toy's tokenizer and the sessions are all the
service's.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from local.stack import REGION, ROOT, SERVICE_GRACE_SECONDS
from steps.cli import Refused, run_step
from steps.config import RunConfig, config_from_dict
from steps.platform import files
from steps.platform.versions import require_training_session_sdk

SERVICE_STATE = "service-state"
#: The SDK's warning that the endpoint is http://: the local service on 127.0.0.1 is.
LOCAL_ENDPOINT_WARNINGS = "sagemaker.train.training_session._endpoints"


def finished_run(runs_dir: Path, run_id: str) -> tuple[Path, dict]:
    """The run's folder and its model.json, refused (naming what is missing) when there is no adapter to use."""
    run_dir = runs_dir / run_id
    if not run_dir.is_dir():
        runs = sorted(p.parent.name for p in runs_dir.glob("*/model.json")) if runs_dir.is_dir() else []
        raise Refused(f"{run_dir} does not exist; the local runs with a trained adapter: {', '.join(runs) or 'none'}")
    model = run_dir / "model.json"
    if not model.is_file():
        from local.report import resume_command  # here: the report's imports are not make sample's

        raise Refused(f"{model} does not exist: run {run_id} has no trained adapter (TrainDAPO did not finish); "
                      f"resume it with: {resume_command(run_dir)}")
    if not (run_dir / SERVICE_STATE).is_dir():
        raise Refused(f"{run_dir / SERVICE_STATE} does not exist: this run's adapter weights are gone (runs that "
                      "succeeded before local runs kept them removed them); train a new one with make local-run")
    return run_dir, files.read_json(model, "Train a new adapter with make local-run.")


def keep_only_the_adapter(run_dir: Path) -> None:
    """A run that succeeded has nothing to resume: of the local service's model packages only the trained adapter's
    stays (the sampler weights model.json names, and its registry entry), for ``make sample`` and ``--reevaluate``;
    the training states and the earlier steps' sampler weights go. Without a model.json nothing is worth keeping."""
    state, model = run_dir / SERVICE_STATE, run_dir / "model.json"
    arn = files.read_json(model, "Nothing was removed.").get("model_package_arn") if model.is_file() else None
    if arn is None:
        shutil.rmtree(state, ignore_errors=True)
        return
    for meta in sorted((state / "packages").glob("*/*.json")):
        if json.loads(meta.read_text()).get("arn") != arn:
            meta.unlink()  # first: a package without its entry is never served, one without weights would be
            meta.with_suffix(".npz").unlink(missing_ok=True)


@contextmanager
def local_service(run_dir: Path) -> Iterator[str]:
    """The local training-session service on the run's model packages, and this process's AWS environment pointed
    at it (restored afterwards); yields its URL."""
    from local.stack import _start_service, environment, stop_process

    with open(run_dir / "training-session-service.log", "a") as log:
        proc, url = _start_service(["--state-dir", str(run_dir / SERVICE_STATE)], log)
        env = {"SAGEMAKER_TRAINING_SESSION_ENDPOINT": url, "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": url,
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
               "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "SAGEMAKER_VALIDATE_ROLE": "false"}
        try:
            with environment(env):
                yield url
        finally:
            stop_process(proc, SERVICE_GRACE_SECONDS)


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline import sample

    p = argparse.ArgumentParser(prog="python -m local.sample", description=__doc__.split("\n")[0])
    p.add_argument("run_id", metavar="RUN_ID", help="a local run whose TrainDAPO finished (runs/RUN_ID/)")
    p.add_argument("--runs-dir", default=str(ROOT / "runs"), help="where the local runs are (default: runs/)")
    sample.add_arguments(p)

    def body() -> int:
        sample.quiet_logging(LOCAL_ENDPOINT_WARNINGS)
        args = p.parse_args(argv)
        run_dir, model = finished_run(Path(args.runs_dir), args.run_id)
        cfg: RunConfig = config_from_dict(model["config"], source=f"{run_dir / 'model.json'}: config")
        request = sample.request_from(args, model["model_package_arn"])
        with local_service(run_dir):
            return sample.try_adapter(cfg, request)

    require_training_session_sdk()  # exits 2 naming the fix, before the step does anything
    return run_step(body, hint=lambda: "nothing is left running: the local service and its session were stopped",
                    terminal=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: the local service and its session were stopped", file=sys.stderr)
        sys.exit(130)
