"""The loop's state: one frozen :class:`LoopState`, written to ``checkpoint.json`` as it is.

SageMaker syncs the checkpoint dir (/opt/ml/checkpoints) to S3 and restores it
when a job is retried. The state names the saved training state (a model
package holding weights and Adam moments) and how many steps it contains, where
the data order stands, the sampling-seed counter, the kept groups carried into
the next step, the keep-rate evidence, the health guards' counts and the prompts' history of selective
rollouts (steps/dapo/selective.py). It is written atomically
(``steps/platform/files.py``), so a kill mid-write leaves the previous checkpoint intact.

The data order: each epoch is a fresh permutation drawn from ``(seed, epoch)``,
so the whole order is a pure function of the seed and a resume needs only the
position ``(epoch, offset)``: no RNG state to pickle, no prompt seen twice in an epoch.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from steps.cli import Refused
from steps.dapo.guards import GuardState
from steps.dapo.sampling import Group, Rollout, derived_seed
from steps.dapo.selective import Selector, SkipState, draw
from steps.dapo.task import Grade
from steps.platform import files

FILENAME = "checkpoint.json"
VERSION = 3


class CheckpointError(Refused):
    pass


@dataclass(frozen=True)
class DataPosition:
    epoch: int = 0
    offset: int = 0


def take(n_examples: int, batch_size: int, seed: int, pos: DataPosition) -> tuple[list[int], DataPosition]:
    """The next ``batch_size`` example indices from ``pos`` (one generation batch), wrapping into new epochs."""
    if n_examples < 1:
        raise ValueError("no training examples")
    out: list[int] = []
    epoch, offset = pos.epoch, pos.offset
    while len(out) < batch_size:
        perm = np.random.default_rng([seed, epoch]).permutation(n_examples)
        chunk = perm[offset : offset + batch_size - len(out)]
        out.extend(int(i) for i in chunk)
        offset += len(chunk)
        if offset >= n_examples:
            epoch, offset = epoch + 1, 0
    return out, DataPosition(epoch, offset)


@dataclass
class Cursor:
    """Where a step's next generation batch is drawn from, as the step draws them: the data position, and
    the generation batches drawn over the run (the count seeds each batch's sampling requests)."""

    position: DataPosition
    drawn: int

    def next(self, n_examples: int, batch_size: int, seed: int,
             selector: Selector | None = None) -> tuple[list[int], int]:
        """The next generation batch's example indices and its sampling seed; with a ``selector``, the prompts
        it skips are passed over (they count as drawn: the epoch moves on past them)."""
        batch_seed = derived_seed(seed, self.drawn)
        if selector is None:
            indices, self.position = take(n_examples, batch_size, seed, self.position)
        else:
            rng = np.random.default_rng([seed, self.drawn, 31])  # seeded per batch: a resume skips the same

            def more(n: int) -> list[int]:
                out, self.position = take(n_examples, n, seed, self.position)
                return out

            indices = draw(more, batch_size, lambda i: selector.keep(i, rng), limit=n_examples)
        self.drawn += 1
        return indices, batch_seed


@dataclass(frozen=True)
class LoopState:
    """Everything the loop needs to carry on, and nothing else."""

    seed: int
    step: int = 0  # optimizer steps contained in the saved state
    position: DataPosition = DataPosition()
    gen_batches_drawn: int = 0  # seeds the next sampling requests
    carry: tuple[Group, ...] = ()  # kept groups beyond batch_size, trained next step
    kept_groups: int = 0  # keep-rate evidence over the run (informative / sampled groups), for dynamic sampling
    sampled_groups: int = 0
    state_model_package_arn: str = ""  # saved training state (weights + Adam) of `step`
    sampler_model_package_arn: str = ""
    stopped_early: bool = False
    stop_reason: str = ""
    guard: str = ""  # the health guard that stopped the run (steps/dapo/guards.py), or ""
    guard_state: GuardState = GuardState()  # the guards' counts, so a resumed run keeps them
    selective: SkipState = SkipState()  # the prompts' history and exploration probabilities (selective rollouts)

    def with_saved_state(self, arn: str) -> "LoopState":
        return replace(self, state_model_package_arn=arn)


def to_json(state: LoopState) -> dict[str, Any]:
    return {"version": VERSION, **asdict(replace(state, selective=SkipState())), "selective": state.selective.to_json()}


def _group(raw: dict[str, Any]) -> Group:
    rollouts = tuple(
        Rollout(tuple(r["tokens"]), tuple(r["logprobs"]), r["stop_reason"], r["reward"], Grade(**r["grade"]))
        for r in raw["rollouts"]
    )
    return Group(raw["example_index"], tuple(raw["prompt"]), rollouts, raw["sampler_step"])


def from_json(raw: dict[str, Any]) -> LoopState:
    if raw.get("version") != VERSION:
        raise ValueError(f"unsupported checkpoint version {raw.get('version')!r} (this code writes {VERSION})")
    fields = {k: v for k, v in raw.items() if k != "version"}
    fields["position"] = DataPosition(**fields["position"])
    fields["carry"] = tuple(_group(g) for g in fields["carry"])
    # Absent from checkpoints written before the guards: a resumed run then starts their counts afresh.
    fields["guard_state"] = GuardState.from_json(fields.get("guard_state"))
    fields["selective"] = SkipState.from_json(fields.get("selective"))
    return LoopState(**fields)


def write(directory: str | Path, state: LoopState) -> Path:
    return files.write_json(Path(directory) / FILENAME, to_json(state))


def read(directory: str | Path) -> LoopState | None:
    """The checkpoint in ``directory``, None when there is none, CheckpointError when it is unusable."""
    path = Path(directory) / FILENAME
    if not path.exists():
        return None
    try:
        return from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{path} is not a usable checkpoint ({exc}). Resuming from it could apply steps twice, so "
            f"training stops here. Delete {path} to start the run from scratch, or restore the file "
            "from the checkpoint S3 prefix."
        ) from None


def resume_or_start(directory: str | Path, seed: int) -> LoopState:
    """The checkpointed state, or a fresh one; a checkpoint of another seed is refused (its data order differs)."""
    state = read(directory)
    if state is None:
        return LoopState(seed=seed)
    if state.seed != seed:
        path = Path(directory) / FILENAME
        raise CheckpointError(
            f"{path} was written by a run with seed {state.seed}, this run has seed {seed}: resuming would "
            f"change the data order mid-run. Set dapo.seed={state.seed} to resume, or delete {path} to start over."
        )
    return state
