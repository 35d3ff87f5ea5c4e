"""Round-trip efficiency and speculative generation of the DAPO loop.

The local service holds every operation's result until a fixed latency L has
passed (training operations of a session serialise, sampling operations
overlap) and its toy model computes next to nothing, so a step's wall time is
round trips plus overhead. The real ``Trainer`` runs through the real SDK over
HTTP with a scripted grader that fixes the keep rate: a prompt is "mixed" with
probability ``keep`` (a seeded hash of its question) and then gets exactly one
right answer in its group; every other group is all wrong and filtered.

Per step:

* ``rounds`` - generation batches plain (one-at-a-time) DAPO needs to fill the
  batch from this step's carry, replayed from the seeded data order;
* ``ideal`` - ``L * (rounds + 2)``: sampling rounds + forward_backward + optim_step
  (the spec's count); ``ideal_save`` adds the one ``save_weights_for_sampler``
  per step the loop needs to sample the new weights, ``L * (rounds + 3)``;
* ``wall`` - the loop's own step time (first sampling submit to the new sampler
  weights saved), split into its sampling and training phases by the times of
  the ``sampling:`` and ``train:`` lines.

Speculation (``max_inflight_gen_batches`` > 1) overlaps generation batches, so
it can beat ``rounds``; what it costs is extra groups:

* ``surplus`` - informative groups carried to the next step (trained one step
  late, so not lost, but drawn before they were needed);
* ``filtered_late`` - filtered groups of generation batches that came after the
  batch was already full (pure waste);
* ``extra`` = ``surplus + filtered_late``, reported per kept group.
"""
from __future__ import annotations

import hashlib
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from local.training_session.faults import Faults
from local.training_session.toy.tokenizer import HF_FILES
from steps.dapo import metrics as metrics_io
from steps.config import load_config
from steps.dapo.loop import Trainer
from steps.dapo.state import DataPosition, LoopState, take
from steps.gsm8k.data import Example
from steps.gsm8k.reward import Grade
from steps.platform.session import lora_kwargs
from steps.platform.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = ROOT / "config" / "local.yaml"
SEED = 7


@dataclass(frozen=True)
class RunSpec:
    keep: float
    inflight: int
    latency_ms: int
    steps: int = 5
    batch_size: int = 32
    group_size: int = 8


