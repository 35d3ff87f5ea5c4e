"""The one atomic-write helper: a reader never sees a half-written file."""
import json

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
