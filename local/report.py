"""The artifacts of a local run: reports copied out of the step work dirs, curves.png, the local MLflow
store, the model package's registry entry, a summary."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Sequence

from local import console
from steps.dapo import curves, rollouts
from steps.platform import files, tracking

# file name in the step work dirs -> (step, name in runs/<id>/)
ARTIFACTS = {
    "validation.json": "ValidateData",
    "metrics.jsonl": "TrainDAPO",
    "model.json": "TrainDAPO",
    "evaluation.json": "EvaluateModel",
    "predictions.jsonl": "EvaluateModel",
    # Every other answer of the evaluation, so its figures can be recomputed from the run folder (steps/evaluate.py).
    "predictions_base.jsonl": "EvaluateModel",
    "samples.jsonl": "EvaluateModel",
    "samples_base.jsonl": "EvaluateModel",
}


MLFLOW_DB = "mlflow.db"


def _read(path: Path) -> Any:
    """A step's report, for the run's folder and summary; a damaged one (steps/platform/files.py) is named in one
    warning and left out: the run's outcome is its steps' exit codes, not these copies."""
    try:
        return files.read_json(path, "The local run carries on without it.")
    except files.Damaged as exc:
        print("\n".join(console.fit(f"warning: {exc}")), flush=True)
        return None


def mlflow_store(runs_dir: Path, experiment: str) -> str:
    """The local MLflow store every local run logs to (``runs/mlflow.db``, artifacts in ``runs/mlartifacts/``),
    so runs with different parameters sit side by side in one experiment; returns its tracking URI.

    The experiment is created here, as a tracking server is provisioned before a pipeline logs to it:
    its artifact location beside the database (MLflow would otherwise use ./mlruns of the step's directory).
    Under a lock: two local runs starting at once would both create the database's tables, or the experiment.
    """
    import fcntl

    from mlflow.tracking import MlflowClient

    for name in ("mlflow", "alembic"):  # their INFO lines on creating the database
        logging.getLogger(name).setLevel(logging.WARNING)
    runs_dir.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{(runs_dir / MLFLOW_DB).resolve()}"
    with open(runs_dir / f"{MLFLOW_DB}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        client = MlflowClient(tracking_uri=uri)
        if client.get_experiment_by_name(experiment) is None:
            client.create_experiment(experiment, artifact_location=(runs_dir / "mlartifacts").resolve().as_uri())
    return uri


def _outputs(workdir: Path, step: str, name: str) -> list[Path]:
    if not (workdir / step).exists():
        return []
    return sorted(p for p in (workdir / step).rglob(name) if "input" not in p.parts)


def title(run_id: str, params: dict[str, str]) -> str:
    """What identifies a run in its pictures and records: its id and the parameters it overrode."""
    return f"local run {run_id}: {overrides(params)}"


def overrides(params: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "default parameters"


def collect(workdir: Path, run_dir: Path, title: str = "DAPO on the local toy task") -> None:
    for name, step in ARTIFACTS.items():
        found = _outputs(workdir, step, name)
        if found:
            shutil.copy(found[0], run_dir / name)
    write_base_evaluation(run_dir)
    # Rollouts (steps/dapo/rollouts.py): the in-training evaluations' (TrainDAPO), then the final one's.
    shown = [p for step in ("TrainDAPO", "EvaluateModel") for p in _outputs(workdir, step, rollouts.FILE)[:1]]
    if shown:
        files.write_text(run_dir / rollouts.FILE, "".join(p.read_text() for p in shown))
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        plot_curves(metrics, run_dir / "curves.png", title)
        run = _model(run_dir).get("mlflow")
        if run:  # the curves join the evaluation's artifacts in the training run
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=run["tracking_uri"]).log_artifact(run["run_id"], str(run_dir / "curves.png"))


def write_base_evaluation(run_dir: Path) -> None:
    """evaluation_base.json: the base model's figures of the paired evaluation, in evaluation.json's own layout
    (EvaluateModel graded both models in one step; SPEC lists the file)."""
    path = run_dir / "evaluation.json"
    base = (_read(path) or {}).get("base") if path.exists() else None
    if base:
        files.write_json(run_dir / "evaluation_base.json", {**base, "evaluated": "base_model"}, indent=2)


def registry_entry(run_dir: Path, env: dict[str, str]) -> dict[str, Any] | None:
    """The trained model package as the registry describes it (status, description, metadata)."""
    import boto3

    arn = _model(run_dir).get("model_package_arn")
    if not arn:
        return None
    sm = boto3.client("sagemaker", region_name=env["AWS_REGION"],
                      endpoint_url=env["SAGEMAKER_TRAINING_SESSION_ENDPOINT"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    described = sm.describe_model_package(ModelPackageName=arn)
    return {key: described.get(key) for key in
            ("ModelPackageArn", "ModelApprovalStatus", "ApprovalDescription", "CustomerMetadataProperties")}


def _model(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "model.json"
    return (_read(path) or {}) if path.exists() else {}


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        return files.read_records(path)
    except files.Damaged as exc:
        print("\n".join(console.fit(f"warning: {exc}")), flush=True)
        return []


def plot_curves(metrics: Path, out: Path, title: str) -> None:
    """The run's curves, with the base model's greedy accuracy at step 0 when it was evaluated."""
    base = metrics.parent / "evaluation_base.json"
    figures = (_accuracy(base), _accuracy(base, "accuracy_lenient")) if base.exists() else None
    curves.plot_curves(_records(metrics), out, title=title, base=figures)


# -- the run's MLflow run (TrainDAPO creates it; the local run names, tags and ends it) ----------
def mlflow_run(workdir: Path) -> dict[str, str] | None:
    """Where the run's MLflow run is: TrainDAPO keeps it in its checkpoint dir as soon as it starts tracking
    (model.json carries it only once training succeeded)."""
    found = _outputs(workdir, "TrainDAPO", tracking.RUN_FILE)
    ref = _read(found[0]) if found else None
    return ref if isinstance(ref, dict) and {"tracking_uri", "run_id"} <= ref.keys() else None


def reopen_mlflow_run(workdir: Path) -> None:
    """A resumed run's MLflow run is running again (the interrupted run ended it KILLED or FAILED)."""
    ref = mlflow_run(workdir)
    if ref:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=ref["tracking_uri"]).update_run(ref["run_id"], status="RUNNING")


