"""``python -m pipeline.data --config X [--source DIR]`` (``make data [SOURCE=DIR]``): data to S3 as JSONL.

Without ``--source`` it downloads the ``openai/gsm8k`` ``main`` parquet files (train and
test) from the Hugging Face hub, which needs internet; with ``--source DIR`` it uploads the
files you already have as they are (JSONL, JSON, CSV or parquet; a train file and a test, validation, eval, val
or dev file in DIR, or a hub's shards of each: steps/tasks/splits.py), after the
project's own validator (steps/validate.py, with the config's ``task`` section) accepts them:
data that could not train, or whose gold answers the task's grader cannot read, is
refused with the validator's message and nothing is uploaded. Either way the rows go to the
config's ``pipeline.train_s3_uri`` and ``pipeline.eval_s3_uri`` as ``gsm8k-train.jsonl`` and
``gsm8k-test.jsonl``, so running it again replaces them. Not run in CI.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from pipeline.aws import UserError, aws_session, cli_main, resolve_region
from pipeline.config import find_placeholders, load
from steps.platform.versions import require_training_session_sdk

GSM8K_REPO = "openai/gsm8k"
GSM8K_FILES = {"train": "main/train-00000-of-00001.parquet", "test": "main/test-00000-of-00001.parquet"}
COLUMNS = ("question", "answer")
#: Seconds the one request that tells whether the hub answers may take. huggingface_hub itself retries an
#: unanswered request with backoff for ~25 s before it gives up; offline, one short try says as much.
HUB_TIMEOUT = 10.0
NO_HUB_HINT = ("check the connection (behind a proxy: HTTPS_PROXY), or upload the GSM8K JSONL files you have: "
               "make data SOURCE=<dir with train.jsonl and test.jsonl>")


def parquet_rows(path: str) -> Iterator[dict[str, Any]]:
    """The question/answer rows of a parquet file, one record batch in memory at a time."""
    import pyarrow.parquet as pq  # only `make data` needs it

    for batch in pq.ParquetFile(path).iter_batches(columns=list(COLUMNS)):
        yield from batch.to_pylist()


def jsonl_destination(s3_uri: str, filename: str) -> tuple[str, str]:
    """(bucket, key): the URI itself if it names a .jsonl object, else ``filename`` under the prefix."""
    bucket, _, key = s3_uri[len("s3://"):].partition("/")
    if not key.endswith(".jsonl"):
        key = f"{key.rstrip('/')}/{filename}".lstrip("/")
    return bucket, key


def destination(s3_uri: str, filename: str) -> tuple[str, str]:
    """(bucket, key): ``filename`` under the prefix (a URI naming a .jsonl object: beside it)."""
    bucket, _, key = s3_uri[len("s3://"):].partition("/")
    key = key.rsplit("/", 1)[0] if key.endswith(".jsonl") else key
    return bucket, f"{key.rstrip('/')}/{filename}".lstrip("/")


def upload_jsonl(s3: Any, rows: Iterable[Mapping[str, Any]], s3_uri: str, filename: str) -> tuple[str, int]:
    """Write ``rows`` as JSONL (only the GSM8K fields) to S3; returns the object URI and the row count."""
    bucket, key = jsonl_destination(s3_uri, filename)
    count = 0
    # Spooled to disk past 32 MB so memory does not grow with the dataset.
    with tempfile.SpooledTemporaryFile(max_size=32 * 2**20) as buf:
        for row in rows:
            buf.write((json.dumps({k: row[k] for k in COLUMNS}, ensure_ascii=False) + "\n").encode("utf-8"))
            count += 1
        buf.seek(0)
        s3.upload_fileobj(buf, bucket, key)
    return f"s3://{bucket}/{key}", count


# -- --source: the files you have --------------------------------------------------------------
def source_files(directory: Path) -> dict[str, list[Path]]:
    """The train and held-out ("test") files of ``directory``, as a hub names them (steps/tasks/splits.py)."""
    from steps.tasks.reader import DataError
    from steps.tasks.splits import find_splits

    if not directory.is_dir():
        raise UserError(f"SOURCE={directory}: not a directory; give the folder that holds train.jsonl and test.jsonl")
    try:
        splits = find_splits(directory, "SOURCE=")
    except DataError as exc:  # make data's own kind of refusal: the same message
        raise UserError(str(exc)) from None
    return {"train": list(splits.train), "test": list(splits.held_out)}


def validated_source(directory: Path, batch_size: int, task: Any = None) -> dict[str, Path]:
    """The source files, once steps.validate accepts them as they will be trained on (``batch_size``: the
    config's; ``task``: the config's task section, default GSM8K); the validator's own message otherwise. The
    prompt-length check needs the base model's tokenizer: ValidateData runs it in the pipeline."""
    from steps.tasks import build_task
    from steps.validate import validate

    paths = source_files(directory)
    with tempfile.TemporaryDirectory() as out:
        report = validate(paths["train"], paths["test"], batch_size, Path(out),
                          task=build_task(task) if task is not None else None,
                          max_dropped_share=task.max_dropped_share if task is not None else 0.5)
    for line in report["drops"]:  # what each split lost, by reason, as ValidateData prints it
        print(f"data: {line}")
    if report["status"] != "accepted":
        raise UserError(f"{directory}: nothing uploaded (--batch-size is the config's dapo.batch_size, {batch_size}); "
                        f"{report['message']}")
    print(report["message"])
    return paths


