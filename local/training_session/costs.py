"""The cost model of the local service: operations take the time the real service's GPUs would take.

Off by default (the toy model then answers as fast as numpy computes, and tests stay
fast). On, every runtime operation of a session becomes work for that session's
simulated GPUs, and its result is visible (``Completed``) only once the simulated
GPUs have done it:

* **Sampling** (the sampler): a request first prefills its prompt
  (``prompt tokens / prefill_tokens_per_s``), then each of its sequences decodes its
  generated tokens. At most ``max_running`` sequences decode at once (vLLM's
  ``max_num_seqs``); the others wait in one first-come-first-served queue, in the order
  their prefill ended (a request's own sequences in order; requests whose prefill ends at
  the same simulated time in the order of their content, so every run is the same), and
  the first of them starts as soon as a running sequence ends. Every running sequence gets ``min(1 / token_latency,
  decode_tokens_per_s / running sequences)`` tokens per second: one token per
  ``token_latency_ms`` while the running sequences fit the sampler's batch capacity
  (``decode_tokens_per_s x token_latency_ms``), and an equal share of the decode
  throughput beyond it. That is processor sharing within the running set, as vLLM's
  continuous batching decodes one token of every running request per step: a request's
  finish time moves later when more sequences start while it decodes, but not when more
  wait in the queue. A request is done when its last sequence is.
* **Training** (the trainer): operations run one at a time, in sequence order.
  ``forward_backward`` costs its datum tokens / ``train_tokens_per_s`` (``forward``
  a third of that: no backward pass); ``optim_step``, ``save_weights_for_sampler``
  and ``save_state`` (or a ``load_state``) fixed times.
* ``shared_gpus``: sampler and trainer are the same GPUs. A training operation then
  pauses all decoding while it runs; otherwise they are separate, equal pools.
* ``length_scale``: every generated token, and every ``forward_backward``/``forward`` token, is
  priced as this many: the toy's completions (128 tokens on average, cut off at 512) cost what
  completions ``length_scale`` times as long would, without the toy and the SDK generating and
  parsing them on this CPU. Prompts are scaled with the trained tokens (the request says only
  their sum), which overprices training by their share; prefill is not scaled.

Time is simulated, exactly, event by event (arrivals, prefill ends, sequence ends,
training operations; events less than a microsecond apart are one), not as sleeps
inside the numpy work: the numpy work runs as fast as it can and its result waits for
its simulated finish. A wait sleeps until the earliest time its result could be done:
the finish if nothing else arrives, which an arrival or a pause can only delay. So
every wake-up moves simulated time on by at least a microsecond, and a request needs
about one wake-up per arrival that delays it. Two clocks:

* ``time_scale`` (the default clock): ``time_scale`` simulated seconds pass per
  wall-clock second, so the service feels like the real one at 1 and runs 100x faster
  with the same GPU ratios at 100. Whatever the client computes meanwhile is scaled
  up with it, and so is the toy's own numpy time when it lags behind.
* ``virtual_time``: simulated time passes only while every request to the service
  waits on the simulated GPUs (:class:`VirtualClock`); the client's and the toy's own
  computing takes none. ``make bench`` uses it: the toy and the SDK spend about a
  second of CPU per generation batch on this machine, which any time scale would turn
  into GPU idle time that the real service would not see.

**Figures**: the product's own (:class:`pipeline.throughput.Throughput`, where each default
is sourced): ``make start-pipeline`` prices a run's worst case with the same ones, and
:class:`Costs` is those figures plus the simulation's own settings (on or off, the clock,
shared GPUs, the running cap: ``max_running`` 1024 is vLLM's ``max_num_seqs`` default on
H100-class GPUs, from ``EngineArgs.get_batch_defaults``; 256 on others). The backend sees
none of this: ``metering`` feeds each session's GPUs from the backend's hooks.

Settable like the faults (``settings``): flags of ``python -m local.training_session``,
``LOCAL_TS_COST_*`` variables, ``POST /_admin/costs``. A session keeps the settings it
was created with; ``GET /_admin/costs`` reports each session's simulated clock and
how busy its GPUs were.
"""
from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Mapping

from local.training_session.settings import Settings, require
from pipeline.throughput import Throughput

