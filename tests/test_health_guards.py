"""The health guards: each rule (steps/dapo/health.py), their memory across a resume, the local service's knobs
that drive the toy sick (local/training_session/sickness.py), and each guard stopping a sick toy's run."""
from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path

import pytest

from local.toy_data import write_split
from local.training_session.__main__ import _parser, _settings
from local.training_session.sickness import ENV_VARS, Sickness
from steps import train
from steps.config import DapoConfig
from steps.dapo import state as ckpt_io
from steps.dapo.health import GUARDS, GuardState, Limits, observe
from steps.dapo.state import LoopState
from tests.local_service import client_kwargs

ROOT = Path(__file__).resolve().parents[1]
HEALTHY = {"entropy": 0.8, "repetition_frac": 0.0, "truncated_frac": 0.05, "format_error_rate": 0.1,
           "accuracy": 0.5}
#: For each guard, figures of a step sick in its way only.
SICK = {
    "entropy_collapse": {**HEALTHY, "entropy": 0.01},
    "repetition_loops": {**HEALTHY, "repetition_frac": 0.6},
    "truncation": {**HEALTHY, "truncated_frac": 0.6},
    "format_errors_rising": {**HEALTHY, "format_error_rate": 0.35, "accuracy": 0.4},
}


def run(steps, limits=Limits(), memory=GuardState()):
    """Observe ``steps`` (figures per step) in turn: (the step the first trip came at, the trip, the memory)."""
    for step, figures in enumerate(steps, start=1):
        memory, trip = observe(memory, figures, limits, step)
        if trip:
            return step, trip, memory
    return None, None, memory


# -- each rule ------------------------------------------------------------------------------
@pytest.mark.parametrize("guard", [g for g in GUARDS if g != "entropy_collapse"])
def test_a_guard_fires_after_patience_consecutive_sick_steps_and_names_itself(guard):
    limits = Limits(patience=3)
    step, trip, _ = run([HEALTHY] + [SICK[guard]] * 5, limits)
    assert step == 4 and trip.guard == guard  # sick at steps 2, 3, 4
    assert trip.reason.startswith(f"health guard {guard} at step 4: ")
    assert "for 3 consecutive steps (guard_patience=3)" in trip.reason and "model of step 3" in trip.reason


@pytest.mark.parametrize("guard", [g for g in GUARDS if g != "entropy_collapse"])
def test_a_healthy_step_resets_the_count(guard):
    sick = SICK[guard]
    assert run([HEALTHY, sick, sick, HEALTHY, sick, sick, HEALTHY] * 3, Limits(patience=3))[1] is None


def entropy(value):
    return {**HEALTHY, "entropy": value}


def test_entropy_collapse_fires_when_the_median_of_the_last_patience_steps_is_below_the_bound():
    """Near collapse the estimate is noisy upwards only (a rare token's -log p): the guard judges the median of the
    last guard_patience steps' estimates, once it has that many. The three estimates an independent check read at
    temperature 0.03, the middle one above guard_min_entropy, stop the run at the third."""
    step, trip, memory = run([entropy(0.0027), entropy(0.0268), entropy(0.0026)], Limits(patience=3))
    assert (step, trip.guard) == (3, "entropy_collapse")
    assert trip.reason.startswith(
        "health guard entropy_collapse at step 3: the entropy estimate (the sampled tokens' mean negative "
        "log-probability) is 0.0027 nats per token (the median of the last 3 steps' estimates: 0.0027, 0.0268, "
        "0.0026), below guard_min_entropy=0.02, over the last 3 steps (guard_patience=3). Training stops here with "
        "the model of step 2")
    assert memory.entropy_window == (0.0027, 0.0268, 0.0026)
    # After a healthy start: as soon as most of the window is collapsed.
    assert run([HEALTHY, HEALTHY, SICK["entropy_collapse"], SICK["entropy_collapse"]], Limits(patience=3))[0] == 4


