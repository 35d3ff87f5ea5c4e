"""Markdown tables and the plot of bench/results.json, and their places in bench/README.md and docs/benchmarks.md."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from bench import tracking

RESULTS = Path(__file__).resolve().parent / "results.json"
START, END = "<!-- results:start -->", "<!-- results:end -->"
# Every target is over the whole run (issue 39): from the session's start to the last train line, step 1 without
# keep-rate evidence, the overlap probe and the last step included; the window's figures are secondary.
FASTEST_TARGET = 1.05  # the default's whole-run step / the fastest loop's, every scenario and keep rate
FLOOR_TARGET = 1.15  # the default's whole-run step / the scenario's throughput floor, every scenario and keep rate
SPEEDUP_TARGET = 2.5  # the default's steps/hour over sequential's over the whole run, default costs, 20% keep
SPEEDUP_KEEP = 0.2
WASTE_TARGET = 1.1  # the default's decoded tokens per trained token over the run, against on-policy concurrent's
OVERHEAD_TARGET = 0.05
LOOP_ORDER = ("sequential", "default", "pipelined", "pipelined-2", "concurrent")


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


def keeps(results: dict, scenario: str | None = None) -> list[float]:
    """The keep rates measured, in ``scenario`` (None: in any)."""
    return sorted({r["spec"]["keep"] for r in results["loops"]["runs"]
                   if scenario is None or r["spec"]["scenario"] == scenario}, reverse=True)


def loops_of(results: dict) -> list[str]:
    """The loops measured, in report order (an older results.json has no ``concurrent``)."""
    measured = {r["spec"]["loop"] for r in results["loops"]["runs"]}
    return [loop for loop in LOOP_ORDER if loop in measured]


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


def learns(results: dict, loop: str) -> bool:
    """Whether ``loop`` may be the default's yardstick: ``pipelined-2`` only if staleness 2 kept learning parity
    (a loop that learns less per step is no fair fastest; its speed is in the matrix all the same)."""
    return loop != "pipelined-2" or results["loops"]["parity"].get("staleness_2", {}).get("keeps_parity", False)


def fastest(results: dict, scenario: str, keep_rate: float) -> dict:
    """The loop of the shortest whole-run step, among those that keep learning parity."""
    return min((find(results, scenario, loop, keep_rate) for loop in loops_of(results) if learns(results, loop)),
               key=lambda r: r["summary"]["run_step_s"])


def waste(s: dict) -> float:
    """Completion tokens decoded per token trained over the whole run (every decoded token, when measured)."""
    return s.get("run_sampled_per_trained", s["sampled_per_trained"])


def matrix_rows(results: dict) -> list[tuple]:
    rows = []
    for sc in scenarios(results):
        for k in keeps(results, sc["name"]):
            base = find(results, sc["name"], "sequential", k)["summary"]
            for loop in loops_of(results):
                r = find(results, sc["name"], loop, k)
                s, w = r["summary"], r["window"]
                uncollected = s.get("uncollected_tokens")
                rows.append((sc["name"], keep(r), loop, s["run_step_s"], f"{s['run_steps_per_hour']:.0f}",
                             f"{s['run_steps_per_hour'] / base['run_steps_per_hour']:.2f}x", s["run_step_per_floor"],
                             waste(s), "-" if uncollected is None else f"{uncollected:,.0f}",
                             s["step_s"], f"{s['steps_per_hour'] / base['steps_per_hour']:.2f}x", s["step_per_floor"],
                             f"{s['busy']:.0%}", s["sampled_per_trained"], s["sampling_s"], s["training_s"],
                             s["ratio"], s["floor_s"], f"{s['sampled_ahead']}/{len(w['sampled'])}",
                             s["gen_batches_mean"], f"{w['from_line']}-{w['to_line']}"))
    return rows


MATRIX_HEADER = ("scenario", "keep", "loop", "run step s", "run steps/h", "run vs sequential", "run step / floor",
                 "run decoded/trained", "uncollected tokens", "window step s", "window vs sequential",
                 "window step / floor", "busy", "window sampled/trained", "S s", "T s", "step / critical path",
                 "floor s", "sampled ahead", "gen batches", "window")


def matrix_section(results: dict) -> str:
    first = results["loops"]["runs"][0]
    return "\n\n".join([
        f"### The matrix (batch {first['spec']['batch_size']} x group {first['spec']['group_size']}, runs of "
        f"{first['spec']['steps']} steps, a balanced window of {len(first['window']['trained'])} steps each, "
        "simulated seconds)",
        "The headline figures are the whole run's (`run ...`): from the session's start to the last train "
        "line, step 1 without keep-rate evidence, the overlap probe and the last step without spares included. "
        "`floor`: the scenario's throughput floor, the same for every loop (see below); `run decoded/trained`: "
        "every completion token the sampler decoded over the run, the groups never collected included, per "
        "completion token trained; `uncollected tokens`: the decoded tokens of groups started and never collected. "
        "Secondary, over the balanced window: `window step s`, `window step / floor`, "
        "`busy`: the GPUs' time spent working (sampler and trainer: two pools, one when shared); `window "
        "sampled/trained`: completion tokens of the collected groups per completion token trained; `S`: "
        "a step's sampled sequences decoded all at once on an idle sampler, `T`: its forward_backward + optim_step + "
        "save_weights_for_sampler (means over the window); `critical path`: per step, on-policy `S + T`, sampled "
        "ahead `max(S, T)` on separate GPUs and `S + T` on shared ones, a checkpoint's save_state added to the "
        "trainer's side; `sampled ahead`: the window's samplings done while a step trained; `window`: its train "
        f"lines. The rollouts: {first['summary']['completion_tokens_mean']:.0f} tokens on average, "
        f"{first['summary']['truncated_frac']:.0%} cut off at 512 (x5 in `long completions`).",
        table(MATRIX_HEADER, matrix_rows(results)),
    ])


def targets(results: dict) -> list[tuple[str, str, str]]:
    """Issue 30's targets, each with its bound and what was measured."""
    rows = []
    for sc in scenarios(results):
        for k in keeps(results, sc["name"]):
            d = find(results, sc["name"], "default", k)["summary"]
            best = fastest(results, sc["name"], k)
            ratio = d["run_step_s"] / best["summary"]["run_step_s"]
            rows.append((f"{sc['name']}, {k:.0%} keep: default run step / fastest ({best['spec']['loop']})",
                         f"<= {FASTEST_TARGET}", f"{ratio:.3f} {verdict(ratio <= FASTEST_TARGET)}"))
            rows.append((f"{sc['name']}, {k:.0%} keep: default run step / throughput floor", f"<= {FLOOR_TARGET}",
                         f"{d['run_step_per_floor']:.3f} {verdict(d['run_step_per_floor'] <= FLOOR_TARGET)}"))
            ref = find(results, sc["name"], "concurrent", k)["summary"]
            wasted = waste(d) / waste(ref)
            rows.append((f"{sc['name']}, {k:.0%} keep: default run decoded/trained / on-policy concurrent's",
                         f"<= {WASTE_TARGET}", f"{wasted:.3f} {verdict(wasted <= WASTE_TARGET)}"))
    if SPEEDUP_KEEP in keeps(results, "defaults"):
        default, sequential = (find(results, "defaults", loop, SPEEDUP_KEEP)["summary"]
                               for loop in ("default", "sequential"))
        speedup = default["run_steps_per_hour"] / sequential["run_steps_per_hour"]
        rows.append((f"defaults, {SPEEDUP_KEEP:.0%} keep: default steps/hour / sequential's, whole run",
                     f">= {SPEEDUP_TARGET}", f"{speedup:.2f} {verdict(speedup >= SPEEDUP_TARGET)}"))
    parity = results["loops"]["parity"]
    for step, s in parity["summary"].items():
        rows.append((f"sampling ahead: greedy accuracy - on-policy's at step {step} ({len(parity['seeds'])} seeds)",
                     f"within {parity['target_points']:g} points", f"{s['gap_points']:+.1f} {verdict(s['met'])}"))
    if "staleness_2" in parity:
        two = parity["staleness_2"]
        seen = "; ".join(two["significantly_worse"] + two["guard_trips"]) or "none"
        rows.append((f"staleness 2: no run significantly worse than staleness 1, no guard trip "
                     f"({len(parity['settings'])} settings x {len(parity['seeds'])} seeds)", "parity",
                     f"{'kept' if two['keeps_parity'] else 'not kept'} (exceptions: {seen})"))
    return rows


