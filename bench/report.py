"""Markdown tables and the plot of bench/results.json, and their places in bench/README.md and docs/benchmarks.md."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from bench import tracking

START, END = "<!-- results:start -->", "<!-- results:end -->"
FASTEST_TARGET = 1.05  # the default's step time / the fastest loop's, every scenario and keep rate
CRITICAL_PATH_TARGET = 1.10  # the default's step time / its critical path, every scenario and keep rate
SPEEDUP_TARGET = 2.0  # the default's steps/hour over sequential's, default costs, 20% keep
WASTE_TARGET = 1.1  # the default's sampled tokens per trained token, over sequential's
OVERHEAD_TARGET = 0.05
LOOP_ORDER = ("sequential", "default", "pipelined")


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


def scenarios(results: dict) -> list[dict]:
    return results["loops"]["scenarios"]


def find(results: dict, scenario: str, loop: str, keep_rate: float) -> dict:
    return next(r for r in results["loops"]["runs"] if r["spec"]["scenario"] == scenario
                and r["spec"]["loop"] == loop and r["spec"]["keep"] == keep_rate)


def keeps(results: dict) -> list[float]:
    return sorted({r["spec"]["keep"] for r in results["loops"]["runs"]}, reverse=True)


def costs_section(results: dict) -> str:
    c = results["loops"]["base_costs"]
    capacity = c["decode_tokens_per_s"] * c["token_latency_ms"] / 1000
    rows = [("decode, one sequence", f"{c['token_latency_ms']:g} ms per token"),
            ("decode throughput (shared)", f"{c['decode_tokens_per_s']:,.0f} tokens/s ({capacity:.0f} sequences "
                                           "at full speed)"),
            ("prefill", f"{c['prefill_tokens_per_s']:,.0f} tokens/s"),
            ("forward_backward", f"{c['train_tokens_per_s']:,.0f} tokens/s (forward alone: a third)"),
            ("optim_step / save_weights_for_sampler / save_state",
             f"{c['optim_step_s']:g} s / {c['save_weights_s']:g} s / {c['save_state_s']:g} s"),
            ("sampler and trainer", "shared GPUs" if c["shared_gpus"] else "separate, equal pools"),
            ("token prices", f"x{c['length_scale']:g}"),
            ("clock", "virtual: time passes only while the loop waits on the GPUs" if c["virtual_time"]
             else f"wall clock x {c['time_scale']:g}")]
    scen = [(sc["name"], sc["what"], ", ".join(f"{k} {v:g}" for k, v in sc["changed"].items()) or "none")
            for sc in scenarios(results)]
    return "\n\n".join([table(("base cost model", "setting"), rows),
                         table(("scenario", "what", "settings changed"), scen)])


def fastest(results: dict, scenario: str, keep_rate: float) -> dict:
    return min((find(results, scenario, loop, keep_rate) for loop in LOOP_ORDER), key=lambda r: r["summary"]["step_s"])


def matrix_rows(results: dict) -> list[tuple]:
    rows = []
    for sc in scenarios(results):
        for k in keeps(results):
            base = find(results, sc["name"], "sequential", k)["summary"]
            for loop in LOOP_ORDER:
                r = find(results, sc["name"], loop, k)
                s, w = r["summary"], r["window"]
                rows.append((sc["name"], keep(r), loop, s["step_s"], f"{s['steps_per_hour']:.0f}",
                             f"{s['steps_per_hour'] / base['steps_per_hour']:.2f}x", f"{s['busy']:.0%}",
                             s["sampled_per_trained"], s["sampling_s"], s["training_s"], s["critical_s"],
                             s["ratio"], f"{s['sampled_ahead']}/{len(w['sampled'])}", s["gen_batches_mean"],
                             f"{w['from_line']}-{w['to_line']}"))
    return rows


MATRIX_HEADER = ("scenario", "keep", "loop", "step s", "steps/h", "vs sequential", "busy", "sampled/trained", "S s",
                 "T s", "critical path s", "step / critical path", "sampled ahead", "gen batches", "window")


def matrix_section(results: dict) -> str:
    first = find(results, "defaults", "sequential", keeps(results)[0])
    return "\n\n".join([
        f"### The matrix (batch {first['spec']['batch_size']} x group {first['spec']['group_size']}, runs of "
        f"{first['spec']['steps']} steps, a balanced window of {len(first['window']['trained'])} steps each, "
        "simulated seconds)",
        "`busy`: the GPUs' time spent working (sampler and trainer: two pools, one when shared); `sampled/trained`: "
        "completion tokens sampled per completion token trained, over the window's samplings and trainings; `S`: "
        "a step's sampled sequences decoded all at once on an idle sampler, `T`: its forward_backward + optim_step + "
        "save_weights_for_sampler (means over the window); `critical path`: per step, on-policy `S + T`, sampled "
        "ahead `max(S, T)` on separate GPUs and `S + T` on shared ones, a checkpoint's save_state added to the "
        "trainer's side; `sampled ahead`: the window's samplings done while a step trained; `window`: its train "
        f"lines. The rollouts: {first['summary']['completion_tokens_mean']:.0f} tokens on average, "
        f"{first['summary']['truncated_frac']:.0%} cut off at 512 (x5 in `long completions`).",
        table(MATRIX_HEADER, matrix_rows(results)),
    ])


def targets(results: dict) -> list[tuple[str, str, str]]:
    rows = []
    for sc in scenarios(results):
        for k in keeps(results):
            d = find(results, sc["name"], "default", k)["summary"]
            best = fastest(results, sc["name"], k)
            ratio = d["step_s"] / best["summary"]["step_s"]
            rows.append((f"{sc['name']}, {k:.0%} keep: default step / fastest ({best['spec']['loop']})",
                         f"<= {FASTEST_TARGET}", f"{ratio:.3f} {verdict(ratio <= FASTEST_TARGET)}"))
            rows.append((f"{sc['name']}, {k:.0%} keep: default step / its critical path", f"<= {CRITICAL_PATH_TARGET}",
                         f"{d['ratio']:.3f} {verdict(d['ratio'] <= CRITICAL_PATH_TARGET)}"))
            seq = find(results, sc["name"], "sequential", k)["summary"]
            waste = d["sampled_per_trained"] / seq["sampled_per_trained"]
            rows.append((f"{sc['name']}, {k:.0%} keep: default sampled/trained / sequential's", f"<= {WASTE_TARGET}",
                         f"{waste:.3f} {verdict(waste <= WASTE_TARGET)}"))
    low = min(keeps(results))
    speedup = find(results, "defaults", "default", low)["summary"]["steps_per_hour"] / \
        find(results, "defaults", "sequential", low)["summary"]["steps_per_hour"]
    rows.append((f"defaults, {low:.0%} keep: default steps/hour / sequential's", f">= {SPEEDUP_TARGET}",
                 f"{speedup:.2f} {verdict(speedup >= SPEEDUP_TARGET)}"))
    parity = results["loops"]["parity"]
    for step, s in parity["summary"].items():
        rows.append((f"sampling ahead: greedy accuracy - on-policy's at step {step} ({len(parity['seeds'])} seeds)",
                     f"within {parity['target_points']:g} points", f"{s['gap_points']:+.1f} {verdict(s['met'])}"))
    return rows


def targets_section(results: dict) -> str:
    rows = targets(results)
    met = sum(r[2].endswith("met") for r in rows)
    return "\n\n".join([f"### Targets ({met} of {len(rows)} met)", table(("target", "bound", "measured"), rows)])


def choices_section(results: dict) -> str:
    """What the default did in each scenario: sampled ahead or not, how many batches, against pipelined."""
    rows = []
    for sc in scenarios(results):
        for k in keeps(results):
            d = find(results, sc["name"], "default", k)["summary"]
            p = find(results, sc["name"], "pipelined", k)["summary"]
            rows.append((sc["name"], f"{k:.0%}", "sample ahead" if d["sampled_ahead"] else "on-policy",
                         d["gen_batches_mean"], d["stale_groups_dropped"], d["step_s"], p["step_s"],
                         d["step_s"] / p["step_s"]))
    return "\n\n".join([
        "### What the default chose (`max_steps_off_policy: null`, `max_inflight_gen_batches: null`)",
        table(("scenario", "keep", "after the probe", "gen batches per step", "stale groups dropped",
               "default step s", "pipelined step s", "default / pipelined"), rows),
    ])


def parity_section(results: dict) -> str:
    parity = results["loops"]["parity"]
    rows = [(r["seed"], "sample ahead" if r["max_steps_off_policy"] else "on-policy",
             *(f"{r['accuracy'][step]:.3f}" for step in parity["summary"]), max(r["off_policy_steps"]),
             r["stale_groups_dropped"], r["groups_sampled"]) for r in parity["runs"]]
    means = [("mean", label, *(f"{s[loop]:.3f}" for s in parity["summary"].values()), "", "", "")
             for loop, label in (("on_policy", "on-policy"), ("sample_ahead", "sample ahead"))]
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
        header(results), costs_section(results), matrix_section(results),
        "![steps per hour per scenario, loop and keep rate](loops.png)", targets_section(results),
        choices_section(results), parity_section(results), overhead_section(results), validation_section(results),
    ])


def render_summary(results: dict) -> str:
    """docs/benchmarks.md's results: steps per hour per scenario, the targets, the plot."""
    rows = []
    for sc in scenarios(results):
        for k in keeps(results):
            runs = {loop: find(results, sc["name"], loop, k)["summary"] for loop in LOOP_ORDER}
            d = runs["default"]
            rows.append((sc["name"], f"{k:.0%}", *(f"{runs[loop]['steps_per_hour']:.0f}" for loop in LOOP_ORDER),
                         "sample ahead" if d["sampled_ahead"] else "on-policy", d["ratio"],
                         d["sampled_per_trained"] / runs["sequential"]["sampled_per_trained"]))
    return "\n\n".join([
        header(results),
        table(("scenario", "keep", "sequential steps/h", "default steps/h", "pipelined steps/h", "default chose",
               "default / critical path", "default sampled/trained vs sequential"), rows),
        "![steps per hour per scenario, loop and keep rate](../bench/loops.png)",
        table(("target", "bound", "measured"), targets(results)),
    ])


def plot_loops(results: dict, out: Path) -> None:
    """Steps per hour per scenario and loop, one panel per keep rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [sc["name"] for sc in scenarios(results)]
    fig, axes = plt.subplots(1, len(keeps(results)), figsize=(12, 4.5), squeeze=False)
    width = 0.8 / len(LOOP_ORDER)
    for ax, k in zip(axes[0], keeps(results)):
        for i, loop in enumerate(LOOP_ORDER):
            xs = [j + (i - 1) * width for j in range(len(names))]
            ax.bar(xs, [find(results, n, loop, k)["summary"]["steps_per_hour"] for n in names], width, label=loop)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_title(f"steps per hour (simulated), {k:.0%} keep")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("DAPO loops under the local service's cost scenarios (batch 32 x group 8)")
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