def test_entropy_collapse_never_fires_on_a_window_mostly_healthy():
    sick, lifted = SICK["entropy_collapse"], entropy(0.05)
    assert run([sick, HEALTHY, HEALTHY] * 10, Limits(patience=3))[1] is None
    assert run([sick, lifted, lifted] * 10, Limits(patience=3))[1] is None
    assert run([sick, sick], Limits(patience=3))[1] is None  # not before the window is full
    assert run([lifted] * 50, Limits(patience=3))[1] is None
    # Patience 1: the step's own estimate.
    assert run([HEALTHY, sick], Limits(patience=1))[0] == 2
    # A step that measured none (NaN) is no evidence: the window keeps the measured ones.
    step, _, memory = run([sick, entropy(math.nan), sick, entropy(math.nan), sick], Limits(patience=3))
    assert step == 5 and memory.entropy_window == (0.01, 0.01, 0.01)


def test_a_step_the_cap_stops_is_named_by_the_guard_whose_condition_holds_on_it():
    """A collapsed policy's groups score alike, so the generation-batch cap can stop its very first step: the guard
    names that stop, whatever its count, and its reason names the cap's too."""
    cap = "only 4 of 16 groups had mixed rewards after max_num_gen_batches=24 generation batches"
    memory, trip = observe(GuardState(), SICK["entropy_collapse"], Limits(), 1, capped=cap)
    assert trip.guard == "entropy_collapse" and memory.streaks["entropy_collapse"] == 1
    assert trip.reason.startswith("health guard entropy_collapse at step 1: the entropy estimate ")
    assert f"on the step the generation-batch cap stopped, which is its symptom: {cap}. Training stops" in trip.reason
    # The first rule that holds, as for any trip; none on a healthy step (the cap's own stop); none with guards off.
    both = {**SICK["entropy_collapse"], "truncated_frac": 0.9}
    assert observe(GuardState(), both, Limits(), 1, capped=cap)[1].guard == "entropy_collapse"
    assert observe(GuardState(), HEALTHY, Limits(), 1, capped=cap)[1] is None
    assert observe(GuardState(), SICK["entropy_collapse"], Limits(enabled=False), 1, capped=cap)[1] is None


def test_the_guards_are_on_by_default_with_the_documented_thresholds():
    assert Limits() == Limits.from_config(DapoConfig()) and Limits().enabled


def test_no_guard_fires_on_healthy_steps_or_when_the_guards_are_off():
    assert run([HEALTHY] * 50)[1] is None
    for guard in GUARDS:
        assert run([HEALTHY] + [SICK[guard]] * 10, Limits(enabled=False))[1] is None


def test_a_figure_that_could_not_be_measured_never_trips():
    assert run([{**HEALTHY, "entropy": math.nan}] * 10, Limits(patience=1))[1] is None


def test_each_threshold_is_a_strict_bound_and_settable():
    at_bound = {**HEALTHY, "entropy": 0.02, "repetition_frac": 0.5, "truncated_frac": 0.5}
    assert run([at_bound] * 5, Limits(patience=1))[1] is None
    assert run([{**HEALTHY, "truncated_frac": 0.3}] * 2, Limits(patience=2, max_truncated_frac=0.25))[1].guard \
        == "truncation"
    # Thresholds that turn a guard off: entropy 0, a share of 1.
    off = Limits(patience=1, min_entropy=0.0, max_repetition_frac=1.0, max_truncated_frac=1.0)
    assert run([{**HEALTHY, "entropy": 0.0, "repetition_frac": 1.0, "truncated_frac": 1.0}] * 3, off)[1] is None


def test_format_errors_rising_needs_both_a_rise_and_a_fall_from_the_runs_own_extremes():
    limits = Limits(patience=2)
    # Format errors rising while accuracy rises too: a policy learning a new style, not this failure.
    assert run([HEALTHY] + [{**HEALTHY, "format_error_rate": 0.5, "accuracy": 0.6}] * 5, limits)[1] is None
    # Accuracy falling with the format held: not this failure either.
    assert run([HEALTHY] + [{**HEALTHY, "accuracy": 0.2}] * 5, limits)[1] is None
    # The first step has nothing to rise from, however bad it is.
    assert run([{**HEALTHY, "format_error_rate": 1.0, "accuracy": 0.0}] * 1, Limits(patience=1))[1] is None
    # Measured from the best accuracy and the lowest format error rate seen, not from the previous step.
    steps = [HEALTHY, {**HEALTHY, "accuracy": 0.7, "format_error_rate": 0.05}, SICK["format_errors_rising"],
             SICK["format_errors_rising"]]
    step, trip, memory = run(steps, limits)
    assert (step, trip.guard) == (4, "format_errors_rising") and "the run's best (0.70)" in trip.reason
    assert (memory.best_accuracy, memory.lowest_format_error) == (0.7, 0.05)