def finish_mlflow_run(workdir: Path, run_id: str, params: dict[str, str], status: str | None,
                      outcome: str) -> str | None:
    """Name and tag the MLflow run after the local run and the parameters it overrode, end it with ``status``
    (FAILED, KILLED; None leaves what the steps set: FINISHED) and return its status; None: no run was tracked
    (the run ended before TrainDAPO began)."""
    ref = mlflow_run(workdir)
    if ref is None:
        return None
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=ref["tracking_uri"])
    client.update_run(ref["run_id"], name=f"{run_id} {overrides(params)}")
    tags = {"local_run.id": run_id, "local_run.parameters": overrides(params), "local_run.outcome": outcome[:4000],
            **{f"parameter.{k}": v for k, v in params.items()}}
    client.log_batch(ref["run_id"], tags=[RunTag(k, v) for k, v in tags.items()])
    if status:
        client.set_terminated(ref["run_id"], status=status)
    return client.get_run(ref["run_id"]).info.status


def _accuracy(path: Path, name: str = "accuracy") -> float | None:
    if not path.exists():
        return None
    figures = _read(path)
    return float(figures["metrics"][name]["value"]) if figures else None


def data_line(validation: dict) -> str:
    """Each split's rows kept of those read, and what was dropped by reason: nothing dropped in silence."""
    parts = []
    for name, split in (validation.get("splits") or {}).items():
        dropped = dict(split.get("rejected_by_reason") or {})
        if name == "train" and (validation.get("overlap") or {}).get("count"):
            dropped["also in eval"] = validation["overlap"]["count"]
        reasons = ", ".join(f"{reason} {n}" for reason, n in dropped.items())
        parts.append(f"{name} {split.get('kept')} of {split.get('rows')} rows kept"
                     + (f" (dropped: {reasons})" if reasons else ""))
    return "; ".join(parts) or json.dumps(validation.get("kept", {}))


