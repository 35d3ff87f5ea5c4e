"""`metrics.jsonl`: the figures of every log line, one JSON object per line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends records and flushes each one, so a killed job keeps what it logged
    and a resumed one continues the same file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def read(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def truncate_after(path: str | Path, step: int) -> None:
    """Drop records of steps beyond ``step``: a resumed run redoes them from its checkpoint."""
    p = Path(path)
    if not p.exists():
        return
    keep = [r for r in read(p) if r.get("step", 0) <= step]
    tmp = p.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
    tmp.replace(p)
