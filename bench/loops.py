"""Three training loops under the local service's cost model, side by side.

* ``sequential``: the loop of the original DAPO change (verl's recipe): one generation
  batch at a time, the surplus of the last one discarded, each checkpoint's
  ``save_state`` awaited before the next step. Built here from the project's own
  ``Trainer`` with a scheduling policy that undoes three of its choices (:func:`policy`),
  so the three loops differ only in the loop.
* ``default``: this project's loop: every request of a generation batch in flight at
  once, surplus carried, speculative generation batches, checkpoints off the critical path.
* ``pipelined``: ``default`` with ``max_steps_off_policy: 1``: the next step samples
  while this one trains.

Every run: batch 32 x group 8, ``max_tokens`` 512, the toy's reasoning-length rollouts
priced by the cost model (``local/training_session/costs.py``, its defaults, in virtual
time: simulated time passes only while the loop waits on the simulated GPUs, so the
toy's and the SDK's own CPU time on this machine costs none), a scripted grader fixing
the keep rate (a seeded hash of each question decides if its group is mixed), and a
learning rate too small to move the policy: the scripted rewards teach nothing, so the
rollout lengths stay the base model's and every loop prices the same workload. Per run,
over the steady-state steps (the first step's train line to the last):

* ``step_s``: simulated seconds per step (the session's simulated clock at each train
  line), and steps per hour;
* ``busy``: the share of the GPUs' time spent working (sampler and trainer: two equal
  pools), and the sampler's decode utilisation (tokens decoded / its throughput);
* ``sampled/trained``: completion tokens sampled per completion token trained;
* the critical path of each step, priced by the same cost model: ``S``, the sampler
  decoding all of the step's sampled sequences at once, and ``T``, its
  forward_backward + optim_step + save_weights_for_sampler. An on-policy loop cannot
  beat ``S + T`` (a step samples the previous step's weights); a pipelined one
  ``max(S, T)``.
"""
from __future__ import annotations

import hashlib
import statistics
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.service import Service
from local.training_session.costs import Costs, Gpus, WallClock
from steps.config import load_config
from steps.dapo import metrics as metrics_io
from steps.dapo.loop import Trainer
from steps.dapo.sampling import Group, StepBatch
from steps.dapo.schedule import Policy
from steps.dapo.state import LoopState
from steps.dapo.task import Grade
from steps.gsm8k.data import Example
from steps.gsm8k.task import Gsm8k
from steps.platform.session import lora_kwargs

ROOT = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = ROOT / "config" / "local.yaml"
SEED = 7
COSTS = Costs(enabled=True, virtual_time=True)
LOOPS = ("sequential", "default", "pipelined")
KEEP_RATES = (1.0, 0.5, 0.2)
BENCH_LEARNING_RATE = 1e-7  # moves the toy's weights by ~5e-7 a step: the workload stays the base model's


@dataclass(frozen=True)
class LoopSpec:
    loop: str
    keep: float
    steps: int = 7
    inflight: int | None = None  # max_inflight_gen_batches; None: the config default
    batch_size: int = 32
    group_size: int = 8
    save_every: int = 3


