"""The DAPO training step against the local training-session service, through the real SDK."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from local.toy_data import write_split
from local.training_session.faults import Faults
from steps import train
from steps.config import load_config
from steps.dapo import health
from steps.dapo import metrics as metrics_io
from steps.dapo import state as ckpt_io
from steps.dapo.batch import build_datums
from steps.dapo.heldout import evaluate_greedy
from steps.dapo.loop import Trainer
from steps.dapo.sampling import DataPosition, GroupSampler, RewardShaping, take
from steps.dapo.state import LoopState
from steps.dapo.task import Grade
from steps.gsm8k.task import GSM8K, Gsm8k
from steps.platform.session import lora_kwargs
from steps.platform.tokenizer import load_tokenizer
from steps.tasks import Example, load_examples
from tests.local_service import BASE_MODEL_ARN, ENDPOINT_ENV_VARS, client_kwargs

ROOT = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = ROOT / "config" / "local.yaml"
pytestmark = pytest.mark.usefixtures("local_service")


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    train_path, eval_path = write_split(d, 600, 100, seed=11)
    return Path(train_path), Path(eval_path)


def argv(tmp_path, data, *sets):
    train_path, eval_path = data
    return ["--config", str(LOCAL_CONFIG), "--train", str(train_path), "--eval", str(eval_path),
            "--model-dir", str(tmp_path / "model"), "--output-dir", str(tmp_path / "out"),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--hyperparameters", str(tmp_path / "none.json"),
            "--set", f"model_package_group_arn={client_kwargs()['model_package_group_arn']}",
            *[x for s in sets for x in ("--set", s)]]


def step_records(tmp_path):
    return [r for r in metrics_io.read(tmp_path / "out" / "metrics.jsonl") if r["kind"] == "step"]


def toy_tokenizer():
    """The base model's tokenizer, as the steps get it: the local service's Hub record names its files."""
    return load_tokenizer(BASE_MODEL_ARN, None)


def running_sessions(service):
    return [s for s in service.sessions() if s["status"] not in ("Stopped", "Failed")]


# -- the loop learns ---------------------------------------------------------------------
@pytest.mark.slow
def test_loop_learns_the_toy_task(learned_toy, local_service):
    """The training run is tests/learned_toy.py's (test_evaluate_approve evaluates the same model)."""
    from sagemaker.train.training_session import ServiceClient

    cfg = load_config(LOCAL_CONFIG)
    assert learned_toy.code == 0, learned_toy.out
    out = learned_toy.out
    steps = step_records(learned_toy.dir)
    n = cfg.dapo.max_steps
    assert [r["step"] for r in steps] == list(range(1, n + 1)) and n <= 40
    # One machine-parsable sampling line and one train line per step.
    assert sum(l.startswith("sampling:") for l in out.splitlines()) == n
    assert sum(l.startswith("train: step=") for l in out.splitlines()) == n

    # Greedy accuracy of the trained model vs the base model on the same held-out questions.
    model = json.loads((learned_toy.dir / "model" / "model.json").read_text())
    evaluation = load_examples(learned_toy.eval)[: cfg.dapo.eval_size]
    tok = toy_tokenizer()
    with ServiceClient(**client_kwargs()).create_sampling_client(base_model=BASE_MODEL_ARN) as base:
        base_acc = evaluate_greedy(base, GSM8K, tok, evaluation, cfg.dapo.max_tokens).accuracy
    assert model["final_eval"]["accuracy"] >= base_acc + 0.30, (base_acc, model["final_eval"])

    first, last = steps[:5], steps[-5:]
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
    assert mean(last, "reward_mean") >= mean(first, "reward_mean") + 0.30
    # Filler that ends without an answer earns nothing, and the soft overlong punishment costs the longest:
    # the policy learns to answer sooner, and stops running into max_tokens.
    assert mean(last, "completion_tokens_mean") < mean(first, "completion_tokens_mean") / 3
    assert mean(first, "truncated_frac") > 0.02 and mean(last, "truncated_frac") < mean(first, "truncated_frac") / 3
    assert model["stopped_early"] is False and model["model_package_arn"].startswith("arn:aws:sagemaker:")
    assert not running_sessions(local_service)

    # The health guards are on (config/local.yaml) and this learning run trips none of them, while each health
    # figure is logged every step: the sampler and the trainer agree (same weights, same maths), no completion
    # loops, format errors fall as the policy learns to answer.
    assert cfg.dapo.guards and not any(l.startswith("stopped:") for l in out.splitlines())
    assert model["guard"] == "" and model["guard_stopped"] is False
    assert all(r["entropy"] > 10 * cfg.dapo.guard_min_entropy and r["repetition_frac"] == 0 for r in steps)
    # Measured on every step that trained on samples its own weights drew (never NaN); a step filled only by the
    # previous step's surplus leaves the figure out and says why.
    assert all(0 <= r["sampler_kl"] < 1e-6 if "sampler_kl" in r else r["sampler_kl_note"] == health.ONLY_OLDER
               for r in steps)
    assert sum("sampler_kl" in r for r in steps) >= len(steps) - 3
    assert all(r["completion_tokens_p50"] <= r["completion_tokens_p95"] <= r["completion_tokens_max"]
               <= cfg.dapo.max_tokens for r in steps)
    assert mean(last, "format_error_rate") < mean(first, "format_error_rate") / 3


