"""What a local run shows on the terminal (local/console.py, local/run.py's Progress): one compact line per
training step within 100 columns by default, the steps' full lines with --verbose."""
from __future__ import annotations

import math

from local import console
from steps.dapo import metrics


def _step_lines(step: int, total: int = 30, entropy: float = 0.41234) -> tuple[str, str]:
    """A step's sampling: and train: lines exactly as steps/dapo/metrics.py prints them."""
    sampling = {"step": step, "gen_batches": 3, "groups_sampled": 48, "filtered_frac": 0.6667, "kept_groups": 16,
                "empty_rollouts": 0}
    train = {"step": step, "reward_mean": 0.4219, "accuracy": 0.40625, "loss": -0.0123, "tokens": 12345,
             "seconds": 4.21, "accuracy_lenient": 0.4531, "completion_tokens_mean": 210.5, "truncated_frac": 0.0312,
             "off_policy_steps": 0, "entropy": entropy, "sampler_kl": math.nan, "completion_tokens_p50": 210.0,
             "completion_tokens_p95": 880.0, "completion_tokens_max": 1024, "repetition_frac": 0.0,
             "format_error_rate": 0.0312, "prefill_tokens": 123456, "sample_tokens": 4567890,
             "train_tokens": 3456789}
    printed = metrics.line("train", train, metrics.TRAIN_FIELDS + metrics.TOKEN_FIELDS[:3])
    return (metrics.line("sampling", sampling, metrics.SAMPLING_FIELDS),
            printed + metrics.progress(step, total, [4.21] * step))


def test_a_step_is_one_line_with_its_sampling_figures_within_100_columns():
    sampling, train = _step_lines(12)
    assert len(train) > 400  # what SageMaker's regexes read: far too wide for a terminal
    shown = console.StepLines()
    assert shown.render("TrainDAPO", sampling) == []  # joins the train line
    [line] = shown.render("TrainDAPO", train)
    assert line == ("[TrainDAPO] step 12/30  reward 0.42  acc 0.41  kept 16/48  entropy 0.412  2,932 tok/s  "
                    "eta 1m16s")
    assert len(line) <= 100


def test_a_figure_not_printed_or_nan_shows_as_a_dash_and_another_steps_sampling_is_not_borrowed():
    sampling, _ = _step_lines(3)
    _, train = _step_lines(4, entropy=math.nan)
    shown = console.StepLines()
    shown.render("TrainDAPO", sampling)
    [line] = shown.render("TrainDAPO", train)
    assert "entropy -" in line and "kept" not in line


def test_lines_wrap_at_100_columns_and_no_path_or_command_is_broken_across_lines():
    path = "/runs/20261204-184207-a3f2/" + "x-y" * 14 + "/TrainDAPO.log"  # 81 characters, hyphens in it
    text = "  note: " + "word " * 30 + path + " end"
    lines = console.fit(text)
    assert all(len(line) <= 100 for line in lines) and len(lines) > 2
    assert any(line.startswith(f"      {path}") for line in lines)  # continuation indent, the path whole
    assert " ".join(" ".join(lines).split()) == " ".join(text.split())  # nothing lost
    assert console.fit("short line") == ["short line"]
    wider = "/tmp/" + "x" * 250  # a path wider than the terminal: on a line of its own, whole
    assert console.fit(f"  artifacts in {wider}") == ["  artifacts in", f"      {wider}"]
    # A command to copy, on a line of its own, is one line at any width: pasted, it runs as printed.
    command = f"    .venv/bin/python -m local.run --runs-dir {wider} --resume 20261204-184207-a3f2"
    assert console.fit(f"  outcome: INTERRUPTED; continue it with:\n{command}") == [
        "  outcome: INTERRUPTED; continue it with:", command]


def test_progress_shows_compact_lines_by_default_and_the_full_ones_with_verbose(tmp_path, capsys):
    sampling, train = _step_lines(2)
    for verbose in (False, True):
        progress = console.Progress(quiet=False, log_dir=tmp_path, verbose=verbose)
        for line in (sampling, train, "INFO botocore: an SDK line"):
            progress.line("TrainDAPO", line)
        out = capsys.readouterr().out.splitlines()
        if verbose:
            assert out == [f"[TrainDAPO] {sampling}", f"[TrainDAPO] {train}"]
        else:
            assert len(out) == 1 and out[0].startswith("[TrainDAPO] step 2/30  reward 0.42") and len(out[0]) <= 100
    quiet = console.Progress(quiet=True, log_dir=tmp_path)
    quiet.line("TrainDAPO", train)
    quiet.line("TrainDAPO", "error: the session failed")
    assert capsys.readouterr().out == "[TrainDAPO] error: the session failed\n"