def is_mixed(question: str, keep: float) -> bool:
    """A seeded coin per question: the same prompts are mixed in every run."""
    digest = hashlib.sha256(f"{SEED}:{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < keep


def scripted_grader(keep: float, group_size: int) -> Callable[[str, Example], Grade]:
    """Mixed prompts: the first completion of each group is right, the rest wrong. Others: all wrong."""
    calls: dict[str, int] = {}

    def grade(text: str, example: Example) -> Grade:
        k = calls.get(example.question, 0)
        calls[example.question] = k + 1
        return Grade(correct=is_mixed(example.question, keep) and k % group_size == 0, formatted=True, extracted=None)

    return grade


def run(spec: RunSpec, client: Any, examples: Sequence[Example], workdir: Path) -> dict[str, Any]:
    """One training run of ``spec.steps`` steps; its per-step rows and a summary."""
    cfg = load_config(LOCAL_CONFIG, {
        "batch_size": spec.batch_size, "group_size": spec.group_size, "max_steps": spec.steps,
        "max_inflight_gen_batches": spec.inflight, "max_num_gen_batches": 40, "seed": SEED,
        "save_every": 1000, "eval_every": 0,  # one checkpoint, after the last step: not timed
    })
    stamps: list[tuple[float, str]] = []
    training_client = client.create_lora_training_client(**lora_kwargs(cfg.session))
    log = metrics_io.MetricsLog(workdir / "metrics.jsonl", print_fn=lambda line: stamps.append((time.monotonic(), line)))
    trainer = Trainer(training_client=training_client, cfg=cfg.dapo, tokenizer=load_tokenizer(None, None, HF_FILES),
                      train_examples=examples, eval_examples=[], metrics=log, checkpoint_dir=workdir / "ckpt",
                      grader=scripted_grader(spec.keep, spec.group_size))
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        outcome = trainer.run(LoopState(seed=SEED))
    finally:
        training_client.stop()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    if outcome.state.step != spec.steps:
        raise RuntimeError(f"{spec}: only {outcome.state.step} steps ({outcome.state.stop_reason})")
    records = [r for r in metrics_io.read(workdir / "metrics.jsonl") if r["kind"] == "step"]
    steps = step_rows(spec, examples, records, stamps)
    return {"spec": asdict(spec), "steps": steps, "summary": summarise(spec, steps, cpu, wall)}


def ratio(measured: float, ideal: float) -> float | None:
    return measured / ideal if ideal else None  # None: no latency, no ideal (the warm-up run)


def line_time(stamps: list[tuple[float, str]], prefix: str) -> float:
    return next(t for t, line in stamps if line.startswith(prefix))


def step_rows(spec: RunSpec, examples: Sequence[Example], records: list[dict], stamps) -> list[dict[str, Any]]:
    """Per step: timings from the log lines, rounds and waste replayed from the data order."""
    L, B = spec.latency_ms / 1000, spec.batch_size
    pos, carry_in, rows = DataPosition(), 0, []
    for r in records:
        kept_per_batch = []
        for _ in range(r["gen_batches"]):
            indices, pos = take(len(examples), B, SEED, pos)
            kept_per_batch.append(sum(is_mixed(examples[i].question, spec.keep) for i in indices))
        rounds, total = 0, carry_in
        while total < B:
            total += kept_per_batch[rounds]
            rounds += 1
        carry_out = carry_in + sum(kept_per_batch) - B
        if carry_out != r["carried_groups"]:  # the replay must agree with what the loop did
            raise RuntimeError(f"replay says {carry_out} groups carried at step {r['step']}, "
                               f"the loop {r['carried_groups']}")
        filtered_late = sum(B - k for k in kept_per_batch[rounds:])
        s = r["step"]
        training = line_time(stamps, f"train: step={s} ") - line_time(stamps, f"sampling: step={s} ")
        wall = r["seconds"]
        rows.append({
            "step": s, "gen_batches": r["gen_batches"], "rounds": rounds, "speculative": r["speculative_batches"],
            "wall_s": wall, "sampling_s": wall - training, "training_s": training,
            "ideal_s": L * (rounds + 2), "ideal_save_s": L * (rounds + 3),
            "ratio": ratio(wall, L * (rounds + 2)), "ratio_save": ratio(wall, L * (rounds + 3)),
            "groups_sampled": r["groups_sampled"], "surplus": carry_out, "filtered_late": filtered_late,
            "extra_per_kept": (carry_out + filtered_late) / B,
        })
        carry_in = carry_out
    return rows


def summarise(spec: RunSpec, steps: list[dict], cpu: float, wall: float) -> dict[str, Any]:
    total = lambda k: sum(s[k] for s in steps)  # noqa: E731
    kept = spec.batch_size * len(steps)
    return {
        "step_wall_mean_s": total("wall_s") / len(steps),
        "ratio": ratio(total("wall_s"), total("ideal_s")),
        "ratio_save": ratio(total("wall_s"), total("ideal_save_s")),
        "ratio_max": max((s["ratio"] or 0.0) for s in steps),
        "ratio_save_max": max((s["ratio_save"] or 0.0) for s in steps),
        "rounds_mean": total("rounds") / len(steps), "gen_batches_mean": total("gen_batches") / len(steps),
        "sampling_s_mean": total("sampling_s") / len(steps), "training_s_mean": total("training_s") / len(steps),
        "sampled_per_kept": total("groups_sampled") / kept,
        "extra_per_kept": total("extra_per_kept") / len(steps),
        "filtered_late_per_kept": total("filtered_late") / kept,
        "realised_keep_rate": kept / total("groups_sampled") if total("groups_sampled") else 0.0,
        "client_cpu_fraction": cpu / wall,
    }


def run_all(specs: Sequence[RunSpec], service: Any, examples: Sequence[Example], client: Any,
            progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    # Warm-up, not reported: first connections, lazy imports, the SDK's first-call costs.
    service.set_faults(Faults())
    with tempfile.TemporaryDirectory() as d:
        run(RunSpec(keep=1.0, inflight=2, latency_ms=0, steps=1), client, examples, Path(d))
    results = []
    for spec in specs:
        service.set_faults(Faults(latency_ms=spec.latency_ms))
        with tempfile.TemporaryDirectory() as d:
            result = run(spec, client, examples, Path(d))
        s = result["summary"]
        progress(f"roundtrip: keep={spec.keep:.0%} inflight={spec.inflight} L={spec.latency_ms}ms "
                 f"step={s['step_wall_mean_s']:.2f}s ratio={s['ratio']:.2f} ratio_save={s['ratio_save']:.2f}")
        results.append(result)
    service.set_faults(Faults())
    return results
