"""Selective rollouts (``dapo.selective_rollouts``, steps/dapo/selective.py), measured with and without.

Part of ``make bench`` (:func:`measure`, after the loops), which writes its figures into bench/results.json under
the key ``selective`` and renders its own section of bench/README.md. ``python -m bench --only selective``
measures only this, keeping the rest of both; ``python -m bench.selective`` is the same with ``--only toy`` or
``--only bench`` (one part), ``--reuse-without`` and ``--render`` (re-render from results.json).

1. **The scripted bench** (:func:`measure_bench`): the ``default`` loop of ``bench/loops.py`` under the cost
   model's default costs, with and without selective rollouts, at keep rates 20% and 5% and temporal
   consistency 0.8 and 0.95. The scripted grader (:class:`ConsistentGsm8k`) decides each question's character
   (mixed, or all-equal: all wrong) afresh each time the question is drawn: with probability ``consistency`` it
   keeps the character it had the last time, otherwise it is drawn anew (mixed with probability ``keep``, by a
   seeded hash of the question and the draw). The chance a question keeps its character is then
   ``consistency + (1 - consistency) * (keep**2 + (1 - keep)**2)``, and its chance of being mixed stays
   ``keep`` at every draw. Prompts must recur for a history to predict anything: the training set is
   ``ROWS_PER_KEPT / keep`` questions (about ``ROWS_PER_KEPT`` mixed at any time), so a run without skipping
   goes through it about every two steps. Each run is ``STEPS`` steps, timed over a balanced window from train
   line ``FIRST_LINE`` on (the history needs a few epochs to say anything).
2. **The learning toy** (:func:`measure_toy`): ``make local-run``'s training (config/local.yaml: batch 16 x
   group 8, 30 steps, the GSM8K grader on the toy task) with and without, for each of ``SEEDS``, on the first
   ``TOY_TRAIN_ROWS`` of local-run's 2,000 training rows (so 30 steps go through them several times: prompts
   recur) and the same 100 held-out questions. Greedy accuracy at steps 10, 20 and 30, completion tokens sampled
   per completion token trained, and the sample tokens billed (the client's count, evaluations included).
   ``max_num_gen_batches`` is raised to ``TOY_MAX_NUM_GEN_BATCHES`` in both arms, so that no run stops at the cap.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from bench import loops, report
from bench.loops import LOCAL_CONFIG, SEED, LoopSpec, ScriptedGsm8k
from bench.service import Service, local_service
from local.toy_data import write_split
from local.training_session.costs import Costs
from local.training_session.toy.tokenizer import HF_FILES
from steps.config import load_config
from steps.dapo import metrics as metrics_io
from steps.dapo.loop import Trainer
from steps.dapo.sampling import Group
from steps.dapo.selective import ALL_RIGHT, ALL_WRONG, MIXED
from steps.dapo.state import LoopState
from steps.dapo.task import Grade
from steps.gsm8k.task import GSM8K
from steps.platform.session import lora_kwargs, service_client
from steps.platform.tokenizer import load_tokenizer
from steps.tasks import Example, load_examples

HERE = Path(__file__).resolve().parent
CONSISTENCIES = (0.8, 0.95)
KEEP_RATES = (0.2, 0.05)
ROWS_PER_KEPT = 64  # training questions per unit of keep rate: ~64 mixed at any time, two steps' worth
STEPS = 14
FIRST_LINE = 6
WINDOW = 6
SEEDS = (0, 1, 2)
TOY_STEPS = 30
TOY_EVAL_STEPS = (10, 20, 30)
TOY_TRAIN_ROWS = 400
#: local.yaml's 24 lets a run without skipping stop at the cap in its last steps on 400 rows (seed 2 at step 30:
#: the toy has learned nearly all of them, 93% of groups all right): both arms get twice as many.
TOY_MAX_NUM_GEN_BATCHES = 48
#: The issue's targets: the bench's steps/hour with skipping over without, at keep 20%, per consistency;
#: the toy's sampled/trained reduction, and greedy accuracy at step 30 (mean gap, worst seed) in points.
TARGET_SPEEDUP = {0.8: 1.4, 0.95: 1.8}
TARGET_TOKEN_REDUCTION = 1.5
TARGET_MEAN_POINTS = 2.0
TARGET_SEED_POINTS = 5.0


def _coin(*parts: object) -> float:
    digest = hashlib.sha256(":".join(map(str, (SEED, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class ConsistentGsm8k(ScriptedGsm8k):
    """The bench's scripted grader with temporal consistency: a question's character (mixed: the first
    completion of its group right, the rest wrong; otherwise all wrong) is kept from its previous draw with
    probability ``consistency``, else drawn anew (mixed with probability ``keep``); seeded per question and draw."""

    def __init__(self, keep: float, group_size: int, consistency: float) -> None:
        super().__init__(keep, group_size)
        self.consistency = consistency
        self.character: dict[str, tuple[int, bool]] = {}  # question -> (draw, mixed)

    def mixed(self, question: str, draw: int) -> bool:
        last, mixed = self.character.get(question, (-1, False))
        for d in range(last + 1, draw + 1):
            if d == 0 or _coin(question, d, "keeps") >= self.consistency:
                mixed = _coin(question, d, "fresh") < self.keep
        self.character[question] = (draw, mixed)
        return mixed

    def grade(self, text: str, example: Example) -> Grade:
        k = self.calls.get(example.question, 0)
        self.calls[example.question] = k + 1
        mixed = self.mixed(example.question, k // self.group_size)
        return Grade(correct=mixed and k % self.group_size == 0, formatted=True, extracted=None)


@dataclass(frozen=True)
class BenchSpec:
    consistency: float
    keep: float
    selective: bool

    @property
    def rows(self) -> int:
        return round(ROWS_PER_KEPT / self.keep)


def run_bench(spec: BenchSpec, costs: Costs, service: Service, client: Any, tokenizer: Any,
              examples: Sequence[Example], workdir: Path) -> dict[str, Any]:
    """One run of the default loop (``bench/loops.py``'s ``run_trainer``, with the consistent grader and the switch)."""
    loop = LoopSpec("default", spec.keep, steps=STEPS)
    overrides = {**loops.run_config(loop, loops.BENCH_LEARNING_RATE), "selective_rollouts": spec.selective,
                 "max_num_gen_batches": 80}  # 5% keep without skipping: ~20 batches a step, with spread
    cfg = load_config(LOCAL_CONFIG, overrides)
    task = ConsistentGsm8k(spec.keep, loop.group_size, spec.consistency)
    records, steps, usage = loops.run_trainer(loop, cfg, task, costs, service, client, tokenizer,
                                              examples[: spec.rows], workdir)
    window = loops.balanced_window([bool(r["sampled_ahead"]) for r in records], WINDOW, FIRST_LINE)
    summary = loops.summarise(steps, window, usage, costs)
    inside = [r for r in records if r["step"] in window["sampled"]]
    summary["skipped_prompts_mean"] = statistics.mean(r.get("skipped_prompts", 0) for r in inside)
    summary["groups_sampled_mean"] = statistics.mean(r["groups_sampled"] for r in inside)
    summary["observed_keep_rate"] = (sum(r["groups_sampled"] * (1 - r["filtered_frac"]) for r in inside)
                                     / sum(r["groups_sampled"] for r in inside))
    # Per step, for the whole run's story (the history's warm-up): the session's clock at its train line, the
    # groups it sampled, the prompts it skipped, its generation batches.
    rows = [{"step": r["step"], "clock_s": usage[r["step"]]["simulated_s"], "groups_sampled": r["groups_sampled"],
             "skipped_prompts": r.get("skipped_prompts", 0), "gen_batches": r["gen_batches"]} for r in records]
    return {"spec": {**asdict(spec), "rows": spec.rows, "steps": STEPS}, "window": window, "summary": summary,
            "steps": rows}


def measure_bench(progress: Callable[[str], None] = print,
                  reuse: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Every spec, or (``reuse``: stored runs without skipping) only the runs with skipping: the loop without it
    takes the same path whatever the selective code does, and its 5% keep runs are the bench's longest."""
    costs = loops.base_costs()
    tokenizer = load_tokenizer(None, None, HF_FILES)
    runs = _measure_bench(costs, tokenizer, progress, reuse)
    return {"costs": costs.to_dict(), "steps": STEPS, "window": WINDOW, "first_line": FIRST_LINE,
            "rows_per_kept": ROWS_PER_KEPT, "runs": runs, "comparisons": bench_comparisons(runs)}


def _measure_bench(costs: Costs, tokenizer: Any, progress: Callable[[str], None],
                   reuse: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, local_service() as service:
        train_path, _ = write_split(tmp, 2000, 0, seed=3)
        examples = load_examples(train_path)
        client = service_client(load_config(LOCAL_CONFIG).session)
        saved = service.costs()["costs"]
        service.set_costs(costs)
        try:
            for consistency in CONSISTENCIES:
                for keep in KEEP_RATES:
                    for selective in (False, True):
                        spec = BenchSpec(consistency, keep, selective)
                        stored = [r for r in reuse if r["spec"] == {**asdict(spec), "rows": spec.rows, "steps": STEPS}]
                        if stored:
                            runs.append(stored[0])
                            continue
                        with tempfile.TemporaryDirectory() as d:
                            result = run_bench(spec, costs, service, client, tokenizer, examples, Path(d))
                        s = result["summary"]
                        progress(f"selective: consistency={consistency} keep={keep:.0%} selective={selective} "
                                 f"step={s['step_s']:.1f}s ({s['steps_per_hour']:.0f}/h) sampled/trained="
                                 f"{s['sampled_per_trained']:.2f} groups/step={s['groups_sampled_mean']:.0f} "
                                 f"skipped/step={s['skipped_prompts_mean']:.0f} keep={s['observed_keep_rate']:.2f}")
                        runs.append(result)
        finally:
            service.set_costs(Costs.from_mapping(saved))
    return runs


def bench_comparisons(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for consistency in CONSISTENCIES:
        for keep in KEEP_RATES:
            by = {r["spec"]["selective"]: r["summary"] for r in runs
                  if r["spec"]["consistency"] == consistency and r["spec"]["keep"] == keep}
            if len(by) < 2:
                continue
            # Whole-run figures (issue 39): the history's warm-up, the first epochs with nothing to predict from,
            # counts; the window's speed-up, from train line FIRST_LINE on, is kept beside it.
            speedup = by[True]["run_steps_per_hour"] / by[False]["run_steps_per_hour"]
            target = TARGET_SPEEDUP.get(consistency) if keep == 0.2 else None
            out.append({"consistency": consistency, "keep": keep, "speedup": speedup,
                        "window_speedup": by[True]["steps_per_hour"] / by[False]["steps_per_hour"],
                        "sampled_per_trained": {"without": by[False]["sampled_per_trained"],
                                                "with": by[True]["sampled_per_trained"]},
                        "steps_per_hour": {"without": by[False]["run_steps_per_hour"],
                                           "with": by[True]["run_steps_per_hour"]},
                        "target": target, "met": None if target is None else speedup >= target})
    return out


# -- the learning toy --------------------------------------------------------------------------------------------
def run_toy(seed: int, selective: bool, client: Any, tokenizer: Any, train: Sequence[Example],
            evaluation: Sequence[Example], workdir: Path) -> dict[str, Any]:
    cfg = load_config(LOCAL_CONFIG, {"seed": seed, "max_steps": TOY_STEPS, "eval_every": TOY_EVAL_STEPS[0],
                                     "save_every": TOY_STEPS, "selective_rollouts": selective,
                                     "max_num_gen_batches": TOY_MAX_NUM_GEN_BATCHES})
    training_client = client.create_lora_training_client(**lora_kwargs(cfg.session))
    trainer = Trainer(training_client=training_client, cfg=cfg.dapo, task=GSM8K, tokenizer=tokenizer,
                      train_examples=train, eval_examples=evaluation,
                      metrics=metrics_io.MetricsLog(workdir / "metrics.jsonl", print_fn=lambda line: None),
                      checkpoint_dir=workdir / "ckpt")
    try:
        state, batches = loops.drive(trainer, LoopState(seed=seed))
    finally:
        training_client.stop()
    # (step, prompt, outcome) of every group sampled, in order
    drawn = [(step, g.example_index, outcome_of(g)) for step, b in enumerate(batches, 1) for g in b.sampled]
    records = metrics_io.read(workdir / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    sampled = sum(r["sampled_completion_tokens"] for r in steps)
    trained = sum(r["tokens"] for r in steps)
    return {"seed": seed, "selective": selective, "steps": state.step,
            "stop_reason": state.stop_reason,
            "accuracy": {str(r["step"]): r["accuracy"] for r in records if r["kind"] == "eval"},
            "sampled_per_trained": sampled / trained if trained else None,
            "sampled_completion_tokens": sampled, "trained_tokens": trained,
            "billed_sample_tokens": steps[-1]["sample_tokens"] if steps else 0,
            "groups_sampled": sum(r["groups_sampled"] for r in steps),
            "skipped_prompts": sum(r.get("skipped_prompts", 0) for r in steps),
            # Passes over the training rows: of the groups sampled, and of the prompts drawn (skipped ones too).
            "epochs_sampled": sum(r["groups_sampled"] for r in steps) / len(train),
            "epochs_drawn": sum(r["groups_sampled"] + r.get("skipped_prompts", 0) for r in steps) / len(train),
            "consistency": temporal_consistency(drawn)}


def outcome_of(group: Group) -> int:
    """A group's outcome as selective rollouts' history records it."""
    return MIXED if group.is_informative() else ALL_WRONG if group.all_wrong() else ALL_RIGHT


def temporal_consistency(drawn: Sequence[tuple[int, int, int]]) -> dict[str, Any]:
    """How well a prompt's last group predicted its next, over consecutive draws of the same prompt: the chance
    it kept its character (mixed, or all-equal), its chance of being mixed after a mixed group and after an
    all-equal one, where a mixed group went (all right next time: the toy learned it), and the optimizer steps
    between the two draws. GRESO's premise is that the chances after mixed and after all-equal differ widely;
    where they are alike, the history cannot tell what to skip."""
    last: dict[int, tuple[int, int]] = {}
    pairs: list[tuple[int, int, int]] = []  # (outcome before, outcome after, steps between)
    for step, prompt, kind in drawn:
        if prompt in last:
            pairs.append((last[prompt][1], kind, step - last[prompt][0]))
        last[prompt] = (step, kind)

    def share(of: Sequence[tuple[int, int, int]], kinds: tuple[int, ...]) -> float | None:
        return sum(b in kinds for _, b, _ in of) / len(of) if of else None

    after_mixed = [p for p in pairs if p[0] == MIXED]
    after_equal = [p for p in pairs if p[0] != MIXED]
    return {"pairs": len(pairs),
            "kept_character": sum((a == MIXED) == (b == MIXED) for a, b, _ in pairs) / len(pairs) if pairs else None,
            "mixed_after_mixed": share(after_mixed, (MIXED,)),
            "all_right_after_mixed": share(after_mixed, (ALL_RIGHT,)),
            "mixed_after_all_equal": share(after_equal, (MIXED,)),
            "steps_between_draws": statistics.mean(gap for _, _, gap in pairs) if pairs else None}


def measure_toy(progress: Callable[[str], None] = print) -> dict[str, Any]:
    tokenizer = load_tokenizer(None, None, HF_FILES)
    runs = []
    with tempfile.TemporaryDirectory() as tmp, local_service() as service:
        del service  # the cost model stays off: the toy's learning does not depend on timing
        train_path, eval_path = write_split(tmp, 2000, 200, seed=0)  # local-run's data (local/run.py DEFAULTS)
        train, evaluation = load_examples(train_path)[:TOY_TRAIN_ROWS], load_examples(eval_path)
        client = service_client(load_config(LOCAL_CONFIG).session)
        for seed in SEEDS:
            for selective in (False, True):
                with tempfile.TemporaryDirectory() as d:
                    result = run_toy(seed, selective, client, tokenizer, train, evaluation, Path(d))
                progress(f"selective toy: seed={seed} selective={selective} sampled/trained="
                         f"{result['sampled_per_trained']:.2f} billed sample tokens={result['billed_sample_tokens']} "
                         "greedy accuracy " + " ".join(f"step {k}: {v:.3f}" for k, v in result["accuracy"].items()))
                runs.append(result)
    return {"seeds": list(SEEDS), "steps": TOY_STEPS, "train_rows": TOY_TRAIN_ROWS, "runs": runs,
            "summary": toy_summary(runs)}


def toy_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: Callable[[dict[str, Any]], float], selective: bool) -> float:
        return statistics.mean(key(r) for r in runs if r["selective"] == selective)

    accuracy = {}
    for step in map(str, TOY_EVAL_STEPS):
        gaps = [100 * (w["accuracy"].get(step, float("nan")) - wo["accuracy"].get(step, float("nan")))
                for w in runs if w["selective"] for wo in runs if not wo["selective"] and wo["seed"] == w["seed"]]
        accuracy[step] = {"without": mean(lambda r: r["accuracy"].get(step, float("nan")), False),
                          "with": mean(lambda r: r["accuracy"].get(step, float("nan")), True),
                          "gap_points": statistics.mean(gaps), "worst_seed_points": min(gaps)}
    without, with_ = (mean(lambda r: r["sampled_per_trained"], s) for s in (False, True))
    last = accuracy[str(TOY_EVAL_STEPS[-1])]
    return {"sampled_per_trained": {"without": without, "with": with_, "reduction": without / with_},
            "billed_sample_tokens": {"without": mean(lambda r: r["billed_sample_tokens"], False),
                                     "with": mean(lambda r: r["billed_sample_tokens"], True)},
            "accuracy": accuracy,
            "met": {"tokens": without / with_ >= TARGET_TOKEN_REDUCTION,
                    "accuracy_mean": abs(last["gap_points"]) <= TARGET_MEAN_POINTS,
                    "accuracy_worst_seed": last["worst_seed_points"] >= -TARGET_SEED_POINTS}}


# -- results.json and bench/README.md ---------------------------------------------------------------------------
def render(results: dict[str, Any]) -> str:
    """The section of bench/README.md: the bench's comparisons and the toy's, with the targets met or missed."""
    sel = results.get("selective", {})
    took = "; ".join(f"{name} on {sel[part].get('date', '?')}, {sel[part].get('seconds', float('nan')):.0f} s"
                     for part, name in (("bench", "the scripted bench"), ("toy", "the toy")) if part in sel)
    lines = [f"Measured by `make bench` (`python -m bench --only selective` alone): {took or 'not yet'} "
             "(this machine's wall time; the figures are simulated time and the toy's own steps)."]
    bench = sel.get("bench")
    if bench:
        lines += ["", f"The `default` loop at the cost model's default costs, batch 32 x group 8, "
                  f"{bench['steps']}-step "
                  "runs timed over the whole run (the speed-up's target), and over a balanced window of "
                  f"{bench['window']} steps from train line {bench['first_line']} on (secondary: the prompts' "
                  f"history warmed up); training set {bench['rows_per_kept']} / keep questions.", "",
                  "| consistency | keep | run steps/h without | run steps/h with | run speed-up | target | window "
                  "speed-up | sampled/trained without | with | groups sampled a step without | with | skipped a step |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in bench["comparisons"]:
            runs = {r["spec"]["selective"]: r["summary"] for r in bench["runs"]
                    if r["spec"]["consistency"] == c["consistency"] and r["spec"]["keep"] == c["keep"]}
            target = "-" if c["target"] is None else f">= {c['target']}x {'met' if c['met'] else '**MISSED**'}"
            window = f"{c['window_speedup']:.2f}x" if "window_speedup" in c else "-"
            lines.append(
                f"| {c['consistency']} | {c['keep']:.0%} | {c['steps_per_hour']['without']:.0f} | "
                f"{c['steps_per_hour']['with']:.0f} | {c['speedup']:.2f}x | {target} | {window} | "
                f"{c['sampled_per_trained']['without']:.2f} | {c['sampled_per_trained']['with']:.2f} | "
                f"{runs[False]['groups_sampled_mean']:.0f} | {runs[True]['groups_sampled_mean']:.0f} | "
                f"{runs[True]['skipped_prompts_mean']:.0f} |")
    toy = sel.get("toy")
    if toy:
        s = toy["summary"]
        lines += ["", f"The learning toy (config/local.yaml, {toy['steps']} steps, the first {toy['train_rows']} of "
                  f"local-run's training rows, seeds {', '.join(map(str, toy['seeds']))}; means over seeds):", "",
                  "| | without | with | target |", "|---|---|---|---|",
                  f"| sampled / trained completion tokens | {s['sampled_per_trained']['without']:.2f} | "
                  f"{s['sampled_per_trained']['with']:.2f} | {s['sampled_per_trained']['reduction']:.2f}x lower, "
                  f">= {TARGET_TOKEN_REDUCTION}x {'met' if s['met']['tokens'] else '**MISSED**'} |",
                  f"| billed sample tokens | {s['billed_sample_tokens']['without']:,.0f} | "
                  f"{s['billed_sample_tokens']['with']:,.0f} | |"]
        for step, a in s["accuracy"].items():
            target = ""
            if step == str(TOY_EVAL_STEPS[-1]):
                target = (f"mean {a['gap_points']:+.1f} points (within {TARGET_MEAN_POINTS}: "
                          f"{'met' if s['met']['accuracy_mean'] else '**MISSED**'}), worst seed "
                          f"{a['worst_seed_points']:+.1f} (> -{TARGET_SEED_POINTS}: "
                          f"{'met' if s['met']['accuracy_worst_seed'] else '**MISSED**'})")
            lines.append(f"| greedy accuracy, step {step} | {a['without']:.3f} | {a['with']:.3f} | {target} |")
        off = [r["consistency"] for r in toy["runs"] if not r["selective"] and r.get("consistency", {}).get("pairs")]
        if off:
            def avg(key: str) -> float:
                return statistics.mean(c[key] for c in off if c[key] is not None)

            lines += ["", f"The toy's temporal consistency, without skipping (consecutive draws of a prompt, mean over "
                      f"seeds): it kept its character {avg('kept_character'):.0%} of the time; mixed after a mixed "
                      f"group {avg('mixed_after_mixed'):.0%} (all right {avg('all_right_after_mixed'):.0%}), after an "
                      f"all-equal one {avg('mixed_after_all_equal'):.0%}; {avg('steps_between_draws'):.1f} steps "
                      "between two draws of a prompt."]
        lines += ["", "| seed | selective | sampled/trained | billed sample tokens | groups sampled | skipped | "
                  "epochs sampled / drawn | accuracy 10 / 20 / 30 |", "|---|---|---|---|---|---|---|---|"]
        for r in toy["runs"]:
            acc = " / ".join(f"{r['accuracy'].get(str(k), float('nan')):.3f}" for k in TOY_EVAL_STEPS)
            lines.append(f"| {r['seed']} | {'on' if r['selective'] else 'off'} | {r['sampled_per_trained']:.2f} | "
                         f"{r['billed_sample_tokens']:,} | {r['groups_sampled']} | {r['skipped_prompts']} | "
                         f"{r['epochs_sampled']:.1f} / {r['epochs_drawn']:.1f} | {acc} |")
    return "\n".join(lines)


START, END = "<!-- selective:start -->", "<!-- selective:end -->"


def update_readme(path: Path, body: str) -> None:
    """The section between the selective markers, added at the end under its heading the first time."""
    text = path.read_text(encoding="utf-8")
    if START not in text:
        path.write_text(text.rstrip("\n") + f"\n\n## Selective rollouts\n\n{START}\n{END}\n", encoding="utf-8")
    report.update_readme(path, body, (START, END))


PARTS = ("bench", "toy")


def measure(parts: Sequence[str] = PARTS, previous: dict[str, Any] | None = None, reuse_without: bool = False,
            progress: Callable[[str], None] = print) -> dict[str, Any]:
    """results.json's ``selective`` section: ``parts`` measured now (each with its date and seconds), any other
    part kept from ``previous`` (the section as stored). ``reuse_without``: the bench's runs without skipping are
    taken from ``previous`` (see :func:`measure_bench`)."""
    previous = previous or {}
    section = {part: previous[part] for part in PARTS if part not in parts and part in previous}
    for part in parts:
        t0 = time.monotonic()
        if part == "bench":
            stored = previous.get("bench", {}).get("runs", []) if reuse_without else []
            figures = measure_bench(progress, reuse=[r for r in stored if not r["spec"]["selective"]])
        else:
            figures = measure_toy(progress)
        section[part] = {**figures, "date": datetime.date.today().isoformat(), "seconds": time.monotonic() - t0}
    return section


def only(parts: Sequence[str] = PARTS, reuse_without: bool = False) -> int:
    """``python -m bench --only selective``: selective rollouts measured (``parts``: both, or one), the rest of
    results.json kept as it is (re-read before writing: nothing else of it is this run's, so the two parts may
    run at once)."""
    measured = measure(parts, report.load_results().get("selective"), reuse_without=reuse_without)
    results = report.load_results()
    kept = {part: figures for part, figures in results.get("selective", {}).items() if part in PARTS}
    results["selective"] = {**kept, **{part: measured[part] for part in parts}}
    report.save_results(results)
    return render_section(results)


def render_section(results: dict[str, Any]) -> int:
    """The "Selective rollouts" section of bench/README.md, from ``results``."""
    body = render(results)
    update_readme(HERE / "README.md", body)
    print(body)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.selective``: ``python -m bench --only selective`` with a choice of part and re-rendering."""
    p = argparse.ArgumentParser(prog="python -m bench.selective", description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=PARTS, help="measure one part; the other's figures are kept")
    p.add_argument("--reuse-without", action="store_true",
                   help="bench: keep the stored runs without skipping, measure only those with it")
    p.add_argument("--render", action="store_true", help="re-render bench/README.md's section from results.json")
    args = p.parse_args(argv)
    if args.render:
        return render_section(report.load_results())
    return only([args.only] if args.only else PARTS, reuse_without=args.reuse_without)


if __name__ == "__main__":
    sys.exit(main())
