"""``make bench`` (``python -m bench``): measure, write bench/results.json, refresh bench/README.md.

Ratios, not absolute times, are the figures to read: measured and ideal come
from the same run on the same machine. Runs in a few minutes on 2 cores.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from bench import overhead, report, roundtrip, tracking, validation
from bench.roundtrip import LOCAL_CONFIG, RunSpec
from bench.service import local_service
from local.toy_data import write_split
from steps.config import load_config
from steps.gsm8k.data import load_examples
from steps.platform.session import service_client

HERE = Path(__file__).resolve().parent
LATENCY_MS = 200
DEFAULT_INFLIGHT = 2  # the config default of max_inflight_gen_batches
KEEP_RATES = (1.0, 0.5, 0.2)
SPECS = (
    [RunSpec(keep, inflight, LATENCY_MS, steps=5) for keep in KEEP_RATES for inflight in (1, 2, 4)]
    # A longer latency: how the ratio moves when the fixed per-step overhead matters less.
    + [RunSpec(keep, DEFAULT_INFLIGHT, 1000, steps=3) for keep in KEEP_RATES]
)


def measure_roundtrips() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp, local_service() as service:
        train_path, _ = write_split(tmp, 2000, 10, seed=3)
        examples = load_examples(train_path)
        client = service_client(load_config(LOCAL_CONFIG).session)
        return roundtrip.run_all(SPECS, service, examples, client)


def main() -> int:
    t0 = time.monotonic()
    # First, while this process's heap is small: garbage of the training runs makes
    # the collector's pauses part of whatever is timed after them.
    print("overhead: client CPU per sample", flush=True)
    oh = overhead.measure()
    print("validation: 20,000 and 200,000 rows", flush=True)
    sizes = validation.measure()
    runs = measure_roundtrips()
    oh["step_fraction"] = {
        f"{r['spec']['keep']:.0%}": overhead.step_fraction(oh, r["steps"], r["spec"]["group_size"],
                                                           r["spec"]["batch_size"])
        for r in runs if r["spec"]["inflight"] == DEFAULT_INFLIGHT and r["spec"]["latency_ms"] == LATENCY_MS
    }
    # MLflow tracking against the shortest measured step (100% keep, default inflight, L = 200 ms).
    fastest = min(sum(s["wall_s"] for s in r["steps"]) / len(r["steps"]) for r in runs
                  if r["spec"]["inflight"] == DEFAULT_INFLIGHT and r["spec"]["latency_ms"] == LATENCY_MS)
    print("tracking: MLflow client cost per step record", flush=True)
    tracked = tracking.measure(fastest)
    print(tracking.line(tracked), flush=True)
    small, large = sizes[0], sizes[-1]
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "roundtrip": {"latency_ms": LATENCY_MS, "default_inflight": DEFAULT_INFLIGHT,
                      "batch_size": SPECS[0].batch_size, "group_size": SPECS[0].group_size, "runs": runs},
        "overhead": oh,
        "tracking": tracked,
        "validation": {"sizes": sizes, "marginal_rows_per_s":
                       (large["rows"] - small["rows"]) / (large["wall_s"] - small["wall_s"])},
    }
    results["bench_seconds"] = time.monotonic() - t0
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    markdown = report.render(results)
    report.update_readme(HERE / "README.md", markdown)
    print(markdown)
    print(f"\nwrote {HERE / 'results.json'} and the tables in {HERE / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
