"""The forecast before step 1 (steps/dapo/forecast.py): what the probe reads, and the run it stops."""
from __future__ import annotations

import math

import pytest

from local.toy_data import write_split
from steps.config import load_config
from steps.dapo import metrics as metrics_io
from steps.dapo import state as ckpt_io
from steps.dapo.forecast import forecast
from steps.dapo.sampling import Group, Rollout
from steps.dapo.task import Grade
from steps.tasks import load_examples
from tests.test_train import LOCAL_CONFIG, Scripted, run_trainer


def group(i, grades, tokens=10):
    return Group(i, (0,) * 5, tuple(Rollout((1,) * tokens, (), "stop", float(g.correct), g) for g in grades))


RIGHT, WRONG, UNFORMATTED = Grade(True, True, "7"), Grade(False, True, "8"), Grade(False, False, None)


def test_the_forecast_reads_the_probe_and_predicts_the_run():
    groups = [group(0, [RIGHT, WRONG]), group(1, [WRONG, WRONG]), group(2, [RIGHT, RIGHT]), group(3, [WRONG, RIGHT])]
    f = forecast(groups, batch_size=4, steps=10)
    assert (f.prompts, f.group_size, f.pass_rate, f.format_rate, f.keep_rate) == (4, 2, 0.5, 1.0, 0.5)
    assert f.gen_batches_per_step == 2.0  # half the groups kept: two generation batches fill a step
    assert f.sampled_tokens == 2 * 4 * 2 * 10 * 10  # batches x prompts x answers x tokens x steps
    assert f.trained_tokens == 4 * 2 * (5 + 10 - 1) * 10  # a datum is prompt + completion less one token
    assert f.stop_reason("strict") == "" and f.cost_usd is None


@pytest.mark.parametrize("grades,cause", [
    ([WRONG, WRONG], "every answer was wrong"),
    ([RIGHT, RIGHT], "every answer was right"),
    ([UNFORMATTED, UNFORMATTED], "the instructed answer form was never followed"),
])
def test_a_probe_without_a_mixed_group_names_the_cause_and_what_to_try(grades, cause):
    f = forecast([group(i, grades) for i in range(3)], batch_size=3, steps=5)
    reason = f.stop_reason("strict")
    assert f.keep_rate == 0 and math.isinf(f.gen_batches_per_step) and f.sampled_tokens == 0
    assert cause in reason and "training stops before step 1" in reason
    assert 'PARAMS="GroupSize=16"' in reason and "TASK=" in reason and "supervised fine-tuning" in reason


def test_a_run_whose_base_model_never_answers_right_stops_before_step_1_after_the_probe_alone(tmp_path,
                                                                                                local_service):
    cfg = load_config(LOCAL_CONFIG, {"batch_size": "4", "group_size": "2", "max_steps": "5", "eval_every": "0",
                                     "overlong_buffer": "0"})
    examples = load_examples(write_split(tmp_path / "data", 40, 8, seed=11)[0])
    outcome, lines, name = run_trainer(tmp_path, examples, cfg, Scripted(mixed=set(), group_size=2))
    state = outcome.state
    assert state.stopped_early and state.step == 0 and "every answer was wrong" in state.stop_reason
    assert [line for line in lines if line.startswith("stopped:")] == [f"stopped: {state.stop_reason}"]
    assert sum(line.startswith("forecast: ") for line in lines) == 2 and not any("train:" in x for x in lines)
    # The session did nothing beyond the probe: the base weights saved for its sampler, one generation batch.
    ops = local_service.state.find(name).operations()
    assert [op.kind for op in ops if op.training] == ["saveWeights"]
    assert sum(not op.training for op in ops) == cfg.dapo.batch_size
    records = metrics_io.read(tmp_path / "metrics.jsonl")
    assert [r["kind"] for r in records] == ["forecast", "stopped"] and records[0]["keep_rate"] == 0
    assert ckpt_io.read(tmp_path / "ckpt") == state  # a restart has nothing left to do
