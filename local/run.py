"""`make local-run`: the whole pipeline on this machine, offline.

Starts moto (server mode) and the local training-session service on
127.0.0.1, generates the toy GSM8K-format dataset and uploads it to moto S3,
builds build/pipeline.json exactly as `make pipeline-definition` does, runs
that definition with the local interpreter (EvaluateModel grades the base model
and the trained adapter on the same questions), and leaves runs/<run-id>/ with
the reports (evaluation_base.json: the base model's half of evaluation.json),
the rollouts, curves.png and a summary. Every process it started is stopped,
also on Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from local import report
from local.pipeline_runner import LocalExecution, PipelineFailed, StepRecord
from local.stack import ROOT, LocalStack
from local.toy_data import write_split
from pipeline import budget
from pipeline.config import load
from pipeline.start import check_params
from steps.cli import Refused, parse_pairs
from steps.platform import tracking
from steps.platform.versions import require_training_session_sdk


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m local.run", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "config" / "local.yaml"))
    p.add_argument("--train-rows", type=int, default=2000)
    p.add_argument("--eval-rows", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="pipeline parameter override")
    p.add_argument("--runs-dir", default=str(ROOT / "runs"))
    p.add_argument("--definition-out", default=str(ROOT / "build" / "pipeline.json"))
    p.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    return p.parse_args(argv)


class Progress:
    """Step status lines, and one compact line per training step."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started: dict[str, float] = {}

    def status(self, rec: StepRecord) -> None:
        if rec.status == "Executing":
            self.started[rec.name] = time.monotonic()
            print(f"[{rec.name}] started ({rec.type})", flush=True)
            return
        secs = time.monotonic() - self.started.get(rec.name, time.monotonic())
        extra = f": {rec.message}" if rec.message else ""
        print(f"[{rec.name}] {rec.status} in {secs:.1f}s{extra}", flush=True)

    def line(self, step: str, line: str) -> None:
        if line.startswith("error:") or line.startswith("stopped:"):
            print(f"[{step}] {line}", flush=True)
        elif not self.quiet and line.startswith(("train:", "eval:", "done:", "approve:")):
            print(f"[{step}] {line}", flush=True)


def build_definition(config: str, out: str) -> dict[str, Any]:
    from pipeline.definition import write_definition

    path = write_definition(config, out)
    return json.loads(Path(path).read_text())


def upload_dataset(s3: Any, bucket: str, run_dir: Path, rows: tuple[int, int], seed: int) -> dict[str, str]:
    train, evaluation = write_split(run_dir / "data", rows[0], rows[1], seed)
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    uris = {}
    for name, path in (("train", train), ("eval", evaluation)):
        key = f"data/{name}/{Path(path).name}"
        s3.upload_file(str(path), bucket, key)
        uris[name] = f"s3://{bucket}/data/{name}/"
    return uris


def main(argv: Sequence[str] | None = None) -> int:
    require_training_session_sdk()
    args = parse_args(argv)
    params = parse_pairs(args.param, "--param", example="BatchSize=64")
    run_id = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.runs_dir) / run_id
    workdir = run_dir / "work"
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress(args.quiet)
    t0 = time.monotonic()
    definition = build_definition(args.config, args.definition_out)
    steps = len(definition["Steps"])
    print(f"local-run {run_id}: definition {args.definition_out} ({steps} top-level steps)", flush=True)
    declared = {p["Name"]: p["Type"] for p in definition["Parameters"]}
    execution_config = check_params(params, declared, args.config)
    print(budget.describe(execution_config.dapo, prices=execution_config.session.prices), flush=True)
    failure: PipelineFailed | None = None
    cfg = load(args.config)[0]
    experiment = cfg.experiment_name
    # What SageMaker's MLflow tracking server is on AWS: a local store every local run logs to.
    tracking_env = {tracking.ENV_TRACKING_URI: report.mlflow_store(Path(args.runs_dir), experiment),
                    tracking.ENV_EXPERIMENT: experiment}
    with LocalStack(log_path=run_dir / "training-session-service.log") as stack:
        print(f"local-run {run_id}: moto {stack.moto_url}, training-session service {stack.service_url}", flush=True)
        env = {**stack.env(), **tracking_env}
        s3 = stack.s3()
        bucket = _bucket_of(definition)
        uris = upload_dataset(s3, bucket, run_dir, (args.train_rows, args.eval_rows), args.seed)
        params = {"TrainDataS3Uri": uris["train"], "EvalDataS3Uri": uris["eval"], **params}
        execution = LocalExecution(definition, params, s3, workdir, env, execution_id=run_id,
                                   pipeline_name=cfg.name, on_line=progress.line, on_status=progress.status)
        try:
            execution.run()
        except PipelineFailed as exc:
            failure = exc
        report.collect(workdir, run_dir)  # with evaluation_base.json, from EvaluateModel's paired evaluation
        sessions = stack.sessions()
        package = report.registry_entry(run_dir, env)
    summary = report.summarize(run_dir, execution.records, failure, time.monotonic() - t0, sessions, package)
    print(summary, flush=True)
    return 0 if failure is None else 1


def _bucket_of(definition: dict[str, Any]) -> str:
    """The bucket the pipeline's own outputs go to (from the definition's S3 URIs)."""
    import re

    buckets = re.findall(r"s3://([a-z0-9.\-]+)/", json.dumps(definition))
    if not buckets:
        raise SystemExit("error: the pipeline definition names no S3 bucket; set pipeline.default_bucket in the config")
    return max(set(buckets), key=buckets.count)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: every process this run started has been stopped", file=sys.stderr)
        sys.exit(130)
