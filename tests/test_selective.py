"""Selective rollouts (steps/dapo/selective.py): the prompts' history across a resume, the adaptive skip
probability, the exploration floor, and the skip decisions as the data order is drawn. Pure functions only."""
import json

import numpy as np
import pytest

from steps.dapo import selective as sel
from steps.dapo import state as ckpt_io
from steps.dapo.sampling import Cursor, DataPosition, Group, Rollout
from steps.dapo.state import LoopState
from steps.dapo.task import Grade


def group(index: int, correct: list[bool]) -> Group:
    rollouts = tuple(Rollout((1,), (-0.1,), "stop", float(c), Grade(c, True, None)) for c in correct)
    return Group(index, (7,), rollouts)


MIX, RIGHT, WRONG = [True, False], [True, True], [False, False]


def test_the_history_records_outcome_streak_and_step():
    h = sel.PromptHistory().observed([group(3, WRONG), group(1, MIX)], step=1)
    h = h.observed([group(3, WRONG), group(5, RIGHT)], step=2)
    assert h.of(3) == (sel.ALL_WRONG, 2) and h.step[3] == 2
    assert h.of(1) == (sel.MIXED, 0) and h.of(5) == (sel.ALL_RIGHT, 1)
    assert h.of(0) == (sel.UNSEEN, 0) and h.of(10_000) == (sel.UNSEEN, 0)  # beyond the arrays: never sampled
    assert h.observed([group(3, MIX)], step=3).of(3) == (sel.MIXED, 0)  # a mixed group ends the streak
    assert h.of(3) == (sel.ALL_WRONG, 2)  # observed() copied: the old history is unchanged


def test_the_history_survives_a_checkpoint_and_a_resume(tmp_path):
    history = sel.PromptHistory().observed([group(i, WRONG if i % 3 else RIGHT) for i in range(0, 100_000, 7)], step=4)
    state = LoopState(seed=0, step=4, selective=sel.SkipState(history, p_easy=0.41, p_hard=0.62))
    ckpt_io.write(tmp_path, state)
    resumed = ckpt_io.resume_or_start(tmp_path, seed=0)
    assert resumed == state
    assert resumed.selective.history.of(99_995) == (sel.ALL_WRONG, 1)
    assert (resumed.selective.p_easy, resumed.selective.p_hard) == (0.41, 0.62)
    # Bounded: a 100k-prompt history is 7 bytes a prompt in memory and compressed in checkpoint.json.
    assert sum(a.nbytes for a in (history.outcome, history.streak, history.step)) <= 7 * 100_000
    assert (tmp_path / "checkpoint.json").stat().st_size < 100_000


def test_a_checkpoint_without_a_history_resumes_with_an_empty_one(tmp_path):
    raw = ckpt_io.to_json(LoopState(seed=0, step=2))
    del raw["selective"]  # written before selective rollouts
    (tmp_path / "checkpoint.json").write_text(json.dumps(raw))
    assert ckpt_io.read(tmp_path).selective == sel.SkipState()


def test_the_skip_probability_grows_with_the_streak_down_to_the_floor():
    assert sel.keep_probability(sel.UNSEEN, 0, 0.5, 0.5, 0.01) == 1.0
    assert sel.keep_probability(sel.MIXED, 0, 0.5, 0.5, 0.01) == 1.0
    assert sel.keep_probability(sel.ALL_RIGHT, 1, 0.5, 0.9, 0.01) == 0.5  # easy prompts: p_easy
    assert sel.keep_probability(sel.ALL_WRONG, 2, 0.5, 0.9, 0.01) == pytest.approx(0.81)  # hard prompts: p_hard ** 2
    # The exploration floor: however long the streak, the prompt keeps this chance of being sampled.
    assert sel.keep_probability(sel.ALL_RIGHT, 40, 0.5, 0.5, 0.01) == 0.01
    assert sel.keep_probability(sel.ALL_WRONG, 65_535, 0.05, 0.05, 0.02) == 0.02


def test_the_exploration_probabilities_adapt_toward_the_target():
    settings = sel.Settings(enabled=True, target_zero_variance=0.3, explore_p=0.5, p_step=0.1, p_min=0.2, p_max=0.7)
    # Too many all-wrong groups sampled (share 0.5 >= 2/3 of 0.3): skip hard prompts more; no all-right: less.
    state = sel.after_step(sel.SkipState(), [group(0, WRONG), group(1, MIX)], 1, settings)
    assert (state.p_easy, state.p_hard) == pytest.approx((0.6, 0.4))
    # Too many all-right (0.5 >= 1/3 of 0.3), none all-wrong.
    state = sel.after_step(state, [group(2, RIGHT), group(3, MIX)], 2, settings)
    assert (state.p_easy, state.p_hard) == pytest.approx((0.5, 0.5))
    # Clamped to [p_min, p_max].
    for step in range(3, 12):
        state = sel.after_step(state, [group(4, WRONG)], step, settings)
    assert (state.p_easy, state.p_hard) == pytest.approx((0.7, 0.2))
    assert sel.after_step(state, [], 12, settings) == state  # nothing sampled: no evidence, nothing moves
    # A step whose draws the history had no say in (no prompt predicted all-equal) moves nothing.
    quiet = sel.after_step(state, [group(9, WRONG)], 13, settings, had_a_say=False)
    assert (quiet.p_easy, quiet.p_hard) == (state.p_easy, state.p_hard) and quiet.history.of(9) == (sel.ALL_WRONG, 1)


