"""The public-SDK example script works against the local service, as docs/local-run.md says."""
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.local_service import ENDPOINT_ENV_VARS


def test_sdk_smoke_script_trains_through_the_public_sdk(local_service):
    env = {**os.environ, **{v: local_service.url for v in ENDPOINT_ENV_VARS}}
    out = subprocess.run([sys.executable, "-m", "local.examples.sdk_smoke"], env=env, capture_output=True,
                         text=True, timeout=120, cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr
    before, after = map(float, re.search(r"completion: (-?[\d.]+) -> (-?[\d.]+)", out.stdout).groups())
    assert after > before  # a positive-advantage PPO step made the sampled completion more likely


def test_sdk_smoke_script_explains_missing_endpoints():
    env = {k: v for k, v in os.environ.items() if k not in ENDPOINT_ENV_VARS}
    out = subprocess.run([sys.executable, "-m", "local.examples.sdk_smoke"], env=env, capture_output=True,
                         text=True, timeout=120, cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 2 and "SAGEMAKER_TRAINING_SESSION_ENDPOINT" in out.stderr
