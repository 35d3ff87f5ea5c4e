"""``make bench`` (``python -m bench``): measure, write bench/results.json, refresh bench/README.md and README.md.

The training loops run against the local service's cost model (``bench/loops.py``), so
their figures are simulated GPU seconds of a ~30B model's service, read as ratios; the
client-side figures (overhead, tracking, validation) are this machine's own.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import loops, overhead, parity, report, tracking, validation
from bench.service import local_service
from local.toy_data import write_split
from local.training_session.toy.tokenizer import HF_FILES
from steps.config import DapoConfig, load_config
from steps.gsm8k.data import load_examples
from steps.platform.session import service_client
from steps.platform.tokenizer import load_tokenizer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOOP_SPECS = [loops.LoopSpec(loop, keep) for keep in loops.KEEP_RATES for loop in loops.LOOPS]
# Keep what pays: the default loop with fewer and more speculative generation batches in flight.
SPECULATION_SPECS = [loops.LoopSpec("default", keep, inflight=n) for keep in (0.5, 0.2) for n in (1, 2, 8)]


def measure_loops(tokenizer: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, local_service() as service:
        train_path, eval_path = write_split(tmp, 2000, 200, seed=3)
        train, evaluation = load_examples(train_path), load_examples(eval_path)
        client = service_client(load_config(loops.LOCAL_CONFIG).session)
        runs = loops.run_all(LOOP_SPECS + SPECULATION_SPECS, service, client, tokenizer, train)
        learned = parity.measure(client, tokenizer, train, evaluation)
    return {"costs": loops.COSTS.to_dict(), "default_inflight": DapoConfig().max_inflight_gen_batches, "runs": runs,
            "parity": learned}


def main() -> int:
    t0 = time.monotonic()
    # First, while this process's heap is small: garbage of the training runs makes
    # the collector's pauses part of whatever is timed after them.
    print("overhead: client CPU per sample", flush=True)
    oh = overhead.measure()
    print("validation: 20,000 and 200,000 rows", flush=True)
    sizes = validation.measure()
    tokenizer = load_tokenizer(None, None, HF_FILES)
    measured = measure_loops(tokenizer)
    default = {r["spec"]["keep"]: r for r in measured["runs"]
               if r["spec"]["loop"] == "default" and r["spec"]["inflight"] is None}
    oh["step_fraction"] = {f"{keep:.0%}": overhead.step_fraction(oh, r["steps"][1:], r["spec"]["group_size"],
                                                                 r["spec"]["batch_size"])
                           for keep, r in default.items()}
    # MLflow tracking against the shortest step measured (the default loop at 100% keep, simulated seconds).
    fastest = min(r["summary"]["step_s"] for r in default.values())
    print("tracking: MLflow client cost per step record", flush=True)
    tracked = tracking.measure(fastest)
    print(tracking.line(tracked), flush=True)
    small, large = sizes[0], sizes[-1]
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "loops": measured,
        "overhead": oh,
        "tracking": tracked,
        "validation": {"sizes": sizes, "marginal_rows_per_s":
                       (large["rows"] - small["rows"]) / (large["wall_s"] - small["wall_s"])},
    }
    results["bench_seconds"] = time.monotonic() - t0
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    report.plot_loops(results, HERE / "loops.png")
    report.update_readme(HERE / "README.md", report.render(results))
    report.update_readme(ROOT / "README.md", report.render_summary(results))
    print(report.render(results))
    print(f"\nwrote {HERE / 'results.json'}, {HERE / 'loops.png'} and the tables in {HERE / 'README.md'} and "
          f"{ROOT / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
