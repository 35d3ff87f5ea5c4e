"""`python -m steps.train`: the TrainDAPO step.

Reads the SageMaker training contract (SM_CHANNEL_TRAIN, SM_CHANNEL_EVAL,
SM_MODEL_DIR, SM_OUTPUT_DATA_DIR, /opt/ml/input/config/hyperparameters.json,
/opt/ml/checkpoints), each overridable by a flag for local use. Everything that
can be checked without AWS (config, SDK versions, data, checkpoint) is checked
before the training session, the billed resource, is created; the session is
stopped on every exit path.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from steps import checkpoint as ckpt_io
from steps import metrics as metrics_io
from steps.config import ConfigError, RunConfig, load_config, to_dict
from steps.data import Example, load_examples
from steps.data_order import DataPosition
from steps.loop import Outcome, Trainer
from steps.session import SessionConfigError, lora_kwargs, service_client
from steps.tokenization import load_tokenizer
from steps.versions import require_training_session_sdk

log = logging.getLogger("steps.train")
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "config" / "default.yaml"
EXIT_REFUSED = 2


class Terminated(BaseException):
    """SIGTERM arrived (SageMaker stopping the job): unwind so the session is stopped.

    A BaseException, like KeyboardInterrupt, so no `except Exception` on the way
    (a sample retry, say) mistakes it for a failed request and carries on."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m steps.train", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=env("DAPO_CONFIG", str(DEFAULT_CONFIG)), help="YAML config (session/dapo sections)")
    p.add_argument("--hyperparameters", default="/opt/ml/input/config/hyperparameters.json",
                   help="SageMaker hyperparameters JSON; flat config keys that override --config (ignored if absent)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key (repeatable)")
    p.add_argument("--train", default=env("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train"))
    p.add_argument("--eval", default=env("SM_CHANNEL_EVAL", "/opt/ml/input/data/eval"))
    p.add_argument("--model-dir", default=env("SM_MODEL_DIR", "/opt/ml/model"))
    p.add_argument("--output-dir", default=env("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"))
    p.add_argument("--checkpoint-dir", default="/opt/ml/checkpoints")
    return p.parse_args(argv)


def read_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    hp = Path(args.hyperparameters)
    if hp.exists():
        overrides.update(json.loads(hp.read_text(encoding="utf-8")))
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = value
    return overrides


def load_inputs(args: argparse.Namespace, cfg: RunConfig) -> tuple[list[Example], list[Example]]:
    train = load_examples(args.train)
    if len(train) < cfg.dapo.batch_size:
        raise ValueError(
            f"{args.train}: {len(train)} training examples, fewer than dapo.batch_size={cfg.dapo.batch_size}. "
            "Add data or lower batch_size; no training session was created."
        )
    evaluation = load_examples(args.eval) if Path(args.eval).exists() else []
    return train, evaluation


def fresh_start(seed: int) -> ckpt_io.Checkpoint:
    return ckpt_io.Checkpoint(step=0, state_model_package_arn="", sampler_model_package_arn="",
                              position=DataPosition(), gen_batches_drawn=0, seed=seed)


def open_session(svc: Any, cfg: RunConfig, start: ckpt_io.Checkpoint) -> Any:
    if start.state_model_package_arn:
        log.info("resuming from %s (step %d)", start.state_model_package_arn, start.step)
        return svc.create_training_client_from_state_with_optimizer(start.state_model_package_arn, **lora_kwargs(cfg.session))
    return svc.create_lora_training_client(**lora_kwargs(cfg.session))


def write_model_dir(model_dir: str, cfg: RunConfig, outcome: Outcome) -> None:
    d = Path(model_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = outcome.final_eval
    record = {
        "model_package_arn": outcome.sampler_model_package_arn,
        "state_model_package_arn": outcome.state_model_package_arn,
        "base_model": cfg.session.base_model,
        "steps_completed": outcome.steps_completed,
        "stopped_early": outcome.stopped_early,
        "stop_reason": outcome.stop_reason,
        "final_eval": None if final is None else {"accuracy": final.accuracy, "n": final.n, "format_error_rate": final.format_error_rate},
        "config": to_dict(cfg),
    }
    tmp = d / ".model.json.tmp"
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    tmp.replace(d / "model.json")


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, read_overrides(args))
    train, evaluation = load_inputs(args, cfg)
    start = ckpt_io.read(args.checkpoint_dir) or fresh_start(cfg.dapo.seed)
    tokenizer = load_tokenizer(cfg.session.tokenizer)
    metrics_path = Path(args.output_dir) / "metrics.jsonl"
    metrics_io.truncate_after(metrics_path, start.step)
    svc = service_client(cfg.session)

    signal.signal(signal.SIGTERM, _raise_terminated)
    tc = None
    try:
        tc = open_session(svc, cfg, start)
        trainer = Trainer(tc=tc, cfg=cfg.dapo, tokenizer=tokenizer, train=train, eval=evaluation,
                          metrics=metrics_io.MetricsLog(metrics_path), checkpoint_dir=Path(args.checkpoint_dir),
                          print_fn=lambda line: print(line, flush=True))
        outcome = trainer.run(start)
        write_model_dir(args.model_dir, cfg, outcome)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if tc is not None:
            tc.stop()
            log.info("training session %s stopped", tc.training_session_name)
    print(f"done: steps={outcome.steps_completed} stopped_early={str(outcome.stopped_early).lower()} "
          f"model_package_arn={outcome.sampler_model_package_arn}", flush=True)
    return 0


def _service_errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import BotoCoreError, ClientError
    from sagemaker.train.training_session import TrainingSessionError

    return (TrainingSessionError, ClientError, BotoCoreError)


def _resume_hint(checkpoint_dir: str) -> str:
    try:
        ckpt = ckpt_io.read(checkpoint_dir)
    except ckpt_io.CheckpointError:
        ckpt = None
    if ckpt is None:
        return "no checkpoint was saved yet; running the step again starts from scratch"
    return f"running the step again resumes from the checkpoint of step {ckpt.step} in {checkpoint_dir}"


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    require_training_session_sdk()
    args = parse_args(argv)
    try:
        return run(args)
    except (ConfigError, SessionConfigError, ckpt_io.CheckpointError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    except _service_errors() as exc:
        print(f"error: the training session failed ({type(exc).__name__}: {exc}); the session was stopped and "
              f"{_resume_hint(args.checkpoint_dir)}", file=sys.stderr, flush=True)
        return 1
    except Terminated:
        print(f"error: SIGTERM received; the training session was stopped and {_resume_hint(args.checkpoint_dir)}",
              file=sys.stderr, flush=True)
        return 143


if __name__ == "__main__":
    sys.exit(main())
