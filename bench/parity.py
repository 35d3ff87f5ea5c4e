"""Learning parity: does training on stale groups learn as well per step as the on-policy loop?

``max_steps_off_policy`` 0 (on-policy), 1 (sampling one step ahead, what the default chooses on separate GPUs)
and 2 (as 1, and a surplus sampled ahead trained two steps old rather than dropped), on the toy task for real:
``config/local.yaml``'s run (batch 16 x group 8, learning rate 0.006, soft overlong punishment, the guards on),
in ``SETTINGS``: the default task (GSM8K's grader, the toy's GSM8K rows) and each built-in answer format the toy
learns (``boxed``, ``answer_is``, ``choice``: the toy's rows in that format, graded strict by the built-in task).
Each of ``SEEDS`` (data order and sampling seeds) runs every setting once per staleness, on a session of its own;
greedy accuracy on the same ``EVAL_SIZE`` held-out questions after ``EVAL_STEPS``.

Against staleness 1 each run of 0 and 2 gets the paired difference of its final greedy accuracy on the same
questions, with its exact 95% interval (``steps/dapo/stats.py``, as EvaluateModel compares adapter and base).
Staleness 2 keeps parity when no run of it is significantly worse than its staleness-1 twin (the interval's
upper bound >= 0) and no guard tripped: only then may the auto choice adopt it (``steps/dapo/loop.py``,
``off_policy_limit``). The cost model is off: whether a group is stale does not depend on timing here (sampling
ahead samples a whole step on the weights one step old), so the runs only need to be fast.

``python -m bench --only parity`` measures it alone, into ``bench/results.json`` (the rest kept), and renders.
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.loops import LOCAL_CONFIG
from steps.config import TaskConfig, load_config
from steps.dapo import metrics as metrics_io
from steps.dapo import stats
from steps.dapo.heldout import EvalResult
from steps.dapo.loop import Trainer
from steps.dapo.state import LoopState
from steps.gsm8k.task import GSM8K
from steps.platform.session import lora_kwargs
from steps.tasks import Example

SEEDS = (0, 1, 2)
STALENESS = (0, 1, 2)
SETTINGS = ("default", "boxed", "answer_is", "choice")
STEPS = 20
EVAL_STEPS = (10, 20)
EVAL_SIZE = 200
TARGET_POINTS = 3.0  # sampling ahead (1) against on-policy (0), the default setting's mean gap


def run(seed: int, off_policy: int, task: Any, client: Any, tokenizer: Any, train: Sequence[Example],
        evaluation: Sequence[Example], workdir: Path) -> tuple[dict[str, Any], EvalResult | None]:
    cfg = load_config(LOCAL_CONFIG, {"seed": seed, "max_steps": STEPS, "eval_every": EVAL_STEPS[0],
                                     "eval_size": EVAL_SIZE, "save_every": STEPS,
                                     "max_steps_off_policy": off_policy})
    training_client = client.create_lora_training_client(**lora_kwargs(cfg.session))
    trainer = Trainer(training_client=training_client, cfg=cfg.dapo, task=task, tokenizer=tokenizer,
                      train_examples=train, eval_examples=evaluation,
                      metrics=metrics_io.MetricsLog(workdir / "metrics.jsonl", print_fn=lambda line: None),
                      checkpoint_dir=workdir / "ckpt")
    try:
        outcome = trainer.run(LoopState(seed=seed))
    finally:
        training_client.stop()
    records = metrics_io.read(workdir / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    return {"seed": seed, "max_steps_off_policy": off_policy,
            "accuracy": {str(r["step"]): r["accuracy"] for r in records if r["kind"] == "eval"},
            "steps_completed": outcome.state.step, "guard": outcome.state.guard,
            "off_policy_steps": [r["off_policy_steps"] for r in steps],
            "stale_groups_dropped": sum(r["stale_groups_dropped"] for r in steps),
            "groups_sampled": sum(r["groups_sampled"] for r in steps)}, outcome.final_eval


def paired(run: EvalResult | None, reference: EvalResult | None) -> dict[str, Any] | None:
    """``run``'s final greedy accuracy minus ``reference``'s on the same questions, with its 95% interval."""
    if run is None or reference is None:
        return None
    pairs = list(zip(run.predictions, reference.predictions))
    b = sum(x.correct and not y.correct for x, y in pairs)
    c = sum(y.correct and not x.correct for x, y in pairs)
    interval = stats.paired_difference(b, c, len(pairs))
    return {"value": (b - c) / len(pairs), "ci95_low": interval.low, "ci95_high": interval.high}


def setting_data(setting: str, train: Sequence[Example], evaluation: Sequence[Example]
                 ) -> tuple[Any, Sequence[Example], Sequence[Example]]:
    """The task and the train and held-out examples of ``setting``."""
    if setting == "default":
        return GSM8K, train, evaluation
    from local import toy_data
    from steps.tasks import build_task

    task = build_task(TaskConfig(name=setting))
    rows = [task.read(row, task.fields_for(row)) for row in toy_data.generate_rows(2200, 3, setting)]
    return task, rows[EVAL_SIZE:], rows[:EVAL_SIZE]


def measure(client: Any, tokenizer: Any, train: Sequence[Example], evaluation: Sequence[Example],
            progress: Callable[[str], None] = print, settings: Sequence[str] = SETTINGS) -> dict[str, Any]:
    runs = []
    for setting in settings:
        task, train_set, held_out = setting_data(setting, train, evaluation)
        for seed in SEEDS:
            finals = {}
            for off_policy in STALENESS:
                with tempfile.TemporaryDirectory() as d:
                    result, finals[off_policy] = run(seed, off_policy, task, client, tokenizer, train_set, held_out,
                                                     Path(d))
                runs.append({"setting": setting, **result})
            for result in runs[-len(STALENESS):]:
                result["vs_staleness_1"] = paired(finals[result["max_steps_off_policy"]], finals[1])
                progress(f"parity: {setting} seed={seed} max_steps_off_policy={result['max_steps_off_policy']} "
                         "greedy accuracy " + " ".join(f"step {k}: {v:.3f}" for k, v in result["accuracy"].items())
                         + (f" guard {result['guard']}" if result["guard"] else ""))
    return {"seeds": list(SEEDS), "steps": STEPS, "eval_size": EVAL_SIZE, "target_points": TARGET_POINTS,
            "settings": list(settings), "runs": runs, "summary": summary(runs), "staleness_2": verdict(runs)}


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The default setting's mean greedy accuracy on-policy and sampling ahead, at each evaluated step."""
    out = {}
    default = [r for r in runs if r.get("setting", "default") == "default"]
    for step in map(str, EVAL_STEPS):
        by_mode = {m: [r["accuracy"][step] for r in default if r["max_steps_off_policy"] == m and step in r["accuracy"]]
                   for m in (0, 1)}
        if not all(by_mode.values()):
            continue
        gap = 100 * (statistics.mean(by_mode[1]) - statistics.mean(by_mode[0]))
        out[step] = {"on_policy": statistics.mean(by_mode[0]), "sample_ahead": statistics.mean(by_mode[1]),
                     "gap_points": gap, "met": abs(gap) <= TARGET_POINTS}
    return out


def verdict(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether staleness 2 keeps parity with 1: no run significantly worse than its twin, no guard trip."""
    twos = [r for r in runs if r["max_steps_off_policy"] == 2]
    worse = [f"{r['setting']} seed {r['seed']}" for r in twos
             if r["vs_staleness_1"] is None or r["vs_staleness_1"]["ci95_high"] < 0]
    tripped = [f"{r['setting']} seed {r['seed']} staleness {r['max_steps_off_policy']}: {r['guard']}"
               for r in runs if r["guard"]]
    return {"keeps_parity": bool(twos) and not worse and not tripped, "significantly_worse": worse,
            "guard_trips": tripped}
