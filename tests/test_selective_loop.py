"""Selective rollouts in the loop, against the local training-session service through the real SDK: prompts
predicted all-equal are skipped as batches are drawn, the figures reach the train line, and a run resumed from
its checkpoint skips exactly as the uninterrupted run does (the history and probabilities are in the state)."""
from __future__ import annotations

import pytest

from steps.config import load_config
from steps.dapo import metrics as metrics_io
from steps.dapo import state as ckpt_io
from steps.dapo.selective import ALL_WRONG, MIXED
from steps.tasks import load_examples
from tests.test_train import LOCAL_CONFIG, Scripted, run_trainer, toy_data  # noqa: F401 - toy_data: a fixture

pytestmark = pytest.mark.usefixtures("local_service")


def config(max_steps: int):
    return load_config(LOCAL_CONFIG, {
        "batch_size": "4", "group_size": "2", "max_steps": str(max_steps), "max_inflight_gen_batches": "1",
        "max_num_gen_batches": "20", "eval_every": "0", "save_every": "3", "overlong_buffer": "0",
        "selective_rollouts": "true", "selective_p_step": "0.1", "guards": "false"})


def test_skips_what_recurs_all_equal_and_resumes_with_its_history(tmp_path, toy_data):  # noqa: F811
    examples = load_examples(toy_data[0])[:24]  # 24 prompts, a third mixed: an epoch every two steps or so
    mixed = {e.question for i, e in enumerate(examples) if i % 3 == 0}
    straight, lines, _ = run_trainer(tmp_path / "a", examples, config(6), Scripted(mixed, 2))
    assert straight.state.step == 6
    steps = [r for r in metrics_io.read(tmp_path / "a" / "metrics.jsonl") if r["kind"] == "step"]
    assert steps[0]["skipped_prompts"] == 0  # nothing known yet
    assert sum(r["skipped_prompts"] for r in steps[3:]) > 0
    # Skipping pays: the later steps, which know the prompts, keep more of what they sample than the first.
    assert min(r["observed_keep_rate"] for r in steps[3:]) > steps[0]["observed_keep_rate"]
    train_lines = [line for line in lines if line.startswith("train:")]
    assert all(" skipped_prompts=" in line and " exploration_share=" in line for line in train_lines)

    # The same run, stopped after its step-3 checkpoint and resumed: the history came back with it.
    first, _, _ = run_trainer(tmp_path / "b", examples, config(3), Scripted(mixed, 2))
    saved = ckpt_io.read(tmp_path / "b" / "ckpt")
    assert saved is not None and saved.step == 3 and first.state.step == 3
    history = saved.selective.history
    assert {history.of(i)[0] for i in range(len(examples)) if history.step[i] > 0} == {MIXED, ALL_WRONG}
    resumed, _, _ = run_trainer(tmp_path / "b", examples, config(6), Scripted(mixed, 2), start=saved)
    assert resumed.state.step == 6
    again = [r for r in metrics_io.read(tmp_path / "b" / "metrics.jsonl") if r["kind"] == "step"][3:]
    fields = ("groups_sampled", "skipped_prompts", "exploration_share", "observed_keep_rate")
    assert [[r[k] for k in fields] for r in again] == [[r[k] for k in fields] for r in steps[3:]]
    assert resumed.state.selective == straight.state.selective
