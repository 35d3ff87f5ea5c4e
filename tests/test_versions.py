from importlib import metadata

import botocore.session
import pytest

from steps.platform.versions import FIX, find_sdk_problems, require_training_session_sdk


def test_installed_sdk_passes():
    assert find_sdk_problems() == []
    require_training_session_sdk()  # does not exit


def test_old_sagemaker_train_is_named(capsys):
    def old_layout(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    problems = find_sdk_problems(import_module=old_layout)
    assert [p.what for p in problems] == [
        "sagemaker.train.training_session cannot be imported (No module named 'sagemaker.train.training_session')"
    ]
    with pytest.raises(SystemExit) as exc:
        require_training_session_sdk(problems)
    assert exc.value.code != 0
    err = capsys.readouterr().err
    installed = {name: metadata.version(name) for name in ("sagemaker-train", "botocore")}
    assert all(f"{name} {version}" in err for name, version in installed.items())  # installed versions are named
    assert FIX in err and "pip install" in err
    # The project's venv comes first: the usual cause is a shell without it (issue 29), not an old system SDK.
    fix = err.split("  fix: ", 1)[1]
    assert fix.index("make install") < fix.index(".venv/bin/python -m") < fix.index(FIX)
    assert all(len(line) < 200 for line in err.splitlines())


def test_botocore_without_training_session_models(tmp_path):
    # A botocore session whose model search path holds no service models at all
    # behaves like a botocore too old to know the training-session API.
    session = botocore.session.get_session()
    session.set_config_variable("data_path", str(tmp_path))
    loader = session.get_component("data_loader")
    loader.search_paths.clear()
    loader.search_paths.append(str(tmp_path))
    problems = [p.what for p in find_sdk_problems(botocore_session=session)]
    assert "botocore has no 'sagemakertrainingsessionruntime' service model" in problems
    assert "botocore's 'sagemaker' model has no CreateTrainingSession operation" in problems