# -- dynamic sampling on scripted reward patterns -------------------------------------------
class Scripted(Gsm8k):
    """GSM8K's prompts; prompts in `mixed` get exactly one right answer per group, all others are always wrong."""

    def __init__(self, mixed, group_size):
        self.mixed, self.group_size = mixed, group_size
        self.calls: dict[str, int] = {}

    def grade(self, text: str, example: Example) -> Grade:
        k = self.calls.get(example.question, 0)
        self.calls[example.question] = k + 1
        correct = example.question in self.mixed and k % self.group_size == 0
        return Grade(correct=correct, formatted=True, extracted=None)


def run_trainer(tmp_path, examples, cfg, task, start=None):
    """The Trainer on a session of its own; (outcome, printed lines, the session's name)."""
    from sagemaker.train.training_session import ServiceClient

    svc = ServiceClient(**client_kwargs())
    training_client = svc.create_lora_training_client(**lora_kwargs(cfg.session))
    lines: list[str] = []
    try:
        trainer = Trainer(training_client=training_client, cfg=cfg.dapo, task=task, tokenizer=toy_tokenizer(),
                          train_examples=examples, eval_examples=examples[:4],
                          metrics=metrics_io.MetricsLog(tmp_path / "metrics.jsonl", print_fn=lines.append),
                          checkpoint_dir=tmp_path / "ckpt")
        outcome = trainer.run(start or LoopState(seed=cfg.dapo.seed))
    finally:
        training_client.stop()
    return outcome, lines, training_client.training_session_name


