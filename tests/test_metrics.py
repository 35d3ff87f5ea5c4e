"""The one metrics record per step: built from what was sampled and trained, written to lines and metrics.jsonl."""
import math
import re

import pytest

from pipeline.pipeline import METRIC_DEFINITIONS
from steps.dapo import health, metrics
from steps.dapo.batch import train_samples
from steps.dapo.sampling import Group, Rollout, StepBatch
from steps.dapo.task import Grade


def group(i, rewards, sampler_step=2):
    return Group(i, (0,), tuple(Rollout((1, 2), (-1.0, -1.0), "stop", float(r), Grade(bool(r), True, None))
                                for r in rewards), sampler_step)


def step_batch(sampled, kept, carry=()):
    return StepBatch(kept=tuple(kept), carry=tuple(carry), sampled=tuple(sampled), gen_batches=1 if sampled else 0,
                     failed_groups=0, empty_rollouts=0, speculative=0, hit_cap=False)


def test_figures_come_from_the_groups_sampled_this_step():
    sampled = [group(0, [1, 0]), group(1, [0, 0]), group(2, [1, 1])]
    batch = step_batch(sampled, kept=sampled[:1])
    record = {**metrics.sampling_figures(3, batch),
              **metrics.train_figures(batch, train_samples(batch.kept, False, True), {"loss:sum": -0.5}, 1.5, 3),
              **health.health_figures(health.step_rollouts(batch)), "sampler_kl": 1.5e-07}
    assert record["reward_mean"] == 0.5 and record["accuracy"] == 0.5
    assert record["filtered_frac"] == 2 / 3 and record["filtered_all_wrong_frac"] == 1 / 3
    assert metrics.line("train", record, metrics.TRAIN_FIELDS) == (
        "train: step=3 reward_mean=0.5000 accuracy=0.5000 loss=-0.5 tokens=4 seconds=1.50 accuracy_lenient=0.5000 "
        "completion_tokens_mean=2.0 truncated_frac=0.0000 off_policy_steps=0 "
        # the health figures, appended (steps/dapo/health.py)
        "entropy=1.0000 sampler_kl=1.5e-07 completion_tokens_p50=2.0 completion_tokens_p95=2.0 "
        "completion_tokens_max=2 repetition_frac=0.0000 format_error_rate=0.0000")
    assert metrics.line("sampling", record, metrics.SAMPLING_FIELDS) == (
        "sampling: step=3 gen_batches=1 groups_sampled=3 filtered_frac=0.6667 kept_groups=1 empty_rollouts=0")


def test_a_step_filled_by_carried_groups_reports_the_groups_it_trains_on():
    carried = [group(0, [1, 0]), group(1, [1, 1, 1, 0])]
    batch = step_batch(sampled=[], kept=carried)
    record = metrics.train_figures(batch, train_samples(batch.kept, False, True), {"loss:sum": 0.0}, 0.1, 4)
    assert record["reward_mean"] == 4 / 6 and record["accuracy"] == 4 / 6  # not 0 for "nothing sampled"
    # Nothing was sampled, so nothing was filtered or kept this step: no fraction, rather than a false 0.
    sampling = metrics.sampling_figures(4, batch)
    assert math.isnan(sampling["filtered_frac"]) and math.isnan(sampling["filtered_all_wrong_frac"])
    text = metrics.line("sampling", sampling, metrics.SAMPLING_FIELDS)
    assert text == "sampling: step=4 gen_batches=0 groups_sampled=0 filtered_frac=nan kept_groups=2 empty_rollouts=0"
    # CloudWatch's regex takes no datapoint from it; the other figures of the line still match.
    by_name = {m.name: m.regex for m in METRIC_DEFINITIONS}
    assert re.search(by_name["sampling:filtered_frac"], text) is None
    assert re.search(by_name["sampling:kept_groups"], text).group(1) == "2"


