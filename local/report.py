"""The artifacts of a local run: reports copied out of the step work dirs, curves.png, a summary."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

# file name in the step work dirs -> (step, name in runs/<id>/)
ARTIFACTS = {
    "validation.json": "ValidateData",
    "metrics.jsonl": "TrainDAPO",
    "model.json": "TrainDAPO",
    "evaluation.json": "EvaluateModel",
    "predictions.jsonl": "EvaluateModel",
}


def collect(workdir: Path, run_dir: Path) -> None:
    for name, step in ARTIFACTS.items():
        found = [p for p in (workdir / step).rglob(name) if "input" not in p.parts] if (workdir / step).exists() else []
        if found:
            shutil.copy(found[0], run_dir / name)
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        plot_curves(metrics, run_dir / "curves.png")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def plot_curves(metrics: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = _records(metrics)
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = [r["step"] for r in steps]
    ax.plot(x, [r["reward_mean"] for r in steps], label="reward mean (sampled)")
    ax.plot(x, [r["accuracy"] for r in steps], label="accuracy (sampled, T=1)")
    ax.plot(x, [r["filtered_frac"] for r in steps], label="filtered fraction", linestyle="--")
    ax.plot(x, [r["filtered_all_wrong_frac"] for r in steps], label="filtered, all wrong", linestyle=":")
    base = metrics.parent / "evaluation_base.json"
    points = ([(0, _accuracy(base))] if base.exists() else []) + [(r["step"], r["accuracy"]) for r in evals]
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label="greedy eval accuracy (step 0: base)")
    ax.set_xlabel("step")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title("DAPO on the local toy task")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _accuracy(path: Path) -> float | None:
    if not path.exists():
        return None
    return float(json.loads(path.read_text())["metrics"]["accuracy"]["value"])


def summarize(run_dir: Path, records: dict[str, Any], failure: Any, seconds: float, sessions: list[dict]) -> str:
    lines = [f"== local run {run_dir.name} ({seconds:.0f}s) =="]
    for rec in records.values():
        lines.append(f"  {rec.name:<16} {rec.type:<11} {rec.status}{': ' + rec.message if rec.message else ''}")
    val = run_dir / "validation.json"
    if val.exists():
        v = json.loads(val.read_text())
        lines.append(f"  data: {json.dumps(v.get('kept', v.get('counts', {})))}")
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        steps = [r for r in _records(metrics) if r.get("kind") == "step"]
        if steps:
            first, last = steps[0], steps[-1]
            lines.append(f"  training: {len(steps)} steps, sampled accuracy {first['accuracy']:.2f} -> {last['accuracy']:.2f}, "
                         f"filtered fraction {first['filtered_frac']:.2f} -> {last['filtered_frac']:.2f}")
    trained, base = _accuracy(run_dir / "evaluation.json"), _accuracy(run_dir / "evaluation_base.json")
    if trained is not None:
        gain = f" (base model {base:.3f}, {100 * (trained - base):+.1f} points)" if base is not None else ""
        lines.append(f"  greedy eval accuracy: {trained:.3f}{gain}")
    lines.append(f"  outcome: {'succeeded, model approved' if failure is None else 'FAILED at ' + failure.step + ': ' + failure.message}")
    running = [s for s in sessions if s.get("status") not in ("Stopped", "Failed")]
    lines.append(f"  training sessions created: {len(sessions)}, left running: {len(running)}")
    lines.append(f"  artifacts: {run_dir}/ ({', '.join(sorted(p.name for p in run_dir.iterdir() if p.is_file()))})")
    text = "\n".join(lines)
    (run_dir / "summary.txt").write_text(text + "\n")
    return text
