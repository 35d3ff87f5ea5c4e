"""What MLflow tracking costs a training step (target: under 1% of a step).

A step hands the tracker one record (the step's figures, as ``MetricsLog`` sends them); the
tracker (steps/platform/tracking.py) queues it and a background thread writes it to MLflow.
Measured over ``N_RECORDS`` records into a real MLflow store (sqlite, as ``make local-run`` uses):

* ``caller_us`` - wall time of ``log_metrics`` in the training thread, per record: what the loop
  itself waits (mean over the records);
* ``process_cpu_ms`` - CPU time of the whole process per record, the tracker thread's MLflow writes
  included, less the same tracker started and finished with no records (its run creation and
  params). On 2 cores that CPU is taken from the client, so it counts against the step as well;
* both as a fraction of ``step_s``, a measured step of the round-trip runs.

A remote tracking server moves the writes' CPU into network waits on the tracker thread; the
caller's cost stays a queue put.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from local.report import mlflow_store
from steps.platform.tracking import MlflowTracker, Settings

N_RECORDS = 300
REPEATS = 3
EXPERIMENT = "bench"


def step_record(step: int) -> dict[str, Any]:
    """A step's figures as MetricsLog hands them to trackers (the keys of metrics.jsonl's step records)."""
    figures = {"gen_batches": 2, "groups_sampled": 64, "filtered_frac": 0.45, "kept_groups": 32, "empty_rollouts": 0,
               "filtered_all_wrong_frac": 0.3, "carried_groups": 3, "failed_groups": 0, "speculative_batches": 1,
               "reward_mean": 0.42, "accuracy": 0.42, "loss": -0.0123, "tokens": 12345, "seconds": 4.2}
    return {f"step/{key}": value + step * 1e-6 for key, value in figures.items()}


def _run(uri: str, records: int) -> tuple[float, float]:
    """(caller seconds summed over the records, process CPU seconds from start to finished)."""
    cpu0 = time.process_time()
    tracker = MlflowTracker(Settings(uri, EXPERIMENT), params={"dapo.batch_size": "32"})
    caller = 0.0
    for step in range(1, records + 1):
        record = step_record(step)
        t0 = time.perf_counter()
        tracker.log_metrics(record, step)
        caller += time.perf_counter() - t0
    assert tracker.finish() is not None, "the tracker failed; see its warning"
    return caller, time.process_time() - cpu0


def measure(step_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        uri = mlflow_store(Path(tmp), EXPERIMENT)
        _run(uri, 5)  # imports and the first connection, outside the figures
        empty = min(_run(uri, 0)[1] for _ in range(REPEATS))
        runs = [_run(uri, N_RECORDS) for _ in range(REPEATS)]
    caller_s = min(r[0] for r in runs) / N_RECORDS
    cpu_s = max(0.0, min(r[1] for r in runs) - empty) / N_RECORDS
    return {"records": N_RECORDS, "metrics_per_record": len(step_record(1)), "step_s": step_s,
            "caller_us": caller_s * 1e6, "process_cpu_ms": cpu_s * 1e3,
            "caller_fraction": caller_s / step_s, "cpu_fraction": cpu_s / step_s,
            "target_fraction": 0.01, "met": (caller_s + cpu_s) / step_s < 0.01}


def line(result: dict[str, Any]) -> str:
    return (f"MLflow tracking: {result['caller_us']:.1f} us in the training thread and "
            f"{result['process_cpu_ms']:.2f} ms of process CPU per record ({result['metrics_per_record']} figures) "
            f"= {100 * (result['caller_fraction'] + result['cpu_fraction']):.3f}% of a {result['step_s']:.2f} s step "
            f"(target < 1%: {'met' if result['met'] else 'MISSED'})")


if __name__ == "__main__":
    print(line(measure(step_s=1.0)))
