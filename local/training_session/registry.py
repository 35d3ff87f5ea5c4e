"""The model package registry of the local service: groups, versions, their weights on disk and approval status.

``saveState`` / ``saveWeights`` register a version here, as the real service does in the session's group; the
control plane's descriptions come from the objects' ``describe()`` and ``summary()`` (moto's ``response_object``).
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from local.training_session.exceptions import invalid
from local.training_session.toy.policy import Policy
from steps.platform import files

_GROUP_ARN = re.compile(r"^arn:(?P<partition>[\w-]+):sagemaker:(?P<region>[\w-]+):(?P<account>\d{12}):"
                        r"model-package-group/(?P<name>[A-Za-z0-9][A-Za-z0-9-]{0,62})$")
#: Policies kept loaded for sampling: the current sampler and a few before it.
LOADED_POLICIES = 3


@dataclass(frozen=True)
class PackageGroup:
    name: str
    arn: str
    created: float
    description: str = ""

    def describe(self) -> dict[str, Any]:
        return {"ModelPackageGroupName": self.name, "ModelPackageGroupArn": self.arn,
                "ModelPackageGroupDescription": self.description, "CreationTime": self.created,
                "CreatedBy": {}, "ModelPackageGroupStatus": "Completed"}


@dataclass(frozen=True)
class ModelPackage:
    arn: str
    group_name: str
    version: int
    created: float
    description: str
    is_checkpoint: bool  # saveState (weights + optimizer) vs saveWeights (weights only)
    base_model_name: str
    base_model_version: str
    session_name: str
    s3_uri: str
    approval_status: str = "PendingManualApproval"
    approval_description: str = ""
    modified: float = 0.0
    # UpdateModelPackage's CustomerMetadataProperties (the approve step's figures), beside the session's name.
    customer_metadata: dict[str, str] = dataclasses.field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"ModelPackageName": self.group_name, "ModelPackageGroupName": self.group_name,
                "ModelPackageVersion": self.version, "ModelPackageArn": self.arn,
                "ModelPackageDescription": self.description, "CreationTime": self.created,
                "ModelPackageStatus": "Completed", "ModelApprovalStatus": self.approval_status}

    def describe(self) -> dict[str, Any]:
        """DescribeModelPackage: what the SDK reads (base model, IsCheckpoint, location)."""
        container = {
            "Image": "local-training-session",
            "IsCheckpoint": self.is_checkpoint,
            "BaseModel": {"HubContentName": self.base_model_name,
                          "HubContentVersion": self.base_model_version},
            "ModelDataSource": {"S3DataSource": {"S3Uri": self.s3_uri, "S3DataType": "S3Prefix",
                                                 "CompressionType": "None"}},
        }
        out = {**self.summary(), "InferenceSpecification": {"Containers": [container]},
               "ModelPackageStatusDetails": {"ValidationStatuses": [], "ImageScanStatuses": []},
               "LastModifiedTime": self.modified or self.created,
               "CustomerMetadataProperties": {"TrainingSessionName": self.session_name, **self.customer_metadata}}
        if self.approval_description:
            out["ApprovalDescription"] = self.approval_description
        return out


def group_name_of(name_or_arn: str) -> str:
    """A group's name from its name or ARN (botocore's model has checked which it is)."""
    return name_or_arn.rsplit("/", 1)[-1]


def parse_group_arn(arn: str) -> re.Match[str]:
    """Account and name of a group ARN. botocore's model allows any non-blank name after
    ``model-package-group/``; a group that can exist has a name as CreateModelPackageGroup's."""
    match = _GROUP_ARN.match(arn)
    if not match:
        raise invalid(f"ModelPackageGroupArn {arn!r} must name a group that can exist: "
                      "arn:aws:sagemaker:REGION:ACCOUNT:model-package-group/NAME, NAME 1-63 letters, "
                      "digits and hyphens")
    return match


