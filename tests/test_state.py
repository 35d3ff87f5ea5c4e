import json

import pytest

from steps.dapo import state as ckpt_io
from steps.dapo.sampling import DataPosition, Group, Rollout, take
from steps.dapo.state import LoopState, resume_or_start
from steps.dapo.task import Grade


def test_take_is_a_permutation_per_epoch_and_resumable():
    first, pos = take(10, 4, seed=3, pos=DataPosition())
    second, pos = take(10, 4, seed=3, pos=pos)
    third, pos = take(10, 4, seed=3, pos=pos)  # wraps into epoch 1
    assert sorted(first + second + third[:2]) == list(range(10))
    assert pos == DataPosition(epoch=1, offset=2)
    # Resuming from a saved position gives exactly the same continuation.
    again, _ = take(10, 4, seed=3, pos=DataPosition(epoch=0, offset=8))
    assert again == third
    assert take(10, 4, seed=4, pos=DataPosition())[0] != first


def _ckpt(step=3):
    group = Group(5, (1, 2), (Rollout((3, 4), (-0.5, -0.25), "stop", 1.0, Grade(True, True, "4")),
                              Rollout((9,), (-2.0,), "length", 0.0, Grade(False, False, None))), sampler_step=2)
    return LoopState(seed=0, step=step, position=DataPosition(1, 7), gen_batches_drawn=11, carry=(group,),
                     kept_groups=5, sampled_groups=9, state_model_package_arn="arn:state",
                     sampler_model_package_arn="arn:w")


def test_checkpoint_round_trips(tmp_path):
    ckpt_io.write(tmp_path, _ckpt())
    assert ckpt_io.read(tmp_path) == _ckpt()
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind
    assert ckpt_io.read(tmp_path / "elsewhere") is None


def test_rewrite_replaces_the_previous_checkpoint_whole(tmp_path):
    ckpt_io.write(tmp_path, _ckpt(3))
    ckpt_io.write(tmp_path, _ckpt(4))
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 4


@pytest.mark.parametrize("content", ['{"version": 1, "step": 3', "{}", '{"version": 9}', "not json"])
def test_corrupt_checkpoint_is_a_clear_error(tmp_path, content):
    (tmp_path / "checkpoint.json").write_text(content)
    with pytest.raises(ckpt_io.CheckpointError) as exc:
        ckpt_io.read(tmp_path)
    msg = str(exc.value)
    assert "checkpoint.json" in msg and "Delete" in msg


def test_a_resume_with_another_seed_is_refused(tmp_path):
    ckpt_io.write(tmp_path, _ckpt())
    assert resume_or_start(tmp_path, seed=0) == _ckpt()
    with pytest.raises(ckpt_io.CheckpointError, match="seed 0, this run has seed 5") as exc:
        resume_or_start(tmp_path, seed=5)
    assert "dapo.seed=0" in str(exc.value)
    assert resume_or_start(tmp_path / "none", seed=5) == LoopState(seed=5)
