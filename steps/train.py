"""`python -m steps.train`: the TrainDAPO step.

Reads the SageMaker training contract (SM_CHANNEL_TRAIN, SM_CHANNEL_EVAL, the
optional SM_CHANNEL_TOKENIZER, SM_MODEL_DIR, SM_OUTPUT_DATA_DIR,
/opt/ml/input/config/hyperparameters.json, /opt/ml/checkpoints), each
overridable by a flag for local use. Everything that
can be checked without AWS (config, SDK versions, data, checkpoint) is checked
before the training session, the billed resource, is created; the session is
stopped on every exit path. One that a SIGKILL left Running (nothing in the
process can stop it then) is stopped by the next start of the step, before it
creates its own (steps/platform/ownership.py).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from steps.cli import Refused, parse_pairs, run_step, stopping
from steps.config import RunConfig, load_config, to_dict
from steps.dapo import curves, rollouts
from steps.dapo import metrics as metrics_io
from steps.dapo import state as checkpoint
from steps.dapo.loop import Outcome, Trainer, total_steps
from steps.dapo.state import LoopState
from steps.platform import billing, tracking
from steps.platform.artifacts import write_model_json
from steps.platform.ownership import this_jobs_session_name
from steps.platform.session import lora_kwargs, service_client, stop_session
from steps.platform.tokenizer import load_tokenizer
from steps.platform.versions import require_training_session_sdk
from steps.tasks import RowTask, build_task, load_examples

log = logging.getLogger("steps.train")
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "config" / "default.yaml"
#: Seconds a step being stopped (SIGTERM, Ctrl-C) gives MLflow to take what is queued, its session stopped: an
#: MLflow still connecting (its module importing, a first run's database being created) held an interrupted step
#: for the 30 s of tracking.FINISH_TIMEOUT_SECONDS, past its supervisor's grace.
STOPPING_TRACKING_SECONDS = 5.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m steps.train", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=env("DAPO_CONFIG", str(DEFAULT_CONFIG)),
                   help="YAML config (session/dapo sections)")
    p.add_argument("--hyperparameters", default="/opt/ml/input/config/hyperparameters.json",
                   help="SageMaker hyperparameters JSON; flat config keys that override --config (ignored if absent)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key (repeatable)")
    p.add_argument("--train", default=env("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train"))
    p.add_argument("--eval", default=env("SM_CHANNEL_EVAL", "/opt/ml/input/data/eval"))
    p.add_argument("--tokenizer", default=env("SM_CHANNEL_TOKENIZER"),
                   help="directory of the base model's tokenizer files (the `tokenizer` channel of "
                        "pipeline.tokenizer_s3_uri); default: the tokenizer the Hub names for the base model")
    p.add_argument("--model-dir", default=env("SM_MODEL_DIR", "/opt/ml/model"))
    p.add_argument("--output-dir", default=env("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"))
    p.add_argument("--checkpoint-dir", default="/opt/ml/checkpoints")
    return p.parse_args(argv)


def read_config(args: argparse.Namespace) -> RunConfig:
    overrides: dict[str, Any] = {}
    hp = Path(args.hyperparameters)
    if hp.exists():
        overrides.update(json.loads(hp.read_text(encoding="utf-8")))
    overrides.update(parse_pairs(args.set, "--set"))
    return load_config(args.config, overrides)


def load_inputs(args: argparse.Namespace, cfg: RunConfig, task: RowTask) -> tuple[list[Any], list[Any]]:
    train = load_examples(args.train, task)
    if len(train) < cfg.dapo.batch_size:
        raise Refused(
            f"{args.train}: {len(train)} training examples, fewer than dapo.batch_size={cfg.dapo.batch_size}. "
            "Add data or lower batch_size; no training session was created."
        )
    evaluation = load_examples(args.eval, task) if Path(args.eval).exists() else []
    return train, evaluation


def open_session(service: Any, cfg: RunConfig, start: LoopState, name: str | None) -> Any:
    """``name``: the session's name (None: the SDK names it)."""
    kwargs = lora_kwargs(cfg.session, name)
    if start.state_model_package_arn:
        log.info("resuming from %s (step %d)", start.state_model_package_arn, start.step)
        return service.create_training_client_from_state_with_optimizer(start.state_model_package_arn, **kwargs)
    return service.create_lora_training_client(**kwargs)