class PackageRegistry:
    """Thread-safe store of groups and packages, persisted under a directory.

    Weights live on disk (an ``.npz`` per package beside its metadata JSON), not in
    memory: a DAPO run saves sampler weights every step, and a few MB per step adds
    up. Only the policies recently sampled from are kept loaded. Without a state
    directory the files go to a temporary one removed at :meth:`close`; with one, a
    restarted service still serves the packages an earlier one saved.
    """

    def __init__(self, state_dir: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, PackageGroup] = {}
        self._packages: dict[str, ModelPackage] = {}
        self._last_version: dict[str, int] = {}  # per group; never reused, even after a delete
        self._policies: OrderedDict[str, Policy] = OrderedDict()  # LRU
        self._temporary = state_dir is None
        self._dir = Path(tempfile.mkdtemp(prefix="local-ts-")) if state_dir is None else Path(state_dir)
        self._load()

    def close(self) -> None:
        """Remove the weights if they were only ever meant to last this run."""
        if self._temporary:
            shutil.rmtree(self._dir, ignore_errors=True)

    # -- groups -------------------------------------------------------------
    def create_group(self, name: str, region: str, account: str, description: str = "") -> PackageGroup:
        with self._lock:
            if name in self._groups:
                raise invalid(f"Model Package Group {name!r} already exists")
            arn = f"arn:aws:sagemaker:{region}:{account}:model-package-group/{name}"
            return self._put_group(PackageGroup(name, arn, time.time(), description))

    def ensure_group(self, arn: str) -> PackageGroup:
        """The group an ARN names, created on first use (the local service needs no setup)."""
        name = parse_group_arn(arn)["name"]
        with self._lock:
            return self._groups.get(name) or self._put_group(PackageGroup(name, arn, time.time()))

    def group(self, name_or_arn: str) -> PackageGroup:
        name = group_name_of(name_or_arn)
        with self._lock:
            if name not in self._groups:
                raise invalid(f"Model Package Group {name!r} does not exist")
            return self._groups[name]

    def _put_group(self, group: PackageGroup) -> PackageGroup:
        self._groups[group.name] = group
        self._write_json(self._dir / "groups" / f"{group.name}.json", dataclasses.asdict(group))
        return group

    # -- packages -----------------------------------------------------------
    def add(self, group: PackageGroup, weights: dict[str, np.ndarray], *, is_checkpoint: bool,
            description: str, base_model: tuple[str, str], session_name: str, s3_prefix: str) -> ModelPackage:
        """Register ``weights`` as the group's next version."""
        with self._lock:
            version = self._last_version.get(group.name, 0) + 1
            self._last_version[group.name] = version
            arn = f"{group.arn.replace(':model-package-group/', ':model-package/')}/{version}"
            package = ModelPackage(
                arn=arn, group_name=group.name, version=version, created=time.time(),
                description=description or ("training state" if is_checkpoint else "sampler weights"),
                is_checkpoint=is_checkpoint, base_model_name=base_model[0],
                base_model_version=base_model[1], session_name=session_name,
                s3_uri=f"{s3_prefix.rstrip('/')}/{group.name}/{version}/")
            np.savez(self._package_path(package, ".npz"), **weights)
            self._write_meta(package)
            self._packages[arn] = package
            return package

    def get(self, arn: str) -> ModelPackage:
        with self._lock:
            if arn not in self._packages:
                raise invalid(f"Model package {arn!r} does not exist")
            return self._packages[arn]

    def list(self, group_name_or_arn: str) -> list[ModelPackage]:
        """A group's packages, oldest first (callers sort and page)."""
        name = group_name_of(group_name_or_arn)
        with self._lock:
            return sorted((p for p in self._packages.values() if p.group_name == name),
                          key=lambda p: (p.created, p.version))

    def update_approval(self, arn: str, status: str | None, description: str | None,
                        metadata: dict[str, str] | None = None, remove: list[str] | None = None) -> ModelPackage:
        """SageMaker's semantics: what a request omits is kept; metadata keys are added or replaced, and those in
        ``remove`` (CustomerMetadataPropertiesToRemove) removed."""
        with self._lock:
            if arn not in self._packages:
                raise invalid(f"Model package {arn!r} does not exist")
            old = self._packages[arn]
            new = dataclasses.replace(
                old, approval_status=status or old.approval_status,
                approval_description=old.approval_description if description is None else description,
                customer_metadata={k: v for k, v in {**old.customer_metadata, **(metadata or {})}.items()
                                   if k not in (remove or ())}, modified=time.time())
            self._packages[arn] = new
            self._write_meta(new)
            return new

    def delete(self, arn: str) -> None:
        with self._lock:
            package = self._packages.pop(arn, None)
            if package is None:
                raise invalid(f"Model package {arn!r} does not exist")
            self._policies.pop(arn, None)
            for suffix in (".json", ".npz"):
                self._package_path(package, suffix).unlink(missing_ok=True)

    def weights(self, arn: str) -> dict[str, np.ndarray]:
        """The arrays saved with the package (read from disk each time: loads are rare)."""
        path = self._package_path(self.get(arn), ".npz")
        with np.load(path) as data:
            return {k: data[k] for k in data.files}

    def policy(self, arn: str) -> Policy:
        """The package's weights as a Policy, kept loaded while it is among the latest used."""
        with self._lock:
            if arn in self._policies:
                self._policies.move_to_end(arn)
                return self._policies[arn]
        policy = Policy.from_state_dict(self.weights(arn))
        with self._lock:
            self._policies[arn] = policy
            while len(self._policies) > LOADED_POLICIES:
                self._policies.popitem(last=False)
        return policy

    # -- persistence ----------------------------------------------------------
    def _package_path(self, package: ModelPackage, suffix: str) -> Path:
        path = self._dir / "packages" / package.group_name / f"{package.version}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _write_meta(self, package: ModelPackage) -> None:
        self._write_json(self._package_path(package, ".json"), dataclasses.asdict(package))

    @staticmethod
    def _write_json(path: Path, payload: dict[str, Any]) -> None:
        files.write_json(path, payload)  # atomic: a crash never leaves half a file

    def _load(self) -> None:
        for path in sorted((self._dir / "groups").glob("*.json")):
            group = PackageGroup(**json.loads(path.read_text()))
            self._groups[group.name] = group
        for path in sorted((self._dir / "packages").glob("*/*.json")):
            package = ModelPackage(**json.loads(path.read_text()))
            self._packages[package.arn] = package
            self._last_version[package.group_name] = max(package.version,
                                                         self._last_version.get(package.group_name, 0))

