"""The local service's cost model: the simulated GPUs' arithmetic, its settings, and results held until done."""
from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request

import pytest

from local.training_session.costs import Costs, Gpus, VirtualClock, WallClock
from tests.local_service import BASE_MODEL_ARN

# 10 tokens/s per sequence (100 ms per token) up to a capacity of 10 sequences (100 tokens/s shared).
SMALL = Costs(enabled=True, decode_tokens_per_s=100, token_latency_ms=100, prefill_tokens_per_s=1000,
              train_tokens_per_s=1000, optim_step_s=2, save_weights_s=3, save_state_s=5)


class Sim:
    """A session's simulated GPUs on a wall clock the test sets."""

    def __init__(self, costs: Costs = SMALL, wall: float = 1000.0) -> None:
        self.wall = wall
        self.gpus = Gpus(costs, WallClock(costs.time_scale, lambda: self.wall))

    def now(self) -> float:
        """Simulated seconds since the session started."""
        return self.gpus.now() - self.gpus.origin

    def at(self, simulated: float) -> Gpus:
        self.wall += (simulated - self.now()) / self.gpus.costs.time_scale
        return self.gpus

    def finish(self, job) -> float:
        assert self.at(self.now() + 1e6).done(job)  # far enough for anything queued in these tests
        return self.since_start(job.finish)

    def since_start(self, t: float) -> float:
        return t - self.gpus.origin


def test_one_sequence_costs_its_prefill_and_its_tokens_times_the_token_latency():
    sim = Sim()
    job = sim.gpus.sampling_arrives(prompt_tokens=200)  # 0.2 s of prefill
    sim.gpus.sampled(job, [50])  # 5 s of decode under capacity
    assert not sim.at(5.19).done(job)
    assert sim.at(5.2 + 1e-6).done(job)
    assert sim.since_start(job.finish) == pytest.approx(5.2)


def test_sequences_beyond_the_batch_capacity_share_the_decode_throughput():
    sim = Sim()
    under = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(under, [20] * 10)  # exactly the capacity: 2 s at full speed
    assert sim.finish(under) == pytest.approx(2.0)

    sim = Sim()
    over = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(over, [20] * 40)  # 4x the capacity: 800 tokens at 100 tokens/s
    assert sim.finish(over) == pytest.approx(8.0)
    assert sim.gpus.snapshot()["decoded_tokens"] == pytest.approx(800)


@pytest.mark.parametrize("max_running", [20, 1024])  # 20: the cap holds exactly the 20 sequences, as if none
def test_a_finish_moves_later_when_more_sequences_arrive(max_running):
    sim = Sim(Costs(**{**SMALL.to_dict(), "max_running": max_running}))
    first = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(first, [40])  # alone: 4 s
    sim.at(1.0)  # 10 tokens done; then 19 more sequences arrive: 20 active, 5 tokens/s each
    crowd = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(crowd, [100] * 19)
    # The first's remaining 30 tokens now take 6 s: it ends at 7 s, not 4.
    assert sim.finish(first) == pytest.approx(7.0)
    # The crowd: 30 tokens at 5/s to t=7, then 19 sequences (over capacity) share 100/s for the other 70 each.
    assert sim.since_start(crowd.finish) == pytest.approx(7.0 + 70 * 19 / 100)


def test_beyond_the_running_cap_a_late_request_waits_for_a_running_sequence_and_slows_none():
    """vLLM's max_num_seqs: 20 sequences run, sharing the 100 tokens/s (5 each); a 21st waits for a running one to
    end, and the running ones keep their 5 tokens/s (without the cap, 21 would share from 0.5 s)."""
    def run(max_running: int) -> tuple[float, float, float]:
        sim = Sim(Costs(**{**SMALL.to_dict(), "max_running": max_running}))
        short, long = sim.gpus.sampling_arrives(0), sim.gpus.sampling_arrives(0)
        sim.gpus.sampled(short, [5])  # ends at 1 s
        sim.gpus.sampled(long, [20] * 19)  # 5 tokens by 1 s, 15 more at 5/s: ends at 4 s
        sim.at(0.5)
        late = sim.gpus.sampling_arrives(0)
        sim.gpus.sampled(late, [20])
        assert sim.at(0.9).snapshot()["waiting_now"] == (1 if max_running == 20 else 0)
        return sim.finish(short), sim.finish(long), sim.finish(late)

    assert run(20) == pytest.approx((1.0, 4.0, 4.5))  # late: from 1 s, 15 tokens at 5/s, then 5 alone at 10/s
    # Uncapped, 21 share 100 tokens/s from 0.5 s: every running one slowed, the late one sooner.
    assert run(1024) == pytest.approx((0.5 + 2.5 * 21 / 100, 4.025, 4.275))


