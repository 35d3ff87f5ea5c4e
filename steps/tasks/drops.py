"""Nothing dropped in silence: the rows a split lost, by reason, each with the first ``file:line`` it happened at,
and the refusal of a split that lost more than it may (``task.max_dropped_share``).

One function writes the lines, so check-task (steps/tasks/check.py) and ValidateData (steps/validate.py) report
the same drops of the same data.
"""
from __future__ import annotations

from pathlib import Path

from steps.tasks.rules import Rejection, SplitScan

#: How the user allows a split to lose more: each place a setting is typed.
ALLOW = ('PARAMS="MaxDroppedShare={share}" (make local-run, make start-pipeline), task.max_dropped_share: {share} '
         "in the config, --max-dropped-share {share} (steps.validate)")


def _at(r: Rejection) -> str:
    # The file's name: a split's files lie in one folder (steps/tasks/splits.py), and a job's paths are long.
    return f"{Path(r.file).name}:{r.line}" + (f" ({r.detail[:80]})" if r.detail else "")


def drop_lines(scan: SplitScan) -> list[str]:
    """``<split>: R rows, K kept, D dropped``, then each reason's count and first row, most first (a train row asking
    a held-out question: ``also in eval``); the fields a file lacks, with its own fields and "did you mean"."""
    head = f"{scan.name}: {scan.rows} rows, {scan.kept} kept, "
    if not scan.dropped:
        return [head + "none dropped"]
    lines = [head + f"{scan.dropped} dropped ({scan.dropped / max(scan.rows, 1):.0%})"]
    counts = [(reason, n, scan.first_by_reason[reason]) for reason, n in scan.by_reason.most_common()]
    if scan.overlap:
        counts.append((scan.first_overlap[0].reason, scan.overlap, scan.first_overlap[0]))
    for reason, n, first in sorted(counts, key=lambda c: -c[1]):
        lines.append(f"  {reason} {n}, first {_at(first)}")
    lines += [f"  {problem}" for problem in scan.field_problems.values()]
    return lines


def too_many_dropped(scan: SplitScan, max_share: float) -> str | None:
    """The refusal of a split that lost more than ``max_share`` of its rows (None: it did not)."""
    if not scan.rows or scan.dropped <= max_share * scan.rows:
        return None
    allowed = min(1.0, round(scan.dropped / scan.rows + 0.05, 1))
    return (f"{scan.name} lost {scan.dropped} of its {scan.rows} rows ({scan.dropped / scan.rows:.0%}), more than "
            f"task.max_dropped_share {max_share:g} allows:\n"
            + "\n".join(f"  {line}" for line in drop_lines(scan)[1:])
            + "\n  fix: correct the rows named, or allow it: " + ALLOW.format(share=f"{allowed:g}"))
