"""Throughput and memory of ``steps.validate`` on generated GSM8K-format files.

Rows are unique word problems in the GSM8K layout, with a few faults mixed in
(0.2% no final number, 0.1% empty question, 0.1% duplicates) and an eval file
whose first 100 questions also appear in train. Each size is validated twice:

* as the container runs it, ``python -m steps.validate`` in a subprocess: wall
  time (interpreter start and imports included) and the child's peak RSS
  (``VmHWM``, see :mod:`bench.peak_rss`);
* in-process under ``tracemalloc``: the peak of Python allocations.

Two sizes, so that memory growing with the file would show.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from steps.validate import validate

SIZES = (20_000, 200_000)
EVAL_ROWS = 1_000
OVERLAP = 100
NAMES = ("Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gina", "Hugo")


def row(i: int) -> dict[str, str]:
    name, a, b = NAMES[i % len(NAMES)], 3 + i % 97, 2 + (i // 97) % 89
    question = (f"{name} has {a} marbles in box {i} and buys {b} more at the market. "
                f"How many marbles are in box {i} now?")
    answer = f"{name} starts with {a} marbles and buys {b} more, so {a} + {b} = {a + b}.\n#### {a + b}"
    return {"question": question, "answer": answer}


def write_rows(path: Path, n: int, start: int = 0) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(start, start + n):
            r = row(i)
            if i % 500 == 1:
                r["answer"] = "no final number here"
            elif i % 1000 == 2:
                r["question"] = ""
            elif i % 1000 == 3:
                r = row(i - 1)  # a duplicate of the row before
            f.write(json.dumps(r) + "\n")


def write_dataset(d: Path, n: int) -> tuple[Path, Path]:
    train, evaluation = d / f"train_{n}.jsonl", d / f"eval_{n}.jsonl"
    write_rows(train, n)
    write_rows(evaluation, EVAL_ROWS, start=n - OVERLAP)  # the last 100 train rows reappear in eval
    return train, evaluation


def run_subprocess(train: Path, evaluation: Path, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.peak_rss", "steps.validate", "--train", str(train),
           "--eval", str(evaluation), "--batch-size", "32", "--output", str(out)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"steps.validate failed: {proc.stderr}")
    peak_kb = int(proc.stderr.strip().splitlines()[-1].removeprefix("peak_rss_kb="))
    return {"wall_s": wall, "peak_rss_mb": peak_kb / 1024}


def run_tracemalloc(train: Path, evaluation: Path, out: Path) -> dict[str, Any]:
    tracemalloc.start()
    try:
        report = validate(str(train), str(evaluation), 32, out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {"tracemalloc_peak_mb": peak / 2**20, "status": report["status"],
            "kept": report["kept"], "overlap": report["overlap"]["count"]}


def measure() -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for n in SIZES:
            train, evaluation = write_dataset(d, n)
            sub = run_subprocess(train, evaluation, d / f"out_{n}")
            traced = run_tracemalloc(train, evaluation, d / f"traced_{n}")
            rows = n + EVAL_ROWS
            results.append({"rows": rows, "train_mb": train.stat().st_size / 2**20,
                            "rows_per_s": rows / sub["wall_s"], **sub, **traced})
    return results
