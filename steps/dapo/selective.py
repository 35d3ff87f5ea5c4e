"""Selective rollouts (GRESO, arXiv 2506.02177): skip, before sampling, prompts whose groups will be all-equal.

An all-equal group (every completion right, or every one wrong) has zero advantage and is dropped by dynamic
sampling after it was paid for. A prompt's recent groups predict its next one well ("temporal consistency"),
so each prompt keeps a small record of its last groups (:class:`PromptHistory`: the last outcome, how many
all-equal groups in a row, and the step of the last one), and when a generation batch is drawn a prompt whose
last ``z`` groups were all-equal is sampled only with probability ``max(p ** z, keep_floor)``, skipped
otherwise. ``p`` is one of two exploration probabilities, ``p_easy`` for prompts last all right and ``p_hard``
for prompts last all wrong, each moved by ``p_step`` after every step toward a target share of zero-variance
groups among the groups sampled (a third of the target for easy prompts, two thirds for hard ones: a hard
prompt is the likelier to become learnable as the model improves), within ``[p_min, p_max]``.
``keep_floor`` is the exploration floor: no prompt's chance of being sampled falls below it, however long its
streak, so none is starved for ever. The constants are GRESO's (its code: ``presampling_selector.py`` and
``ray_trainer.py`` of github.com/Infini-AI-Lab/GRESO).

Everything here is pure and seeded: the skip decisions of a generation batch come from an RNG seeded by the
run's seed and the batch's number, so a resumed run draws the same prompts as an uninterrupted one.
"""
from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Sequence

import numpy as np

# A prompt's last outcome, one byte per prompt index.
UNSEEN, MIXED, ALL_RIGHT, ALL_WRONG = 0, 1, 2, 3
STREAK_MAX = np.iinfo(np.uint16).max


class Group(Protocol):
    """What the history reads of a graded group (steps/dapo/sampling.py's ``Group``, which draws through this
    module's filter: the protocol keeps the import one way)."""

    example_index: int

    def is_informative(self) -> bool: ...

    def all_wrong(self) -> bool: ...


@dataclass(frozen=True)
class Settings:
    """The ``dapo.selective_*`` keys (config/default.yaml documents each)."""

    enabled: bool = False
    target_zero_variance: float = 0.25
    explore_p: float = 0.5  # p_easy and p_hard at the start of a run
    p_step: float = 0.01
    p_min: float = 0.05
    p_max: float = 0.95
    keep_floor: float = 0.01

    @classmethod
    def from_config(cls, cfg: Any) -> "Settings":
        return cls(cfg.selective_rollouts, cfg.selective_target_zero_variance, cfg.selective_explore_p,
                   cfg.selective_p_step, cfg.selective_p_min, cfg.selective_p_max, cfg.selective_keep_floor)


def _empty(dtype: Any) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


@dataclass(frozen=True, eq=False)
class PromptHistory:
    """Per training prompt (by example index): its last group's outcome, the all-equal groups in a row that end
    with it, and the optimizer step it was sampled for. Seven bytes a prompt (700 kB for 100k prompts); the
    arrays grow to the highest index seen and are never changed in place (:meth:`observed` copies)."""

    outcome: np.ndarray = field(default_factory=lambda: _empty(np.uint8))
    streak: np.ndarray = field(default_factory=lambda: _empty(np.uint16))
    step: np.ndarray = field(default_factory=lambda: _empty(np.int32))

    def __len__(self) -> int:
        return len(self.outcome)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PromptHistory) and all(
            np.array_equal(a, b) for a, b in zip(self._arrays(), other._arrays()))

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.outcome, self.streak, self.step

    def of(self, index: int) -> tuple[int, int]:
        """(last outcome, all-equal streak) of prompt ``index``; (UNSEEN, 0) for one never sampled."""
        if index >= len(self):
            return UNSEEN, 0
        return int(self.outcome[index]), int(self.streak[index])

    def observed(self, groups: Sequence[Group], step: int) -> "PromptHistory":
        """The history once ``groups`` (sampled for optimizer step ``step``) are graded."""
        if not groups:
            return self
        size = max(len(self), 1 + max(g.example_index for g in groups))
        outcome, streak, when = (np.zeros(size, a.dtype) for a in self._arrays())
        for new, old in zip((outcome, streak, when), self._arrays()):
            new[: len(old)] = old
        for g in groups:
            i = g.example_index
            kind = MIXED if g.is_informative() else ALL_WRONG if g.all_wrong() else ALL_RIGHT
            outcome[i] = kind
            streak[i] = 0 if kind == MIXED else min(int(streak[i]) + 1, STREAK_MAX)
            when[i] = step
        return PromptHistory(outcome, streak, when)

    def to_json(self) -> dict[str, str]:
        """Each array compressed and base64-encoded: a 100k-prompt history is tens of kB in checkpoint.json."""
        return {name: base64.b64encode(zlib.compress(a.astype(a.dtype.newbyteorder("<")).tobytes())).decode()
                for name, a in zip(("outcome", "streak", "step"), self._arrays())}

    @classmethod
    def from_json(cls, raw: dict[str, str] | None) -> "PromptHistory":
        if not raw:
            return cls()
        arrays = [np.frombuffer(zlib.decompress(base64.b64decode(raw[name])), dtype=np.dtype(dtype).newbyteorder("<"))
                  .astype(dtype) for name, dtype in (("outcome", np.uint8), ("streak", np.uint16), ("step", np.int32))]
        if len({len(a) for a in arrays}) != 1:
            raise ValueError("selective.history: its arrays differ in length")
        return cls(*arrays)


