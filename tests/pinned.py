"""The figures of a seeded local run that a change of the loop's structure must not move (issue 37): every
training and evaluation figure of ``metrics.jsonl`` but the wall-clock ones, and the approval. Pinned in
``tests/local_run_pinned.json`` from the loop before its rewrite; ``python -m tests.pinned RUN_DIR`` prints them."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

PINNED = Path(__file__).with_name("local_run_pinned.json")
WALL_CLOCK = ("seconds",)  # the machine's time, not the loop's behaviour


def _value(v: Any) -> Any:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else float(f"{v:.9g}")  # nine digits: any behavioural change shows
    return v


def figures(run_dir: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # The forecast's record came after the pin (issue 38); its probe is step 1's first batch, which the pin holds.
    kept = [{k: _value(v) for k, v in r.items() if k not in WALL_CLOCK} for r in records
            if r.get("kind") not in ("billing", "forecast")]
    evaluation = json.loads((run_dir / "evaluation.json").read_text())["metrics"]
    approval = [line.split()[2] for line in (run_dir / "summary.txt").read_text().splitlines()
                if line.strip().startswith("model package:")]
    return {"metrics": kept, "evaluation": json.loads(json.dumps(evaluation), parse_float=lambda f: _value(float(f))),
            "approval": approval}


if __name__ == "__main__":
    print(json.dumps(figures(Path(sys.argv[1])), indent=1))
