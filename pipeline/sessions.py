"""``python -m pipeline.sessions --config X [--stop-orphans [--yes]]``: the pipeline's training sessions.

``make sessions`` lists every training session of the pipeline that the service still lists,
newest first: status, age, whether its owner job (TrainDAPO's training job, EvaluateModel's
processing job) is running, the attempt, the tokens it has billed so far (DescribeTrainingSession's
BillableTokenUsage; in USD too with ``session.prices``), the owner job's name and the session's name
(steps/platform/ownership.py says how a name records its owner), and the tokens of them all.

``make stop-orphans`` stops the Running ones whose owning job is not running, after one
question for all of them (``YES=1`` answers it), and prints each session it stopped.
TrainDAPO does the same every time it starts; this is for when the pipeline will not run
again soon, or to check that nothing is left billing.
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from pipeline.aws import cli_main, resolve_region
from pipeline.config import load
from steps.config.models import Prices
from steps.platform import billing
from steps.platform.ownership import (
    OwnedSession,
    job_key,
    orphans,
    owner_job,
    pipeline_key,
    pipeline_sessions,
    running_jobs,
    stop_sessions,
)
from steps.platform.versions import require_training_session_sdk


def billed_cells(count: billing.TokenCount | None, prices: Prices | None) -> tuple[str, ...]:
    """A session's billed prefill, sample and train tokens (and USD with prices); "?" where they could not be read."""
    if count is None:
        return ("?",) * (4 if prices else 3)
    usd = billing.cost_usd(count, prices)
    return tuple(f"{n:,}" for n in (count.prefill, count.sample, count.train)) + (() if usd is None else
                                                                                 (f"{usd:,.2f}",))


def table(sessions: list[OwnedSession], running: set[str], now: datetime,
          billed: dict[str, billing.TokenCount | None] | None = None, prices: Prices | None = None) -> list[str]:
    live = {job_key(job) for job in running}
    billed = billed or {}
    rows = [("status", "age", "job running", "attempt", "prefill", "sample", "train", *(("USD",) if prices else ()),
             "owner job", "session")]
    rows += [(s.status, s.age(now), "yes" if s.job in live else "no", str(s.attempt),
              *billed_cells(billed.get(s.name), prices), owner_job(s.job), s.name) for s in sessions]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]


def confirm(question: str, yes: bool, ask: Callable[[str], str] = input) -> bool:
    """One question, unless ``yes``; no answer (no terminal) is no."""
    if yes:
        return True
    try:
        answer = ask(f"{question} [y/N] ")
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


def service_client(region: str, role_arn: str) -> Any:
    """The SDK's ServiceClient, for listing and stopping only (the role is what sessions it created would run as)."""
    from sagemaker.train.training_session import ServiceClient

    return ServiceClient(region=region, role_arn=role_arn)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.sessions", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config with a pipeline section (its name and region)")
    p.add_argument("--stop-orphans", action="store_true",
                   help="stop the Running sessions whose owner job is not running")
    p.add_argument("--yes", action="store_true", help="stop them without asking")
    args = p.parse_args(argv)

    require_training_session_sdk()
    cfg, run = load(args.config)
    region = resolve_region(run.session.region, args.config)
    service = service_client(region, run.session.role_arn or cfg.role_arn)
    sessions = pipeline_sessions(service, cfg.name)
    running = running_jobs(region).names()  # after the sessions: see ownership.claim_session_name
    found = orphans(sessions, running)
    print(f"training sessions of pipeline {cfg.name} in {region} (names start {pipeline_key(cfg.name)}-): "
          f"{len(sessions)}, {sum(s.status == 'Running' for s in sessions)} Running, "
          f"{len(found)} of them orphaned (their job is not running)")
    if sessions:
        client = billing.control_client(region)
        billed = {s.name: billing.service_count(s.name, region, client) for s in sessions}
        prices = run.session.prices
        print("\n".join(table(sessions, running, datetime.now(timezone.utc), billed, prices)))
        read = [count for count in billed.values() if count is not None]
        total = sum(read, billing.TokenCount())
        usd = billing.cost_usd(total, prices)
        print(f"billed by the {len(read)} sessions read: {total.prefill:,} prefill, {total.sample:,} sample and "
              f"{total.train:,} train tokens" + (f" = USD {usd:,.2f} at session.prices" if usd is not None else ""))
    if not args.stop_orphans or not found:
        return 0
    if not confirm(f"Stop the {len(found)} orphaned training session(s)?", args.yes):
        print("nothing stopped (answer y, or run with YES=1)")
        return 1
    stop_sessions(service, found, say=print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