def other_jsonl(s3: Any, bucket: str, key: str) -> list[str]:
    """.jsonl objects beside ``key`` under its prefix: the pipeline reads every one of them as data."""
    prefix = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])
            if o["Key"].endswith(".jsonl") and o["Key"] != key]


# -- the hub ----------------------------------------------------------------------------------
def _network_errors() -> tuple[type[BaseException], ...]:
    """What the hub client raises when no answer comes (DNS, refused, timeout, proxy): OSError, and the
    transport errors of whichever HTTP library this huggingface_hub version uses."""
    errors: list[type[BaseException]] = [OSError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "RequestException")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def hub_files() -> dict[str, str]:
    """The two parquet files, downloaded (or from the local cache when the hub does not answer)."""
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise UserError("make data needs huggingface_hub: pip install -e '.[data]'") from None

    def fetch(split: str, cached_only: bool = False) -> str:
        return hf_hub_download(repo_id=GSM8K_REPO, filename=GSM8K_FILES[split], repo_type="dataset",
                               local_files_only=cached_only)

    url = hf_hub_url(GSM8K_REPO, GSM8K_FILES["train"], repo_type="dataset")
    try:
        get_hf_file_metadata(url, timeout=HUB_TIMEOUT)  # one request, no retries
    except HfHubHTTPError:
        pass  # the hub answered: hf_hub_download reports what it said
    except _network_errors() as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        try:
            paths = {split: fetch(split, cached_only=True) for split in GSM8K_FILES}
        except LocalEntryNotFoundError:
            raise UserError(f"cannot reach the Hugging Face hub for {GSM8K_REPO} ({reason}); {NO_HUB_HINT}") from None
        print(f"note: the Hugging Face hub did not answer ({reason}); using the copies in its local cache")
        return paths
    return {split: fetch(split) for split in GSM8K_FILES}


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.data", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config; uses pipeline.train_s3_uri and pipeline.eval_s3_uri")
    p.add_argument("--source", metavar="DIR", help="upload the JSONL files in DIR (a train file and a test or eval "
                                                  "file) instead of downloading GSM8K; validated first, with the "
                                                  "config's task")
    args = p.parse_args(argv)

    require_training_session_sdk()
    cfg, run = load(args.config)
    left = [k for k in find_placeholders(run) if k in ("pipeline.train_s3_uri", "pipeline.eval_s3_uri")]
    if left:
        raise UserError(f"{args.config}: fill in {', '.join(left)} first")
    # What can fail without AWS does first: the files are validated, or the hub reached, before any S3 call.
    mine = validated_source(Path(args.source), run.dapo.batch_size, run.task) if args.source else None
    parquet = None if mine else hub_files()
    s3 = aws_session(resolve_region(run.session.region, args.config)).client("s3")
    for split, uri in (("train", cfg.train_s3_uri), ("test", cfg.eval_s3_uri)):
        filename = f"gsm8k-{split}.jsonl"
        if mine:  # as they are: ValidateData reads every format (a split's shards under their own names)
            for f in mine[split]:
                name = f.name if len(mine[split]) > 1 else f"gsm8k-{split}{f.suffix}"
                bucket, key = jsonl_destination(uri, name) if f.suffix == ".jsonl" else destination(uri, name)
                s3.upload_file(str(f), bucket, key)
                print(f"{split}: {f} -> s3://{bucket}/{key}")
        else:
            dest, n = upload_jsonl(s3, parquet_rows(parquet[split]), uri, filename)
            bucket, key = jsonl_destination(uri, filename)
            print(f"{split}: {n} rows -> {dest}")
        others = other_jsonl(s3, bucket, key)
        if others:
            print(f"note: s3://{bucket}/{key.rsplit('/', 1)[0]}/ also holds {', '.join(others)}: the pipeline reads "
                  "every .jsonl under the prefix", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
