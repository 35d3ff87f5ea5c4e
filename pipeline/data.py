"""``python -m pipeline.data --config X`` (``make data``): GSM8K from the Hugging Face hub to S3 as JSONL.

Downloads the ``openai/gsm8k`` ``main`` parquet files (train and test) and
uploads them as JSONL rows ``{"question", "answer"}`` to the config's
``pipeline.train_s3_uri`` and ``pipeline.eval_s3_uri``. Needs internet; not run in CI.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any, Iterable, Iterator, Mapping, Sequence

from pipeline.aws import UserError, aws_session, cli_main, resolve_region
from pipeline.config import find_placeholders, load
from steps.platform.versions import require_training_session_sdk

GSM8K_REPO = "openai/gsm8k"
GSM8K_FILES = {"train": "main/train-00000-of-00001.parquet", "test": "main/test-00000-of-00001.parquet"}
COLUMNS = ("question", "answer")


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


def download(split: str) -> str:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise UserError("make data needs huggingface_hub: pip install -e '.[data]'") from None
    return hf_hub_download(repo_id=GSM8K_REPO, filename=GSM8K_FILES[split], repo_type="dataset")


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.data", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config; uses pipeline.train_s3_uri and pipeline.eval_s3_uri")
    args = p.parse_args(argv)

    require_training_session_sdk()
    cfg, run = load(args.config)
    left = [k for k in find_placeholders(run) if k in ("pipeline.train_s3_uri", "pipeline.eval_s3_uri")]
    if left:
        raise UserError(f"{args.config}: fill in {', '.join(left)} first")
    s3 = aws_session(resolve_region(run.session.region, args.config)).client("s3")
    for split, uri in (("train", cfg.train_s3_uri), ("test", cfg.eval_s3_uri)):
        dest, n = upload_jsonl(s3, parquet_rows(download(split)), uri, f"gsm8k-{split}.jsonl")
        print(f"{split}: {n} rows -> {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