def model_record(cfg: RunConfig, outcome: Outcome, run: tracking.RunRef | None = None) -> dict[str, Any]:
    state, final = outcome.state, outcome.final_eval
    return {
        "model_package_arn": state.sampler_model_package_arn,
        "state_model_package_arn": state.state_model_package_arn,
        "base_model": cfg.session.base_model,
        "steps_completed": state.step,
        "stopped_early": state.stopped_early,
        "stop_reason": state.stop_reason,
        "guard": state.guard,  # the health guard that stopped training (steps/dapo/health.py), or ""
        "guard_stopped": bool(state.guard),  # never approved (the gate reads training.guard_stopped)
        "final_eval": None if final is None else
        {"accuracy": final.accuracy, "accuracy_lenient": final.accuracy_lenient, "n": final.n,
         "format_error_rate": final.format_error_rate},
        "config": to_dict(cfg),
        "mlflow": None if run is None else run.to_dict(),  # EvaluateModel logs to the same run
    }


def log_curves(tracker: tracking.MlflowTracker, metrics_path: Path) -> None:
    """curves.png beside metrics.jsonl, an artifact of the MLflow run; one that cannot be drawn is a warning,
    never a failed step (the figures are in metrics.jsonl and the run's metric series)."""
    out = metrics_path.parent / "curves.png"
    try:
        curves.plot_curves(metrics_io.read(metrics_path), out)
    except Exception as exc:  # noqa: BLE001 - a picture never fails training
        log.warning("curves.png not drawn (%s: %s)", type(exc).__name__, exc)
        return
    tracker.log_artifact(out)


def finish_tracking(tracker: tracking.MlflowTracker | None, outcome: Outcome, metrics_path: Path
                    ) -> tracking.RunRef | None:
    if tracker is None:
        return None
    log_curves(tracker, metrics_path)
    state = outcome.state
    tags = {"steps_completed": state.step, "stopped_early": str(state.stopped_early).lower(),
            "guard_stopped": str(bool(state.guard)).lower()}
    stop = {"stop_reason": state.stop_reason, **({"guard": state.guard} if state.guard else {})}
    tracker.set_tags({**tags, **stop} if state.stop_reason else tags)
    return tracker.finish()


def earlier_tokens(metrics_path: Path) -> billing.TokenCount:
    """The billable tokens of earlier attempts of this step, as the last train line kept in metrics.jsonl (the
    checkpoint's step, once truncated) counted them; nothing for a fresh start."""
    steps = [r for r in metrics_io.read(metrics_path) if r.get("kind") == "step"]
    return billing.TokenCount.from_fields(steps[-1]) if steps else billing.TokenCount()


def resume_hint(checkpoint_dir: str) -> str:
    try:
        state = checkpoint.read(checkpoint_dir)
    except checkpoint.CheckpointError:
        state = None
    if state is None:
        return "no checkpoint was saved yet; running the step again starts from scratch"
    return f"running the step again resumes from the checkpoint of step {state.step} in {checkpoint_dir}"


def describe_failure(exc: BaseException) -> str:
    from botocore.exceptions import BotoCoreError, ClientError
    from sagemaker.train.training_session import TrainingSessionError

    if isinstance(exc, (TrainingSessionError, ClientError, BotoCoreError)):
        return f"the training session failed ({type(exc).__name__}: {exc})"
    return f"{type(exc).__name__}: {exc}"