def targets_section(results: dict) -> str:
    rows = targets(results)
    met = sum(r[2].endswith("met") for r in rows)
    return "\n\n".join([f"### Targets ({met} of {len(rows)} met)", table(("target", "bound", "measured"), rows)])


def choices_section(results: dict) -> str:
    """What the default did in each scenario: sampled ahead or not, how many batches, against pipelined."""
    rows = []
    for sc in scenarios(results):
        for k in keeps(results, sc["name"]):
            d = find(results, sc["name"], "default", k)["summary"]
            p = find(results, sc["name"], "pipelined", k)["summary"]
            c = find(results, sc["name"], "concurrent", k)["summary"]
            rows.append((sc["name"], f"{k:.0%}", "sample ahead" if d["sampled_ahead"] else "on-policy",
                         d["gen_batches_mean"], d["stale_groups_dropped"], d["run_step_s"], p["run_step_s"],
                         c["run_step_s"], d["run_step_s"] / min(p["run_step_s"], c["run_step_s"])))
    return "\n\n".join([
        "### What the default chose (`max_steps_off_policy: null`, `max_inflight_gen_batches: null`)",
        "Whole-run steps (the window's choices: sampled ahead or not after the probe, generation batches, stale "
        "groups dropped).",
        table(("scenario", "keep", "after the probe", "gen batches per step", "stale groups dropped",
               "default run step s", "pipelined run step s", "on-policy concurrent run step s",
               "default / the better of the two"), rows),
    ])


