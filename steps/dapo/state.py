"""The loop's state: one frozen :class:`LoopState`, written to ``checkpoint.json`` as it is.

SageMaker syncs the checkpoint dir (/opt/ml/checkpoints) to S3 and restores it
when a job is retried. The state names the saved training state (a model
package holding weights and Adam moments) and how many steps it contains, where
the data order stands, the sampling-seed counter, the kept groups carried into
the next step, the keep-rate evidence, the health guards' counts and the prompts' history of selective
rollouts (steps/dapo/selective.py). It is written atomically
(``steps/platform/files.py``), so a kill mid-write leaves the previous checkpoint intact.

The data order is a pure function of the seed (steps/dapo/sampling.py), so a resume needs only the
position ``(epoch, offset)``. A checkpoint step's ``save_state`` runs behind the next step's sampling
(:class:`PendingCheckpoint`): ``checkpoint.json`` is written once it is done, so it only ever names a state
that exists.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from steps.cli import Refused
from steps.dapo.health import GuardState
from steps.dapo.sampling import DataPosition, Group, Rollout
from steps.dapo.selective import SkipState
from steps.dapo.task import Grade
from steps.platform import files

log = logging.getLogger(__name__)

FILENAME = "checkpoint.json"
VERSION = 3


class CheckpointError(Refused):
    pass


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
    guard: str = ""  # the health guard that stopped the run (steps/dapo/health.py), or ""
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


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint whose save_state may still be running."""

    save_state: Any
    state: LoopState

    def write(self, directory: str | Path) -> str:
        """Wait for the save_state, then write checkpoint.json: it only ever names a state that exists."""
        arn = self.save_state.result().model_package_arn
        write(directory, self.state.with_saved_state(arn))
        log.info("checkpoint: step=%d state=%s", self.state.step, arn)
        return arn


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
