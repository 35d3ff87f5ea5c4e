"""``make bench`` (``python -m bench``): measure, write bench/results.json, refresh bench/README.md and
docs/benchmarks.md.

The training loops run against the local service's cost model in a matrix of cost scenarios
(``bench/loops.py``), so their figures are simulated GPU seconds of a ~30B model's service, read
as ratios; the client-side figures (overhead, tracking, validation) are this machine's own. The
scenarios vary the base costs: the service's defaults, or what ``LOCAL_TS_COST_*`` sets.
Selective rollouts are measured last (``bench/selective.py``: the scripted bench and the learning toy, with and
without), into ``results["selective"]``; ``--only selective`` measures only them, keeping the rest.
"""
from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from bench import loops, overhead, parity, report, selective, tracking, validation
from bench.service import local_service
from local.toy_data import write_split
from local.training_session.costs import Costs
from local.training_session.toy.tokenizer import HF_FILES
from steps.config import load_config
from steps.platform.session import service_client
from steps.platform.tokenizer import load_tokenizer
from steps.tasks import load_examples

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOOP_SPECS = [loops.LoopSpec(loop, keep, sc.name) for sc in loops.SCENARIOS for keep in sc.keeps
              for loop in loops.LOOPS]
PARTIAL = HERE / "results.partial.jsonl"  # each loop run as it ends (not committed; removed once results.json is)


#: Processes measuring the loops at once (``BENCH_JOBS``), each with a local service of its own, while this one
#: measures parity: the figures are simulated time, so this changes the bench's wall time only.
JOBS = int(os.environ.get("BENCH_JOBS") or os.cpu_count() or 1)


def measure_loops(tokenizer: Any, specs: Sequence[loops.LoopSpec] = LOOP_SPECS,
                  learned: dict[str, Any] | None = None) -> dict[str, Any]:
    """``specs`` (in order, one per worker task: the first free worker takes the next), and parity meanwhile unless
    ``learned`` is given (carried from an earlier run: ``--only``)."""
    base = loops.base_costs()
    PARTIAL.unlink(missing_ok=True)
    with ProcessPoolExecutor(JOBS, mp_context=multiprocessing.get_context("spawn")) as pool:
        workers = [pool.submit(loops.measure_runs, [spec], base, PARTIAL) for spec in specs]
        if learned is None:
            with tempfile.TemporaryDirectory() as tmp, local_service():
                train_path, eval_path = write_split(tmp, 2000, 200, seed=3)
                train, evaluation = load_examples(train_path), load_examples(eval_path)
                client = service_client(load_config(loops.LOCAL_CONFIG).session)
                learned = parity.measure(client, tokenizer, train, evaluation)
        done = {json.dumps(r["spec"], sort_keys=True): r for w in workers for r in w.result()}
    return assemble(base, [done[json.dumps(asdict(spec), sort_keys=True)] for spec in LOOP_SPECS
                           if json.dumps(asdict(spec), sort_keys=True) in done], learned)


def assemble(base: Costs, runs: list[dict[str, Any]], learned: dict[str, Any]) -> dict[str, Any]:
    """The loops' section of results.json: runs in the matrix's order, their floors, the scenarios measured."""
    floors = loops.with_floors(runs, base)
    measured = {r["spec"]["scenario"] for r in runs}
    scenarios = [{"name": sc.name, "what": sc.what, "keeps": list(sc.keeps), "costs": sc.costs(base).to_dict(),
                  "changed": {k: v for k, v in sc.costs(base).to_dict().items() if v != base.to_dict()[k]}}
                 for sc in loops.SCENARIOS if sc.name in measured]
    return {"base_costs": base.to_dict(), "scenarios": scenarios, "runs": runs, "floors": floors, "parity": learned}