def floors_section(results: dict) -> str:
    """The throughput floor of each scenario and keep rate, and the length bias of the default's window."""
    rows = [(f["scenario"], f"{f['keep']:.0%}", f"{f['keep_observed']:.1%}", f["sampling_s"], f["training_s"],
             f["floor_s"]) for f in results["loops"]["floors"]]
    bias = []
    for sc in scenarios(results):
        for k in keeps(results, sc["name"]):
            d = find(results, sc["name"], "default", k)["summary"]
            bias.append((sc["name"], f"{k:.0%}", f"{d['trained_completion_tokens_mean']:.1f}",
                         f"{d['sampled_completion_tokens_mean']:.1f}", f"{d['trained_completion_tokens_p95']:.1f}",
                         f"{d['sampled_completion_tokens_p95']:.1f}"))
    return "\n\n".join([
        "### Throughput floors",
        "Per scenario and keep rate, the same for every loop (`bench/loops.py`, `throughput_floor`): `S`, the "
        "groups a step needs at the observed keep rate decoded at the sampler's full throughput with no tail "
        "(completion tokens x `length_scale` / `decode_tokens_per_s`); `T`, a step's forward_backward + optim_step "
        "+ save_weights_for_sampler plus a third of a checkpoint's save_state; the floor `max(S, T)` on separate "
        "GPUs (fully overlapped), `S + T` on shared ones. Pooled over every loop's whole run.",
        table(("scenario", "keep", "keep observed", "S s", "T s", "floor s"), rows),
        "### Length bias (the default's window: per-step completion tokens, trained groups against all sampled)",
        table(("scenario", "keep", "trained mean", "sampled mean", "trained p95", "sampled p95"), bias),
    ])


def paired_cell(r: dict) -> str:
    d = r.get("vs_staleness_1")
    if r["max_steps_off_policy"] == 1 or d is None:
        return "-"
    return f"{100 * d['value']:+.1f} [{100 * d['ci95_low']:+.1f}, {100 * d['ci95_high']:+.1f}]"