def test_the_printed_resume_command_works_in_the_shell_make_local_run_was_typed_in(tmp_path):
    """No venv active there: make's form for the project's runs/, else the venv's python with the runs dir."""
    from local import report
    from local.stack import ROOT

    assert report.resume_command(ROOT / "runs" / "20261204-184207-a3f2") == "make local-run RESUME=20261204-184207-a3f2"
    assert report.resume_command(tmp_path / "20261204-184207-a3f2") == \
        f".venv/bin/python -m local.run --runs-dir {tmp_path} --resume 20261204-184207-a3f2"


def test_the_package_version_is_explained_not_reset():
    """A fresh run's package is version 33 of 30 steps: each step's saveWeights and each checkpoint's saveState
    registered a version before it, as the service does (their ARNs are in metrics and checkpoints)."""
    from local import report

    arn = "arn:aws:sagemaker:us-west-2:123456789012:model-package/dapo-local/33"
    assert report.package_version_note(arn) == (
        "(the final sampler weights: version 33 of dapo-local; versions 1-32 are this run's earlier sampler weights "
        "and checkpoints, each registered as the service does)")


def test_the_paired_evaluation_and_the_approval_read_in_a_line_or_two():
    """EvaluateModel's eval: line (as steps/evaluate.py prints it) and an approve: line's first clause; the whole
    of each stays in the step's log."""
    from steps.evaluate import summary_line

    def metric(value: float) -> dict[str, float]:
        return {"value": value}

    trained = {"accuracy": metric(0.25), "format_error_rate": metric(0.0), "accuracy_lenient": metric(0.25),
               "pass_at_k": {"value": 0.4, "k": 4}, "maj_at_k": metric(0.3083)}
    evaluation = {"metrics": trained, "n": 20, "failed_requests": 0,
                  "base": {"metrics": {"accuracy": metric(0.2), "pass_at_k": {"value": 0.35, "k": 4}}},
                  "improvement": {"value": 0.05, "ci95_low": -0.1895, "ci95_high": 0.2884}}
    shown = console.StepLines().render("EvaluateModel", summary_line(evaluation))
    assert " ".join(" ".join(shown).split()) == (
        "[EvaluateModel] eval on 20 questions: accuracy 0.250 (base 0.200), improvement +0.050 (95% CI -0.190 to "
        "+0.288), pass@4 0.400 (base 0.350)")
    assert all(len(line) <= 100 for line in shown)
    assert console.StepLines().render("TrainDAPO", "eval: step=10 accuracy=0.5300") == \
        ["[TrainDAPO] eval: step=10 accuracy=0.5300"]
    approve = "approve: arn:aws:sagemaker:r:1:model-package/g/5 approved: Approved by the pipeline; accuracy 0.61"
    shown = console.StepLines().render("ApproveModel", approve)
    assert " ".join(shown).split() == ("[ApproveModel] approve: arn:aws:sagemaker:r:1:model-package/g/5 approved: "
                                       "Approved by the pipeline; ... (all of it: logs/ApproveModel.log)").split()
    assert all(len(line) <= 100 for line in shown)


def test_no_library_advice_reaches_the_terminal_of_make_sample():
    """transformers says "PyTorch was not found" on import (only its tokenizers are used): make sample's logging
    setup (pipeline/sample.py quiet_logging, before the tokenizer's import) keeps it off."""
    import subprocess
    import sys

    from local.stack import ROOT

    code = "from pipeline.sample import quiet_logging; quiet_logging(); import transformers"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stderr


def test_every_failure_a_resume_can_mend_prints_the_resume_command_on_a_line_of_its_own(tmp_path):
    """A job step's failure, a step the dead service failed (even a refusal: the service, not the input, failed)
    and the runner's own; not a refusal of the input, nor the gate's verdict, which a resume would repeat."""
    from local import report
    from local.pipeline_runner import PipelineFailed, StepRecord

    run_dir = tmp_path / "runs" / "20261204-184207-a3f2"
    command = report.resume_command(run_dir)

    def outcome(step: str, kind: str | None, message: str) -> str:
        records = {step: StepRecord(step, kind, "Failed", message)} if kind else {}
        return report.outcome(run_dir, records, PipelineFailed(step, message), interrupted=False)

    dead = report.blame_dead_service("exit code 2: error: the session was not found", -9)
    assert dead.startswith("the local training-session service died (exit code -9), so the step failed: exit code 2")
    mended = (outcome("TrainDAPO", "Training", "exit code 1: error: x"), outcome("EvaluateModel", "Processing", dead),
              outcome("local run", None, "OSError: no port"))
    for text in mended:
        assert text.endswith(f"; continue it with:\n    {command}")
        assert console.fit(f"  outcome: {text}")[-1] == f"    {command}"  # one line, whatever its width
    for repeated in (outcome("ValidateData", "Processing", "exit code 2: error: refused"),
                     outcome("AccuracyTooLow", "Fail", "Not approved: accuracy 0.1 below 0.5")):
        assert command not in repeated