def test_the_queue_admits_first_come_first_served_one_sequence_at_a_time():
    """Cap 2: a request's own sequences wait their turn one by one, and a shorter request that came later waits
    for all of an earlier one's (not shortest first). Each wait is one jump of virtual time: the bound a wait
    sleeps until runs the queue too."""
    sim = Sim(Costs(**{**SMALL.to_dict(), "max_running": 2}))
    first = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(first, [10, 30])  # both run at 10 tokens/s: end at 1 s and 3 s
    sim.at(0.2)
    second = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(second, [10, 10])  # waits: its first from 1 s to 2 s, its second from 2 s to 3 s
    sim.at(0.4)
    third = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(third, [5])  # waits behind both of second's: from 3 s to 3.5 s
    assert sim.at(1.5).snapshot()["waiting_now"] == 2
    for job, done, jumps in ((first, 3.0, 1), (second, 3.0, 0), (third, 3.5, 1)):  # second ends with first
        assert jump_until_done(sim, [job], limit=1) == jumps
        assert sim.since_start(job.finish) == pytest.approx(done)


def test_training_queues_in_order_and_costs_tokens_or_fixed_times():
    sim = Sim()
    g = sim.gpus
    fb = g.training_arrives("forwardBackward", 3000)  # 3 s at 1000 tokens/s
    optim = g.training_arrives("optimizerStep", 0)  # 2 s, after the forward_backward
    save = g.training_arrives("saveWeights", 0)  # 3 s
    assert [sim.since_start(j.finish) for j in (fb, optim, save)] == pytest.approx([3.0, 5.0, 8.0])
    sim.at(20.0)
    later = g.training_arrives("saveState", 0)  # the trainer is idle again: starts at its arrival
    assert sim.since_start(later.finish) == pytest.approx(25.0)
    forward = g.training_arrives("forward", 3000)  # a third of forward_backward
    assert sim.since_start(forward.finish) == pytest.approx(26.0)
    assert sim.at(30.0).snapshot()["trainer_busy_s"] == pytest.approx(3 + 2 + 3 + 5 + 1)


@pytest.mark.parametrize("shared, expected", [(False, 5.0), (True, 8.0)])
def test_shared_gpus_pause_decoding_while_training_runs(shared, expected):
    sim = Sim(Costs(**{**SMALL.to_dict(), "shared_gpus": shared}))
    sample = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(sample, [50])  # 5 s of decode
    sim.at(1.0)
    sim.gpus.training_arrives("saveWeights", 0)  # 3 s from t=1
    assert sim.finish(sample) == pytest.approx(expected)
    busy = sim.gpus.snapshot()
    assert busy["sampler_busy_s"] == pytest.approx(5.0) and busy["trainer_busy_s"] == pytest.approx(3.0)


def test_the_length_scale_prices_each_generated_and_trained_token_as_that_many():
    """Long completions without generating them: 4x the tokens, 4x the decode and forward_backward time."""
    sim = Sim(Costs(**{**SMALL.to_dict(), "length_scale": 4.0}))
    sample = sim.gpus.sampling_arrives(prompt_tokens=200)  # prefill is not scaled: 0.2 s
    sim.gpus.sampled(sample, [50])  # 200 tokens at 10/s
    fb = sim.gpus.training_arrives("forwardBackward", 500)  # 2,000 tokens at 1,000/s
    optim = sim.gpus.training_arrives("optimizerStep", 0)  # fixed times stay
    assert sim.finish(sample) == pytest.approx(20.2)
    assert [sim.since_start(j.finish) for j in (fb, optim)] == pytest.approx([2.0, 4.0])
    assert sim.gpus.snapshot()["decoded_tokens"] == pytest.approx(200)


def test_the_time_scale_runs_simulated_time_faster_than_the_wall_clock():
    sim = Sim(Costs(**{**SMALL.to_dict(), "time_scale": 100.0}))
    job = sim.gpus.training_arrives("saveState", 0)  # 5 simulated seconds
    start = sim.wall
    sim.wall = start + 0.049
    assert not sim.gpus.done(job)
    sim.wall = start + 0.0501
    assert sim.gpus.done(job) and sim.now() == pytest.approx(5.01)