def test_when_several_fire_at_once_the_first_rule_is_named():
    looping = {**HEALTHY, "repetition_frac": 0.9, "truncated_frac": 0.9}  # a loop runs into max_tokens too
    assert run([looping] * 3)[1].guard == "repetition_loops"


# -- the guards' memory across a resume -----------------------------------------------------------
def test_a_resumed_run_keeps_the_guards_counts(tmp_path):
    memory = run([HEALTHY, SICK["truncation"], SICK["truncation"]])[2]
    assert memory.streaks["truncation"] == 2
    ckpt_io.write(tmp_path, LoopState(seed=3, step=3, guard_state=memory))
    resumed = ckpt_io.read(tmp_path).guard_state
    assert resumed == memory
    # One more sick step after the resume completes the patience of 3.
    step, trip, _ = run([SICK["truncation"]], memory=resumed)
    assert (step, trip.guard) == (1, "truncation")


def test_a_checkpoint_written_before_the_guards_reads_with_fresh_counts(tmp_path):
    raw = ckpt_io.to_json(LoopState(seed=1, step=2))
    del raw["guard_state"], raw["guard"]
    (tmp_path / ckpt_io.FILENAME).write_text(json.dumps(raw))
    state = ckpt_io.read(tmp_path)
    assert state.step == 2 and state.guard_state == GuardState() and state.guard == ""


# -- the knobs that drive the toy sick --------------------------------------------------------------
def test_each_knob_is_settable_by_environment_and_flag_and_refused_when_out_of_range(monkeypatch):
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LOCAL_TS_SICK_LOOP_RATE", "0.7")
    monkeypatch.setenv("LOCAL_TS_SICK_TEMPERATURE", "0.5")
    args = _parser().parse_args(["--sick-temperature", "0.03", "--sick-run-on-rate", "0.8",
                                 "--sick-drop-form-per-step", "1"])
    assert _settings(Sickness, args) == Sickness(temperature=0.03, loop_rate=0.7, run_on_rate=0.8,
                                                 drop_form_per_step=1.0)
    with pytest.raises(ValueError, match=r"sickness setting loop_rate=1.5 is invalid: expected a fraction"):
        Sickness(loop_rate=1.5)
    with pytest.raises(ValueError, match=r"temperature=0 is invalid"):
        Sickness(temperature=0)


def test_the_admin_route_sets_the_sickness_and_refuses_a_bad_one(local_service):
    def post(body):
        request = urllib.request.Request(f"{local_service.url}/_admin/sickness", json.dumps(body).encode(),
                                         method="POST")
        try:
            with urllib.request.urlopen(request) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert post({"loop_rate": 0.4}) == (200, {"sickness": {**Sickness().to_dict(), "loop_rate": 0.4}})
    assert local_service.state.sick.sickness == Sickness(loop_rate=0.4)
    status, body = post({"loop_rate": 2})
    assert status == 400 and "loop_rate=2 is invalid" in body["message"]
    status, body = post({"fever": 1})
    assert status == 400 and "unknown sickness setting(s) ['fever']" in body["message"]
    assert local_service.state.sick.sickness == Sickness(loop_rate=0.4)  # a refused setting changes nothing


# -- each guard stops the toy driven sick ------------------------------------------------------------
@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    train_path, eval_path = write_split(d, 600, 100, seed=11)
    return Path(train_path), Path(eval_path)


#: guard -> (the knob that drives the toy into its failure, the run's settings). Patience 2: a sick run stops
#: within 3 steps. The toy answers in three tokens ("#### N <eos>"): collapsed, its entropy estimate sits near
#: 0.01-0.03, so that test sets guard_min_entropy to 0.05, and samples one prompt a generation batch with a
#: high cap, since a collapsed group rarely differs (its step is filled anyway; the cap is not what stops it).
#: format_errors_rising needs a step to rise from: the knob drops the answer form from the second step on.
CASES = {
    "entropy_collapse": (Sickness(temperature=0.03),
                         ("batch_size=1", "max_num_gen_batches=200", "guard_min_entropy=0.05")),
    "repetition_loops": (Sickness(loop_rate=0.7), ("batch_size=4",)),
    "truncation": (Sickness(run_on_rate=0.8), ("batch_size=4",)),
    "format_errors_rising": (Sickness(drop_form_per_step=1.0), ("batch_size=8",)),
}


