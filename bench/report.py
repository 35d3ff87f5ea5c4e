"""Markdown tables and the plot of bench/results.json, and their places in bench/README.md and README.md."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from bench import tracking

START, END = "<!-- results:start -->", "<!-- results:end -->"
CRITICAL_PATH_TARGET = 1.15  # default's step time / its critical path
PIPELINED_SPEEDUP_TARGET = 1.4  # pipelined steps/hour over sequential's, at 20% keep
WASTE_TARGET = 1.1  # sampled tokens per trained token, over sequential's
OVERHEAD_TARGET = 0.05


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def keep(r: dict) -> str:
    return f"{r['spec']['keep']:.0%}"


def main_runs(results: dict) -> list[dict]:
    """One run per loop and keep rate: the loops at their configured speculation."""
    return [r for r in results["loops"]["runs"] if r["spec"]["loop"] != "default" or r["spec"]["inflight"] is None]


def find(results: dict, loop: str, keep_rate: float) -> dict:
    return next(r for r in main_runs(results) if r["spec"]["loop"] == loop and r["spec"]["keep"] == keep_rate)


def costs_section(results: dict) -> str:
    c = results["loops"]["costs"]
    capacity = c["decode_tokens_per_s"] * c["token_latency_ms"] / 1000
    rows = [("decode, one sequence", f"{c['token_latency_ms']:g} ms per token"),
            ("decode throughput (shared)", f"{c['decode_tokens_per_s']:,.0f} tokens/s ({capacity:.0f} sequences "
                                           "at full speed)"),
            ("prefill", f"{c['prefill_tokens_per_s']:,.0f} tokens/s"),
            ("forward_backward", f"{c['train_tokens_per_s']:,.0f} tokens/s (forward alone: a third)"),
            ("optim_step / save_weights_for_sampler / save_state",
             f"{c['optim_step_s']:g} s / {c['save_weights_s']:g} s / {c['save_state_s']:g} s"),
            ("sampler and trainer", "shared GPUs" if c["shared_gpus"] else "separate, equal pools"),
            ("clock", "virtual: time passes only while the loop waits on the GPUs" if c["virtual_time"]
             else f"wall clock x {c['time_scale']:g}")]
    return table(("cost model", "setting"), rows)


def loops_rows(runs: Sequence[dict]) -> list[tuple]:
    rows = []
    for r in runs:
        s, loop = r["summary"], r["spec"]["loop"]
        base = next((x for x in runs if x["spec"]["loop"] == "sequential" and x["spec"]["keep"] == r["spec"]["keep"]),
                    None)
        speedup = s["steps_per_hour"] / base["summary"]["steps_per_hour"] if base else None
        rows.append((keep(r), loop, s["step_s"], f"{s['steps_per_hour']:.0f}",
                     f"{speedup:.2f}x" if speedup else "", f"{s['busy']:.0%}", f"{s['sampler_busy']:.0%}",
                     f"{s['decode_utilisation']:.0%}", s["sampled_per_trained"], s["sampling_s"], s["training_s"],
                     "max(S, T)" if loop == "pipelined" else "S + T", s["ratio"], s["ratio_max"],
                     s["gen_batches_mean"], s["off_policy_steps_max"]))
    return rows


LOOPS_HEADER = ("keep", "loop", "step s", "steps/h", "vs sequential", "busy", "sampler busy", "decode util",
                "sampled/trained", "S s", "T s", "critical path", "step / critical path", "step / max(S, T)",
                "gen batches", "off-policy max")


def loops_section(results: dict) -> str:
    runs = sorted(main_runs(results), key=lambda r: (-r["spec"]["keep"], ("sequential", "default", "pipelined")
                                                       .index(r["spec"]["loop"])))
    first = runs[0]["summary"]
    return "\n\n".join([
        f"### Three loops under the cost model (batch {runs[0]['spec']['batch_size']} x group "
        f"{runs[0]['spec']['group_size']}, {len(runs[0]['steps']) - 1} steady-state steps each, simulated seconds)",
        "`busy`: the GPUs' time spent working (sampler and trainer, equal pools); `decode util`: tokens decoded / "
        "the sampler's throughput; `sampled/trained`: completion tokens sampled per completion token trained; "
        "`S`: the step's sampled sequences decoded all at once on an idle sampler, `T`: its forward_backward + "
        "optim_step + save_weights_for_sampler; an on-policy loop's critical path is `S + T`, a pipelined one's "
        f"`max(S, T)`. The rollouts: {first['completion_tokens_mean']:.0f} tokens on average, "
        f"{first['truncated_frac']:.0%} cut off at 512.",
        table(LOOPS_HEADER, loops_rows(runs)),
    ])


def targets(results: dict) -> list[tuple[str, str, str]]:
    rows = []
    for k in (1.0, 0.5, 0.2):
        r = find(results, "default", k)
        ratio = r["summary"]["ratio"]
        rows.append((f"default step / its critical path (S + T), {keep(r)} keep", f"<= {CRITICAL_PATH_TARGET}",
                     f"{ratio:.2f} {verdict(ratio <= CRITICAL_PATH_TARGET)}"))
    seq, pip = find(results, "sequential", 0.2)["summary"], find(results, "pipelined", 0.2)["summary"]
    speedup = pip["steps_per_hour"] / seq["steps_per_hour"]
    rows.append(("pipelined steps/hour / sequential's, 20% keep", f">= {PIPELINED_SPEEDUP_TARGET}",
                 f"{speedup:.2f} {verdict(speedup >= PIPELINED_SPEEDUP_TARGET)}"))
    for loop in ("default", "pipelined"):
        for k in (1.0, 0.5, 0.2):
            waste = find(results, loop, k)["summary"]["sampled_per_trained"] / \
                find(results, "sequential", k)["summary"]["sampled_per_trained"]
            rows.append((f"{loop} sampled/trained tokens / sequential's, {k:.0%} keep", f"<= {WASTE_TARGET}",
                         f"{waste:.2f} {verdict(waste <= WASTE_TARGET)}"))
    parity = results["loops"]["parity"]
    for step, s in parity["summary"].items():
        rows.append((f"pipelined greedy accuracy - default's at step {step} ({len(parity['seeds'])} seeds)",
                     f"within {parity['target_points']:g} points", f"{s['gap_points']:+.1f} {verdict(s['met'])}"))
    return rows


def targets_section(results: dict) -> str:
    return "\n\n".join(["### Targets", table(("target", "bound", "measured"), targets(results))])


def speculation_section(results: dict) -> str:
    runs = [r for r in results["loops"]["runs"] if r["spec"]["loop"] == "default"]
    default = results["loops"]["default_inflight"]
    rows = [(keep(r), r["spec"]["inflight"] or f"{default} (default)", r["summary"]["step_s"],
             r["summary"]["gen_batches_mean"],
             r["summary"]["sampled_per_trained"], r["summary"]["ratio"])
            for r in sorted(runs, key=lambda r: (-r["spec"]["keep"], r["spec"]["inflight"] or default))]
    return "\n\n".join([
        "### Speculative generation batches (`max_inflight_gen_batches`, the default loop)",
        table(("keep", "inflight", "step s", "gen batches", "sampled/trained", "step / critical path"), rows),
    ])


def parity_section(results: dict) -> str:
    parity = results["loops"]["parity"]
    rows = [(r["seed"], "pipelined" if r["max_steps_off_policy"] else "default",
             *(f"{r['accuracy'][step]:.3f}" for step in parity["summary"]), max(r["off_policy_steps"]),
             r["stale_groups_dropped"], r["groups_sampled"]) for r in parity["runs"]]
    means = [("mean", loop, *(f"{s[loop]:.3f}" for s in parity["summary"].values()), "", "", "")
             for loop in ("default", "pipelined")]
    return "\n\n".join([
        f"### Learning parity (the toy task, greedy accuracy on {parity['eval_size']} held-out questions)",
        table(("seed", "loop", *(f"step {s}" for s in parity["summary"]), "off-policy max", "stale groups dropped",
               "groups sampled"), rows + means),
    ])


def overhead_section(results: dict) -> str:
    oh = results["overhead"]
    per = oh["per_1000_samples_s"]
    rows = [(k, f"{v * 1000:.1f}") for k, v in per.items()]
    rows.append(("**total (project code + SDK serialisation)**", f"**{oh['per_1000_samples_total_s'] * 1000:.1f}**"))
    rows += [(f"({k}, not project code)", f"{v * 1000:.1f}")
             for k, v in oh["not_project_code_per_1000_samples_s"].items()]
    fractions = [(f"{keep_rate}", f"{f['samples_drawn']:.0f}", f["samples_trained"], f"{f['client_cpu_s'] * 1000:.1f}",
                  f["step_s"], f"{f['fraction']:.2%}", verdict(f["fraction"] < OVERHEAD_TARGET))
                 for keep_rate, f in oh["step_fraction"].items()]
    return "\n\n".join([
        f"### Client overhead ({oh['samples']} samples of {oh['completion_tokens']} tokens, "
        f"prompts of {oh['prompt_tokens']} tokens; thread CPU, best of repeats)",
        table(("work", "ms per 1,000 samples"), rows),
        f"As a fraction of the default loop's simulated step, target < {OVERHEAD_TARGET:.0%}:",
        table(("keep", "samples graded", "samples trained", "client ms", "step s", "fraction", "target"), fractions),
        tracking.line(results["tracking"]) + ".",
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


def header(results: dict) -> str:
    return f"Run of {results['date']} on {results['machine']}; `make bench` took {results['bench_seconds']:.0f} s."


def render(results: dict) -> str:
    """bench/README.md's results: every table."""
    return "\n\n".join([
        header(results), costs_section(results), loops_section(results), "![steps per hour and busy "
        "fraction per loop and keep rate](loops.png)", targets_section(results), speculation_section(results),
        parity_section(results), overhead_section(results), validation_section(results),
    ])