def test_events_are_exact_at_a_large_simulated_clock():
    """Deep into a long run (or at a large time scale) rounding must not lose a sequence's end."""
    sim = Sim()
    sim.at(1e9)
    job = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(job, [3, 1_000_000])
    assert sim.finish(job) == pytest.approx(1e9 + 1_000_000 * 0.1)


def test_jumping_from_earliest_finish_to_earliest_finish_ends_every_job():
    """What virtual time does: the clock only ever moves to a waiting job's earliest possible finish (here
    exactly: time scale 1). Rounding must never leave a job unfinished with no later time to jump to."""
    rng = random.Random(3)
    sim = Sim(Costs(enabled=True, token_latency_ms=25, decode_tokens_per_s=6000))
    jobs = []
    for _ in range(60):
        sim.at(sim.gpus.now() + rng.random())
        job = sim.gpus.sampling_arrives(rng.randint(10, 60))
        sim.gpus.sampled(job, [rng.choice([1, 3, 37, 130, 512]) for _ in range(8)])
        jobs.append(job)
    for _ in range(10_000):
        waiting = [j for j in jobs if not sim.gpus.done(j)]
        if not waiting:
            break
        sim.wall = min(sim.gpus._earliest_finish(j) for j in waiting)  # noqa: SLF001 - the bound the wait uses
    assert all(sim.gpus.done(j) for j in jobs)


def jump_until_done(sim: Sim, jobs: list, limit: int) -> int | None:
    """What virtual time does: jump the clock to the earliest time a waiting job could be done, until every job
    is. The number of jumps, or None if ``limit`` jumps were not enough."""
    for jumps in range(limit + 1):
        waiting = [j for j in jobs if not sim.gpus.done(j)]
        if not waiting:
            return jumps
        sim.wall = min(sim.gpus._earliest_finish(j) for j in waiting)  # noqa: SLF001 - the bound the wait uses
    return None


def test_a_crowded_decoder_never_stalls_the_clock():
    """Issue 20's hang. 400 sequences share the decoder at 15 tokens/s each, where one alone gets 40. The bound a
    wait slept until assumed 40, so each jump covered 3/8 of what was left (78 jumps for one request); and once one
    rounding step of decode progress was left, ``progress + rate * dt`` no longer changed it, and the clock crept
    on by a rounding step per jump for ever (here, after a session's first 1,000 tokens). The bound is now the
    finish if nothing else arrives: one jump per request."""
    sim = Sim(Costs(enabled=True), wall=0.0)  # the default figures: 150 sequences at full speed, 6,000 tokens/s
    first = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(first, [1000])  # alone: 25 s
    assert jump_until_done(sim, [first], limit=5) == 1
    short = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(short, [100] * 8)
    crowd = [sim.gpus.sampling_arrives(0) for _ in range(49)]
    for job in crowd:
        sim.gpus.sampled(job, [512] * 8)
    assert jump_until_done(sim, [short], limit=100) == 1
    assert sim.since_start(short.finish) == pytest.approx(25 + 100 / 15)  # 400 sharing: 15 tokens/s each
    assert jump_until_done(sim, crowd, limit=100) == 1  # the 392 others end together


def test_a_sample_whose_work_is_not_known_holds_back_what_finishes_after_its_arrival():
    """Events are committed in time order: an earlier arrival still being computed is waited for."""
    sim = Sim()
    early = sim.gpus.sampling_arrives(0)
    sim.gpus.sampled(early, [10])  # would end at 1 s alone
    sim.at(0.5)
    computing = sim.gpus.sampling_arrives(0)  # arrived at 0.5 s; its numpy work is still running
    assert not sim.at(2.0).done(early)
    sim.gpus.sampled(computing, [10] * 19)  # 20 active from 0.5 s: 5 tokens/s each
    assert sim.gpus.done(early) and sim.since_start(early.finish) == pytest.approx(0.5 + 5 / 5)