def test_lengths_cut_offs_and_off_policy_steps_of_a_step():
    fresh = Group(0, (0,), (Rollout((1,) * 512, (-1.0,) * 512, "length", 0.0, Grade(False, False, None)),
                            Rollout((1, 2), (-1.0, -1.0), "stop", 1.0, Grade(True, True, "7"))), sampler_step=4)
    carried = group(1, [1, 0], sampler_step=3)  # sampled for the step before: one step older
    batch = step_batch([fresh], kept=[carried, fresh])
    record = metrics.train_figures(batch, train_samples(batch.kept, False, True), {}, 1.0, 5, stale_dropped=2)
    assert record["completion_tokens_mean"] == 257 and record["truncated_frac"] == 0.5
    assert record["off_policy_steps"] == 1 and record["stale_groups_dropped"] == 2
    assert metrics.train_figures(step_batch([fresh], [fresh]), [], {}, 1.0, 5)["off_policy_steps"] == 0


def test_records_go_to_the_lines_the_jsonl_and_every_tracker(tmp_path):
    lines, tracked = [], []

    class Tracker:
        def log_metrics(self, record, step):
            tracked.append((step, record))

    log = metrics.MetricsLog(tmp_path / "m" / "metrics.jsonl", print_fn=lines.append, trackers=[Tracker()])
    log.eval({"step": 2, "accuracy": 0.25, "n": 4})
    assert lines == ["eval: step=2 accuracy=0.2500"]
    assert metrics.read(tmp_path / "m" / "metrics.jsonl") == [{"kind": "eval", "step": 2, "accuracy": 0.25, "n": 4}]
    assert tracked == [(2, {"eval/accuracy": 0.25, "eval/n": 4})]
    metrics.truncate_after(tmp_path / "m" / "metrics.jsonl", 1)
    assert metrics.read(tmp_path / "m" / "metrics.jsonl") == []


def test_an_evaluations_rollouts_go_to_rollouts_jsonl_and_every_trackers_table(tmp_path):
    from steps.dapo import rollouts
    from steps.dapo.heldout import Prediction

    tables = []

    class Tracker:
        def log_metrics(self, record, step):
            pass

        def log_table(self, data, artifact_file):
            tables.append((artifact_file, data))

    log = metrics.MetricsLog(tmp_path / "metrics.jsonl", print_fn=lambda _: None, trackers=[Tracker()])
    answers = [Prediction(f"q{i}", "7", "7", True, True, True, "#### 7", "stop", False, 1.0) for i in range(3)]
    log.rollouts(rollouts.rows(answers, 10, "trained", 2), 10)
    log.rollouts(rollouts.rows(answers, 20, "trained", 0), 20)  # eval_rollouts 0: nothing anywhere
    written = metrics.read(tmp_path / "rollouts.jsonl")
    assert [(r["step"], r["question"], r["extracted"], r["gold"], r["reward"]) for r in written] == [
        (10, "q0", "7", "7", 1.0), (10, "q1", "7", "7", 1.0)]
    [(name, data)] = tables
    assert name == "rollouts/step_000010.json" and data["question"] == ["q0", "q1"]
    assert list(data) == list(rollouts.FIELDS)
    metrics.truncate_after(tmp_path / "rollouts.jsonl", 5)  # a resumed run redoes step 10's evaluation
    assert metrics.read(tmp_path / "rollouts.jsonl") == []


