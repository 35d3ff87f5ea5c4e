"""`checkpoint.json`: what a restarted training step needs to carry on.

SageMaker syncs the checkpoint dir (/opt/ml/checkpoints) to S3 and restores it
when a job is retried. The file names the saved training state (a model
package holding weights and Adam moments), how many steps it contains, where
the data order stands, the sampling-seed counter and the kept groups carried
into the next step. It is written atomically (temp file, fsync, rename), so a
kill mid-write leaves the previous checkpoint intact, never a half file.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from steps.data_order import DataPosition
from steps.rollouts import Group, Rollout

FILENAME = "checkpoint.json"
VERSION = 1


class CheckpointError(RuntimeError):
    pass


@dataclass(frozen=True)
class Checkpoint:
    step: int  # optimizer steps contained in the saved state
    state_model_package_arn: str
    sampler_model_package_arn: str
    position: DataPosition
    gen_batches_drawn: int  # seeds the next sampling requests
    seed: int
    carry: tuple[Group, ...] = ()
    keep_kept: int = 0
    keep_sampled: int = 0
    stopped_early: bool = False
    stop_reason: str = ""


def _group_from_dict(d: dict[str, Any]) -> Group:
    rollouts = tuple(
        Rollout(tuple(r["tokens"]), tuple(r["logprobs"]), r["stop_reason"], r["reward"], r["correct"], r["formatted"])
        for r in d["rollouts"]
    )
    return Group(d["example_index"], tuple(d["prompt"]), rollouts)


def to_json(ckpt: Checkpoint) -> dict[str, Any]:
    return {"version": VERSION, **asdict(ckpt)}


def from_json(raw: dict[str, Any]) -> Checkpoint:
    if raw.get("version") != VERSION:
        raise ValueError(f"unsupported checkpoint version {raw.get('version')!r}")
    fields = dict(raw)
    fields.pop("version")
    fields["position"] = DataPosition(**fields["position"])
    fields["carry"] = tuple(_group_from_dict(g) for g in fields.get("carry", ()))
    return Checkpoint(**fields)


def write(directory: str | Path, ckpt: Checkpoint) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / FILENAME
    tmp = d / f".{FILENAME}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(to_json(ckpt), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def read(directory: str | Path) -> Checkpoint | None:
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
