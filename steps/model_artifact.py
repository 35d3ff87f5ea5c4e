"""Reading `model.json` from what SageMaker hands a step: the model dir, the
`model.tar.gz` it makes of it, a directory holding that tarball, or the file itself."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any


class ModelArtifactError(ValueError):
    pass


def _from_tar(path: Path) -> dict[str, Any]:
    with tarfile.open(path, "r:*") as tar:
        for member in tar.getmembers():
            if Path(member.name).name == "model.json" and member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                return json.loads(f.read().decode("utf-8"))
    raise ModelArtifactError(f"{path}: no model.json inside the archive; was it produced by the TrainDAPO step?")


def read_model_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        if (p / "model.json").exists():
            p = p / "model.json"
        else:
            tars = sorted(p.glob("*.tar.gz"))
            if not tars:
                raise ModelArtifactError(f"{path}: neither model.json nor a model.tar.gz in this directory")
            p = tars[0]
    if not p.exists():
        raise ModelArtifactError(f"{path}: no such file or directory")
    record = _from_tar(p) if p.name.endswith((".tar.gz", ".tgz", ".tar")) else json.loads(p.read_text(encoding="utf-8"))
    if not record.get("model_package_arn"):
        raise ModelArtifactError(f"{path}: model.json has no model_package_arn")
    return record
