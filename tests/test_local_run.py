"""`make local-run` end to end: moto server, the local service, and build/pipeline.json interpreted."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from local import console, report, run
from local.pipeline_runner import LocalExecution, PipelineFailed
from local.stack import ROOT
from steps import evaluate
from steps.cli import Refused
from steps.config import config_from_dict, load_yaml
from steps.config.parameters import PARAMETERS
from steps.dapo import curves
from steps.platform import billing
from steps.platform.ownership import Owner
from steps.terminal import whole
from tests import pinned
from tests.test_interrupt import assert_the_step_stopped_its_session_before_the_service_stopped
from tests.test_reevaluate import sample_and_reevaluate


# -- the pieces of run.py, without a run ----------------------------------------------------------------
def test_run_ids_never_collide_even_within_one_second(tmp_path):
    """Two runs started in the same second (or drawing the same digits) get their own folder, and with it their own
    execution id, job and session names and MLflow run name."""
    drawn = iter(["aaaa", "aaaa", "bbbb"])
    clock = lambda: 1_800_000_000.0  # noqa: E731 - the same second for both
    first = run.create_run_dir(tmp_path, clock=clock, suffix=lambda: next(drawn))
    second = run.create_run_dir(tmp_path, clock=clock, suffix=lambda: next(drawn))
    assert first.name.endswith("-aaaa") and second.name.endswith("-bbbb") and first.name[:-4] == second.name[:-4]
    # Processes racing for one folder: the directory is the claim, so each gets its own.
    with ProcessPoolExecutor(4) as pool:
        made = list(pool.map(_create_run_dir_at, [tmp_path / "race"] * 8))
    assert len(set(made)) == 8 and all(Path(d).is_dir() for d in made)
    # The session names built from them stay whole within the API's 63 characters, so they differ too.
    names = {Owner("dapo-local", f"{step}-{d.name}").session_name(1) for d in (first, second)
             for step in ("TrainDAPO", "EvaluateModel")}
    assert len(names) == 4 and all(len(n) <= 63 and first.name[:-5] in n for n in names)


def _create_run_dir_at(runs_dir: Path) -> str:
    return str(run.create_run_dir(runs_dir, clock=lambda: 1_800_000_000.0))


def test_the_mlflow_store_is_created_once_when_runs_start_together(tmp_path):
    with ProcessPoolExecutor(3) as pool:
        uris = list(pool.map(report.mlflow_store, [tmp_path] * 3, ["dapo-local"] * 3))
    assert len(set(uris)) == 1
    assert [e.name for e in MlflowClient(uris[0]).search_experiments()] == ["dapo-local", "Default"]


def test_help_lists_every_parameter_with_meaning_and_default_and_every_option_has_help(capsys):
    with pytest.raises(SystemExit) as exited:
        run.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert exited.value.code == 0
    local = config_from_dict(load_yaml(run.DEFAULT_CONFIG))
    for p in PARAMETERS:
        default = "the run's generated toy data" if p.name in run.DATA_PARAMETERS else p.default(local)
        assert f"{p.name} {p.meaning} ({p.kind}, default {default})" in out, p.name
    assert all(a.help for a in run.parser(run.DEFAULT_CONFIG)._actions), "an option without help text"


@pytest.mark.parametrize("param, message", [
    ("batchsize=3", "unknown pipeline parameter 'batchsize'; did you mean BatchSize?"),
    ("MaxStep=3", "did you mean MaxSteps?"),
    ("BatchSize=x", "parameter BatchSize='x': must be integer"),
    ("SelectiveRollouts=1", "parameter SelectiveRollouts='1': must be true or false"),
    ("BatchSize=0", "'dapo.batch_size' must be >= 1, got 0"),
    ("TrainDataS3Uri=s3://b/x/", "the local run uploads its data and sets TrainDataS3Uri itself"),
    ("MaxSteps", "expected NAME=VALUE"),
])
def test_a_bad_param_is_refused_before_anything_is_built_or_created(tmp_path, param, message):
    with pytest.raises(Refused, match=re.escape(message)):
        _run(tmp_path, "--param", param)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "pipeline.json").exists()


def test_a_resume_needs_a_run_and_keeps_its_parameters(tmp_path):
    with pytest.raises(Refused, match="does not exist; the runs there: none"):
        _run(tmp_path, "--resume", "20261204-000000-abcd")
    with pytest.raises(Refused, match="runs with the parameters and data the run started with; drop --param"):
        _run(tmp_path, "--resume", "20261204-000000-abcd", "--param", "MaxSteps=3")
    assert not (tmp_path / "runs").exists()


def test_a_failed_step_keeps_its_whole_log_and_its_own_error_line_is_the_reason(tmp_path):
    """Not the tail of what its interpreter printed on the way out (a traceback from a closed event loop)."""
    code = ("import sys\n"
            "for i in range(40): print(f'line {i}', flush=True)\n"
            "print('error: the service did not answer; running the step again resumes', file=sys.stderr)\n"
            "print('  at step 3', file=sys.stderr, flush=True)\n"
            "print('Exception ignored in: <function _Handle.__del__>', file=sys.stderr)\n"
            "print('RuntimeError: Event loop is closed', file=sys.stderr)\n"
            "sys.exit(1)")
    definition = {"Version": "2020-12-01", "Parameters": [], "Steps": [
        {"Name": "Noisy", "Type": "Processing",
         "Arguments": {"AppSpecification": {"ContainerEntrypoint": ["python", "-c", code]}}}]}
    execution = LocalExecution(definition, {}, None, tmp_path / "work", {}, execution_id="x", pipeline_name="p",
                               log_dir=tmp_path / "logs")
    with pytest.raises(PipelineFailed) as failed:
        execution.run()
    assert failed.value.message == \
        "exit code 1: error: the service did not answer; running the step again resumes | at step 3"
    log = (tmp_path / "logs" / "Noisy.log").read_text().splitlines()
    assert log[1:41] == [f"line {i}" for i in range(40)] and "RuntimeError: Event loop is closed" in log
    assert log[-1] == "== exit code 1"


def test_curves_name_the_run_label_every_axis_and_keep_strict_and_lenient_apart(tmp_path):
    steps = [{"kind": "step", "step": i, "reward_mean": 0.1 * i, "accuracy": 0.1 * i, "accuracy_lenient": 0.1 * i,
              "filtered_frac": 0.2, "filtered_all_wrong_frac": 0.1, "completion_tokens_mean": 50.0,
              "truncated_frac": 0.0} for i in (1, 2, 3)]
    evals = [{"kind": "eval", "step": 3, "accuracy": 0.5, "accuracy_lenient": 0.5}]
    title = report.title("20261204-184207-a3f2", {"MaxSteps": "3"})
    fig = curves.plot_curves(steps + evals, tmp_path / "curves.png", title=title, base=(0.1, 0.1))
    assert title == "local run 20261204-184207-a3f2: MaxSteps=3" and fig.axes[0].get_title() == title
    top, lengths, health, cut, shares = fig.axes
    assert all(a.get_xlabel() and a.get_ylabel() for a in (top, lengths, health))
    assert cut.get_ylabel() and shares.get_ylabel()
    lines = {line.get_label(): (i, line) for i, line in enumerate(top.get_lines())}
    for strict, lenient in (("accuracy, strict: the reward's (sampled, T=1)", "accuracy, lenient (sampled, T=1)"),
                            ("greedy eval accuracy, strict (step 0: base)", "greedy eval accuracy, lenient")):
        (i, s), (j, le) = lines[strict], lines[lenient]
        assert list(s.get_ydata()) == list(le.get_ydata())  # the two coincide here ...
        assert j < i  # ... so lenient is drawn under strict, and looks otherwise
        assert (s.get_linewidth(), s.get_marker(), s.get_alpha()) != (le.get_linewidth(), le.get_marker(),
                                                                       le.get_alpha())


def _run(tmp_path, *extra, quiet=True):
    return run.main(["--runs-dir", str(tmp_path / "runs"), "--definition-out", str(tmp_path / "pipeline.json"),
                     *(["--quiet"] if quiet else []), *extra])


def _run_dir(tmp_path) -> Path:
    (d,) = [p for p in (tmp_path / "runs").iterdir() if (p / "summary.txt").exists()]  # beside the MLflow store
    return d


@pytest.mark.slow
def test_local_run_trains_evaluates_and_approves(tmp_path, capsys):
    code = _run(tmp_path, "--train-rows", "400", "--eval-rows", "80", "--param", "MaxSteps=15",
                "--param", "EvalSize=60", quiet=False)
    out, err = capsys.readouterr()
    assert code == 0, out
    d = _run_dir(tmp_path)
    # Every figure of the seeded run and its approval are the loop's before its rewrite (issue 37), to nine digits.
    assert pinned.figures(d) == json.loads(pinned.PINNED.read_text())
    # The forecast before step 1 (issue 38): its keep rate, read from step 1's first generation batch, is step 1's.
    records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    (seen,) = [r for r in records if r["kind"] == "forecast"]
    step_1 = next(r for r in records if r["kind"] == "step")
    assert abs(seen["keep_rate"] - (1 - step_1["filtered_frac"])) <= 0.1 and seen["pass_rate"] > 0
    # A person's terminal: every line within 100 columns (but a command to copy, or a path, never cut: issue 38),
    # one compact line per training step (local/console.py) ...
    wide = [line for line in (out + err).splitlines() if len(line) > 100 and not whole(line)]
    assert not wide, wide
    compact = re.findall(r"^\[TrainDAPO\] step (\d+)/15  reward \S+  acc \S+  kept \d+/\d+  entropy \S+  "
                         r"[\d,]+k? tok/s  eta \S+$", out, re.M)
    assert compact == [str(i) for i in range(1, 16)] and "train: step=" not in out and "sampling: " not in out
    # ... while the step's log keeps the full lines SageMaker's metric regexes (the definition's own) read.
    train_log = (d / "logs" / "TrainDAPO.log").read_text()
    definition = json.loads((tmp_path / "pipeline.json").read_text())
    [train_step] = [s for s in definition["Steps"] if s["Name"] == "TrainDAPO"]
    regexes = train_step["Arguments"]["AlgorithmSpecification"]["MetricDefinitions"]
    assert len(regexes) >= 15
    records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    for metric in regexes:  # each reads its own figure of every step (a nan is no point, as in CloudWatch)
        kind, key = metric["Name"].split(":")
        matched = [float(m.group(1)) for m in re.finditer(metric["Regex"], train_log, re.M)]
        expected = [r[key] for r in records if r["kind"] == ("eval" if kind == "eval" else "step") and r[key] == r[key]]
        assert matched and matched == pytest.approx(expected, rel=1e-3, abs=1e-2), metric
    assert len(re.findall(r"^train: step=\d+ reward_mean=", train_log, re.M)) == 15
    # The runner's own lines are in local-run.log (it was empty: the root logger was at WARNING).
    assert "[TrainDAPO] Succeeded in" in (d / "local-run.log").read_text()
    flat = " ".join(out.split())  # the summary's lines wrapped at 100 columns, read as one
    for name in ("validation.json", "metrics.jsonl", "evaluation.json", "evaluation_base.json", "curves.png",
                 "rollouts.jsonl", "summary.txt"):
        assert (d / name).exists(), name
    # The steps ran in the definition's order, the condition chose the approve branch.
    order = re.findall(r"^\[(\w+)\] started \(", out, re.M)
    assert order == ["ValidateData", "TrainDAPO", "EvaluateModel", "CheckAccuracy", "ApproveModel"]
    # Each step says what it does; EvaluateModel that it evaluates both models.
    assert ("[EvaluateModel] started (Processing): evaluates the base model and the trained adapter, each on the "
            "first 60 held-out questions [") in flat
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", d.name)
    # Every step's whole output and the service's own log are kept (the console showed none of the SDK's lines);
    # train lines end with the progress and the time left.
    logs = {p.name: p.read_text() for p in (d / "logs").iterdir()}
    assert sorted(logs) == ["ApproveModel.log", "EvaluateModel.log", "TrainDAPO.log", "ValidateData.log"]
    assert re.search(r"^train: step=15 .* progress=15/15 eta=0s$", logs["TrainDAPO.log"], re.M)
    assert "unencrypted" in logs["TrainDAPO.log"] and "unencrypted" not in out and "INFO" not in out
    assert "session dapo-" in (d / "training-session-service.log").read_text()
    # A run that succeeded has nothing to resume: of the service's packages only the adapter's stays (make sample,
    # --reevaluate), with its registry entry.
    assert sorted(p.suffix for p in (d / "service-state" / "packages").rglob("*") if p.is_file()) == [".json", ".npz"]
    # The overridden parameters: in the summary, and as the MLflow run's name and tags (below).
    assert "  parameters: MaxSteps=15 EvalSize=60\n" in out and "parameters: MaxSteps=15 EvalSize=60" in \
        (d / "summary.txt").read_text()
    trained = json.loads((d / "evaluation.json").read_text())
    base = json.loads((d / "evaluation_base.json").read_text())
    # evaluation_base.json is the base half of EvaluateModel's paired evaluation, in the same layout.
    assert base == {**trained["base"], "evaluated": "base_model"} and trained["n"] == base["n"] == 60
    assert trained["metrics"]["accuracy"]["value"] > base["metrics"]["accuracy"]["value"]
    gain = trained["improvement"]
    assert 0 < gain["ci95_low"] < gain["value"] < gain["ci95_high"] and gain["n"] == 60
    # Every answer of both models is in the run folder, and evaluation.json's figures follow from them alone.
    assert len((d / "samples_base.jsonl").read_text().splitlines()) == 60 * 4
    assert evaluate.main(["--recompute", str(d)]) == 0
    assert re.search(r"^recompute: (\d+) of \1 figures of ", capsys.readouterr().out, re.M)
    # The summary: both accuracies with intervals, the difference with its interval, pass@k, where the rollouts are.
    m, b = trained["metrics"], base["metrics"]
    assert (f"greedy eval accuracy on 60 held-out questions: trained {m['accuracy']['value']:.3f} (95% CI "
            f"{m['accuracy']['ci95_low']:.3f}-{m['accuracy']['ci95_high']:.3f}), base {b['accuracy']['value']:.3f} "
            f"(95% CI {b['accuracy']['ci95_low']:.3f}-") in flat
    assert (f"improvement: {100 * gain['value']:+.1f} points (95% CI {100 * gain['ci95_low']:+.1f} to "
            f"{100 * gain['ci95_high']:+.1f};") in flat
    assert f"pass@4 trained {m['pass_at_k']['value']:.3f}, base {b['pass_at_k']['value']:.3f}" in flat
    assert ("rollouts: rollouts.jsonl in the run's folder (64 answers with question, completion, extracted and gold "
            "answer, reward: in training at steps 10, 15; EvaluateModel's, base and trained side by side)") in flat
    assert f"artifactsin{d}/:" in "".join(out.split())  # a path wider than 100 columns is cut across lines
    steps = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in steps) == 15  # the MaxSteps parameter reached the training job
    assert "left running: 0" in out and "model approved" in out
    # Its package is not version 1: every step's sampler weights and every checkpoint is a version in the group.
    version = int(json.loads((d / "model.json").read_text())["model_package_arn"].rsplit("/", 1)[1])
    assert version > 15 and (f"version {version} of dapo-local; versions 1-{version - 1} are this run's earlier "
                             "sampler weights and checkpoints") in flat
    # TrainDAPO's and EvaluateModel's sessions are named after their jobs (the orphan sweep finds them); the base
    # model and the trained adapter were evaluated in EvaluateModel's one session.
    names = re.findall(r"(\S+) Stopped", out.split("training sessions created: 2, left running: 0\n", 1)[1])
    assert [n.split("-")[2] for n in names] == ["TrainDAPO", "EvaluateModel"]
    # What the run may bill, said before it starts: the execution's MaxSteps in place; the toy's own figures, no
    # ~30B model's hours (the toy is not served on AWS).
    cost = out.index("toy run: a run may draw up to max_steps 15 x max_num_gen_batches ")
    assert cost < out.index("toy run: its sessions may bill up to ") < out.index("[ValidateData] started")
    assert "cost: a step may take up to" not in out and " h " not in flat.split("[ValidateData] started")[0]
    assert json.loads((tmp_path / "pipeline.json").read_text())["Version"] == "2020-12-01"
    # What the run billed: each step's session as the service counted it (DescribeTrainingSession), the step's own
    # count the same; in the summary, the registry metadata and (below) the MLflow run.
    bills = {"TrainDAPO": json.loads((d / "model.json").read_text())["billing"], "EvaluateModel": trained["billing"]}
    for step, bill in bills.items():
        count = billing.TokenCount.from_fields(bill)
        assert bill["source"] == billing.SERVICE and bill["client_count"] == count.fields(), bill
        assert (f"{step} {count.prefill:,} prefill, {count.sample:,} sample, {count.train:,} train (step's "
                f"count: the same; session {bill['session']})") in flat
    total = billing.TokenCount.from_fields(bills["TrainDAPO"]) + billing.TokenCount.from_fields(trained["billing"])
    assert total.train == bills["TrainDAPO"]["train_tokens"] > 0 and total.prefill > 0
    assert (f"in all {total.prefill:,} prefill, {total.sample:,} sample, {total.train:,} train "
            "(session.prices unset: no USD figure)") in flat
    assert (f"billed_prefill_tokens={total.prefill} billed_sample_tokens={total.sample} "
            f"billed_source={billing.SERVICE} billed_train_tokens={total.train}") in flat

    # The local MLflow store under the runs dir has the run: its params and one point per step.
    store = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    assert f"mlflowui--backend-store-uri{store}" in "".join(out.split())  # a path wider than 100 columns is cut
    client = MlflowClient(tracking_uri=store)
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("dapo-local").experiment_id])
    assert mlflow_run.data.params["dapo.max_steps"] == "15"
    assert mlflow_run.info.run_name == f"{d.name} MaxSteps=15 EvalSize=60" and mlflow_run.info.status == "FINISHED"
    assert {k: v for k, v in mlflow_run.data.tags.items() if k.startswith(("parameter.", "local_run."))} == {
        "parameter.MaxSteps": "15", "parameter.EvalSize": "60", "local_run.id": d.name,
        "local_run.parameters": "MaxSteps=15 EvalSize=60", "local_run.outcome": "succeeded"}
    assert [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "step/reward_mean")] == list(range(1, 16))
    assert mlflow_run.data.metrics["final_eval/accuracy"] == trained["metrics"]["accuracy"]["value"]
    assert mlflow_run.data.metrics["final_eval/improvement_ci95_low"] == gain["ci95_low"]
    assert mlflow_run.data.metrics["base_eval/accuracy"] == base["metrics"]["accuracy"]["value"]
    # Billed tokens: running totals per step, TrainDAPO's session, EvaluateModel's, and the run's.
    history = [m.value for m in client.get_metric_history(mlflow_run.info.run_id, "step/sample_tokens")]
    assert len(history) == 15 and history == sorted(history) and history[-1] <= bills["TrainDAPO"]["sample_tokens"]
    for kind, n in total.fields().items():
        assert mlflow_run.data.metrics[f"billing/{kind}"] == bills["TrainDAPO"][kind]
        assert mlflow_run.data.metrics[f"eval_billing/{kind}"] == trained["billing"][kind]
        assert mlflow_run.data.metrics[f"run_billing/{kind}"] == n
    assert {a.path for a in client.list_artifacts(mlflow_run.info.run_id)} == {
        "evaluation.json", "predictions.jsonl", "curves.png", "rollouts"}
    # Rollouts as MLflow tables: the in-training evaluations' (eval_every 10, and the last step's) and EvaluateModel's,
    # the same rows as rollouts.jsonl.
    shown = [json.loads(l) for l in (d / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["step"], r["model"]) for r in shown] == [(10, "trained")] * 16 + [(15, "trained")] * 16 + \
        [(0, "base")] * 16 + [(15, "trained")] * 16
    assert {a.path for a in client.list_artifacts(mlflow_run.info.run_id, "rollouts")} == {
        "rollouts/step_000010.json", "rollouts/step_000015.json", "rollouts/final.json"}
    table = json.loads(Path(client.download_artifacts(mlflow_run.info.run_id, "rollouts/final.json",
                                                      str(tmp_path))).read_text())
    assert table["columns"][:7] == ["step", "model", "question", "completion", "extracted", "gold", "reward"]
    assert [row[2:7] for row in table["data"]] == [[r[k] for k in ("question", "completion", "extracted", "gold",
                                                                    "reward")] for r in shown[32:]]
    # The approved adapter, tried and re-evaluated without training again (tests/test_reevaluate.py; one run serves).
    sample_and_reevaluate(d, capsys)


# A rejection below AccuracyThreshold, with both numbers and what held: the approved run's first re-evaluation
# (tests/test_reevaluate.py), which runs the same gate and RecordRejection without training again.


@pytest.mark.slow
def test_a_run_the_cap_stopped_before_its_first_step_is_never_approved(tmp_path, capsys):
    """Even at AccuracyThreshold 0: the base weights it evaluated are recorded as rejected, and the summary says
    that training stopped early and why."""
    # Two samples per prompt: few groups have mixed rewards, so one generation batch cannot fill a step.
    code = _run(tmp_path, "--train-rows", "300", "--eval-rows", "40", "--param", "GroupSize=2",
                "--param", "MaxNumGenBatches=1", "--param", "EvalSize=20", "--param", "AccuracyThreshold=0")
    out = capsys.readouterr().out
    flat = " ".join(out.split())  # lines wrapped at 100 columns, read as one
    assert code == 1
    assert "[CheckAccuracy] Succeeded in" in out and ": false" in out
    assert "[RecordRejection] Succeeded" in out and "ApproveModel" not in out
    assert "Not approved: no optimizer step completed" in flat
    assert "training STOPPED EARLY after 0 optimizer steps: step 1: only" in flat
    assert "model package: Rejected" in out
    evaluation = json.loads((_run_dir(tmp_path) / "evaluation.json").read_text())
    assert evaluation["training"]["stopped_early"] is True and evaluation["training"]["steps_completed"] == 0


def test_a_batch_larger_than_the_toy_data_is_refused_before_anything_starts(tmp_path):
    """The toy's row count is known before the stack starts: no 38 s wait for ValidateData to refuse it."""
    for extra, message in (((), "BatchSize 16 is larger than the toy train split (5 rows, --train-rows)"),
                           (("--param", "BatchSize=5000"), "BatchSize 5000 is larger than the toy train split (2000 ")):
        with pytest.raises(Refused, match=re.escape(message)):
            _run(tmp_path, "--train-rows", "5" if not extra else "2000", "--eval-rows", "20", *extra)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "pipeline.json").exists()


