"""The cost model watching the backend from outside it: each session's simulated GPUs, fed by the backend's hooks.

:class:`CostMeter` is one of the backend's :class:`~local.training_session.sessions.Hooks`.
A session created while the cost model is on gets simulated GPUs of its own
(:class:`~local.training_session.costs.Gpus`, keeping the settings of its creation).
Every operation submitted to it becomes a job on them: a training operation's
cost is known from its request, a sample's decode work once it has run (its generated
lengths). A finished result is held back until its job is done in simulated time.
The meter also owns the :class:`~local.training_session.costs.VirtualClock`, which
counts every request (``server``) and every held poll, for sessions in virtual time.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, ContextManager, Sequence

from local.training_session.costs import Costs, Gpus, Job, VirtualClock, WallClock
from local.training_session.sessions import Hooks, Operation, Session
from local.training_session.work import Outcome, Sampled, Work

#: What the cost model does not price: loading a package's weights into the sampler.
UNPRICED = frozenset({"loadWeightsForSampling"})


class CostMeter(Hooks):
    """The cost model's settings for new sessions, and each costed session's simulated GPUs."""

    def __init__(self, costs: Costs | None = None) -> None:
        self.costs = costs or Costs()  # for sessions created from now on
        self.clock = VirtualClock()  # the simulated time of sessions with costs.virtual_time
        self._lock = threading.Lock()
        self._gpus: weakref.WeakKeyDictionary[Session, Gpus] = weakref.WeakKeyDictionary()
        self._jobs: weakref.WeakKeyDictionary[Operation, Job] = weakref.WeakKeyDictionary()

    def session_created(self, session: Session) -> None:
        costs = self.costs
        if costs.enabled:
            clock = self.clock if costs.virtual_time else WallClock(costs.time_scale)
            with self._lock:
                self._gpus[session] = Gpus(costs, clock)

    def submitted(self, session: Session, op: Operation, work: Work) -> None:
        gpus = self.gpus(session)
        if gpus is None or work.kind in UNPRICED:
            return
        # Requests arriving at once (the SDK submits a batch from several threads, in no fixed order) queue in the
        # order of their content, so that the simulation is the same in every run.
        job = (gpus.training_arrives(work.kind, work.tokens) if work.training
               else gpus.sampling_arrives(work.tokens, order=repr(work)))
        with self._lock:
            self._jobs[op] = job

    def ran(self, session: Session, op: Operation, outcome: Outcome | None) -> None:
        """A sampling operation's decode work: its generated lengths (none if it failed or was skipped)."""
        job, gpus = self._job(op), self.gpus(session)
        if job is not None and gpus is not None and not op.training:
            gpus.sampled(job, outcome.lengths if isinstance(outcome, Sampled) else [])

    def holding(self) -> ContextManager[None]:
        return self.clock.holding()

    def ready(self, session: Session, op: Operation, deadline: float, stopped: threading.Event) -> bool:
        job, gpus = self._job(op), self.gpus(session)
        return job is None or gpus is None or gpus.wait(job, deadline, stopped)

    def gpus(self, session: Session) -> Gpus | None:
        """The session's simulated GPUs; None if it was created with the cost model off."""
        with self._lock:
            return self._gpus.get(session)

    def _job(self, op: Operation) -> Job | None:
        with self._lock:
            return self._jobs.get(op)

    def snapshot(self, sessions: Sequence[Session]) -> dict[str, Any]:
        """For ``GET /_admin/costs``: the settings new sessions get, and each costed session's GPUs so far."""
        costed = [(s, self.gpus(s)) for s in sessions]
        return {"costs": self.costs.to_dict(), "virtual_clock": self.clock.snapshot(),
                "sessions": {s.name: gpus.snapshot() for s, gpus in costed if gpus is not None}}