def test_dynamic_sampling_keeps_batch_size_groups_and_carries_the_surplus(tmp_path, toy_data):
    cfg = load_config(LOCAL_CONFIG, {"batch_size": "4", "group_size": "2", "max_steps": "5",
                                     "max_inflight_gen_batches": "1", "max_num_gen_batches": "20", "eval_every": "0",
                                     "overlong_buffer": "0"})  # only the scripted rewards decide what is kept
    examples = load_examples(toy_data[0])[:40]
    mixed = {e.question for i, e in enumerate(examples) if i % 3 == 0}
    outcome, lines, _ = run_trainer(tmp_path, examples, cfg, Scripted(mixed, 2))
    assert outcome.state.step == 5 and not outcome.state.stopped_early

    # Replay the seeded data order to know exactly which prompts each generation batch drew.
    pos, carry, expected = DataPosition(), 0, []
    for _ in range(5):
        kept_total, sampled, batches = carry, 0, 0
        while kept_total < 4:
            idx, pos = take(len(examples), 4, cfg.dapo.seed, pos)
            kept_total += sum(examples[i].question in mixed for i in idx)
            sampled += 4
            batches += 1
        expected.append((batches, sampled, 1 - (kept_total - carry) / sampled))
        carry = kept_total - 4
    steps = [r for r in metrics_io.read(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    got = [(r["gen_batches"], r["groups_sampled"], r["filtered_frac"]) for r in steps]
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    assert [round(g[2], 6) for g in got] == [round(e[2], 6) for e in expected]
    assert all(r["kept_groups"] == 4 for r in steps)
    assert any(r["carried_groups"] > 0 for r in steps)  # surplus carried, not dropped
    assert sum(l.startswith("sampling: step=") for l in lines) == 5


def test_data_the_model_can_never_answer_stops_before_step_1_cleanly(tmp_path, toy_data, local_service, capsys):
    """The forecast, through the step's entry point: it stops before step 1 (the cap would have drawn
    max_num_gen_batches batches of all-wrong groups first), exits 0, and leaves a stopped checkpoint."""
    rows = [json.loads(l) for l in toy_data[0].read_text().splitlines()[:40]]
    impossible = tmp_path / "impossible.jsonl"
    impossible.write_text("".join(json.dumps({**r, "answer": "so #### 9999"}) + "\n" for r in rows))
    code = train.main(argv(tmp_path, (impossible, toy_data[1]), "max_num_gen_batches=3", "batch_size=4",
                           "overlong_buffer=0"))  # no length penalty: every reward is 0, every group filtered
    assert code == 0
    out = capsys.readouterr().out
    stop_line = next(l for l in out.splitlines() if l.startswith("stopped:"))
    assert stop_line.startswith("stopped: forecast: no group of the probe (4 prompts x ") and \
        "every answer was wrong" in stop_line
    assert "forecast: prompts=4 " in out and "keep_rate=0.0000" in out and "sampling: step=1" not in out
    model = json.loads((tmp_path / "model" / "model.json").read_text())
    assert model["stopped_early"] is True and model["steps_completed"] == 0 and model["model_package_arn"]
    assert model["stop_reason"] == stop_line.removeprefix("stopped: ")
    ckpt = ckpt_io.read(tmp_path / "ckpt")
    assert ckpt.stopped_early and ckpt.stop_reason == model["stop_reason"]
    assert not running_sessions(local_service)


# -- what waits on what: pipelining and checkpoints ------------------------------------------------
@pytest.mark.parametrize("off_policy", [0, 1, 2])
def test_sampling_runs_while_training_only_when_pipelined_and_never_waits_for_a_checkpoint(
        tmp_path, toy_data, local_service, off_policy):
    """Every operation takes 100 ms of service time (training ones one after another), so the service's
    own record says what the loop waited for: the next step's sampling starts before the new sampler
    weights are saved only with max_steps_off_policy 1 or 2, and never waits for a checkpoint's save_state."""
    # One generation batch in flight: no spare's surplus fills a whole step of 4 groups, so every step samples.
    cfg = load_config(LOCAL_CONFIG, {"batch_size": "4", "group_size": "2", "max_steps": "4", "save_every": "2",
                                     "eval_every": "0", "overlong_buffer": "0", "max_steps_off_policy": off_policy,
                                     "max_inflight_gen_batches": 1})
    examples = load_examples(toy_data[0])[:40]
    mixed = {e.question for i, e in enumerate(examples) if i % 2 == 0}
    local_service.set_faults(Faults(latency_ms=100))
    outcome, _, name = run_trainer(tmp_path, examples, cfg, Scripted(mixed, 2))
    local_service.set_faults(Faults())
    assert outcome.state.step == 4

    ops = local_service.state.find(name).operations()  # in submit order
    steps = [r for r in metrics_io.read(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    for update in (1, 2, 3):  # the last step samples nothing after it
        fb = [i for i, op in enumerate(ops) if op.kind == "forwardBackward"][update - 1]
        save = next(op for op in ops[fb:] if op.kind == "saveWeights")
        next_sampling = min(op.submitted for op in ops[fb:] if not op.training)
        assert (next_sampling < save.not_before) is bool(off_policy), update
        if update == 2:  # a checkpoint step: its save_state runs while the next step samples
            save_state = next(op for op in ops[fb:] if op.kind == "saveState")
            assert next_sampling < save_state.not_before
    # How stale the trained groups were: on-policy, only carried ones are (one step); sampled ahead, every group
    # is one step old; with 2, a surplus sampled ahead is carried and trained two steps old, never dropped.
    assert all(r["off_policy_steps"] <= max(1, off_policy) for r in steps)
    assert [r["off_policy_steps"] for r in steps] == {0: [0, 0, 1, 1], 1: [0, 1, 1, 1], 2: [0, 1, 1, 2]}[off_policy]
    assert off_policy != 2 or sum(r["stale_groups_dropped"] for r in steps) == 0


def test_a_pipelined_run_resumes_from_a_checkpoint_of_the_state_before_its_sampling_ahead(
        tmp_path, toy_data, local_service, monkeypatch):
    """Step 3's batch was sampled while step 2 trained; the checkpoint of step 2 still names the data
    position after step 2's own draws, so the rerun redraws step 3 and no step is applied twice."""
    from steps.dapo import loop

    calls = []

    def datums_then_a_bug(samples, aggregation):
        calls.append(1)
        if len(calls) == 4:
            raise ValueError("a bug in step 4")
        return build_datums(samples, aggregation)

    sets = ("batch_size=4", "save_every=2", "max_steps=4", "eval_every=0", "max_steps_off_policy=1")
    monkeypatch.setattr(loop, "build_datums", datums_then_a_bug)
    assert train.main(argv(tmp_path, toy_data, *sets)) == 1
    first = step_records(tmp_path)
    ckpt = ckpt_io.read(tmp_path / "ckpt")
    assert [r["step"] for r in first] == [1, 2, 3] and ckpt.step == 2
    assert ckpt.gen_batches_drawn == sum(r["gen_batches"] for r in first[:2])

    monkeypatch.setattr(loop, "build_datums", build_datums)
    assert train.main(argv(tmp_path, toy_data, *sets)) == 0
    final = ckpt_io.read(tmp_path / "ckpt")
    assert [r["step"] for r in step_records(tmp_path)] == [1, 2, 3, 4] and final.step == 4
    assert int(local_service.state.registry.weights(final.state_model_package_arn)["adam_step"]) == 4


# -- concurrency -------------------------------------------------------------------------------
def test_a_generation_batch_is_one_round_trip(tmp_path, toy_data, local_service):
    """Every prompt of a generation batch is submitted before any result is awaited."""
    from sagemaker.train.training_session import SamplingParams, ServiceClient

    examples = load_examples(toy_data[0])[:8]
    latency = 0.5
    with ServiceClient(**client_kwargs()).create_sampling_client(base_model=BASE_MODEL_ARN) as client:
        session = local_service.state.find(client.training_session_name)
        local_service.set_faults(Faults(latency_ms=int(latency * 1000)))
        sampler = GroupSampler(GSM8K, toy_tokenizer(), examples, 4, SamplingParams(max_tokens=512),
                               RewardShaping(512))
        groups = sampler.launch(client, range(8), seed=1).result()
        local_service.set_faults(Faults())
        submitted = [op.submitted for op in session.operations() if not op.training]
    assert all(g is not None for g in groups) and len(submitted) == 8
    # All eight were in flight together: the last was submitted before the first could finish.
    assert max(submitted) - min(submitted) < latency


def test_evaluation_grades_each_answer_once(toy_data, local_service):
    """The prediction reuses the sampler's grade: the grader runs once per answer, not twice."""
    from sagemaker.train.training_session import ServiceClient

    examples = load_examples(toy_data[1])[:12]
    graded: list[str] = []

    class Counting(Gsm8k):
        def grade(self, text: str, example: Example) -> Grade:
            graded.append(example.question)
            return super().grade(text, example)

    with ServiceClient(**client_kwargs()).create_sampling_client(base_model=BASE_MODEL_ARN) as client:
        result = evaluate_greedy(client, Counting(), toy_tokenizer(), examples, 512)
    assert result.n == 12 and result.failed == 0
    assert sorted(graded) == sorted(ex.question for ex in examples)
    assert [p.correct for p in result.predictions] == [GSM8K.grade(p.completion, ex).correct
                                                       for p, ex in zip(result.predictions, examples)]


# -- subprocess runs (used by tests/test_faults.py: SIGKILL, SIGTERM, a dying session, resume) -----
def subprocess_env(service):
    env = {k: v for k, v in os.environ.items()}
    for var in ENDPOINT_ENV_VARS:
        env[var] = service.url
    return env


def start_training(tmp_path, data, service, *sets):
    return subprocess.Popen([sys.executable, "-m", "steps.train", *argv(tmp_path, data, *sets)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=subprocess_env(service), cwd=str(ROOT))


def test_an_unexpected_error_mid_training_is_a_failure_with_a_resume_hint(tmp_path, toy_data, local_service,
                                                                         monkeypatch, capsys):
    """Not "refused input" (exit 2): a ValueError after a checkpoint is a failure, and running again resumes."""
    from steps.dapo import loop

    calls = []

    def datums_then_a_bug(samples, aggregation):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("a bug in step 3")
        return build_datums(samples, aggregation)

    monkeypatch.setattr(loop, "build_datums", datums_then_a_bug)
    before = {s["name"] for s in local_service.sessions()}
    assert train.main(argv(tmp_path, toy_data, "batch_size=4", "save_every=2", "max_steps=5")) == 1
    err = capsys.readouterr().err
    assert "error: ValueError: a bug in step 3; the training session was stopped and running the step again " \
           "resumes from the checkpoint of step 2" in err
    assert [s["status"] for s in local_service.sessions() if s["name"] not in before] == ["Stopped"]


def test_a_stop_that_fails_too_does_not_replace_the_training_error(tmp_path, toy_data, local_service, monkeypatch,
                                                                   capsys):
    """A dead service fails the training call and then the stop: the step reports the training error and says the
    session could not be stopped (the stop's error used to replace it). Here the session is gone by the time the
    step stops it, so the StopTrainingSession the SDK sends over the wire is refused."""
    from steps.dapo import loop

    before = {s["name"] for s in local_service.sessions()}
    backend = local_service.state.backend

    def datums_of_a_session_gone(samples, aggregation):
        [name] = [s["name"] for s in local_service.sessions() if s["name"] not in before]
        backend.stop_session(name)
        backend.delete_session(name)
        raise ValueError("a bug in step 1")

    monkeypatch.setattr(loop, "build_datums", datums_of_a_session_gone)
    assert train.main(argv(tmp_path, toy_data, "batch_size=4", "max_steps=2")) == 1
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert line.startswith("error: ValueError: a bug in step 1; the training session ") and \
        "could not be stopped from here" in line, line


def test_too_small_dataset_never_creates_a_session(tmp_path, toy_data, local_service, capsys):
    small = tmp_path / "small.jsonl"
    small.write_text("".join(toy_data[0].read_text().splitlines(keepends=True)[:5]))
    before = len(local_service.sessions())
    assert train.main(argv(tmp_path, (small, toy_data[1]), "batch_size=16")) == 2
    err = capsys.readouterr().err
    assert "5 training examples, fewer than dapo.batch_size=16" in err and "no training session was created" in err
    assert len(local_service.sessions()) == before
