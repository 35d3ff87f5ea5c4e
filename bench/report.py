"""Markdown tables of bench/results.json, and their place in bench/README.md."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

START, END = "<!-- results:start -->", "<!-- results:end -->"
RATIO_TARGET = 1.25
OVERHEAD_TARGET = 0.05


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def runs(results: dict, inflight: int | None = None, latency_ms: int | None = None) -> list[dict]:
    return [r for r in results["roundtrip"]["runs"]
            if (inflight is None or r["spec"]["inflight"] == inflight)
            and (latency_ms is None or r["spec"]["latency_ms"] == latency_ms)]


def roundtrip_section(results: dict) -> str:
    rt = results["roundtrip"]
    L, default = rt["latency_ms"], rt["default_inflight"]
    main = runs(results, default, L)
    per_step = [(f"{r['spec']['keep']:.0%}", s["step"], s["rounds"], s["gen_batches"], s["wall_s"], s["sampling_s"],
                 s["training_s"], s["ideal_s"], s["ratio"], s["ideal_save_s"], s["ratio_save"])
                for r in main for s in r["steps"]]
    summary = [(f"{r['spec']['keep']:.0%}", r["spec"]["latency_ms"], r["spec"]["inflight"],
                r["summary"]["step_wall_mean_s"], r["summary"]["ratio"], verdict(r["summary"]["ratio"] <= RATIO_TARGET),
                r["summary"]["ratio_save"], verdict(r["summary"]["ratio_save"] <= RATIO_TARGET),
                f"{r['summary']['client_cpu_fraction']:.0%}")
               for r in runs(results, default)]
    return "\n\n".join([
        f"### Round trips (L = {L} ms, batch {rt['batch_size']} x group {rt['group_size']}, "
        f"max_inflight_gen_batches = {default})",
        "Per step, seconds. `rounds`: generation batches plain DAPO needs; `ideal` = L x (rounds + 2); "
        "`ideal+save` = L x (rounds + 3).",
        table(("keep", "step", "rounds", "gen batches", "wall", "sampling", "training", "ideal", "ratio",
               "ideal+save", "ratio+save"), per_step),
        f"Per run (sum of wall / sum of ideal over the steps; target ratio <= {RATIO_TARGET}; "
        "`client CPU` = the client process's CPU time / its wall time over the run, SDK included):",
        table(("keep", "L ms", "inflight", "step s", "ratio", "target", "ratio+save", "target+save", "client CPU"),
              summary),
    ])


def speculation_section(results: dict) -> str:
    L = results["roundtrip"]["latency_ms"]
    rows = [(f"{r['spec']['keep']:.0%}", r["spec"]["inflight"], r["summary"]["step_wall_mean_s"],
             r["summary"]["rounds_mean"], r["summary"]["gen_batches_mean"], r["summary"]["sampled_per_kept"],
             r["summary"]["extra_per_kept"], r["summary"]["filtered_late_per_kept"])
            for r in sorted(runs(results, latency_ms=L), key=lambda r: (-r["spec"]["keep"], r["spec"]["inflight"]))]
    return "\n\n".join([
        f"### Speculative generation (L = {L} ms)",
        "`extra/kept` = (surplus informative groups carried + filtered groups of batches drawn after the batch "
        "was full) per kept group; `late filtered/kept` is the part that is pure waste (carried groups are "
        "trained one step later).",
        table(("keep", "inflight", "step s", "rounds", "gen batches", "sampled/kept", "extra/kept",
               "late filtered/kept"), rows),
    ])


def overhead_section(results: dict) -> str:
    oh = results["overhead"]
    per = oh["per_1000_samples_s"]
    rows = [(k, f"{v * 1000:.1f}") for k, v in per.items()]
    rows.append(("**total (project code + SDK serialisation)**", f"**{oh['per_1000_samples_total_s'] * 1000:.1f}**"))
    rows += [(f"({k}, not project code)", f"{v * 1000:.1f}")
             for k, v in oh["not_project_code_per_1000_samples_s"].items()]
    fractions = [(f"{keep}", f"{f['samples_drawn']:.0f}", f["samples_trained"], f"{f['client_cpu_s'] * 1000:.1f}",
                  f["step_wall_s"], f"{f['fraction']:.1%}", verdict(f["fraction"] < OVERHEAD_TARGET))
                 for keep, f in oh["step_fraction"].items()]
    return "\n\n".join([
        f"### Client overhead ({oh['samples']} samples of {oh['completion_tokens']} tokens, "
        f"prompts of {oh['prompt_tokens']} tokens; thread CPU, best of repeats)",
        table(("work", "ms per 1,000 samples"), rows),
        f"As a fraction of the measured step wall time (L = {results['roundtrip']['latency_ms']} ms, "
        f"default inflight), target < {OVERHEAD_TARGET:.0%}:",
        table(("keep", "samples graded", "samples trained", "client ms", "step s", "fraction", "target"), fractions),
    ])


def validation_section(results: dict) -> str:
    rows = [(f"{v['rows']:,}", f"{v['train_mb']:.0f}", v["wall_s"], f"{v['rows_per_s']:,.0f}",
             f"{v['peak_rss_mb']:.0f}", f"{v['tracemalloc_peak_mb']:.1f}") for v in results["validation"]["sizes"]]
    marginal = results["validation"]["marginal_rows_per_s"]
    return "\n\n".join([
        "### Validation (`python -m steps.validate`)",
        table(("rows", "train MB", "wall s", "rows/s", "peak RSS MB", "tracemalloc peak MB"), rows),
        f"Between the two sizes (interpreter start cancels out): {marginal:,.0f} rows/s.",
    ])


def render(results: dict) -> str:
    return "\n\n".join([
        f"Run of {results['date']} on {results['machine']}; `make bench` took {results['bench_seconds']:.0f} s.",
        roundtrip_section(results), speculation_section(results), overhead_section(results),
        validation_section(results),
    ])


def update_readme(readme: Path, markdown: str) -> None:
    """Replace the text between the results markers of bench/README.md."""
    text = readme.read_text(encoding="utf-8")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    if not rest:
        raise ValueError(f"{readme} has no {START} marker")
    readme.write_text(f"{head}{START}\n{markdown}\n{END}{tail}", encoding="utf-8")