def render_summary(results: dict) -> str:
    """README.md's bench section: the loops, the targets, the plot."""
    rows = [(keep(r), r["spec"]["loop"], r["summary"]["step_s"], f"{r['summary']['steps_per_hour']:.0f}",
             f"{r['summary']['busy']:.0%}", r["summary"]["sampled_per_trained"], r["summary"]["ratio"])
            for r in sorted(main_runs(results), key=lambda r: (-r["spec"]["keep"], ("sequential", "default",
                                                                                      "pipelined").index(r["spec"]["loop"])))]
    return "\n\n".join([
        header(results),
        table(("keep", "loop", "step s", "steps/h", "busy", "sampled/trained", "step / critical path"), rows),
        "![steps per hour and busy fraction per loop and keep rate](bench/loops.png)",
        table(("target", "bound", "measured"), targets(results)),
    ])


def plot_loops(results: dict, out: Path) -> None:
    """Steps per hour and busy fraction per loop and keep rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loop_names = ("sequential", "default", "pipelined")
    keeps = sorted({r["spec"]["keep"] for r in main_runs(results)}, reverse=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(loop_names)
    for i, loop in enumerate(loop_names):
        runs = [find(results, loop, k)["summary"] for k in keeps]
        xs = [j + (i - 1) * width for j in range(len(keeps))]
        axes[0].bar(xs, [s["steps_per_hour"] for s in runs], width, label=loop)
        axes[1].bar(xs, [100 * s["busy"] for s in runs], width, label=loop)
    for ax, title in zip(axes, ("steps per hour (simulated service time)", "GPUs busy (%)")):
        ax.set_xticks(range(len(keeps)), [f"{k:.0%} keep" for k in keeps])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    axes[1].set_ylim(0, 100)
    fig.suptitle("DAPO loops under the local service's cost model (batch 32 x group 8)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def update_readme(readme: Path, markdown: str) -> None:
    """Replace the text between the results markers of ``readme``."""
    text = readme.read_text(encoding="utf-8")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    if not rest:
        raise ValueError(f"{readme} has no {START} marker")
    readme.write_text(f"{head}{START}\n{markdown}\n{END}{tail}", encoding="utf-8")