def train(args: argparse.Namespace, session: dict[str, Any]) -> int:
    """``session`` learns the training session's name and whether it was stopped (for the failure's hint)."""
    cfg = read_config(args)
    service = service_client(cfg.session)
    # First, whatever this attempt goes on to refuse: an earlier attempt's session that is still billing.
    session_name = this_jobs_session_name(service, cfg.session.region)
    task = build_task(cfg.task)  # the config's task section (steps/tasks/): its prompt, grader and row rules
    train_examples, eval_examples = load_inputs(args, cfg, task)
    start = checkpoint.resume_or_start(args.checkpoint_dir, cfg.dapo.seed)
    tokenizer = load_tokenizer(cfg.session.base_model, cfg.session.region, args.tokenizer)
    metrics_path = Path(args.output_dir) / "metrics.jsonl"
    metrics_io.truncate_after(metrics_path, start.step)
    metrics_io.truncate_after(metrics_path.parent / rollouts.FILE, start.step)  # redone evaluations rewrite theirs

    earlier = earlier_tokens(metrics_path)
    meter = billing.TokenMeter(earlier, cfg.session.prices)

    training_client = open_session(service, cfg, start, session_name)
    session["name"] = training_client.training_session_name
    tracker = tracking.start(tracking.config_params(to_dict(cfg)), Path(args.checkpoint_dir) / tracking.RUN_FILE)
    metrics = metrics_io.MetricsLog(metrics_path, print_fn=lambda s: print(s, flush=True),
                                    trackers=[tracker] if tracker else [],
                                    total_steps=total_steps(cfg.dapo, len(train_examples)))
    outcome: Outcome | None = None
    try:
        trainer = Trainer(training_client=training_client, cfg=cfg.dapo, task=task, tokenizer=tokenizer,
                          train_examples=train_examples, eval_examples=eval_examples,
                          chat_template_kwargs=cfg.session.chat_template_kwargs, metrics=metrics,
                          checkpoint_dir=Path(args.checkpoint_dir), meter=meter)
        outcome = trainer.run(start)
    finally:
        try:  # first: the session is what is billed; the hint says if it could not be stopped
            session["stopped"] = stop_session(training_client, failing=outcome is None)
        finally:  # also when the stop failed (its service unreachable): the MLflow run ends either way
            if tracker is not None and (outcome is None or not session.get("stopped")):
                tracker.finish("FAILED", STOPPING_TRACKING_SECONDS if stopping() else tracking.FINISH_TIMEOUT_SECONDS)
    # What the session billed, read once it is stopped (its count is final then), beside the client's count.
    name = training_client.training_session_name
    bill = billing.block(meter.total, billing.service_count(name, cfg.session.region), name, cfg.session.prices,
                         earlier)
    metrics.billing(outcome.state.step, bill)
    record = model_record(cfg, outcome, finish_tracking(tracker, outcome, metrics_path))
    write_model_json(args.model_dir, {**record, "billing": bill})
    state = outcome.state
    print(f"done: steps={state.step} stopped_early={str(state.stopped_early).lower()} "
          f"model_package_arn={state.sampler_model_package_arn}" + (f" guard={state.guard}" if state.guard else ""),
          flush=True)
    return 0


def session_hint(session: dict[str, Any]) -> str:
    """What became of the training session, in the failure's one line."""
    if "name" not in session:
        return "no training session was created"
    if session.get("stopped"):
        return "the training session was stopped"
    return (f"the training session {session['name']} could not be stopped from here (`make sessions` lists it, "
            "`make stop-orphans` stops it)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    session: dict[str, Any] = {}
    require_training_session_sdk()  # exits 2 naming the fix, before the step does anything
    return run_step(lambda: train(args, session), describe=describe_failure,
                    hint=lambda: f"{session_hint(session)} and {resume_hint(args.checkpoint_dir)}")


if __name__ == "__main__":
    sys.exit(main())