def training_lines(run_dir: Path) -> list[str]:
    """What ValidateData kept and how the sampled accuracy moved; a stop before max_steps said plainly."""
    lines = []
    val = run_dir / "validation.json"
    if val.exists():
        v = _read(val) or {}
        lines.append(f"  data: {data_line(v)}")
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        steps = [r for r in _records(metrics) if r.get("kind") == "step"]
        if steps:
            first, last = steps[0], steps[-1]
            lines.append(f"  training: {len(steps)} steps, sampled accuracy {first['accuracy']:.2f} -> "
                         f"{last['accuracy']:.2f}, filtered fraction {first['filtered_frac']:.2f} -> "
                         f"{last['filtered_frac']:.2f}")
            lines += sampled_per_trained_lines(steps)
    model = _model(run_dir)
    if model.get("stopped_early"):
        lines.append(f"  training STOPPED EARLY after {model.get('steps_completed')} optimizer steps: "
                     f"{model.get('stop_reason')}")
    return lines


def resume_command(run_dir: Path, option: str = "--resume") -> str:
    """The command that continues the run (``option`` "--reevaluate": that evaluates it again), from the shell
    `make local-run` was typed in (no venv active): make's for the project's runs/, else the project venv's python
    with the run's --runs-dir. Printed on a line of its own, it is never wrapped (local/console.py)."""
    from local.stack import ROOT

    if run_dir.parent.resolve() == (ROOT / "runs").resolve():
        return f"make local-run {option.lstrip('-').upper()}={run_dir.name}"
    return f".venv/bin/python -m local.run --runs-dir {run_dir.parent} {option} {run_dir.name}"


def sampled_per_trained_lines(steps: Sequence[dict[str, Any]]) -> list[str]:
    """Completion tokens sampled per completion token trained over the run, and what selective rollouts skipped
    when they were on (``make bench`` measures the same run without them: bench/README.md)."""
    sampled = sum(r.get("sampled_completion_tokens", 0) for r in steps)
    trained = sum(r.get("tokens", 0) for r in steps)
    if not sampled or not trained:
        return []
    skipping = any("skipped_prompts" in r for r in steps)
    how = (f"selective rollouts on: {sum(r.get('skipped_prompts', 0) for r in steps)} prompts skipped"
           if skipping else "selective rollouts off")
    return [f"  sampled tokens per trained token: {sampled / trained:.2f} ({how})"]


def outcome(run_dir: Path, records: dict[str, Any], failure: Any, interrupted: bool) -> str:
    """Succeeded, failed where and why, or interrupted; with the resume command where resuming can help."""
    resume = f"; continue it with:\n    {resume_command(run_dir)}"  # on a line of its own: never wrapped
    return ("INTERRUPTED" + resume if interrupted else "succeeded, model approved" if failure is None
            else f"FAILED at {failure.step}: {failure.message}"
            + (resume if _resumable(records.get(failure.step), failure.message) else ""))


def session_lines(sessions: list[dict] | None) -> list[str]:
    """The sessions the run created and how many are left running (the billing check)."""
    lines = []
    if sessions is None:
        lines.append("  training sessions: unknown (the training-session service could not say)")
    else:
        running = [s for s in sessions if s.get("status") not in ("Stopped", "Failed")]
        lines.append(f"  training sessions created: {len(sessions)}, left running: {len(running)}")
        if sessions:  # the pipeline's jobs name theirs after themselves
            lines.append("    " + ", ".join(f"{s['name']} {s['status']}" for s in sessions))
    return lines


