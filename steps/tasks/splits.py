"""Which files of a folder are the train split and which the held-out split, named as hubs name them.

A file belongs to a split when a word of its path under the folder (split at ``/ - _ .`` and spaces) is the
split's name: ``train.jsonl``, ``gsm8k-test.jsonl``, ``data/validation-00000-of-00001.parquet``,
``default/train/0000.parquet``. A split may be several files (a hub's shards), all in one folder. Held-out
names, in the order one is chosen when a folder has several (Hugging Face datasets often have validation and
test): ``test``, ``validation``, ``eval``, ``val``, ``dev``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from steps.tasks.reader import FORMATS_READ, DataError, data_files

TRAIN = "train"
HELD_OUT = ("test", "validation", "eval", "val", "dev")
_WORD = re.compile(r"[-_. /\\]+")


@dataclass(frozen=True)
class Splits:
    train: tuple[Path, ...]
    held_out: tuple[Path, ...]
    held_out_name: str  # which of HELD_OUT the held-out files are named by
    ignored: tuple[str, ...] = ()  # other held-out splits found, not used (said on the terminal)


def words(path: Path, root: Path) -> set[str]:
    rel = path.relative_to(root).with_suffix("")
    return {w for w in _WORD.split(str(rel).lower()) if w}


# A hub's shards of one split: train-00000-of-00002.parquet, default/train/0000.parquet.
_SHARD = re.compile(r"(^|[-_.])\d+([-_]of[-_]\d+)?$")


def _one_split(split: str, files: list[Path], root: Path, given: str) -> None:
    """A split is one file, or shards in one folder: two datasets' files (gsm8k's main/ and socratic/, or
    train.jsonl beside train_socratic.jsonl) are refused, naming them."""
    folders = sorted({f.parent for f in files})
    if len(folders) > 1:
        names = ", ".join(f"{f.relative_to(root)}/" for f in folders)
        raise DataError(f"{given}{root}: {split} files in {len(folders)} folders ({names}); a split's files "
                        f"(shards) lie in one folder: give one of them, {given}{folders[0]}")
    if len(files) > 1 and not all(_SHARD.search(f.stem) for f in files):
        names = ", ".join(f.name for f in files)
        raise DataError(f"{given}{root}: {len(files)} {split} files among: {names}; keep exactly one per split in "
                        "the folder (or a hub's shards: train-00000-of-00002.parquet, ...)")


def find_splits(directory: str | Path, given: str = "") -> Splits:
    """The train and held-out files of ``directory``; ``given`` is how the user named it (``DATA=``, ``SOURCE=``),
    quoted in a refusal, which also names the files found and the formats read."""
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"{given}{root}: not a directory; give the folder that holds a train file and a test (or "
                        "validation) file")
    files = data_files(root)
    named = {f: words(f, root) for f in files}
    train = [f for f in files if TRAIN in named[f]]
    by_name = {name: [f for f in files if name in named[f] and f not in train] for name in HELD_OUT}
    found = [name for name in HELD_OUT if by_name[name]]
    if not train or not found:
        missing = " and ".join(s for s, ok in (("train", train), ("held-out", found)) if not ok)
        listed = ", ".join(str(f.relative_to(root)) for f in files[:8]) + (" ..." if len(files) > 8 else "")
        raise DataError(f"{given}{root}: no {missing} file among {listed}: a file of each split is named with its "
                        f"split, train and one of {', '.join(HELD_OUT)} (train.jsonl, test.parquet, "
                        f"validation-00000-of-00001.parquet); the formats read: {FORMATS_READ}")
    _one_split(TRAIN, train, root, given)
    held_out = by_name[found[0]]
    _one_split(found[0], held_out, root, given)
    return Splits(tuple(train), tuple(held_out), found[0], tuple(found[1:]))
