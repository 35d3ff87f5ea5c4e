"""`make local-run` end to end: moto server, the local service, and build/pipeline.json interpreted."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from local import run
from steps.platform import billing


def _run(tmp_path, *extra):
    return run.main(["--runs-dir", str(tmp_path / "runs"), "--definition-out", str(tmp_path / "pipeline.json"),
                     "--quiet", *extra])


def _run_dir(tmp_path) -> Path:
    (d,) = [p for p in (tmp_path / "runs").iterdir() if (p / "summary.txt").exists()]  # beside the MLflow store
    return d


def test_local_run_trains_evaluates_and_approves(tmp_path, capsys):
    code = _run(tmp_path, "--train-rows", "400", "--eval-rows", "80", "--param", "MaxSteps=15",
                "--param", "EvalSize=60")
    out = capsys.readouterr().out
    assert code == 0, out
    d = _run_dir(tmp_path)
    for name in ("validation.json", "metrics.jsonl", "evaluation.json", "evaluation_base.json", "curves.png",
                 "rollouts.jsonl", "summary.txt"):
        assert (d / name).exists(), name
    # The steps ran in the definition's order, the condition chose the approve branch.
    order = [l.split("]")[0][1:] for l in out.splitlines() if l.endswith(")") and " started (" in l]
    assert order == ["ValidateData", "TrainDAPO", "EvaluateModel", "CheckAccuracy", "ApproveModel"]
    trained = json.loads((d / "evaluation.json").read_text())
    base = json.loads((d / "evaluation_base.json").read_text())
    # evaluation_base.json is the base half of EvaluateModel's paired evaluation, in the same layout.
    assert base == {**trained["base"], "evaluated": "base_model"} and trained["n"] == base["n"] == 60
    assert trained["metrics"]["accuracy"]["value"] > base["metrics"]["accuracy"]["value"]
    gain = trained["improvement"]
    assert 0 < gain["ci95_low"] < gain["value"] < gain["ci95_high"] and gain["n"] == 60
    # The summary: both accuracies with intervals, the difference with its interval, pass@k, where the rollouts are.
    m, b = trained["metrics"], base["metrics"]
    assert (f"greedy eval accuracy on 60 held-out questions: trained {m['accuracy']['value']:.3f} (95% CI "
            f"{m['accuracy']['ci95_low']:.3f}-{m['accuracy']['ci95_high']:.3f}), base {b['accuracy']['value']:.3f} "
            f"(95% CI {b['accuracy']['ci95_low']:.3f}-") in out
    assert (f"improvement: {100 * gain['value']:+.1f} points (95% CI {100 * gain['ci95_low']:+.1f} to "
            f"{100 * gain['ci95_high']:+.1f};") in out
    assert f"pass@4 trained {m['pass_at_k']['value']:.3f}, base {b['pass_at_k']['value']:.3f}" in out
    assert (f"rollouts: {d / 'rollouts.jsonl'} (64 answers with question, completion, extracted and gold answer, "
            "reward: in training at steps 10, 15; EvaluateModel's, base and trained side by side)") in out
    steps = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in steps) == 15  # the MaxSteps parameter reached the training job
    assert "left running: 0" in out and "model approved" in out
    # TrainDAPO's and EvaluateModel's sessions are named after their jobs (the orphan sweep finds them); the base
    # model and the trained adapter were evaluated in EvaluateModel's one session.
    names = re.findall(r"(\S+) Stopped", out.split("training sessions created: 2, left running: 0\n", 1)[1])
    assert [n.split("-")[2] for n in names] == ["TrainDAPO", "EvaluateModel"]
    # What the run may bill, said before it starts: the execution's MaxSteps in place.
    cost = out.index("cost: a run may draw up to max_steps 15 x max_num_gen_batches ")
    assert cost < out.index("[ValidateData] started") and "cost: a step may take up to" in out
    assert json.loads((tmp_path / "pipeline.json").read_text())["Version"] == "2020-12-01"
    # What the run billed: each step's session as the service counted it (DescribeTrainingSession), the step's own
    # count the same; in the summary, the registry metadata and (below) the MLflow run.
    bills = {"TrainDAPO": json.loads((d / "model.json").read_text())["billing"], "EvaluateModel": trained["billing"]}
    for step, bill in bills.items():
        count = billing.TokenCount.from_fields(bill)
        assert bill["source"] == billing.SERVICE and bill["client_count"] == count.fields(), bill
        assert (f"    {step:<14} {count.prefill:,} prefill, {count.sample:,} sample, {count.train:,} train (step's "
                f"count: the same; session {bill['session']})") in out
    total = billing.TokenCount.from_fields(bills["TrainDAPO"]) + billing.TokenCount.from_fields(trained["billing"])
    assert total.train == bills["TrainDAPO"]["train_tokens"] > 0 and total.prefill > 0
    assert (f"    in all         {total.prefill:,} prefill, {total.sample:,} sample, {total.train:,} train "
            "(session.prices unset: no USD figure)") in out
    assert (f"billed_prefill_tokens={total.prefill} billed_sample_tokens={total.sample} "
            f"billed_source={billing.SERVICE} billed_train_tokens={total.train}") in out

    # The local MLflow store under the runs dir has the run: its params and one point per step.
    store = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    assert f"mlflow ui --backend-store-uri {store}" in out
    client = MlflowClient(tracking_uri=store)
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("dapo-local").experiment_id])
    assert mlflow_run.data.params["dapo.max_steps"] == "15"
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


def test_accuracy_below_the_threshold_fails_with_both_numbers(tmp_path, capsys):
    code = _run(tmp_path, "--train-rows", "300", "--eval-rows", "40", "--param", "MaxSteps=2",
                "--param", "EvalSize=40", "--param", "AccuracyThreshold=0.99")
    out = capsys.readouterr().out
    assert code == 1
    accuracy = json.loads((_run_dir(tmp_path) / "evaluation.json").read_text())["metrics"]["accuracy"]["value"]
    fail_line = next(l for l in out.splitlines() if l.startswith("[AccuracyTooLow] Failed"))
    assert f"Not approved: accuracy {accuracy} against the AccuracyThreshold 0.99, optimizer steps completed 2" \
        in fail_line
    assert "ApproveModel" not in out and "[RecordRejection] Succeeded" in out
    assert "model package: Rejected" in out
    assert (_run_dir(tmp_path) / "evaluation_base.json").exists()
    assert "rejection_reason=accuracy " in out and "below AccuracyThreshold 0.99" in out


def test_a_run_the_cap_stopped_before_its_first_step_is_never_approved(tmp_path, capsys):
    """Even at AccuracyThreshold 0: the base weights it evaluated are recorded as rejected, and the summary says
    that training stopped early and why."""
    # Two samples per prompt: few groups have mixed rewards, so one generation batch cannot fill a step.
    code = _run(tmp_path, "--train-rows", "300", "--eval-rows", "40", "--param", "GroupSize=2",
                "--param", "MaxNumGenBatches=1", "--param", "EvalSize=20", "--param", "AccuracyThreshold=0")
    out = capsys.readouterr().out
    assert code == 1
    assert "[CheckAccuracy] Succeeded in" in out and ": false" in out
    assert "[RecordRejection] Succeeded" in out and "ApproveModel" not in out
    assert "optimizer steps completed 0 (at least 1 needed)" in out
    assert "training STOPPED EARLY after 0 optimizer steps: step 1: only" in out
    assert "model package: Rejected" in out
    evaluation = json.loads((_run_dir(tmp_path) / "evaluation.json").read_text())
    assert evaluation["training"]["stopped_early"] is True and evaluation["training"]["steps_completed"] == 0


def test_too_little_data_stops_at_validate_with_no_training_session(tmp_path, capsys):
    code = _run(tmp_path, "--train-rows", "5", "--eval-rows", "20")
    out = capsys.readouterr().out
    assert code == 1
    assert "[ValidateData] Failed" in out and "TrainDAPO" not in out
    assert "train data has 5 usable rows, fewer than --batch-size 16" in out
    d = _run_dir(tmp_path)
    validation = json.loads((d / "validation.json").read_text())
    assert validation["status"] == "refused"
    assert "training sessions created: 0" in out
    assert not (d / "metrics.jsonl").exists()


def test_ctrl_c_stops_every_process_the_run_started(tmp_path):
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "local.run", "--runs-dir", str(tmp_path / "runs"),
                             "--definition-out", str(tmp_path / "pipeline.json"), "--train-rows", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(root))
    urls = []
    for line in proc.stdout:
        urls += re.findall(r"http://127\.0\.0\.1:\d+", line)
        if line.startswith("[TrainDAPO] train: step=1 "):
            break
    proc.send_signal(signal.SIGINT)  # to the runner only, as a kill -INT would
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err
    assert len(urls) >= 2
    for url in urls[:2]:  # moto and the training-session service no longer listen
        host, port = url[len("http://"):].split(":")
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2).close()
    # No step process (they all run with paths under this run's directory) is left.
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "runs")], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", leftover.stdout
