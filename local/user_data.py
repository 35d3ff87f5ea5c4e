"""The user's own data for a local run (``make local-run DATA=<dir>``): its splits found as a hub names them, its
fields checked before anything starts, and its files copied into the run and uploaded (or the generated toy
data's).

The folder is read as ValidateData reads it (steps/tasks/): any of JSONL, JSON, CSV and parquet, the train split and
a held-out split named ``test``, ``validation``, ``eval``, ``val`` or ``dev`` (steps/tasks/splits.py). A field the
task looks for and a file lacks is refused here, naming the file's own fields and the closest of them, before moto
or the training-session service start: not minutes later by ValidateData.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from steps.cli import Refused, option
from steps.tasks.reader import first_row
from steps.tasks.splits import Splits, find_splits

#: Where a run keeps the user's files: runs/<id>/data/<split>/, uploaded as the split's S3 prefix.
SPLIT_DIRS = ("train", "eval")


def find(directory: str) -> Splits:
    """The train and held-out files of ``DATA=``; a folder that does not fit is refused, naming what it holds."""
    return find_splits(directory, option("--data", ""))  # DATA= under make, --data otherwise


def precheck(task: Any, splits: Splits) -> list[str]:
    """Each split's fields as the task finds them in its first file; a missing or misspelled field is refused."""
    said = []
    for name, files in (("train", splits.train), (splits.held_out_name, splits.held_out)):
        fields, problem = task.fields_of(first_row(files[0]), files[0].name)
        if problem:
            raise Refused(f"{option('--data', files[0].parent)}: {problem} ({option('--task', task.name)})")
        said.append(f"{name} {len(files)} file{'s' * (len(files) > 1)} ({files[0].name}{', ...' * (len(files) > 1)})"
                    f": question {fields.question!r}, answer {fields.answer!r}")
    if splits.ignored:
        said.append(f"held-out split {splits.held_out_name}; also found, not used: {', '.join(splits.ignored)}")
    return said


def copy_into(splits: Splits, data: Path) -> tuple[Path, Path]:
    """The splits' files copied to ``data``/train/ and ``data``/eval/ as they are (ValidateData reads any format)."""
    dirs = tuple(data / d for d in SPLIT_DIRS)
    for files, folder in zip((splits.train, splits.held_out), dirs):
        folder.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, folder / f.name)
    return dirs[0], dirs[1]


def upload(s3: Any, bucket: str, run_dir: Path, rows: tuple[int, int], seed: int,
           source: str | None = None) -> dict[str, str]:
    """The toy data generated into runs/<id>/data/, or the ``source`` folder's train and test files copied there
    (a resume uploads what is there), uploaded to moto S3."""
    from local.toy_data import write_split

    data = run_dir / "data"
    if (data / "eval.jsonl").exists() or (data / "eval").is_dir():  # a resume: what the run started with
        paths: tuple[Path, Path] = ((data / "train.jsonl", data / "eval.jsonl") if (data / "eval.jsonl").exists()
                                    else (data / "train", data / "eval"))
    elif source is not None:
        paths = copy_into(find(source), data)
    else:
        paths = write_split(data, rows[0], rows[1], seed)
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    uris = {}
    for name, path in zip(("train", "eval"), paths):
        for f in sorted(path.iterdir()) if path.is_dir() else [path]:
            s3.upload_file(str(f), bucket, f"data/{name}/{f.name}")
        uris[name] = f"s3://{bucket}/data/{name}/"
    return uris
