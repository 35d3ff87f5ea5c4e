"""`make data`: your own GSM8K JSONL uploaded once the validator accepts it, refused with its message otherwise,
and offline a one-line error after one request to the hub. Real boto3 against moto."""
from __future__ import annotations

import json
from pathlib import Path

import boto3
import huggingface_hub
import pytest
from huggingface_hub.utils._http import default_client_factory
from moto import mock_aws

from local.toy_data import write_split
from pipeline import data
from pipeline.aws import UserError
from tests.local_service import REGION

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "local.yaml"  # batch_size 16; data under s3://dapo-local/data/{train,eval}
BUCKET = "dapo-local"
GSM8K = Path("/work/shared/data/gsm8k")


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        yield client


def objects(s3) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def test_source_files_are_uploaded_as_they_are_once_the_validator_accepts_them(s3, tmp_path, capsys):
    train, eval_ = write_split(tmp_path / "mine", 40, 10, seed=3)
    s3.put_object(Bucket=BUCKET, Key="data/train/old.jsonl", Body=b"")
    assert data.main(["--config", str(CONFIG), "--source", str(tmp_path / "mine")]) == 0
    assert objects(s3) == {"data/train/old.jsonl": b"", "data/train/gsm8k-train.jsonl": train.read_bytes(),
                           "data/eval/gsm8k-test.jsonl": eval_.read_bytes()}
    out, err = capsys.readouterr()
    assert "validation accepted: train 40/40 rows kept; eval 10/10 rows kept" in out
    assert f"train: {train} -> s3://{BUCKET}/data/train/gsm8k-train.jsonl" in out
    assert "note: s3://dapo-local/data/train/ also holds data/train/old.jsonl" in err  # the pipeline reads it too


def test_source_data_that_cannot_train_is_refused_with_the_validators_message_and_nothing_uploaded(
        s3, tmp_path, capsys):
    write_split(tmp_path / "mine", 12, 10, seed=3)  # fewer valid rows than local.yaml's batch_size 16
    with (tmp_path / "mine" / "train.jsonl").open("a") as f:
        f.write(json.dumps({"question": "no final answer", "answer": "none"}) + "\n")
    assert data.main(["--config", str(CONFIG), "--source", str(tmp_path / "mine")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'mine'}: nothing uploaded (--batch-size is the config's "
                          "dapo.batch_size, 16); validation refused the data:\n- train data has 12 usable rows")
    assert "train.jsonl:13: no '#### <number>' final answer" in err and "Traceback" not in err
    assert objects(s3) == {}


@pytest.mark.skipif(not GSM8K.is_dir(), reason=f"{GSM8K} (real GSM8K) is absent on this machine")
def test_the_real_gsm8k_folder_is_recognised():
    """openai/grade-school-math's own names: train.jsonl, test.jsonl (example_model_solutions.jsonl is neither)."""
    assert data.source_files(GSM8K) == {"train": [GSM8K / "train.jsonl"], "test": [GSM8K / "test.jsonl"]}


def test_a_source_folder_must_name_one_file_per_split(tmp_path):
    (tmp_path / "gsm8k-train.jsonl").write_text("")
    (tmp_path / "eval.jsonl").write_text("")
    assert data.source_files(tmp_path) == {"train": [tmp_path / "gsm8k-train.jsonl"], "test": [tmp_path / "eval.jsonl"]}
    (tmp_path / "train_socratic.jsonl").write_text("")
    with pytest.raises(UserError, match=r"SOURCE=.*: 2 train files among: gsm8k-train.jsonl, train_socratic.jsonl; "
                                        r"keep exactly one per split"):
        data.source_files(tmp_path)
    with pytest.raises(UserError, match=r"not a directory"):
        data.source_files(tmp_path / "missing")


def test_offline_the_hub_is_asked_once_and_the_error_is_one_line(s3, tmp_path, monkeypatch, capsys):
    """No network here (tests/conftest.py refuses every connection but loopback's): one request, no retry loop
    (huggingface_hub's own would retry for ~25 s), and a line that says what to do; nothing uploaded."""
    requests = []

    def counting_client():
        client = default_client_factory()
        client.event_hooks = {**client.event_hooks, "request": [*client.event_hooks["request"], requests.append]}
        return client

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    huggingface_hub.set_client_factory(counting_client)
    try:
        assert data.main(["--config", str(CONFIG)]) == 2
    finally:
        huggingface_hub.set_client_factory(default_client_factory)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: cannot reach the Hugging Face hub for openai/gsm8k (")
    assert "make data SOURCE=<dir with train.jsonl and test.jsonl>" in err
    asked = [(r.method, str(r.url)) for r in requests if "/resolve/" in r.url.path]  # not the library's own calls
    assert asked == [("HEAD", "https://huggingface.co/datasets/openai/gsm8k/resolve/main/main/train-00000-of-00001.parquet")]
    assert objects(s3) == {}