def test_the_selector_skips_predicted_all_equal_prompts_and_explores_some():
    history = sel.PromptHistory().observed([group(i, WRONG) for i in range(50)], step=1)
    history = history.observed([group(i, WRONG) for i in range(50)], step=2)  # streak 2: keep 0.25 at p 0.5
    selector = sel.Selector(sel.Settings(enabled=True), sel.SkipState(history))
    cursor = Cursor(DataPosition(), 0)
    indices, _ = cursor.next(100, 40, seed=1, selector=selector)
    assert len(indices) == 40 and len(set(indices)) == 40
    unseen = [i for i in indices if i >= 50]
    assert selector.skipped > 0 and selector.explored == 40 - len(unseen) > 0
    assert selector.skipped + selector.picked == cursor.position.offset  # every prompt looked at counts
    figures = selector.figures()
    assert figures["skipped_prompts"] == selector.skipped
    assert figures["exploration_share"] == pytest.approx(selector.explored / 40)
    assert figures["predicted_keep_rate"] == pytest.approx(len(unseen) / 40)
    # Seeded per generation batch: a resumed run draws the same prompts.
    again = Cursor(DataPosition(), 0).next(100, 40, seed=1, selector=sel.Selector(sel.Settings(enabled=True),
                                                                                sel.SkipState(history)))[0]
    assert again == indices


def test_a_batch_is_filled_even_when_every_prompt_is_predicted_all_equal():
    history = sel.PromptHistory().observed([group(i, RIGHT) for i in range(10)], step=1)
    settings = sel.Settings(enabled=True, explore_p=0.05, p_min=0.05, keep_floor=0.01)
    for _ in range(20):
        history = history.observed([group(i, RIGHT) for i in range(10)], step=1)
    indices, _ = Cursor(DataPosition(), 0).next(10, 8, seed=0, selector=sel.Selector(settings, sel.SkipState(history)))
    assert len(indices) == 8  # after an epoch's worth looked at, the rest are taken as they come


def test_the_floor_keeps_every_prompt_reachable():
    """Over many draws a prompt with an endless all-equal streak is still sampled about floor of the time."""
    history = sel.PromptHistory(np.array([sel.ALL_WRONG], np.uint8), np.array([60_000], np.uint16),
                                np.array([1], np.int32))
    selector = sel.Selector(sel.Settings(enabled=True, keep_floor=0.05), sel.SkipState(history, 0.05, 0.05))
    rng = np.random.default_rng(0)
    kept = sum(selector.keep(0, rng) for _ in range(4000))
    assert 150 <= kept <= 250  # 5% of 4000, give or take


def test_the_figures_are_appended_to_the_train_line_and_reach_every_tracker(tmp_path):
    """After every existing field (the CloudWatch regexes read the line), before progress; metrics.jsonl and the
    trackers (MLflow: ``step/skipped_prompts`` ...) get them as any figure."""
    from steps.dapo import metrics

    lines, tracked = [], []

    class Tracker:
        def log_metrics(self, record, step):
            tracked.append(record)

    log = metrics.MetricsLog(tmp_path / "metrics.jsonl", print_fn=lines.append, trackers=[Tracker()], total_steps=2)
    record = {**{k: 0.5 for k in metrics.TRAIN_FIELDS + metrics.TOKEN_FIELDS}, "step": 1,
              "skipped_prompts": 12, "predicted_keep_rate": 0.75, "observed_keep_rate": 0.625,
              "exploration_share": 0.25}
    log.step(record)
    before = metrics.line("train", record, metrics.TRAIN_FIELDS + metrics.TOKEN_FIELDS)
    assert lines[0].startswith(before + " skipped_prompts=12 predicted_keep_rate=0.7500 observed_keep_rate=0.6250 "
                               "exploration_share=0.2500 progress=1/2")
    assert metrics.read(tmp_path / "metrics.jsonl")[0]["skipped_prompts"] == 12
    assert tracked[0]["step/exploration_share"] == 0.25
    # Off (no selective figures in the record): the line is what it was.
    log.step({k: v for k, v in record.items() if k not in metrics.SELECTIVE_FIELDS})
    assert lines[1].startswith(before + " progress=")


def test_the_local_runs_summary_gives_sampled_per_trained_tokens():
    from local.report import sampled_per_trained_lines

    off = [{"sampled_completion_tokens": 300, "tokens": 100}, {"sampled_completion_tokens": 100, "tokens": 100}]
    assert sampled_per_trained_lines(off) == ["  sampled tokens per trained token: 2.00 (selective rollouts off)"]
    on = [{**r, "skipped_prompts": n} for r, n in zip(off, (0, 7))]
    assert sampled_per_trained_lines(on) == [
        "  sampled tokens per trained token: 2.00 (selective rollouts on: 7 prompts skipped)"]
    assert sampled_per_trained_lines([{"tokens": 5}]) == []  # a record without the figure (an older run): no line
