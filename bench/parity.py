"""Learning parity: does sampling one step ahead (``max_steps_off_policy: 1``, what the default chooses on
separate GPUs) learn as well per step as the on-policy loop (``max_steps_off_policy: 0``)?

The toy task for real (the GSM8K grader, ``config/local.yaml``'s run: batch 16 x group 8,
learning rate 0.006, soft overlong punishment), once on-policy and once sampling ahead,
for each of ``SEEDS`` (data order and sampling seeds), each run on a session of
its own. Greedy accuracy on the same ``EVAL_SIZE`` held-out questions after ``EVAL_STEPS``.
The cost model is off: whether a group is one step old does not depend on timing here
(the pipelined loop samples a whole step ahead on the weights one step old), so the
runs only need to be fast.
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.loops import LOCAL_CONFIG
from steps.config import load_config
from steps.dapo import metrics as metrics_io
from steps.dapo.loop import Trainer
from steps.dapo.state import LoopState
from steps.gsm8k.data import Example
from steps.gsm8k.task import GSM8K
from steps.platform.session import lora_kwargs

SEEDS = (0, 1, 2)
STEPS = 20
EVAL_STEPS = (10, 20)
EVAL_SIZE = 200
TARGET_POINTS = 3.0


def run(seed: int, off_policy: int, client: Any, tokenizer: Any, train: Sequence[Example],
        evaluation: Sequence[Example], workdir: Path) -> dict[str, Any]:
    cfg = load_config(LOCAL_CONFIG, {"seed": seed, "max_steps": STEPS, "eval_every": EVAL_STEPS[0],
                                     "eval_size": EVAL_SIZE, "save_every": STEPS,
                                     "max_steps_off_policy": off_policy})
    training_client = client.create_lora_training_client(**lora_kwargs(cfg.session))
    trainer = Trainer(training_client=training_client, cfg=cfg.dapo, task=GSM8K, tokenizer=tokenizer,
                      train_examples=train, eval_examples=evaluation,
                      metrics=metrics_io.MetricsLog(workdir / "metrics.jsonl", print_fn=lambda line: None),
                      checkpoint_dir=workdir / "ckpt")
    try:
        trainer.run(LoopState(seed=seed))
    finally:
        training_client.stop()
    records = metrics_io.read(workdir / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    return {"seed": seed, "max_steps_off_policy": off_policy,
            "accuracy": {str(r["step"]): r["accuracy"] for r in records if r["kind"] == "eval"},
            "off_policy_steps": [r["off_policy_steps"] for r in steps],
            "stale_groups_dropped": sum(r["stale_groups_dropped"] for r in steps),
            "groups_sampled": sum(r["groups_sampled"] for r in steps)}


def measure(client: Any, tokenizer: Any, train: Sequence[Example], evaluation: Sequence[Example],
            progress: Callable[[str], None] = print) -> dict[str, Any]:
    runs = []
    for seed in SEEDS:
        for off_policy in (0, 1):
            with tempfile.TemporaryDirectory() as d:
                result = run(seed, off_policy, client, tokenizer, train, evaluation, Path(d))
            progress(f"parity: seed={seed} max_steps_off_policy={off_policy} greedy accuracy "
                     + " ".join(f"step {k}: {v:.3f}" for k, v in result["accuracy"].items()))
            runs.append(result)
    summary = {}
    for step in map(str, EVAL_STEPS):
        by_mode = {mode: [r["accuracy"][step] for r in runs if r["max_steps_off_policy"] == mode] for mode in (0, 1)}
        gap = 100 * (statistics.mean(by_mode[1]) - statistics.mean(by_mode[0]))
        summary[step] = {"on_policy": statistics.mean(by_mode[0]), "sample_ahead": statistics.mean(by_mode[1]),
                         "gap_points": gap, "met": abs(gap) <= TARGET_POINTS}
    return {"seeds": list(SEEDS), "steps": STEPS, "eval_size": EVAL_SIZE, "target_points": TARGET_POINTS,
            "runs": runs, "summary": summary}