def is_mixed(question: str, keep: float) -> bool:
    """A seeded coin per question: the same prompts are mixed in every run."""
    digest = hashlib.sha256(f"{SEED}:{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < keep


class ScriptedGsm8k(Gsm8k):
    """GSM8K's prompts with a scripted grader: for mixed prompts the first completion of each group is
    right and the rest wrong; for the others all are wrong."""

    def __init__(self, keep: float, group_size: int) -> None:
        self.keep, self.group_size = keep, group_size
        self.calls: dict[str, int] = {}

    def grade(self, text: str, example: Example) -> Grade:
        k = self.calls.get(example.question, 0)
        self.calls[example.question] = k + 1
        return Grade(correct=is_mixed(example.question, self.keep) and k % self.group_size == 0, formatted=True,
                     extracted=None)


@dataclass
class Recorder:
    """What each step sampled and trained (``Trainer.on_batch``), for the cost model to price."""

    sampled: list[tuple[Group, ...]] = field(default_factory=list)  # per step, in step order
    trained_tokens: list[int] = field(default_factory=list)  # forward_backward datum tokens per step

    def __call__(self, step: int, batch: StepBatch) -> None:
        self.sampled.append(batch.sampled)
        # A datum is prompt + completion without its last token (steps/dapo/batch.py).
        self.trained_tokens.append(sum(len(g.prompt) + len(r.tokens) - 1 for g in batch.kept for r in g.rollouts))


def policy(loop: str, cfg: Any) -> Policy:
    """The scheduling policy of a loop: the product's, or the sequential baseline's (the original change's
    loop: the surplus of a step's last generation batch discarded, not carried, and a checkpoint's
    save_state awaited before the next step; one batch in flight and no sampling ahead come from its config)."""
    product = Policy.from_config(cfg)
    return replace(product, carry_surplus=False, save_behind=False) if loop == "sequential" else product


def run_config(spec: LoopSpec, learning_rate: float) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        "batch_size": spec.batch_size, "group_size": spec.group_size, "max_steps": spec.steps, "max_tokens": 512,
        "max_num_gen_batches": 40, "seed": SEED, "learning_rate": learning_rate, "save_every": spec.save_every,
        "eval_every": 0, "max_steps_off_policy": 1 if spec.loop == "pipelined" else 0,
        "overlong_buffer": 0,  # a length penalty would make groups of equal grades mixed: the grader alone decides
    }
    if spec.loop == "sequential":
        overrides["max_inflight_gen_batches"] = 1
    elif spec.inflight is not None:
        overrides["max_inflight_gen_batches"] = spec.inflight
    return overrides


def run(spec: LoopSpec, service: Service, client: Any, tokenizer: Any, examples: Sequence[Example],
        workdir: Path) -> dict[str, Any]:
    """One run of ``spec.steps`` steps on a session of its own; its per-step rows and summary."""
    cfg = load_config(LOCAL_CONFIG, run_config(spec, BENCH_LEARNING_RATE))
    usage: dict[int, dict[str, float]] = {}  # the session's simulated clock and GPU use at each train line
    training_client = client.create_lora_training_client(**lora_kwargs(cfg.session))
    session = training_client.training_session_name

    def on_line(line: str) -> None:
        if line.startswith("train: step="):
            usage[int(line.split()[1].split("=")[1])] = service.costs()["sessions"][session]

    recorder = Recorder()
    trainer = Trainer(
        training_client=training_client, cfg=cfg.dapo, task=ScriptedGsm8k(spec.keep, spec.group_size),
        tokenizer=tokenizer, train_examples=examples, eval_examples=[],
        metrics=metrics_io.MetricsLog(workdir / "metrics.jsonl", print_fn=on_line),
        checkpoint_dir=workdir / "ckpt", policy=policy(spec.loop, cfg.dapo), on_batch=recorder)
    try:
        outcome = trainer.run(LoopState(seed=SEED))
    finally:
        training_client.stop()
    if outcome.state.step != spec.steps:
        raise RuntimeError(f"{spec}: only {outcome.state.step} steps ({outcome.state.stop_reason})")
    records = [r for r in metrics_io.read(workdir / "metrics.jsonl") if r["kind"] == "step"]
    steps = step_rows(recorder, records, usage, cfg.dapo.max_steps_off_policy)
    return {"spec": asdict(spec), "steps": steps, "summary": summarise(steps[1:], usage[1], usage[spec.steps])}


def ideal_sampling_s(groups: Sequence[Group], costs: Costs = COSTS) -> float:
    """Simulated seconds to sample ``groups`` if every request arrived at once on an idle sampler."""
    wall = [0.0]
    gpus = Gpus(costs, WallClock(1.0, lambda: wall[0]))
    jobs = []
    for g in groups:
        job = gpus.sampling_arrives(len(g.prompt))
        gpus.sampled(job, [len(r.tokens) for r in g.rollouts])
        jobs.append(job)
    wall[0] = 1e9  # run the simulation to the end
    assert all(gpus.done(j) for j in jobs)
    return max((j.finish for j in jobs), default=0.0)