#: Each field's environment variable, flag of ``python -m local.training_session`` and help: the ways to set it.
SETTINGS = {
    "enabled": ("LOCAL_TS_COST_MODEL", "--cost-model", "operations take the simulated time of the real service's GPUs"),
    "time_scale": ("LOCAL_TS_COST_TIME_SCALE", "--time-scale", "simulated seconds per wall-clock second (default 1)"),
    "decode_tokens_per_s": ("LOCAL_TS_COST_DECODE_TOKENS_PER_S", "--decode-tokens-per-s",
                           "the sampler's decode throughput, shared"),
    "token_latency_ms": ("LOCAL_TS_COST_TOKEN_LATENCY_MS", "--token-latency-ms",
                        "per-token latency of a sequence under capacity"),
    "prefill_tokens_per_s": ("LOCAL_TS_COST_PREFILL_TOKENS_PER_S", "--prefill-tokens-per-s",
                            "prompt tokens prefilled per second"),
    "train_tokens_per_s": ("LOCAL_TS_COST_TRAIN_TOKENS_PER_S", "--train-tokens-per-s",
                          "forward_backward tokens per second"),
    "optim_step_s": ("LOCAL_TS_COST_OPTIM_STEP_S", "--optim-step-s", "seconds of an optim_step"),
    "save_weights_s": ("LOCAL_TS_COST_SAVE_WEIGHTS_S", "--save-weights-s", "seconds of a save_weights_for_sampler"),
    "save_state_s": ("LOCAL_TS_COST_SAVE_STATE_S", "--save-state-s", "seconds of a save_state (or load_state)"),
    "max_running": ("LOCAL_TS_COST_MAX_RUNNING", "--max-running",
                    "sequences the sampler decodes at once; the rest wait, first come first served (default 1024)"),
    "shared_gpus": ("LOCAL_TS_COST_SHARED_GPUS", "--shared-gpus",
                   "sampling and training share the GPUs: training pauses decoding"),
    "length_scale": ("LOCAL_TS_COST_LENGTH_SCALE", "--length-scale",
                     "price each generated and trained token as this many (long completions, simulated)"),
    "virtual_time": ("LOCAL_TS_COST_VIRTUAL_TIME", "--virtual-time",
                    "simulated time passes only while every request waits on the simulated GPUs"),
}
ENV_VARS = {name: var for name, (var, _, _) in SETTINGS.items()}
MIN_SLEEP_S = 0.0005
#: The simulation tells events apart to a microsecond: far below any operation's cost, far above the rounding of
#: the clock (see :func:`tick`).
RESOLUTION_S = 1e-6


@dataclass(frozen=True)
class Costs(Throughput, Settings):
    """The product's throughput figures (:class:`Throughput`), and whether and how the service simulates them."""

    enabled: bool = False
    time_scale: float = 1.0
    shared_gpus: bool = False
    virtual_time: bool = False
    length_scale: float = 1.0
    max_running: int = 1024  # vLLM's max_num_seqs on H100-class GPUs (256 on others)
    KIND: ClassVar[str] = "cost"
    SETTINGS: ClassVar[Mapping[str, tuple[str, str, str]]] = SETTINGS

    def __post_init__(self) -> None:
        for name in ("enabled", "shared_gpus", "virtual_time"):
            require("cost", isinstance(getattr(self, name), bool), name, getattr(self, name), "true or false")
        self._require("time_scale", lambda v: v > 0, "a number > 0")
        self._require("length_scale", lambda v: v > 0, "a number > 0")
        self._require("max_running", lambda v: v >= 1 and float(v).is_integer(), "a whole number >= 1")
        # A bench scenario scales it by a factor (bench/loops.py Scenario.times): 1024 x 0.25 is the cap 256.
        object.__setattr__(self, "max_running", int(self.max_running))
        super().__post_init__()

    def training_seconds(self, kind: str, tokens: float) -> float:
        """:meth:`Throughput.training_seconds` of ``tokens`` priced ``length_scale`` times each."""
        return super().training_seconds(kind, tokens * self.length_scale)


def tick(t: float) -> float:
    """The least simulated time between two events near ``t``: :data:`RESOLUTION_S`, or a few rounding steps of
    ``t`` if the clock is so large that a microsecond is finer than its floats."""
    return max(RESOLUTION_S, 8 * math.ulp(t))


@dataclass(eq=False)
class Job:
    """One operation on the simulated GPUs. Times are simulated seconds since the session started."""

    arrival: float
    seconds: float = 0.0  # training: its cost; sampling: the prefill
    known: bool = False  # its work is known (a sample's generated lengths; a training operation's cost)
    start: float | None = None  # training: its turn on the trainer; sampling: its prefill's end (decoding or queued)
    finish: float | None = None
    sequences_left: int = 0
    longest: float = 0  # sampling: tokens of its longest sequence (priced: times length_scale)
    order: str = ""  # sampling: its place in the queue among requests whose prefill ends at the same time


