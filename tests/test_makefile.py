"""The Makefile does what its help says: `make` alone lists every target, variables reach the commands, and the
README and docs/local-run.md say how to run the `python -m` commands in `.venv`. `make -n` prints the commands
without running them."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make(*args: str) -> str:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def phony_targets() -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith(".PHONY:")]
    return line.split(":", 1)[1].split()


def test_make_alone_is_help_with_one_line_per_target():
    listed = make()
    assert listed == make("help")
    lines = listed.splitlines()[1:]
    names = [line.split()[0] for line in lines]
    assert sorted(names) == sorted(phony_targets())  # every target, once; nothing else
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # each with its text


def test_local_run_passes_params_on():
    out = make("-n", "local-run", 'PARAMS=MaxSteps=5 BatchSize=8')
    assert re.search(r"^\S+python -m local\.run --param MaxSteps=5 --param BatchSize=8\s*$", out, re.M), out
    assert re.search(r"^\S+python -m local\.run\s*$", make("-n", "local-run"), re.M)


def test_local_run_resumes_and_is_verbose_from_make():
    """The resume command a run prints (make local-run RESUME=<id>) works in the shell `make local-run` was typed
    in: make runs .venv's python."""
    out = make("-n", "local-run", "RESUME=20261204-184207-a3f2", "VERBOSE=1")
    assert re.search(r"^\.venv/bin/python -m local\.run\s+--resume 20261204-184207-a3f2 --verbose\s*$", out, re.M), out


def test_one_config_variable_serves_check_task_sample_and_local_run_and_messages_name_make_s_variables():
    """CONFIG=<file> given on make's command line reaches each (local-run's default stays config/local.yaml, so
    it passes none unless given; LOCAL_CONFIG, the older name, still works), and the targets a person types tell
    the commands so (DAPO_CALLER=make: steps/cli.py names DATA=, PARAMS=, not --data, --param)."""
    for target, extra in (("local-run", ()), ("check-task", ("DATA=d",)), ("sample", ("MODEL=arn:x", "PROMPT=hi"))):
        assert re.search(r"--config mine\.yaml\b", make("-n", target, "CONFIG=mine.yaml", *extra)), target
    assert "--config" not in make("-n", "local-run")
    assert re.search(r"python -m local\.run\s+--config old\.yaml\s*$", make("-n", "local-run", "LOCAL_CONFIG=old.yaml"),
                     re.M)
    database = make("-pn", "local-run")  # make's own view of the target-specific variables; nothing runs
    for target in ("local-run", "check-task", "sample", "start-pipeline"):
        assert f"\n{target}: DAPO_CALLER = make\n" in database, target
    assert "export DAPO_CALLER = make" in (ROOT / "Makefile").read_text()  # in the commands' environment


def test_data_passes_source_on_and_needs_no_download_extra_for_it():
    out = make("-n", "data", "SOURCE=/data/gsm8k", "CONFIG=c.yaml")
    assert re.search(r"python -m pipeline\.data --config c\.yaml --source /data/gsm8k\s*$", out, re.M), out
    assert "pip install" not in out
    assert re.search(r"python -m pipeline\.data --config c\.yaml\s*$", make("-n", "data", "CONFIG=c.yaml"), re.M)


def test_mlflow_ui_serves_the_local_runs_store_on_loopback():
    out = make("-n", "mlflow-ui", "MLFLOW_PORT=5123")
    assert f"mlflow ui --backend-store-uri sqlite:///{ROOT}/runs/mlflow.db --host 127.0.0.1 --port 5123" in out


def test_the_docs_show_activating_the_venv_before_python_m_and_mlflow_ui():
    readme = (ROOT / "README.md").read_text()
    # The first screen shows make targets only (the resume is `make local-run RESUME=<id>`); a `python -m`
    # there would need the venv's activation beside it.
    assert "make mlflow-ui" in readme and "make local-run RESUME=<run-id>" in readme
    assert "python -m" not in readme or "source .venv/bin/activate" in readme
    assert 'make local-run PARAMS="MaxSteps=5 BatchSize=8"' in readme
    page = (ROOT / "docs" / "local-run.md").read_text()
    commands = page.split("## Commands", 1)[1].split("\n## ", 1)[0]
    assert "source .venv/bin/activate" in commands and "make mlflow-ui" in commands
    assert 'make local-run PARAMS="MaxSteps=5 BatchSize=8"' in commands and "make help" in commands
