"""The one atomic-write helper: a reader never sees a half-written file."""
import json
import re
from pathlib import Path

import pytest

from steps.platform import files


def test_a_block_that_raises_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "evaluation.json"
    files.write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with files.atomic_open(target) as f:
            f.write('{"v": 2, "cut')
            raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert list(tmp_path.iterdir()) == [target]


def test_a_stale_temporary_of_a_killed_writer_is_overwritten(tmp_path):
    target = tmp_path / "sub" / "checkpoint.json"
    target.parent.mkdir()
    files.temporary_of(target).write_text("half")
    files.write_json(target, {"step": 3}, indent=2)
    assert json.loads(target.read_text()) == {"step": 3}
    assert not files.temporary_of(target).exists()


@pytest.mark.parametrize("text, wrong", [("", "empty"), ('{"run_id": "ab', "not whole JSON")])
def test_a_damaged_file_is_named_in_one_line_with_what_to_do(tmp_path, text, wrong):
    target = tmp_path / "mlflow-run.json"
    target.write_text(text)
    with pytest.raises(files.Damaged) as caught:
        files.read_json(target, "Logging to a new MLflow run.")
    message = str(caught.value)
    assert message.startswith(f"{target} is damaged ({wrong}") and message.endswith("Logging to a new MLflow run.")
    assert "\n" not in message


def test_records_of_an_append_cut_by_a_kill_leave_out_only_the_cut_last_line(tmp_path):
    target = tmp_path / "metrics.jsonl"
    target.write_text('{"kind": "step", "step": 1}\n{"kind": "step", "step": 2}\n{"kind": "st')
    assert [r["step"] for r in files.read_records(target)] == [1, 2]
    target.write_text('{"kind": "step", "step": 1}\n{"kind": "st\n{"kind": "step", "step": 3}\n')
    with pytest.raises(files.Damaged, match=re.escape(f"{target}:2 is damaged (not a JSON record)")):
        files.read_records(target)


#: The product's writes that do not go through steps/platform/files.py, each with why no reader can meet it cut.
NOT_ATOMIC = {
    ("steps/validate.py", 'open(os.devnull, "w")'): "nothing is written",
    ("steps/tasks/check.py", 'open(os.devnull, "w")'): "nothing is written (check-task counts the drops only)",
    ("local/report.py", 'open(runs_dir / f"{MLFLOW_DB}.lock", "w")'): "an empty lock file",
    ("local/pipeline_runner.py", 'tarfile.open(tar_path, "w:gz")'):
        "a step is recorded Succeeded only after its tarball is uploaded; a step not kept packs it again",
    ("local/toy_data.py", 'path.open("w", encoding="utf-8")'): "a fresh run's generated input; a resume keeps S3's",
    ("local/training_session/registry.py", "np.savez("): "the weights before their entry (written atomically): "
                                                          "a package without its entry is never served",
}
WRITES = re.compile(r"\.write_text\(|\.write_bytes\(|json\.dump\(|np\.savez\(|open\([^)]*[\"']w|\.open\([\"']w")


def test_every_file_the_product_writes_goes_through_the_atomic_writer_or_is_named_here():
    """Issue 37: a file a later step, a retry or a resume reads is never cut by a kill. Appends ("a") are the
    logs and the append-only records, which their readers take line by line (files.read_records)."""
    root = Path(__file__).resolve().parents[1]
    found = set()
    for folder in ("steps", "pipeline", "local"):
        for path in sorted((root / folder).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name == "steps/platform/files.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if WRITES.search(line) and "files.write" not in line:
                    known = [key for key in NOT_ATOMIC if key[0] == name and key[1] in line]
                    assert known, f"{name}:{number} writes a file in place: use steps/platform/files.py\n{line}"
                    found.update(known)
    assert found == set(NOT_ATOMIC)  # each exception still exists, so this list says what the code does
