"""`model.json`: what TrainDAPO leaves in the model dir, and reading it back from what SageMaker hands a
later step (the model dir, the `model.tar.gz` it makes of it, a directory holding that tarball, or the file)."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from steps.cli import Refused
from steps.platform import files

FILENAME = "model.json"


class ModelArtifactError(Refused):
    pass


def write_model_json(model_dir: str | Path, record: dict[str, Any]) -> Path:
    """Written atomically: a half-written model.json never passes for a result."""
    return files.write_json(Path(model_dir) / FILENAME, record, indent=2)


def _from_tar(path: Path) -> dict[str, Any]:
    with tarfile.open(path, "r:*") as tar:
        for member in tar.getmembers():
            if Path(member.name).name == FILENAME and member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                return json.loads(f.read().decode("utf-8"))
    raise ModelArtifactError(f"{path}: no {FILENAME} inside the archive; was it produced by the TrainDAPO step?")


def read_model_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        if (p / FILENAME).exists():
            p = p / FILENAME
        else:
            tars = sorted(p.glob("*.tar.gz"))
            if not tars:
                raise ModelArtifactError(f"{path}: neither {FILENAME} nor a model.tar.gz in this directory")
            p = tars[0]
    if not p.exists():
        raise ModelArtifactError(f"{path}: no such file or directory")
    try:
        record = _from_tar(p) if p.name.endswith((".tar.gz", ".tgz", ".tar")) else json.loads(p.read_text("utf-8"))
    except (OSError, ValueError, tarfile.TarError) as exc:
        raise ModelArtifactError(f"{path}: not a readable {FILENAME} ({exc})") from None
    if not record.get("model_package_arn"):
        raise ModelArtifactError(f"{path}: {FILENAME} has no model_package_arn")
    return record
