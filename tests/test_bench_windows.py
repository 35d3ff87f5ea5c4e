"""make bench's balanced windows and critical path (bench/loops.py): what a window times, at what price."""
import pytest

from bench.loops import balanced_window, critical_s

ON_POLICY = [False] * 11  # bench/loops.py's STEPS
PIPELINED = [False] + [True] * 10  # step 1 has nothing to overlap
AUTO_BACK_ON_POLICY = [False, False, True] + [False] * 8  # the probe: step 3 sampled while step 2 trained


@pytest.mark.parametrize("ahead,lines,sampled", [
    (ON_POLICY, (2, 8), [3, 4, 5, 6, 7, 8]),
    (PIPELINED, (2, 8), [4, 5, 6, 7, 8, 9]),  # step 9 is sampled while step 8 trains: inside train lines 2-8
    (AUTO_BACK_ON_POLICY, (3, 9), [4, 5, 6, 7, 8, 9]),  # lines 2-8 would hold five samplings
])
def test_a_window_holds_as_many_samplings_as_trainings(ahead, lines, sampled):
    w = balanced_window(ahead)
    assert (w["from_line"], w["to_line"]) == lines
    assert w["sampled"] == sampled and len(w["trained"]) == len(sampled) == 6


def test_no_window_holds_the_runs_last_step():
    # The last step starts no spares and samples nothing ahead: a window holding it would flatter the loop.
    for ahead in (ON_POLICY, PIPELINED, AUTO_BACK_ON_POLICY):
        w = balanced_window(ahead)
        assert max(w["sampled"] + w["trained"]) < len(ahead)
    with pytest.raises(RuntimeError, match="before the last"):
        balanced_window(PIPELINED[:9])  # 9 steps: sampling ahead, the window would sample step 9, the last


def test_no_balanced_window_is_an_error():
    with pytest.raises(RuntimeError, match="no balanced window"):
        balanced_window([False] + [True] * 7)  # step 8 sampled nothing ahead: trainings outnumber samplings


def rows(ahead, S, T, saves=()):
    return [{"step": s, "sampled_ahead": a, "sampling_s": S, "training_s": T,
             "save_state_s": 10.0 if s in saves else 0.0} for s, a in enumerate(ahead, start=1)]


@pytest.mark.parametrize("ahead,shared,expected", [
    (ON_POLICY, False, 6 * (13 + 12) + 0),  # S + T; the saves hide under the next step's sampling
    (PIPELINED, False, 6 * 12 + 2 * 10),  # the busier pool: the trainer, with two saves
    (PIPELINED, True, 6 * (13 + 12) + 2 * 10),  # shared GPUs: nothing overlaps
    (ON_POLICY, True, 6 * (13 + 12) + 2 * 10),
])
def test_the_critical_path_prices_each_pool_once(ahead, shared, expected):
    steps = rows(ahead, 13.0, 12.0, saves=(3, 6))
    assert critical_s(steps, balanced_window(ahead), shared) == pytest.approx(expected)


def test_sampled_ahead_the_sampler_is_the_bound_when_it_is_the_busier_pool():
    steps = rows(PIPELINED, 30.0, 12.0, saves=(3, 6))
    assert critical_s(steps, balanced_window(PIPELINED), False) == pytest.approx(6 * 30)


def test_the_throughput_floor_is_the_same_for_every_loop_and_overlaps_only_on_separate_gpus():
    from dataclasses import replace

    from bench.loops import base_costs, throughput_floor

    costs = base_costs()
    spec = {"batch_size": 32, "save_every": 3}
    # Two loops of the same workload: 20% of groups kept, 1,024 completion tokens a group, 12 s of training.
    runs = [{"spec": spec, "steps": [{"groups_kept": 32, "groups_sampled": 160, "sampled_tokens": 160 * 1024,
                                      "training_s": 12.0}] * n} for n in (3, 5)]
    save = costs.training_seconds("saveState", 0) / 3
    f = throughput_floor(runs, costs)
    assert f["sampling_s"] == pytest.approx(160 * 1024 / costs.decode_tokens_per_s)  # no tail, full throughput
    assert f["training_s"] == pytest.approx(12.0 + save)
    assert f["floor_s"] == pytest.approx(max(f["sampling_s"], f["training_s"])) and f["keep_observed"] == 0.2
    shared = throughput_floor(runs, replace(costs, shared_gpus=True))
    assert shared["floor_s"] == pytest.approx(f["sampling_s"] + f["training_s"])
    longer = throughput_floor(runs, replace(costs, length_scale=5))
    assert longer["sampling_s"] == pytest.approx(5 * f["sampling_s"])