@dataclass(frozen=True)
class SkipState:
    """What selective rollouts carry from step to step (checkpointed in the loop state): the prompts' history
    and the two exploration probabilities (None: not yet adjusted, the config's ``selective_explore_p``)."""

    history: PromptHistory = field(default_factory=PromptHistory)
    p_easy: float | None = None
    p_hard: float | None = None

    def probabilities(self, settings: Settings) -> tuple[float, float]:
        return (settings.explore_p if self.p_easy is None else self.p_easy,
                settings.explore_p if self.p_hard is None else self.p_hard)

    def to_json(self) -> dict[str, Any]:
        return {"history": self.history.to_json(), "p_easy": self.p_easy, "p_hard": self.p_hard}

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> "SkipState":
        """Absent from checkpoints written before selective rollouts: a resumed run starts its history afresh."""
        if not raw:
            return cls()
        return cls(PromptHistory.from_json(raw.get("history")), raw.get("p_easy"), raw.get("p_hard"))


def keep_probability(outcome: int, streak: int, p_easy: float, p_hard: float, keep_floor: float) -> float:
    """The chance a prompt is sampled when drawn: 1 unless its last ``streak`` groups were all-equal, then
    ``p ** streak`` (``p``: its kind's exploration probability), never below the floor."""
    if outcome in (UNSEEN, MIXED) or streak == 0:
        return 1.0
    p = p_easy if outcome == ALL_RIGHT else p_hard
    return max(p**streak, keep_floor)


def adjusted(p: float, share: float, target: float, settings: Settings) -> float:
    """One step of GRESO's controller: above its target share of zero-variance groups, explore less (skip
    more); below it, explore more. Within [p_min, p_max]."""
    if share >= target:
        return max(p - settings.p_step, settings.p_min)
    return min(p + settings.p_step, settings.p_max)


def after_step(state: SkipState, groups: Sequence[Group], step: int, settings: Settings,
               had_a_say: bool = True) -> SkipState:
    """The state once a step's sampled ``groups`` are graded: their outcomes recorded and, if any were
    sampled and the history had a say in drawing them (``had_a_say``: a prompt drawn was predicted
    all-equal), each exploration probability moved toward its share of the target. Steps before any prompt
    recurs move nothing, as GRESO adapts only after its first epoch: otherwise a run's first epoch, with
    nothing to skip, would push both probabilities to ``p_max`` before the history could use them."""
    history = state.history.observed(groups, step)
    if not groups or not had_a_say:
        return replace(state, history=history)
    p_easy, p_hard = state.probabilities(settings)
    zero = [g for g in groups if not g.is_informative()]
    hard = sum(g.all_wrong() for g in zero) / len(groups)
    easy = len(zero) / len(groups) - hard
    target = settings.target_zero_variance
    return SkipState(history, adjusted(p_easy, easy, target / 3, settings),
                     adjusted(p_hard, hard, target * 2 / 3, settings))


@dataclass
class Selector:
    """One step's skip decisions, counted for its figures."""

    settings: Settings
    state: SkipState
    skipped: int = 0
    explored: int = 0  # predicted all-equal, sampled anyway
    picked: int = 0
    predicted_mixed: int = 0  # picked prompts last mixed or never sampled

    def keep(self, index: int, rng: np.random.Generator) -> bool:
        """Whether drawn prompt ``index`` is sampled (counted either way)."""
        outcome, streak = self.state.history.of(index)
        p_easy, p_hard = self.state.probabilities(self.settings)
        chance = keep_probability(outcome, streak, p_easy, p_hard, self.settings.keep_floor)
        if chance < 1.0 and rng.random() >= chance:
            self.skipped += 1
            return False
        self.picked += 1
        if chance < 1.0:
            self.explored += 1
        else:
            self.predicted_mixed += 1
        return True

    def observed(self, groups: Sequence[Group], step: int) -> tuple[SkipState, dict[str, Any]]:
        """Once the step's sampled ``groups`` are graded: the prompts' history with them (:func:`after_step`), and
        the step's figures, its observed keep rate among them."""
        informative = sum(g.is_informative() for g in groups)
        figures = {**self.figures(), "observed_keep_rate": informative / len(groups) if groups else float("nan")}
        return after_step(self.state, groups, step, self.settings, self.explored + self.skipped > 0), figures

    def figures(self) -> dict[str, Any]:
        """The step's selective-rollout figures (``observed_keep_rate`` is added where the groups are graded)."""
        p_easy, p_hard = self.state.probabilities(self.settings)
        return {"skipped_prompts": self.skipped,
                "predicted_keep_rate": self.predicted_mixed / self.picked if self.picked else float("nan"),
                "exploration_share": self.explored / self.picked if self.picked else float("nan"),
                "p_easy": p_easy, "p_hard": p_hard}


def selector(settings: Settings, state: SkipState) -> Selector | None:
    """The filter on one step's prompts, None while selective rollouts are off (the default)."""
    return Selector(settings, state) if settings.enabled else None