@pytest.mark.parametrize("guard", GUARDS)
def test_the_toy_driven_sick_is_stopped_by_its_guard(guard, tmp_path, toy_data, local_service, capsys):
    knob, sets = CASES[guard]
    local_service.set_sickness(knob)
    patience = 2
    train_path, eval_path = toy_data
    argv = ["--config", str(ROOT / "config" / "local.yaml"), "--train", str(train_path), "--eval", str(eval_path),
            "--model-dir", str(tmp_path / "model"), "--output-dir", str(tmp_path / "out"),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--hyperparameters", str(tmp_path / "none.json")]
    for s in (f"model_package_group_arn={client_kwargs()['model_package_group_arn']}", f"guard_patience={patience}",
              "max_steps=6", *sets):
        argv += ["--set", s]
    assert train.main(argv) == 0

    out = capsys.readouterr().out.splitlines()
    stop = [line for line in out if line.startswith("stopped: ")]
    assert len(stop) == 1 and stop[0].startswith(f"stopped: health guard {guard} at step ")
    stopped_at = int(stop[0].split(" at step ")[1].split(":")[0])
    assert stopped_at <= patience + 1  # the step whose sampling tripped it: within patience + 1 steps
    model = json.loads((tmp_path / "model" / "model.json").read_text())
    assert model["guard"] == guard and model["guard_stopped"] is True and model["stopped_early"] is True
    assert model["stop_reason"] == stop[0].removeprefix("stopped: ")
    assert model["steps_completed"] == stopped_at - 1 and model["model_package_arn"]
    # A clean stop like the cap's: the checkpoint says so (a rerun trains nothing more), the session is stopped.
    ckpt = ckpt_io.read(tmp_path / "ckpt")
    assert ckpt.stopped_early and ckpt.guard == guard
    # A stop on a trained step saved its state; the forecast's, before step 1, trained nothing to save.
    before_step_1 = "on the forecast's probe before step 1" in stop[0]
    assert bool(ckpt.state_model_package_arn) is not before_step_1 and (stopped_at == 1 or not before_step_1)
    assert f"done: steps={stopped_at - 1} stopped_early=true" in "\n".join(out)
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    # The stop is the last step record (the session's billing record follows it, once the session is stopped).
    assert [r["kind"] for r in records if r["kind"] != "billing"][-1] == "stopped"
    assert [r["guard"] for r in records if r["kind"] == "stopped"] == [guard]
    assert not [s for s in local_service.sessions() if s["status"] not in ("Stopped", "Failed")]


def test_the_readmes_entropy_collapse_knob_at_the_local_runs_own_settings_stops_as_entropy_collapse(
        tmp_path, toy_data, local_service, capsys):
    """config/local.yaml as it is, the toy sampled at temperature 0.03: its groups score alike, so the forecast
    finds no mixed group before step 1 (the generation-batch cap would run out on the first step), and the stop is
    the entropy guard's (0.02 and 0.01 do the same: their estimates are lower still)."""
    local_service.set_sickness(Sickness(temperature=0.03))
    train_path, eval_path = toy_data
    argv = ["--config", str(ROOT / "config" / "local.yaml"), "--train", str(train_path), "--eval", str(eval_path),
            "--model-dir", str(tmp_path / "model"), "--output-dir", str(tmp_path / "out"),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--hyperparameters", str(tmp_path / "none.json"),
            "--set", f"model_package_group_arn={client_kwargs()['model_package_group_arn']}"]
    assert train.main(argv) == 0
    [stop] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("stopped: ")]
    assert stop.startswith("stopped: health guard entropy_collapse at step 1: the entropy estimate ")
    assert "on the forecast's probe before step 1, which is its symptom: forecast: no group of the probe " in stop
    model = json.loads((tmp_path / "model" / "model.json").read_text())
    assert (model["guard"], model["guard_stopped"], model["steps_completed"]) == ("entropy_collapse", True, 0)
    [record] = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
                if json.loads(line)["kind"] == "stopped"]
    # Stopped on the probe, one step's first generation batches, not after the cap's 24.
    assert record["guard"] == "entropy_collapse" and record["entropy"] < 0.02 and record["forecast"] is True
    assert 1 <= record["gen_batches"] < 24