def test_virtual_time_jumps_only_while_every_request_waits_on_the_gpus():
    wall = [0.0]
    clock, stopped = VirtualClock(lambda: wall[0]), threading.Event()
    with clock.request(submits=False), clock.holding():  # a result poll, held for its operation
        with clock.request(submits=True):  # while a submit is still in progress, the client is at work
            clock.sleep_until(5.0, stopped, deadline=wall[0])
            assert clock.now() == 0.0
        clock.sleep_until(5.0, stopped, deadline=wall[0])  # the submit just ended: more may be coming
        assert clock.now() == 0.0
        wall[0] += VirtualClock.QUIET_S
        clock.sleep_until(5.0, stopped, deadline=wall[0])  # quiet, only polls waiting: time jumps
        assert clock.now() == 5.0
    clock.sleep_until(9.0, stopped, deadline=wall[0])  # nothing waits on the GPUs: no time passes
    assert clock.now() == 5.0


@pytest.mark.parametrize("values, named", [({"time_scale": 0}, "time_scale=0"), ({"enabled": "yes"}, "enabled="),
                                           ({"save_state_s": -1}, "save_state_s=-1"), ({"speed": 2}, "'speed'"),
                                           ({"max_running": 0}, "max_running=0"),
                                           ({"max_running": 2.5}, "max_running=2.5 is invalid: expected a whole")])
def test_settings_name_the_bad_one(values, named):
    with pytest.raises(ValueError, match=named):
        Costs.from_mapping(values)


def test_settings_from_the_environment():
    assert Costs.from_env({"LOCAL_TS_COST_MODEL": "1", "LOCAL_TS_COST_TIME_SCALE": "50",
                           "LOCAL_TS_COST_SHARED_GPUS": "false", "LOCAL_TS_COST_MAX_RUNNING": "256"}
                          ) == Costs(enabled=True, time_scale=50.0, max_running=256)
    with pytest.raises(ValueError, match="LOCAL_TS_COST_MODEL='maybe' is not a bool"):
        Costs.from_env({"LOCAL_TS_COST_MODEL": "maybe"})


def test_settings_from_the_command_line_override_the_environment(monkeypatch):
    from local.training_session.__main__ import _parser, _settings

    monkeypatch.setenv("LOCAL_TS_COST_TIME_SCALE", "10")
    monkeypatch.setenv("LOCAL_TS_COST_SAVE_STATE_S", "4")
    args = _parser().parse_args(["--cost-model", "--time-scale", "50", "--shared-gpus"])
    assert _settings(Costs, args) == Costs(enabled=True, time_scale=50.0, save_state_s=4.0, shared_gpus=True)


def _admin(url: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/_admin/costs", data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_through_the_sdk_a_result_is_shown_only_once_its_simulated_time_has_passed(local_service, service_client):
    status, body = _admin(local_service.url, {"enabled": True, "time_scale": 1000, "token_latency_ms": 50,
                                              "max_running": 4.0})  # a whole float (a scenario's factor)
    assert status == 200 and body["costs"]["time_scale"] == 1000 and type(body["costs"]["max_running"]) is int
    assert _admin(local_service.url, {"time_scale": -1})[0] == 400
    with service_client.create_sampling_client(base_model=BASE_MODEL_ARN) as sampler:  # costed: created after
        t0 = time.monotonic()
        response = sampler.sample([2, 6], 4, {"max_tokens": 512, "temperature": 1.0, "seed": 3}).result()
        longest = max(len(seq.tokens) for seq in response.sequences)
        _, report = _admin(local_service.url)
        costed = report["sessions"][sampler.training_session_name]
    # Four sequences, under capacity: the longest decodes at 50 ms per token; the wall clock ran 1000x faster.
    assert costed["sampling_operations"] == 1 and costed["decoded_tokens"] >= longest
    assert costed["simulated_s"] >= longest * 0.05
    assert time.monotonic() - t0 >= longest * 0.05 / 1000


def test_through_the_sdk_virtual_time_passes_only_while_the_client_waits(local_service, service_client):
    """10 s per token: a wall clock would hold the result for minutes, virtual time only while the poll waits."""
    assert _admin(local_service.url, {"enabled": True, "virtual_time": True, "token_latency_ms": 10_000})[0] == 200
    with service_client.create_sampling_client(base_model=BASE_MODEL_ARN) as sampler:
        t0 = time.monotonic()
        response = sampler.sample([2, 6], 2, {"max_tokens": 512, "temperature": 1.0, "seed": 5}).result()
        waited = time.monotonic() - t0
        costed = _admin(local_service.url)[1]["sessions"][sampler.training_session_name]
    longest = max(len(seq.tokens) for seq in response.sequences)
    assert costed["simulated_s"] >= longest * 10 and waited < longest * 10