def parity_section(results: dict) -> str:
    """Learning parity: staleness 0, 1 and 2, each setting and seed (bench/parity.py)."""
    parity = results["loops"]["parity"]
    steps = sorted({s for r in parity["runs"] for s in r["accuracy"]}, key=int)
    rows = [(r.get("setting", "default"), r["seed"], r["max_steps_off_policy"],
             *(f"{r['accuracy'][s]:.3f}" if s in r["accuracy"] else "-" for s in steps), paired_cell(r),
             r.get("guard") or "none", max(r["off_policy_steps"]), r["stale_groups_dropped"], r["groups_sampled"])
            for r in parity["runs"]]
    parts = [f"### Learning parity (the toy task, greedy accuracy on {parity['eval_size']} held-out questions)",
             "`max_steps_off_policy` 0, 1 and 2, each setting and seed on a session of its own; `vs staleness 1`: "
             "the final greedy accuracy's paired difference (points) with its exact 95% interval, on the same "
             "questions as the staleness-1 run of that setting and seed.",
             table(("setting", "seed", "staleness", *(f"step {s}" for s in steps), "vs staleness 1 (points)",
                    "guard trip", "off-policy max", "stale groups dropped", "groups sampled"), rows)]
    if "staleness_2" in parity:
        two = parity["staleness_2"]
        parts.append(f"Staleness 2 {'keeps' if two['keeps_parity'] else 'does not keep'} parity with 1: "
                     f"significantly worse in {', '.join(two['significantly_worse']) or 'no run'}; guard trips: "
                     f"{', '.join(two['guard_trips']) or 'none'}.")
    return "\n\n".join(parts)


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
    if "only" in results:  # a part of the matrix (python -m bench --only), the rest carried
        carried = results["carried"]
        took = f", {results['bench_seconds']:.0f} s" if results.get("bench_seconds") else ", assembled from its runs"
        return (f"Run of {results['date']} on {results['machine']}: only `{results['only']}` "
                f"(`python -m bench --only`{took}); {carried['what']} carried from the run of {carried['from']}.")
    return f"Run of {results['date']} on {results['machine']}; `make bench` took {results['bench_seconds']:.0f} s."


def render(results: dict) -> str:
    """bench/README.md's results: every table."""
    return "\n\n".join([
        header(results), costs_section(results), matrix_section(results),
        "![steps per hour per scenario, loop and keep rate](loops.png)", targets_section(results),
        choices_section(results), floors_section(results), parity_section(results), overhead_section(results),
        validation_section(results),
    ])


def render_summary(results: dict) -> str:
    """docs/benchmarks.md's results: steps per hour per scenario, the targets, the plot."""
    rows = []
    for sc in scenarios(results):
        for k in keeps(results, sc["name"]):
            runs = {loop: find(results, sc["name"], loop, k)["summary"] for loop in loops_of(results)}
            d = runs["default"]
            rows.append((sc["name"], f"{k:.0%}",
                         *(f"{runs[loop]['run_steps_per_hour']:.0f}" for loop in loops_of(results)),
                         f"{d['steps_per_hour']:.0f}", "sample ahead" if d["sampled_ahead"] else "on-policy",
                         d["run_step_per_floor"], waste(d) / waste(runs["concurrent"])))
    return "\n\n".join([
        header(results),
        "Steps per hour over the whole run (from the session's start to the last train line, the overlap probe "
        "included); the default's over the balanced window beside it, secondary.",
        table(("scenario", "keep", *(f"{loop} steps/h" for loop in loops_of(results)), "default steps/h, window",
               "default chose", "default run / floor", "default decoded/trained vs on-policy concurrent"), rows),
        "![steps per hour per scenario, loop and keep rate](../bench/loops.png)",
        table(("target", "bound", "measured"), targets(results)),
    ])


def plot_loops(results: dict, out: Path) -> None:
    """Steps per hour per scenario and loop, one panel per keep rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keeps(results)), figsize=(16, 4.5), squeeze=False)
    order = loops_of(results)
    width = 0.8 / len(order)
    for ax, k in zip(axes[0], keeps(results)):
        names = [sc["name"] for sc in scenarios(results) if k in keeps(results, sc["name"])]
        for i, loop in enumerate(order):
            xs = [j + (i - (len(order) - 1) / 2) * width for j in range(len(names))]
            ax.bar(xs, [find(results, n, loop, k)["summary"]["run_steps_per_hour"] for n in names], width,
                   label=loop)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_title(f"steps per hour over the whole run (simulated), {k:.0%} keep")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("DAPO loops under the local service's cost scenarios (batch 32 x group 8)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def update_readme(readme: Path, markdown: str, markers: tuple[str, str] = (START, END)) -> None:
    """Replace the text between ``markers`` (the results markers unless told) of ``readme``."""
    start, end = markers
    text = readme.read_text(encoding="utf-8")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    if not rest:
        raise ValueError(f"{readme} has no {start} marker")
    readme.write_text(f"{head}{start}\n{markdown}\n{end}{tail}", encoding="utf-8")


def load_results() -> dict[str, Any]:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def save_results(results: dict[str, Any]) -> None:
    RESULTS.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