def only(selection: str, partial: bool = False) -> int:
    """``--only "scenario:keep,..."``: every loop of those scenarios and keep rates (a part of the matrix, for a
    machine too busy for all of it); the client-side figures and parity carried from the last results.json, and
    said so. The parity is unchanged when the code that samples ahead or not is: it runs at a fixed
    ``max_steps_off_policy`` (0 and 1) with the cost model off, and reproduces exactly. ``partial``: no
    measuring, the results of the runs an ``--only`` cut short wrote to ``PARTIAL``."""
    t0 = time.monotonic()
    previous = report.load_results()
    wanted = [(name.strip(), float(keep)) for name, keep in (item.rsplit(":", 1) for item in selection.split(","))]
    unknown = [w for w in wanted if not any(sc.name == w[0] and w[1] in sc.keeps for sc in loops.SCENARIOS)]
    if unknown:
        raise SystemExit(f"--only: no scenario and keep rate {unknown} in bench/loops.py's SCENARIOS")
    specs = [loops.LoopSpec(loop, keep, name) for name, keep in wanted for loop in loops.LOOPS]
    learned = {**previous["loops"]["parity"], "carried_from": previous["date"]}
    if partial:  # the runs a cut-short --only wrote, whole (scenario, keep) combinations only
        runs = [json.loads(line) for line in PARTIAL.read_text(encoding="utf-8").splitlines() if line.strip()]
        have = {(r["spec"]["scenario"], r["spec"]["keep"], r["spec"]["loop"]) for r in runs}
        whole = [(sc, k) for sc, k in wanted if all((sc, k, loop) in have for loop in loops.LOOPS)]
        order = [json.dumps(asdict(spec), sort_keys=True) for spec in LOOP_SPECS]
        runs = sorted((r for r in runs if (r["spec"]["scenario"], r["spec"]["keep"]) in whole),
                      key=lambda r: order.index(json.dumps(r["spec"], sort_keys=True)))
        measured = assemble(loops.base_costs(), runs, learned)
        selection = ",".join(f"{sc}:{k:g}" for sc, k in whole)
    else:
        measured = measure_loops(None, specs, learned=learned)
    results = {**previous, "date": datetime.date.today().isoformat(), "loops": measured, "only": selection,
               "carried": {"from": previous["date"], "what": "parity, overhead, tracking, validation"},
               "bench_seconds": None if partial else time.monotonic() - t0}
    report.save_results(results)
    if not partial:
        PARTIAL.unlink(missing_ok=True)
    return render(results)


def only_parity() -> int:
    """Learning parity alone (``--only parity``), into results.json with everything else kept; then the tables."""
    with tempfile.TemporaryDirectory() as tmp, local_service():
        train_path, eval_path = write_split(tmp, 2000, 200, seed=3)
        client = service_client(load_config(loops.LOCAL_CONFIG).session)
        learned = parity.measure(client, load_tokenizer(None, None, HF_FILES), load_examples(train_path),
                                 load_examples(eval_path))
    results = report.load_results()
    results["loops"]["parity"] = learned
    report.save_results(results)
    return render(results)


def window_steps(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's step rows of its window's trainings."""
    return [s for s in run["steps"] if s["step"] in run["window"]["trained"]]


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
               if r["spec"]["loop"] == "default" and r["spec"]["scenario"] == "defaults"}
    oh["step_fraction"] = {f"{keep:.0%}": overhead.step_fraction(oh, window_steps(r), r["spec"]["group_size"],
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
    # Written before selective rollouts are measured (~50 min on a shared machine), with the last figures of
    # those: should their measurement fail, the hour of loops is kept and `--only selective` completes it.
    if report.RESULTS.exists() and "selective" in (previous := report.load_results()):
        results["selective"] = previous["selective"]
    report.save_results(results)
    PARTIAL.unlink(missing_ok=True)
    results["selective"] = selective.measure()
    results["bench_seconds"] = time.monotonic() - t0
    report.save_results(results)
    return render(results)


def render(results: dict[str, Any]) -> int:
    """The plot and the tables of the READMEs, from ``results``."""
    report.plot_loops(results, HERE / "loops.png")
    report.update_readme(HERE / "README.md", report.render(results))
    report.update_readme(ROOT / "docs" / "benchmarks.md", report.render_summary(results))
    print(report.render(results))
    if "selective" in results:
        selective.render_section(results)
    print(f"\nwrote {report.RESULTS}, {HERE / 'loops.png'} and the tables in {HERE / 'README.md'} and "
          f"{ROOT / 'docs' / 'benchmarks.md'}")
    return 0


if __name__ == "__main__":
    # --render: the plot and the README tables again from bench/results.json, measuring nothing.
    if sys.argv[1:] == ["--render"]:
        raise SystemExit(render(report.load_results()))
    # --only parity: learning parity alone (bench/parity.py), the rest of results.json kept.
    if sys.argv[1:] == ["--only", "parity"]:
        raise SystemExit(only_parity())
    # --only selective (or selective:bench, selective:toy): selective rollouts alone, the rest of results.json kept.
    if sys.argv[1:2] == ["--only"] and len(sys.argv) == 3 and sys.argv[2].split(":")[0] == "selective":
        part = sys.argv[2].partition(":")[2]
        if part and part not in selective.PARTS:
            raise SystemExit(f"--only {sys.argv[2]}: the parts of selective are {', '.join(selective.PARTS)}")
        raise SystemExit(selective.only([part] if part else selective.PARTS))
    if sys.argv[1:2] in (["--only"], ["--only-partial"]) and len(sys.argv) == 3:
        raise SystemExit(only(sys.argv[2], partial=sys.argv[1] == "--only-partial"))
    raise SystemExit(main())