def _start(tmp_path, *extra):
    """The local run in a process group of its own, as a terminal starts a foreground job: a Ctrl-C is a SIGINT to
    that group."""
    root = Path(__file__).resolve().parents[1]
    return subprocess.Popen([sys.executable, "-m", "local.run", "--runs-dir", str(tmp_path / "runs"),
                             "--definition-out", str(tmp_path / "pipeline.json"), "--verbose", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(root),
                            start_new_session=True)


def _signal_masks(pid: int) -> str:
    """The process's blocked, ignored and caught signal masks (Linux /proc), or why they could not be read."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"unreadable ({exc})"
    return " ".join(line.replace("\t", "") for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _mlflow_runs(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}")
    return client.search_runs([client.get_experiment_by_name("dapo-local").experiment_id])


@pytest.mark.slow
def test_a_dead_service_fails_the_step_in_seconds_with_its_own_error_and_the_run_still_reports(tmp_path):
    """The local service killed mid-training: TrainDAPO fails within 30 s (the SDK alone retried for ~10 min) with
    its one `error:` line, the summary is printed, and the MLflow run ends FAILED (it was left RUNNING)."""
    proc = _start(tmp_path, "--train-rows", "200", "--eval-rows", "20")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[TrainDAPO] train: step=2 "):
            break
    [service] = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "local.training_session"], capture_output=True,
                               text=True).stdout.split()
    os.kill(int(service), signal.SIGKILL)
    killed = time.monotonic()
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[TrainDAPO] Failed"):
            failed_after = time.monotonic() - killed
            break
    out, _ = proc.communicate(timeout=60)
    out = "".join(lines) + out
    assert proc.returncode == 1 and failed_after < 30, failed_after
    [failed] = [line for line in out.splitlines() if line.startswith("[TrainDAPO] Failed")]
    reason = re.search(r"Failed in [0-9.]+s: .*?exit code 1: (error: .*) \(whole log: .*\)$", failed).group(1)
    assert reason.startswith("error: the training session failed (ServiceUnreachable: the training-session service "
                             "at http://127.0.0.1:") and "has not answered for" in reason
    assert "could not be stopped from here" in reason and "|" not in reason  # the one line, nothing after it
    assert "Event loop is closed" not in out and "Traceback" not in out
    run_dir = _run_dir(tmp_path)
    assert "Event loop is closed" in (run_dir / "logs" / "TrainDAPO.log").read_text() or \
        "Traceback" in (run_dir / "logs" / "TrainDAPO.log").read_text()  # kept there, whole
    summary = (run_dir / "summary.txt").read_text()
    # The step's failure says first that the service died (its own error only says what it could not reach) ...
    died = "the local training-session service died (exit code -9), so the step failed: exit code 1: error:"
    assert "[TrainDAPO] Failed in " in failed and f": {died}" in failed
    assert f"== local run {run_dir.name} " in out
    assert f"outcome: FAILED at TrainDAPO: {died}" in " ".join(summary.split())
    assert "note: the training-session service exited during the run (exit code -9)" in summary
    # ... and the resume command is one line of its own, whatever its width, which runs as printed: the entry
    # point's own parser and plan read it as this run, with its parameters (a resume refuses anything else).
    [command] = [line.strip() for line in out.splitlines() if line.strip().startswith(".venv/bin/python -m")]
    assert out.split(command)[0].rstrip().endswith("continue it with:")
    program, module, *argv = shlex.split(command)
    assert (program, module) == (".venv/bin/python", "-m") and argv[0] == "local.run" and (ROOT / program).exists()
    resumed = run.resume_plan(run.parse_args(argv[1:]))
    assert resumed.run_id == run_dir.name and resumed.params == json.loads((run_dir / "run.json").read_text())["params"]
    assert "training sessions: unknown" in summary
    [mlflow_run] = _mlflow_runs(tmp_path)
    assert mlflow_run.info.status == "FAILED" and f"mlflow: run {mlflow_run.info.run_id} (FAILED)" in summary
    assert mlflow_run.data.tags["local_run.outcome"].startswith(f"failed at TrainDAPO: {died}")


@pytest.mark.slow
def test_ctrl_c_stops_every_process_and_resume_finishes_the_remaining_steps(tmp_path, capsys):
    """Ctrl-C while step 4's checkpoint is being saved and the in-training evaluation runs (a checkpoint every 2
    steps, an evaluation every 4): TrainDAPO has 12 steps to go, a margin that holds when this reader lags behind
    the run on a loaded machine (at step 11 of 16 it once did not). Then the resume."""
    config = tmp_path / "local.yaml"
    shipped = (Path(__file__).resolve().parents[1] / "config" / "local.yaml").read_text()
    config.write_text(re.sub(r"(?m)^  save_every: \d+$", "  save_every: 2",
                             re.sub(r"(?m)^  eval_every: \d+$", "  eval_every: 4", shipped)))
    assert "  save_every: 2\n" in config.read_text() and "  eval_every: 4\n" in config.read_text()
    proc = _start(tmp_path, "--config", str(config), "--train-rows", "300", "--eval-rows", "40",
                  "--param", "MaxSteps=16", "--param", "EvalSize=20")
    urls, lines = [], []
    for line in proc.stdout:  # the checkpoint of step 2 (save_every) is written by now, step 4's being written
        lines.append(line)
        urls += re.findall(r"http://127\.0\.0\.1:\d+", line)
        if line.startswith("[TrainDAPO] train: step=4 "):
            break
    running = proc.poll() is None  # for the failure message: a run already over cannot be interrupted
    masks = _signal_masks(proc.pid)  # for the failure message: a SIGINT blocked or ignored never arrives
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: to the runner's whole group, as a terminal sends it
    out, err = proc.communicate(timeout=120)
    out = "".join(lines) + out
    assert proc.returncode == 130 and "interrupted" in err, (
        f"exit code {proc.returncode}; the run was {'still running' if running else 'over'} when SIGINT was sent; "
        f"its signal masks then: {masks}\n"
        f"{out[-4000:]}\n{err[-4000:]}")
    assert len(urls) >= 2
    for url in urls[:2]:  # moto and the training-session service no longer listen
        host, port = url[len("http://"):].split(":")
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2).close()
    # No step process (they all run with paths under this run's directory) is left.
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "runs")], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", leftover.stdout
    # The summary still came, and the MLflow run ended KILLED; the step stopped on the Ctrl-C (its supervisor
    # forwarded it), stopping its session; the service, which the Ctrl-C does not reach, could still say so.
    run_id = re.search(r"^local-run (\S+):", out, re.M).group(1)
    # The resume command works from the shell the run was started in: the project venv's python (make's
    # `make local-run RESUME=<id>` for the project's runs/).
    resume = f".venv/bin/python -m local.run --runs-dir {tmp_path / 'runs'} --resume {run_id}"
    assert f"outcome: INTERRUPTED; continue it with: {resume}" in " ".join(out.split())
    assert resume in " ".join(err.split())
    [killed] = _mlflow_runs(tmp_path)
    assert killed.info.status == "KILLED"
    run_dir = tmp_path / "runs" / run_id
    assert "training sessions created: 1, left running: 0\n" in out
    [(session, status)] = re.findall(r"(dapo-\S+-TrainDAPO-\S+) (\w+)", out.split("training sessions created:")[1])
    assert status == "Stopped"
    assert_the_step_stopped_its_session_before_the_service_stopped(run_dir, session)

    # A resume that meets a file it cannot do without cut (issue 37: by a kill, by hand) refuses in one line naming
    # it, before anything starts; the file put back, it resumes. The cut last line of TrainDAPO's metrics.jsonl,
    # an append a SIGKILL interrupted, is left out (its step is redone); its MLflow file is cut in
    # tests/test_tracking.py (a new MLflow run), and the local report then carries on without it.
    for name in ("run.json", "steps.json", "pipeline.json"):
        whole = (run_dir / name).read_text()
        (run_dir / name).write_text(whole[:len(whole) // 2])
        with pytest.raises(Refused) as refused:
            _run(tmp_path, "--resume", run_id)
        assert str(refused.value).startswith(f"{run_dir / name} is damaged (not whole JSON: ")
        assert "\n" not in str(refused.value)
        (run_dir / name).write_text(whole)
    [metrics] = sorted((run_dir / "work" / "TrainDAPO").rglob("metrics.jsonl"))
    metrics.write_text(metrics.read_text() + '{"kind": "step", "step": 5, "reward_me')
    assert report.mlflow_run(run_dir / "work")["run_id"] == killed.info.run_id
    capsys.readouterr()

    # Resumed: same run id, same MLflow run; ValidateData kept, TrainDAPO from its checkpoint to MaxSteps only.
    assert _run(tmp_path, "--resume", run_id) == 0
    out = capsys.readouterr().out
    assert (f"local-run {run_id}: resuming (ValidateData completed before; parameters: MaxSteps=16 EvalSize=20)"
            in " ".join(out.split()))
    assert "[ValidateData] Succeeded: kept from the interrupted run (its outputs restored to S3)" in out
    assert "outcome: succeeded, model approved" in out
    attempts = (run_dir / "logs/TrainDAPO.log").read_text().split("== TrainDAPO of ")[1:]
    assert len(attempts) == 2
    resumed_at = int(re.search(r"resuming from \S+ \(step (\d+)\)", attempts[1]).group(1))
    first = [int(n) for n in re.findall(r"^train: step=(\d+) ", attempts[0], re.M)]
    again = [int(n) for n in re.findall(r"^train: step=(\d+) ", attempts[1], re.M)]
    assert 2 <= resumed_at < 16 and first[-1] >= 4 and again == list(range(resumed_at + 1, 17))
    steps = [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(l)["kind"] == "step"]
    assert steps == list(range(1, 17))
    [finished] = _mlflow_runs(tmp_path)
    assert finished.info.run_id == killed.info.run_id and finished.info.status == "FINISHED"
    assert json.loads((run_dir / "run.json").read_text())["outcome"] == "succeeded"
    with pytest.raises(Refused, match="that run succeeded; there is nothing left to run"):
        _run(tmp_path, "--resume", run_id)


def test_the_gates_announcement_lists_its_four_conditions():
    said = console.announcements({"AccuracyThreshold": 0.2, "MinImprovement": 0.0})["CheckAccuracy"]
    assert said == "accuracy >= 0.2, improvement's 95% lower bound >= 0.0, >= 1 optimizer step, no guard stop?"