@dataclass
class Usage:
    """What the GPUs did, in simulated seconds and tokens (cumulative since the session started)."""

    sampler_busy_s: float = 0.0  # time with at least one sequence decoding
    decoded_tokens: float = 0.0
    prefill_tokens: int = 0
    trained_tokens: int = 0
    sampling_jobs: int = 0
    training_jobs: int = 0
    revealed: int = 0
    reveal_lag_sum_s: float = 0.0  # simulated time results were shown after their finish (scheduling and compute)
    reveal_lag_max_s: float = 0.0


class WallClock:
    """Simulated seconds that run ``scale`` times as fast as the wall clock."""

    def __init__(self, scale: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.scale, self._monotonic = scale, monotonic

    def now(self) -> float:
        return self._monotonic() * self.scale

    def sleep_until(self, t: float, stopped: threading.Event, deadline: float) -> None:
        """Sleep until simulated time ``t`` (or the wall-clock ``deadline``, or ``stopped``)."""
        wall = self._monotonic()
        stopped.wait(max(min((t - self.now()) / self.scale, deadline - wall), MIN_SLEEP_S))


class VirtualClock:
    """Simulated time that passes only while the client waits on the simulated GPUs: a discrete-event clock.

    The service counts its requests: a result poll held for an unfinished operation is
    waiting; any other request in progress means the client is at work. When a poll waits,
    nothing else is in progress and no operation was submitted for ``QUIET_S`` (the SDK
    submits a batch of requests from several threads at once, and a poll may start while
    the last of them are still coming), the clock jumps to the earliest time a waiting poll
    could be answered. So a client's own computing takes no simulated time at all, however
    long the toy model and the SDK take for it on this machine: what is measured is the
    loop's use of the GPUs.
    """

    QUIET_S = 0.01

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._cond = threading.Condition()
        self._now = 0.0
        self._active = 0  # requests in progress, held polls excluded
        self._held = 0  # polls waiting for their operation
        self._wakeups: list[float] = []  # simulated times held polls wait for
        self._quiet_since = monotonic()  # the last submit (or other non-poll request) ended
        self._jumps = 0  # times the clock jumped: the simulation's events as the waits see them

    def now(self) -> float:
        return self._now

    @contextmanager
    def request(self, submits: bool) -> Iterator[None]:
        """Around every request the service handles; ``submits``: not a result poll."""
        with self._cond:
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if submits:
                    self._quiet_since = self._monotonic()
                self._cond.notify_all()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Around a poll's wait for its operation."""
        with self._cond:
            self._active -= 1
            self._held += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._active += 1

    def _may_jump(self) -> bool:
        """A poll is held and no other request is in progress."""
        return self._active == 0 and self._held > 0

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {"now_s": self._now, "requests_working": self._active, "polls_waiting": self._held,
                    "wakeups": len(self._wakeups), "jumps": self._jumps}

    def sleep_until(self, t: float, stopped: threading.Event, deadline: float) -> None:
        with self._cond:
            self._wakeups.append(t)
            try:
                while self._now < t and not stopped.is_set():
                    wall = self._monotonic()
                    quiet = wall - self._quiet_since
                    # Jump only when no waiting poll is already due (it answers first, and its client goes on).
                    if self._may_jump() and quiet >= self.QUIET_S and min(self._wakeups) > self._now:
                        self._now = min(self._wakeups)
                        self._jumps += 1
                        self._cond.notify_all()
                        if self._now >= t:
                            break
                    if wall >= deadline:
                        return
                    self._cond.wait(min(max(self.QUIET_S - quiet, MIN_SLEEP_S), deadline - wall, 0.05))
            finally:
                self._wakeups.remove(t)


Clock = WallClock | VirtualClock


class Gpus:
    """One session's GPUs in simulated time: a sampler that shares its decode among at most ``max_running``
    sequences and queues the rest first come first served, and a FIFO trainer.

    The simulation is committed event by event up to the present, but never past the
    arrival of a sample whose generated lengths are not known yet (its numpy work is
    still running): events are always processed in time order, so no finish time is
    ever revised after a result was shown. Training operations are scheduled when they
    arrive (their cost is known from the request), one after another.
    """

    def __init__(self, costs: Costs, clock: Clock) -> None:
        self.costs = costs
        self.clock = clock
        # Times are the clock's own (no offset to round), ``origin`` when the session started.
        self.origin = clock.now()
        self._cond = threading.Condition()
        self._t = self.origin  # committed simulated time
        self._progress = 0.0  # tokens each decoding sequence has advanced since the start
        self._decoding: list[tuple[float, int, Job]] = []  # heap of (progress at its end, tiebreak, job)
        self._waiting: deque[tuple[float, Job]] = deque()  # sequences (length, job) queued for a running slot
        # heap of (decode start, job.order, tiebreak, job, lengths): the order the queue takes them in
        self._joining: list[tuple[float, str, int, Job, list[float]]] = []
        self._pending: list[Job] = []  # samples arrived whose work is not known: the commit horizon
        self._training: list[tuple[float, float]] = []  # the trainer's intervals, in order
        self._passed = 0  # intervals that ended before the committed time
        self._trainer_free = self.origin
        self._tiebreak = itertools.count()
        self.usage = Usage()

    def now(self) -> float:
        return self.clock.now()

    # -- work arrives ----------------------------------------------------------
    def sampling_arrives(self, prompt_tokens: int, order: str = "") -> Job:
        """A sample request was submitted: it prefills, then decodes what :meth:`sampled` says. ``order``: where it
        queues among requests whose prefill ends at the same simulated time (the request's content, say)."""
        with self._cond:
            job = Job(arrival=self.now(), seconds=prompt_tokens / self.costs.prefill_tokens_per_s, order=order)
            self._pending.append(job)
            self.usage.prefill_tokens += prompt_tokens
            self.usage.sampling_jobs += 1
            return job

    def sampled(self, job: Job, lengths: list[int]) -> None:
        """The generated length of each of the job's sequences (none: the operation failed)."""
        with self._cond:
            self._pending.remove(job)
            job.known = True
            decode_start = job.arrival + job.seconds
            lengths = [n * self.costs.length_scale for n in lengths]
            if lengths:
                job.sequences_left, job.longest = len(lengths), max(lengths)
                heapq.heappush(self._joining, (decode_start, job.order, next(self._tiebreak), job, lengths))
            else:
                job.finish = decode_start
            self._cond.notify_all()

    def training_arrives(self, kind: str, tokens: int) -> Job:
        """A training operation was submitted: it runs once the trainer has done everything before it."""
        with self._cond:
            job = Job(arrival=self.now(), seconds=self.costs.training_seconds(kind, tokens), known=True)
            job.start = max(job.arrival, self._trainer_free)
            job.finish = self._trainer_free = job.start + job.seconds
            if job.seconds > 0:
                self._training.append((job.start, job.finish))
            self.usage.training_jobs += 1
            if kind == "forwardBackward":
                self.usage.trained_tokens += tokens
            return job

    # -- waiting -------------------------------------------------------------------
    def done(self, job: Job) -> bool:
        """Whether ``job`` is done by now in simulated time (its finish is then final)."""
        with self._cond:
            self._advance(self.now())
            return job.finish is not None and job.finish <= self._t

    def wait(self, job: Job, deadline: float, stopped: threading.Event) -> bool:
        """Block until ``job`` is done in simulated time (True), or the wall-clock ``deadline`` passes."""
        while not stopped.is_set():
            with self._cond:
                self._advance(self.now())
                if job.finish is not None and job.finish <= self._t:
                    self._revealed(job)
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                earliest = self._earliest_finish(job)
                if earliest is None or earliest <= self.now():
                    # Held back by work not known yet (its own, or a sample that arrived before it finished).
                    self._cond.wait(min(remaining, 0.05))
                    continue
            self.clock.sleep_until(earliest, stopped, deadline)
        return False

    def _earliest_finish(self, job: Job) -> float | None:
        """A simulated time before which ``job`` cannot be done; None while its work is unknown.

        A true lower bound, so a clock that jumps to it never passes the finish; and at least
        one :func:`tick` after the committed time, so every jump moves time on."""
        if not job.known:
            return None
        if job.finish is not None:
            return job.finish
        if job.start is None:  # not decoding yet: its longest sequence at full speed from the decode start
            bound = job.arrival + job.seconds + job.longest * self.costs.fastest_token_s
        else:
            bound = self._drain_time(job)
        return max(bound, self._t + tick(self._t))

    def _drain_time(self, job: Job) -> float:
        """When ``job``'s last sequence ends if no sequence joins and decoding never pauses.

        The sequences running now end one by one, each end raising the others' share or letting the
        queue's first sequence in. A join or a pause only slows every sequence (a join runs only when
        the queue is empty, else it queues behind the job's own), so this never comes after the real
        time, and it is the real time when neither comes (the same steps :meth:`_advance` takes)."""
        t, progress, left = self._t, self._progress, job.sequences_left
        running, waiting = list(self._decoding), iter(self._waiting)  # a heap's copy is a heap
        tiebreak = itertools.count(-1, -1)  # apart from the heap's own (>= 0): equal ends never compare jobs
        while running and left:
            end, _, owner = heapq.heappop(running)
            t += (end - progress) / self.costs.decode_rate(len(running) + 1)
            progress = end
            left -= owner is job
            admitted = next(waiting, None)
            if admitted is not None:
                heapq.heappush(running, (progress + admitted[0], next(tiebreak), admitted[1]))
        return t

    def _revealed(self, job: Job) -> None:
        lag = max(self.now() - job.finish, 0.0) if job.finish is not None else 0.0
        self.usage.revealed += 1
        self.usage.reveal_lag_sum_s += lag
        self.usage.reveal_lag_max_s = max(self.usage.reveal_lag_max_s, lag)

    # -- the simulation ----------------------------------------------------------------
    def _advance(self, until: float) -> None:
        """Commit every event up to ``until``, or up to the arrival of work not known yet.

        Each step jumps to the next event exactly (a join, a pause's start or end, the
        first sequence to end), so the comparisons in :meth:`_settle` are exact however
        large the simulated clock grows. A sequence due within one :func:`tick` of the
        step's end ends at it: a float sum can fall short of an end by a rounding step
        that no later step can add (``progress + rate * dt == progress``), and decoding
        would never reach it.
        """
        horizon = min([until] + [j.arrival for j in self._pending])
        while True:
            blocked, block_end, next_block = self._block_at(self._t)
            n = len(self._decoding)
            rate = 0.0 if blocked or not n else self.costs.decode_rate(n)
            t_event = min(block_end if blocked else next_block, self._joining[0][0] if self._joining else math.inf)
            t_head = self._t + (self._decoding[0][0] - self._progress) / rate if rate else math.inf
            t_next = min(t_event, t_head, horizon)
            head_ends = t_head <= t_next + tick(t_next)
            if rate:
                dt = t_next - self._t
                self._progress = self._decoding[0][0] if head_ends else self._progress + rate * dt
                self.usage.sampler_busy_s += dt
                self.usage.decoded_tokens += rate * dt * n
            self._t = max(t_next, self._t)
            if not head_ends and t_event > horizon:
                return
            self._settle()

    def _settle(self) -> None:
        """Sequences that ended, requests whose prefill ended (their sequences queued), and the queue's first
        sequences into the running slots that are free, at the committed time."""
        while self._decoding and self._decoding[0][0] <= self._progress:
            _, _, job = heapq.heappop(self._decoding)
            job.sequences_left -= 1
            if job.sequences_left == 0:
                job.finish = self._t
        while self._joining and self._joining[0][0] <= self._t:
            *_, job, lengths = heapq.heappop(self._joining)
            job.start = self._t
            self._waiting.extend((n, job) for n in lengths)
        while self._waiting and len(self._decoding) < self.costs.max_running:
            n, job = self._waiting.popleft()
            heapq.heappush(self._decoding, (self._progress + n, next(self._tiebreak), job))

    def _block_at(self, t: float) -> tuple[bool, float, float]:
        """(decoding paused by training at ``t``, when that pause ends, when the next one starts).

        Only with shared GPUs; the trainer's intervals are in order and never overlap."""
        if self.costs.shared_gpus:
            while self._passed < len(self._training) and self._training[self._passed][1] <= t:
                self._passed += 1
            if self._passed < len(self._training):
                start, end = self._training[self._passed]
                return (True, end, end) if start <= t else (False, end, start)
        return False, float("inf"), float("inf")

    # -- reporting ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """For ``GET /_admin/costs``: the simulated clock and what the GPUs did up to it."""
        with self._cond:
            now = self.now()
            self._advance(now)
            u = self.usage
            trainer_busy = sum(max(0.0, min(end, now) - start) for start, end in self._training)
            return {
                "simulated_s": now - self.origin, "committed_s": self._t - self.origin,
                "sampler_busy_s": u.sampler_busy_s,
                "decoded_tokens": u.decoded_tokens, "prefill_tokens": u.prefill_tokens, "trainer_busy_s": trainer_busy,
                "trained_tokens": u.trained_tokens, "sampling_operations": u.sampling_jobs,
                "training_operations": u.training_jobs, "decoding_now": len(self._decoding),
                "waiting_now": len(self._waiting),
                "reveal_lag_mean_s": u.reveal_lag_sum_s / u.revealed if u.revealed else 0.0,
                "reveal_lag_max_s": u.reveal_lag_max_s,
            }
