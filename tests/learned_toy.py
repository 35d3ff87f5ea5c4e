"""One toy model trained by the real training step on config/local.yaml, for the whole test run.

tests/test_train.py asserts that it learned (test_loop_learns_the_toy_task); tests/test_evaluate_approve.py
evaluates it as EvaluateModel does. One 30-step training serves both (each trained its own before).

Load with ``pytest_plugins`` in ``tests/conftest.py`` (a fixture in a plugin is one fixture, computed once;
imported into two test modules it would be two). Under ``make test``'s two pytest-xdist workers it is
computed once per worker that runs a test using it: xdist's ``loadgroup`` would keep those tests on one worker,
but xdist 3.8 cannot rename a pytest 9.2 node, so its groups do nothing there.
"""
from __future__ import annotations

import contextlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from local.toy_data import write_split
from local.training_session.costs import Costs
from local.training_session.faults import Faults
from local.training_session.sickness import Sickness
from tests.local_service import ENDPOINT_ENV_VARS, client_kwargs

ROOT = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = ROOT / "config" / "local.yaml"


@dataclass(frozen=True)
class LearnedToy:
    dir: Path  # model/ (model.json), out/ (metrics.jsonl), ckpt/, and model.tar.gz as SageMaker packs model/
    train: Path
    eval: Path  # 100 held-out questions
    code: int  # train.main's exit code
    out: str  # what the step printed on stdout


@pytest.fixture(scope="session")
def learned_toy(tmp_path_factory, training_service) -> LearnedToy:
    """``python -m steps.train`` with config/local.yaml's settings on 600 toy questions (100 held out), against
    the local service with no faults, no cost model and a healthy toy."""
    from steps import train

    d = tmp_path_factory.mktemp("learned-toy")
    train_path, eval_path = (Path(p) for p in write_split(d / "data", 600, 100, seed=11))
    printed = io.StringIO()
    training_service.set_faults(Faults())
    training_service.set_costs(Costs())
    training_service.set_sickness(Sickness())
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        for var in ENDPOINT_ENV_VARS:
            mp.setenv(var, training_service.url)
        code = train.main(["--config", str(LOCAL_CONFIG), "--train", str(train_path), "--eval", str(eval_path),
                           "--model-dir", str(d / "model"), "--output-dir", str(d / "out"),
                           "--checkpoint-dir", str(d / "ckpt"), "--hyperparameters", str(d / "none.json"),
                           "--set", f"model_package_group_arn={client_kwargs()['model_package_group_arn']}"])
    if code == 0:
        with tarfile.open(d / "model.tar.gz", "w:gz") as tar:
            tar.add(d / "model" / "model.json", arcname="model.json")
    return LearnedToy(d, train_path, eval_path, code, printed.getvalue())