def test_train_lines_end_with_progress_and_eta_after_every_field(tmp_path):
    """`progress=N/M eta=...` comes after the fields, so each CloudWatch regex still reads its own figure."""
    lines = []
    log = metrics.MetricsLog(tmp_path / "metrics.jsonl", print_fn=lines.append, total_steps=30)
    record = {"step": 0, "reward_mean": 0.25, "accuracy": 0.5, "loss": -0.5, "tokens": 4, "accuracy_lenient": 0.5,
              "completion_tokens_mean": 2.0, "truncated_frac": 0.0, "off_policy_steps": 0, "entropy": 1.0,
              "sampler_kl": 0.0, "completion_tokens_p50": 2.0, "completion_tokens_p95": 2.0,
              "completion_tokens_max": 2, "repetition_frac": 0.0, "format_error_rate": 0.0,
              **{k: 7 for k in metrics.TOKEN_FIELDS}}
    for step, seconds in ((11, 2.0), (12, 4.0)):
        log.step({**record, "step": step, "seconds": seconds})
    fields = metrics.line("train", {**record, "step": 12, "seconds": 4.0}, metrics.TRAIN_FIELDS + metrics.TOKEN_FIELDS)
    assert lines[-1] == fields + " progress=12/30 eta=54s"  # 18 steps left at the mean 3 s a step
    for m in METRIC_DEFINITIONS:
        if m.name.startswith("train:"):
            assert re.search(m.regex, lines[-1]).group(1) == re.search(m.regex, fields).group(1), m.name
    assert [r["step"] for r in metrics.read(tmp_path / "metrics.jsonl")] == [11, 12]  # the record has no ETA
    assert "eta" not in metrics.read(tmp_path / "metrics.jsonl")[0]
    assert metrics.progress(3, 30, [10.0, 20.0, 30.0]) == " progress=3/30 eta=9m00s"
    assert metrics.progress(3, None, [1.0]) == ""  # no known end (a MetricsLog without total_steps): no ending


def test_a_step_that_could_not_measure_sampler_kl_leaves_it_out_and_says_why(tmp_path):
    """A step trained only on groups earlier weights drew (step 18 of a default local run): no NaN in the line, the
    record or the regexes' datapoints; the reason in metrics.jsonl."""
    lines = []
    log = metrics.MetricsLog(tmp_path / "metrics.jsonl", print_fn=lines.append)
    record = {"step": 18, "reward_mean": 0.25, "accuracy": 0.5, "loss": -0.5, "tokens": 4, "seconds": 1.0,
              "accuracy_lenient": 0.5, "completion_tokens_mean": 2.0, "truncated_frac": 0.0, "off_policy_steps": 1,
              "entropy": 1.0, "completion_tokens_p50": 2.0, "completion_tokens_p95": 2.0, "completion_tokens_max": 2,
              "repetition_frac": 0.0, "format_error_rate": 0.0, "sampler_kl_note": health.ONLY_OLDER}
    log.step(record)
    assert "sampler_kl" not in lines[0] and "nan" not in lines[0]
    assert " off_policy_steps=1 entropy=1.0000 completion_tokens_p50=2.0 " in lines[0]
    [written] = metrics.read(tmp_path / "metrics.jsonl")
    assert "sampler_kl" not in written and written["sampler_kl_note"] == health.ONLY_OLDER
    for m in METRIC_DEFINITIONS:
        if m.name.startswith("train:"):
            assert (re.search(m.regex, lines[0]) is None) == (m.name == "train:sampler_kl"), m.name


def test_the_length_bias_compares_the_trained_groups_with_every_group_sampled(tmp_path):
    short = group(0, [1, 0])
    long_ = Group(1, (0,), tuple(Rollout((1,) * n, (-1.0,) * n, "stop", float(n == 40), Grade(n == 40, True, None))
                                 for n in (40, 60)))
    batch = step_batch([short, long_], kept=[short])  # the step trained the short group and carried the long one
    record = metrics.length_bias(batch)
    assert record["trained_completion_tokens_mean"] == 2 and record["trained_completion_tokens_p95"] == 2
    assert record["sampled_completion_tokens_mean"] == (2 + 2 + 40 + 60) / 4
    assert record["sampled_completion_tokens_p95"] == pytest.approx(57.0)  # numpy's linear interpolation
    carried_only = metrics.length_bias(step_batch([], kept=[long_]))
    assert carried_only["trained_completion_tokens_mean"] == 50
    assert math.isnan(carried_only["sampled_completion_tokens_mean"])
    lines = []
    log = metrics.MetricsLog(tmp_path / "metrics.jsonl", print_fn=lines.append)
    log.step({**{k: 1 for k in metrics.TRAIN_FIELDS}, **record})
    assert lines[0].endswith(" trained_completion_tokens_mean=2.0 trained_completion_tokens_p95=2.0 "
                             "sampled_completion_tokens_mean=26.0 sampled_completion_tokens_p95=57.0")
    assert lines[0].startswith("train: step=1 reward_mean=1 ")  # appended after the existing fields