def training_s(datum_tokens: int, costs: Costs = COSTS) -> float:
    """Simulated seconds of a step's forward_backward, optim_step and save_weights_for_sampler."""
    return sum(costs.training_seconds(kind, datum_tokens if kind == "forwardBackward" else 0)
               for kind in ("forwardBackward", "optimizerStep", "saveWeights"))


def step_rows(recorder: Recorder, records: list[dict], usage: dict[int, dict[str, float]],
              pipelined: int) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        s = r["step"]
        sampled = recorder.sampled[s - 1]
        S, T = ideal_sampling_s(sampled), training_s(recorder.trained_tokens[s - 1])
        step_s = usage[s]["simulated_s"] - usage[s - 1]["simulated_s"] if s > 1 else None
        critical = max(S, T) if pipelined else S + T
        rows.append({
            "step": s, "gen_batches": r["gen_batches"], "groups_sampled": r["groups_sampled"],
            "speculative": r["speculative_batches"],
            "step_s": step_s, "sampling_s": S, "training_s": T, "critical_s": critical,
            "ratio": step_s / critical if step_s else None, "ratio_max": step_s / max(S, T) if step_s else None,
            "sampled_tokens": sum(len(x.tokens) for g in sampled for x in g.rollouts),
            "trained_tokens": r["tokens"], "off_policy_steps": r["off_policy_steps"],
            "completion_tokens_mean": r["completion_tokens_mean"], "truncated_frac": r["truncated_frac"],
        })
    return rows


def summarise(steps: list[dict], first: dict[str, float], last: dict[str, float]) -> dict[str, Any]:
    total = lambda k: sum(s[k] for s in steps)  # noqa: E731
    elapsed = last["simulated_s"] - first["simulated_s"]
    sampler = last["sampler_busy_s"] - first["sampler_busy_s"]
    trainer = last["trainer_busy_s"] - first["trainer_busy_s"]
    step_s = total("step_s") / len(steps)
    return {
        "step_s": step_s, "steps_per_hour": 3600 / step_s,
        "busy": (sampler + trainer) / (2 * elapsed), "sampler_busy": sampler / elapsed,
        "trainer_busy": trainer / elapsed,
        "decode_utilisation": (last["decoded_tokens"] - first["decoded_tokens"])
        / (COSTS.decode_tokens_per_s * elapsed),
        "sampled_per_trained": total("sampled_tokens") / total("trained_tokens"),
        "sampling_s": total("sampling_s") / len(steps), "training_s": total("training_s") / len(steps),
        "critical_s": total("critical_s") / len(steps), "ratio": total("step_s") / total("critical_s"),
        "ratio_max": total("step_s") / sum(max(s["sampling_s"], s["training_s"]) for s in steps),
        "gen_batches_mean": total("gen_batches") / len(steps),
        "off_policy_steps_max": max(s["off_policy_steps"] for s in steps),
        "completion_tokens_mean": statistics.mean(s["completion_tokens_mean"] for s in steps),
        "truncated_frac": statistics.mean(s["truncated_frac"] for s in steps),
        "reveal_lag_mean_s": last["reveal_lag_mean_s"], "reveal_lag_max_s": last["reveal_lag_max_s"],
    }


def run_all(specs: Sequence[LoopSpec], service: Service, client: Any, tokenizer: Any,
            examples: Sequence[Example], progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    service.set_costs(COSTS)
    results = []
    for spec in specs:
        with tempfile.TemporaryDirectory() as d:
            result = run(spec, service, client, tokenizer, examples, Path(d))
        s = result["summary"]
        progress(f"loops: {spec.loop} keep={spec.keep:.0%} inflight={spec.inflight} step={s['step_s']:.1f}s "
                 f"({s['steps_per_hour']:.0f}/h) busy={s['busy']:.0%} sampled/trained={s['sampled_per_trained']:.2f} "
                 f"critical-path ratio={s['ratio']:.2f} (vs max(S,T) {s['ratio_max']:.2f}) "
                 f"lag={s['reveal_lag_mean_s']:.2f}s")
        results.append(result)
    service.set_costs(Costs())
    return results