def summarize(run_dir: Path, records: dict[str, Any], failure: Any, seconds: float, sessions: list[dict] | None,
              package: dict[str, Any] | None = None, *, parameters: dict[str, str] | None = None,
              notes: Sequence[str] = (), mlflow_status: str | None = None, interrupted: bool = False) -> str:
    """The run in a screenful, also written to summary.txt. ``sessions`` None: the service could not say."""
    lines = [f"== local run {run_dir.name} ({seconds:.0f}s) ==",
             f"  parameters: {overrides(parameters or {})}"]
    for rec in records.values():
        # The failed step's message is the outcome's, said once (below).
        message = "see the outcome" if failure is not None and rec.name == failure.step else rec.message
        lines.append(f"  {rec.name:<16} {rec.type:<11} {rec.status}{': ' + message if message else ''}")
    lines += training_lines(run_dir)
    lines += evaluation_lines(run_dir)
    lines += billing_lines(run_dir)
    lines.append(f"  outcome: {outcome(run_dir, records, failure, interrupted)}")
    lines += [f"  note: {note}" for note in notes]
    if package:
        metadata = " ".join(f"{k}={v}" for k, v in sorted((package.get("CustomerMetadataProperties") or {}).items()))
        lines.append(f"  model package: {package['ModelApprovalStatus']} {package['ModelPackageArn']}")
        lines.append(f"    {package_version_note(package['ModelPackageArn'])}")
        lines.append(f"    metadata: {metadata or '(none)'}")
    run = _model(run_dir).get("mlflow") or mlflow_run(run_dir / "work")
    if run:
        store = run["tracking_uri"]
        status = f" ({mlflow_status})" if mlflow_status else ""
        lines.append(f"  mlflow: run {run['run_id']}{status} in experiment '{run['experiment']}'; see it with:")
        lines.append(f"    {mlflow_command(store)}")
    lines += rollout_lines(run_dir, run)
    lines += session_lines(sessions)
    names = {p.name for p in run_dir.iterdir() if p.is_file()} | {"summary.txt"}  # written below
    lines.append(f"  artifacts in {run_dir}/:")
    lines.append(f"    {', '.join(sorted(names))}")
    if (run_dir / "logs").is_dir():
        lines.append(f"  each step's whole output in {run_dir / 'logs'}/:")
        lines.append(f"    {', '.join(sorted(p.name for p in (run_dir / 'logs').iterdir()))}; the service's and the "
                     "runner's own: training-session-service.log, local-run.log (above)")
    # Within the terminal's 100 columns: long lines wrapped, a path too long to share a line on its own.
    text = "\n".join(line for logical in lines for line in console.fit(logical))
    files.write_text(run_dir / "summary.txt", text + "\n")
    return text


def mlflow_command(store: str) -> str:
    """How to look at the local MLflow store: `make mlflow-ui` for the project's own, else the mlflow command."""
    from local.stack import ROOT

    if store == f"sqlite:///{(ROOT / 'runs' / MLFLOW_DB).resolve()}":
        return "make mlflow-ui   (http://127.0.0.1:5000)"
    return f"mlflow ui --backend-store-uri {store}"


def package_version_note(arn: str) -> str:
    """Why a fresh run's package is not version 1: every saveWeights (each step's sampler weights) and saveState
    (each checkpoint) registers a version in the session's group, as the training-session service does; the
    package approved or rejected is the last one, the final sampler weights."""
    group, _, version = arn.rpartition(":model-package/")[2].rpartition("/")
    if not version.isdigit() or int(version) <= 1:
        return f"(the final sampler weights, version {version or '?'} of {group or 'its group'})"
    return (f"(the final sampler weights: version {version} of {group}; versions 1-{int(version) - 1} are this "
            "run's earlier sampler weights and checkpoints, each registered as the service does)")


def _resumable(record: Any, message: str) -> bool:
    """A job step that failed, other than refusing its input (exit code 2: it would refuse it again), a step the
    dead service failed, or the runner itself (the stack did not start, say): a resume can do better."""
    if record is None or message.startswith(SERVICE_DIED):
        return True
    return getattr(record, "type", "") in ("Training", "Processing") and not message.startswith("exit code 2:")


#: How a step failure begins when the local training-session service had died (local/run.py): the service, not
#: the model or the data, is what failed.
SERVICE_DIED = "the local training-session service died"


def blame_dead_service(message: str, exit_code: int | None) -> str:
    """A failed step's message, saying first that the service it called had died (``exit_code``: the service's,
    None while it runs): the step's own error then only reports what it could not reach."""
    if exit_code is None or message.startswith(SERVICE_DIED):
        return message
    return f"{SERVICE_DIED} (exit code {exit_code}), so the step failed: {message}"


def _with_interval(metric: dict[str, Any]) -> str:
    return f"{metric['value']:.3f} (95% CI {metric['ci95_low']:.3f}-{metric['ci95_high']:.3f})"


def evaluation_lines(run_dir: Path) -> list[str]:
    """The paired evaluation: both accuracies with intervals, the difference with its interval, pass@k, maj@k."""
    path = run_dir / "evaluation.json"
    if not path.exists():
        return []
    evaluation = _read(path)
    if not evaluation:
        return []
    trained, base, gain = evaluation["metrics"], (evaluation.get("base") or {}).get("metrics"), \
        evaluation.get("improvement")
    if base is None or gain is None:  # an evaluation.json of before the paired evaluation
        return [f"  greedy eval accuracy: {trained['accuracy']['value']:.3f}"]
    lines = [f"  greedy eval accuracy on {evaluation['n']} held-out questions: trained "
             f"{_with_interval(trained['accuracy'])}, base {_with_interval(base['accuracy'])}",
             f"  improvement: {100 * gain['value']:+.1f} points (95% CI {100 * gain['ci95_low']:+.1f} to "
             f"{100 * gain['ci95_high']:+.1f}; {gain['trained_only_correct']} questions only the trained adapter got "
             f"right, {gain['base_only_correct']} only the base model; exact McNemar p={gain['p_value']:.2g})"]
    if "pass_at_k" in trained:
        k, temperature = trained["pass_at_k"]["k"], trained["pass_at_k"]["temperature"]
        lines.append(f"  {k} samples per question at temperature {temperature:g}: pass@{k} trained "
                     f"{trained['pass_at_k']['value']:.3f}, base {base['pass_at_k']['value']:.3f}; maj@{k} trained "
                     f"{trained['maj_at_k']['value']:.3f}, base {base['maj_at_k']['value']:.3f}; pass@1 trained "
                     f"{trained['pass_at_1']['value']:.3f}, base {base['pass_at_1']['value']:.3f}")
    return lines


def rollout_lines(run_dir: Path, run: dict[str, Any] | None) -> list[str]:
    """Where the evaluations' rollouts are: the JSONL here, the tables in the MLflow run."""
    path = run_dir / rollouts.FILE
    if not path.exists():
        return []
    records = _records(path)
    final = [r for r in records if r["model"] == "base"]  # EvaluateModel's rows begin with the base model's
    during = records[: records.index(final[0])] if final else records
    steps = sorted({r["step"] for r in during})
    parts = [f"in training at step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"] if steps else []
    parts += ["EvaluateModel's, base and trained side by side"] if final else []
    lines = [f"  rollouts: {path.name} in the run's folder ({len(records)} answers with question, completion, "
             "extracted and gold answer, "
             f"reward: {'; '.join(parts)})"]
    if run:
        lines.append(f"    and as MLflow tables rollouts/*.json in run {run['run_id']} (its Artifacts tab)")
    return lines



def billing_lines(run_dir: Path) -> list[str]:
    """What the run's training sessions billed: TrainDAPO's (model.json ``billing``) and EvaluateModel's
    (evaluation.json ``billing``), each as the session counted it and as the step counted it, and in all (USD
    with session.prices; steps/platform/billing.py)."""
    from steps.config import config_from_dict
    from steps.platform import billing

    evaluation = run_dir / "evaluation.json"
    blocks = {"TrainDAPO": _model(run_dir).get("billing"),
              "EvaluateModel": (_read(evaluation) or {}).get("billing") if evaluation.exists() else None}
    blocks = {step: block for step, block in blocks.items() if block}
    if not blocks:
        return []

    def tokens(count: billing.TokenCount) -> str:
        return f"{count.prefill:,} prefill, {count.sample:,} sample, {count.train:,} train"

    lines = ["  billed tokens (the session's BillableTokenUsage; the step's own count beside it):"]
    for step, block in blocks.items():
        count, client = billing.TokenCount.from_fields(block), billing.TokenCount.from_fields(block["client_count"])
        if block["source"] != billing.SERVICE:
            beside = "the session's count not read: this is the step's"
        else:
            beside = "step's count: the same" if client == count else f"step's count: {tokens(client)}"
        lines.append(f"    {step:<14} {tokens(count)} ({beside}; session {block['session']})")
    total, _ = billing.totals(*blocks.values())
    prices = config_from_dict(_model(run_dir).get("config"), source="model.json config").session.prices
    usd = billing.cost_usd(total, prices)
    lines.append(f"    {'in all':<14} {tokens(total)}" + (f" = USD {usd:,.4f} at session.prices" if usd is not None
                                                          else " (session.prices unset: no USD figure)"))
    return lines
