"""Three training loops under the local service's cost model, side by side, in a matrix of cost scenarios.

* ``sequential``: the loop of the original DAPO change (verl's recipe): one generation
  batch at a time, the surplus of the last one discarded, each checkpoint's
  ``save_state`` awaited before the next step. Built here from the project's own
  ``Trainer``, driven by :func:`drive`, which undoes two of its choices and its config the rest,
  so the three loops differ only in the loop.
* ``default``: the product's defaults: every request of a generation batch in flight at
  once, as many generation batches in flight as the observed keep rate says a step needs,
  surplus carried, checkpoints off the critical path, and ``max_steps_off_policy: null``
  (auto): step 2 trains while step 3 samples, and the run keeps sampling ahead only if that
  probe step was at least 5% shorter than sampling and training one after the other
  (``steps/dapo/loop.py``).
* ``pipelined``: ``default`` with ``max_steps_off_policy: 1``: the next step samples
  while this one trains, from step 1 on.
* ``concurrent``: ``default`` with ``max_steps_off_policy: 0``: the project's on-policy concurrent mode
  (batches in flight at once, surplus carried, checkpoints behind), never sampling ahead: the
  reference for sampled tokens per trained token.

Every run: batch 32 x group 8, ``max_tokens`` 512, the toy's reasoning-length rollouts
priced by the cost model (``local/training_session/costs.py``, in virtual time: simulated
time passes only while the loop waits on the simulated GPUs, so the toy's and the SDK's own
CPU time on this machine costs none), a scripted grader fixing the keep rate (a seeded hash
of each question decides if its group is mixed), and a learning rate too small to move the
policy: the rollout lengths stay the base model's and every loop prices the same workload.
The loop's clock is the session's simulated clock (``Trainer.clock``), so the train line's
``seconds`` and the auto overlap decision see the service's time, as they would on AWS.

**Balanced windows.** Each run is ``STEPS`` steps; its figures are over a window of
``WINDOW`` steps, from one train line to another, that holds as many samplings as trainings.
A step's sampling falls in the interval between the previous train line and its own (on-policy)
or, sampled ahead, in the one before. The window is the first from train line 2 on (step 1
samples with no keep-rate evidence yet; step 2 is the auto loop's probe) in which the loop
sampled ``WINDOW`` steps and trained ``WINDOW``: train lines 2-8 for an on-policy loop (it
samples and trains steps 3-8) and for a loop sampling ahead (it trains 3-8 and samples 4-9),
3-9 for the auto loop once it chose on-policy. Per window:

* ``step_s``: simulated seconds per step, and steps per hour;
* ``busy``: the share of the GPUs' time spent working (sampler and trainer: two equal pools,
  one with shared GPUs), and the sampler's decode utilisation (tokens decoded / its throughput);
* ``sampled/trained``: completion tokens sampled per completion token trained, over the
  window's samplings and trainings;
* the critical path, priced by the scenario's own cost model (:func:`critical_s`): per step,
  ``S`` the sampler decoding all of a step's sampled sequences at once, ``T`` its
  forward_backward + optim_step + save_weights_for_sampler, and a checkpoint's save_state on
  the trainer. On-policy ``S + T``; sampled ahead on separate GPUs ``max(S, T)``, summed over
  the window's overlapped steps first (the busier pool); on shared GPUs ``S + T`` for any loop.
"""
from __future__ import annotations

import hashlib
import json
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
from steps.dapo.state import LoopState
from steps.dapo.task import Grade
from steps.gsm8k.task import Gsm8k
from steps.platform.session import lora_kwargs
from steps.tasks import Example

ROOT = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = ROOT / "config" / "local.yaml"
SEED = 7
LOOPS = ("sequential", "default", "pipelined", "pipelined-2", "concurrent")
KEEP_RATES = (1.0, 0.2)
LOW_KEEP = 0.05  # a very low keep rate: ~20 generation batches a step, so only where it says most (defaults)
#: Long enough that no window holds the run's last step (which starts no spares and samples nothing ahead):
#: a window ends at train line 9 at the latest (3-9, on-policy after the probe) and samples up to step 10.
STEPS = 11
WINDOW = 6
FIRST_LINE = 2  # windows start at train line 2 or later: step 1 has no keep-rate evidence, step 2 is the probe
BENCH_LEARNING_RATE = 1e-7  # moves the toy's weights by ~5e-7 a step: the workload stays the base model's
END = -1  # usage's key of the session's figures at the run's end (the others: train lines)


@dataclass(frozen=True)
class Scenario:
    """A cost model: the base costs (the defaults, or ``LOCAL_TS_COST_*``) with some figures multiplied."""

    name: str
    what: str
    times: tuple[tuple[str, float], ...] = ()  # (Costs field, factor)
    shared_gpus: bool = False
    keeps: tuple[float, ...] = KEEP_RATES

    def costs(self, base: Costs) -> Costs:
        return replace(base, **{k: getattr(base, k) * f for k, f in self.times},
                       shared_gpus=base.shared_gpus or self.shared_gpus)


SCENARIOS = (
    Scenario("defaults", "the cost model's defaults", keeps=KEEP_RATES + (LOW_KEEP,)),
    Scenario("decode x0.5", "half the decode throughput (75 sequences at full speed)",
             (("decode_tokens_per_s", 0.5),)),
    Scenario("decode x2", "twice the decode throughput (300 sequences at full speed)", (("decode_tokens_per_s", 2),)),
    Scenario("decode x4", "four times the decode throughput (600 sequences at full speed): a faster sampler still",
             (("decode_tokens_per_s", 4),)),
    Scenario("shared GPUs", "sampler and trainer on the same GPUs: training pauses decoding", shared_gpus=True),
    Scenario("training x0.25", "forward_backward, optim_step and save_weights_for_sampler in a quarter of the time",
             (("train_tokens_per_s", 4), ("optim_step_s", 0.25), ("save_weights_s", 0.25))),
    Scenario("training x2", "forward_backward, optim_step and save_weights_for_sampler in twice the time: "
             "the trainer is the bottleneck at 100% keep",
             (("train_tokens_per_s", 0.5), ("optim_step_s", 2), ("save_weights_s", 2))),
    Scenario("long completions", "every generated and trained token priced as 5: 640 tokens on average, "
             "a tail to 2,560", (("length_scale", 5),)),
    Scenario("cap 256", "a quarter of the running cap (256 sequences decode at once, the rest queue, at the default "
             "1024): vLLM's max_num_seqs off H100-class GPUs", (("max_running", 0.25),)),
)


def base_costs() -> Costs:
    """The service's documented settings (``LOCAL_TS_COST_*``, else the defaults), on, in virtual time."""
    return replace(Costs.from_env(), enabled=True, virtual_time=True)


@dataclass(frozen=True)
class LoopSpec:
    loop: str
    keep: float
    scenario: str = "defaults"
    steps: int = STEPS
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
    """What each step sampled and trained, for the cost model to price."""

    sampled: list[tuple[Group, ...]] = field(default_factory=list)  # per step, in step order
    trained_tokens: list[int] = field(default_factory=list)  # forward_backward datum tokens per step

    def __call__(self, batch: StepBatch) -> None:
        self.sampled.append(batch.sampled)
        # A datum is prompt + completion without its last token (steps/dapo/batch.py).
        self.trained_tokens.append(sum(len(g.prompt) + len(r.tokens) - 1 for g in batch.kept for r in g.rollouts))


def drive(trainer: Trainer, state: LoopState, sequential: bool = False) -> tuple[LoopState, list[StepBatch]]:
    """The product's loop, :meth:`Trainer.run`'s pieces (start, step, evaluate, finish) driven from here to see
    each step's batch. ``sequential``: the original change's loop, which differs in two more ways than its
    config (one generation batch in flight, never sampling ahead): the surplus of a step's last generation batch
    is discarded, not trained next step, and a checkpoint's save_state is awaited before the next step samples."""
    carry, batches = trainer.start(state), []
    while carry.state.step < trainer.n_steps and not carry.state.stopped_early:
        carry, batch = trainer.step(carry)
        batches.append(batch)
        if carry.state.stopped_early:
            return carry.state, batches
        if sequential:
            state = carry.state.with_saved_state(carry.pending.write(trainer.checkpoint_dir)) if carry.pending \
                else carry.state
            carry = replace(carry, state=replace(state, carry=()), pending=None)
        if trainer.cfg.eval_every and carry.state.step % trainer.cfg.eval_every == 0:
            trainer.evaluate(carry.state.step, carry.sampler.client)
            carry = replace(carry, lap_from=trainer.clock())  # evaluation belongs to no step's seconds, as in run()
    return trainer.finish(carry), batches


def run_config(spec: LoopSpec, learning_rate: float) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        "batch_size": spec.batch_size, "group_size": spec.group_size, "max_steps": spec.steps, "max_tokens": 512,
        "max_num_gen_batches": 40, "seed": SEED, "learning_rate": learning_rate, "save_every": spec.save_every,
        "eval_every": 0, "overlong_buffer": 0,  # a length penalty would make groups of equal grades mixed
        "guards": False,  # the scripted grades are no learning run for the health guards to judge
    }
    if spec.loop == "sequential":
        overrides.update(max_inflight_gen_batches=1, max_steps_off_policy=0)
    else:  # the product's defaults (config/local.yaml pins on-policy for the toy's wall-clock runs)
        off_policy = {"pipelined": 1, "pipelined-2": 2, "concurrent": 0}.get(spec.loop)
        overrides.update(max_inflight_gen_batches=None, max_steps_off_policy=off_policy)
    if spec.inflight is not None:
        overrides["max_inflight_gen_batches"] = spec.inflight
    return overrides


def run(spec: LoopSpec, costs: Costs, service: Service, client: Any, tokenizer: Any, examples: Sequence[Example],
        workdir: Path) -> dict[str, Any]:
    """One run of ``spec.steps`` steps on a session of its own (created under ``costs``); its rows and window."""
    cfg = load_config(LOCAL_CONFIG, run_config(spec, BENCH_LEARNING_RATE))
    records, steps, usage = run_trainer(spec, cfg, ScriptedGsm8k(spec.keep, spec.group_size), costs, service, client,
                                        tokenizer, examples, workdir)
    window = balanced_window([bool(r["sampled_ahead"]) for r in records])
    return {"spec": asdict(spec), "steps": steps, "window": window,
            "summary": summarise(steps, window, usage, costs)}


def run_trainer(spec: LoopSpec, cfg: Any, task: Any, costs: Costs, service: Service, client: Any, tokenizer: Any,
                examples: Sequence[Example], workdir: Path) -> tuple[list[dict], list[dict[str, Any]], dict]:
    """The ``Trainer`` of ``cfg`` (``spec``'s loop) for ``spec.steps`` steps of ``task`` on a session of its own:
    its step records, its rows (:func:`step_rows`) and the session's simulated clock and GPU use at each train
    line. bench/selective.py runs its own grader and settings through it."""
    usage: dict[int, dict[str, float]] = {}  # the session's simulated clock and GPU use at each train line
    training_client = client.create_lora_training_client(**lora_kwargs(cfg.session))
    session = training_client.training_session_name

    def on_line(line: str) -> None:
        if line.startswith("train: step="):
            usage[int(line.split()[1].split("=")[1])] = service.costs()["sessions"][session]

    trainer = Trainer(
        training_client=training_client, cfg=cfg.dapo, task=task, tokenizer=tokenizer, train_examples=examples,
        eval_examples=[], metrics=metrics_io.MetricsLog(workdir / "metrics.jsonl", print_fn=on_line),
        checkpoint_dir=workdir / "ckpt", clock=lambda: service.costs()["sessions"][session]["simulated_s"])
    try:
        state, batches = drive(trainer, LoopState(seed=SEED), sequential=spec.loop == "sequential")
        # What the sampler decoded by the run's end, collected or not (a spare nobody waited for is billed too)
        usage[END] = service.costs()["sessions"][session]
    finally:
        training_client.stop()
    if state.step != spec.steps:
        raise RuntimeError(f"{spec}: only {state.step} steps ({state.stop_reason})")
    recorder = Recorder()
    for batch in batches:
        recorder(batch)
    records = [r for r in metrics_io.read(workdir / "metrics.jsonl") if r["kind"] == "step"]
    return records, step_rows(recorder, records, usage, costs, spec), usage


def ideal_sampling_s(groups: Sequence[Group], costs: Costs) -> float:
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


def training_s(datum_tokens: int, costs: Costs) -> float:
    """Simulated seconds of a step's forward_backward, optim_step and save_weights_for_sampler."""
    return sum(costs.training_seconds(kind, datum_tokens if kind == "forwardBackward" else 0)
               for kind in ("forwardBackward", "optimizerStep", "saveWeights"))


def step_rows(recorder: Recorder, records: list[dict], usage: dict[int, dict[str, float]], costs: Costs,
              spec: LoopSpec) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        s = r["step"]
        sampled = recorder.sampled[s - 1]
        checkpoint = s % spec.save_every == 0 and s < spec.steps  # the last step's save runs after every window
        rows.append({
            "step": s, "gen_batches": r["gen_batches"], "groups_sampled": r["groups_sampled"],
            "speculative": r["speculative_batches"], "sampled_ahead": bool(r["sampled_ahead"]),
            "step_s": usage[s]["simulated_s"] - usage[s - 1]["simulated_s"] if s > 1 else None,
            "sampling_s": ideal_sampling_s(sampled, costs),
            "training_s": training_s(recorder.trained_tokens[s - 1], costs),
            "save_state_s": costs.training_seconds("saveState", 0) if checkpoint else 0.0,
            "sampled_tokens": sum(len(x.tokens) for g in sampled for x in g.rollouts),
            "groups_kept": sum(g.is_informative() for g in sampled),
            "trained_tokens": r["tokens"], "off_policy_steps": r["off_policy_steps"],
            "stale_groups_dropped": r["stale_groups_dropped"],
            "completion_tokens_mean": r["completion_tokens_mean"], "truncated_frac": r["truncated_frac"],
            **{k: r[k] for k in metrics_io.LENGTH_FIELDS},  # the length bias: trained against sampled groups
        })
    return rows


def interval(step: int, ahead: bool) -> int:
    """The train-line interval a step's sampling falls in: interval ``i`` runs from train line ``i - 1`` to
    ``i``; a step sampled ahead was sampled while the step before it trained."""
    return step - 1 if ahead else step


def balanced_window(ahead: Sequence[bool], n: int = WINDOW, first: int = FIRST_LINE) -> dict[str, Any]:
    """The first window of ``n`` steps, train line ``a`` to ``a + n`` (``a >= first``), in which the loop
    sampled as many steps as it trained (``ahead[s - 1]``: step ``s`` was sampled ahead), and that holds
    neither the sampling nor the training of the run's last step: it starts no spares and samples nothing
    ahead, so a window holding it would flatter the loop."""
    last = len(ahead)
    for a in range(first, last - n):
        sampled = [s for s in range(1, last) if a < interval(s, ahead[s - 1]) <= a + n]
        if len(sampled) == n:
            return {"from_line": a, "to_line": a + n, "trained": list(range(a + 1, a + n + 1)), "sampled": sampled}
    raise RuntimeError(f"no balanced window of {n} steps before the last in a run of {last} (sampled ahead: {ahead})")


def critical_s(steps: Sequence[dict], window: dict[str, Any], shared_gpus: bool) -> float:
    """The window's critical path. Each interval's trainer work is its training ``T`` and the previous
    checkpoint's save_state (queued ahead of ``T``). An on-policy sampling precedes its interval's training,
    the save can hide under it: ``max(S, save) + T``. Sampled ahead, the sampler and the trainer work at
    once, and a step's work may spill into the next interval: the busier pool over those intervals,
    ``max(sum S, sum save + T)``. Shared GPUs overlap nothing (training pauses decoding): every second adds."""
    by_step = {r["step"]: r for r in steps}
    on_policy = sampler = trainer = 0.0
    for i in window["trained"]:
        inside = [by_step[s] for s in window["sampled"] if interval(s, by_step[s]["sampled_ahead"]) == i]
        ahead = sum(r["sampling_s"] for r in inside if r["sampled_ahead"])
        alone = sum(r["sampling_s"] for r in inside if not r["sampled_ahead"])
        save, T = by_step[i - 1]["save_state_s"], by_step[i]["training_s"]
        if shared_gpus:
            on_policy += alone + ahead + save + T
        elif any(r["sampled_ahead"] for r in inside):
            on_policy += alone
            sampler, trainer = sampler + ahead, trainer + save + T
        else:
            on_policy += max(alone, save) + T
    return on_policy + max(sampler, trainer)


def summarise(steps: list[dict], window: dict[str, Any], usage: dict[int, dict[str, float]],
              costs: Costs) -> dict[str, Any]:
    first, last = usage[window["from_line"]], usage[window["to_line"]]
    sampled = [r for r in steps if r["step"] in window["sampled"]]
    trained = [r for r in steps if r["step"] in window["trained"]]
    n = len(trained)
    elapsed = last["simulated_s"] - first["simulated_s"]
    sampler = last["sampler_busy_s"] - first["sampler_busy_s"]
    trainer = last["trainer_busy_s"] - first["trainer_busy_s"]
    pools = 1 if costs.shared_gpus else 2
    critical = critical_s(steps, window, costs.shared_gpus)
    S, T = (statistics.mean(r[k] for r in rows) for k, rows in (("sampling_s", sampled), ("training_s", trained)))
    whole = usage[len(steps)]["simulated_s"]  # the session's clock from its start to the last train line
    # Every completion token the sampler decoded over the run, the groups never collected included (spares
    # started and not waited for), against the tokens of the groups the run counted.
    decoded = usage[END]["decoded_tokens"] / costs.length_scale if END in usage else None
    counted = sum(r["sampled_tokens"] for r in steps)
    run_trained = sum(r["trained_tokens"] for r in steps)
    return {
        "step_s": elapsed / n, "steps_per_hour": 3600 * n / elapsed,
        "run_step_s": whole / len(steps), "run_steps_per_hour": 3600 * len(steps) / whole,
        "busy": (sampler + trainer) / (pools * elapsed), "sampler_busy": sampler / elapsed,
        "trainer_busy": trainer / elapsed,
        "decode_utilisation":
            (last["decoded_tokens"] - first["decoded_tokens"]) / (costs.decode_tokens_per_s * elapsed),
        "sampled_per_trained": sum(r["sampled_tokens"] for r in sampled) / sum(r["trained_tokens"] for r in trained),
        "run_sampled_per_trained": (decoded if decoded is not None else counted) / run_trained,
        "uncollected_tokens": max(0.0, decoded - counted) if decoded is not None else None,
        "decoded_per_counted": decoded / counted if decoded is not None else None,
        "sampling_s": S, "training_s": T, "critical_s": critical / n, "ratio": elapsed / critical,
        "sampled_ahead": sum(r["sampled_ahead"] for r in sampled),
        "gen_batches_mean": statistics.mean(r["gen_batches"] for r in sampled),
        "off_policy_steps_max": max(r["off_policy_steps"] for r in trained),
        "stale_groups_dropped": sum(r["stale_groups_dropped"] for r in trained),
        "completion_tokens_mean": statistics.mean(r["completion_tokens_mean"] for r in sampled),
        "truncated_frac": statistics.mean(r["truncated_frac"] for r in sampled),
        "reveal_lag_mean_s": last["reveal_lag_mean_s"], "reveal_lag_max_s": last["reveal_lag_max_s"],
        # The length bias over the window: per-step completion-length means and p95s, averaged.
        **{k: statistics.mean(r[k] for r in (trained if k.startswith("trained") else sampled))
           for k in metrics_io.LENGTH_FIELDS},
    }


def throughput_floor(runs: Sequence[dict[str, Any]], costs: Costs) -> dict[str, float]:
    """A scenario's (and keep rate's) least step any loop could take, the same for every loop: per trained step,
    ``S`` the groups a step needs at the observed keep rate decoded at the sampler's full throughput, with no
    tail (no sequence ever waits alone), and ``T`` its training plus its share of a checkpoint's save_state;
    ``max(S, T)`` on separate GPUs (fully overlapped), ``S + T`` on shared ones. Pooled over ``runs`` (every
    loop's whole run of the same workload), so a loop's wrong choice shows against it."""
    rows = [r for run in runs for r in run["steps"]]
    spec = runs[0]["spec"]
    kept = sum(r["groups_kept"] for r in rows)
    sampled = sum(r["groups_sampled"] for r in rows)
    tokens_per_group = sum(r["sampled_tokens"] for r in rows) / sampled
    S = spec["batch_size"] * (sampled / kept) * tokens_per_group * costs.length_scale / costs.decode_tokens_per_s
    T = statistics.mean(r["training_s"] for r in rows) + costs.training_seconds("saveState", 0) / spec["save_every"]
    return {"sampling_s": S, "training_s": T, "floor_s": S + T if costs.shared_gpus else max(S, T),
            "keep_observed": kept / sampled}


def with_floors(runs: list[dict[str, Any]], base: Costs) -> list[dict[str, Any]]:
    """One throughput floor per scenario and keep rate; each run's window and whole-run step divided by it."""
    floors = []
    for sc in SCENARIOS:
        for keep in sc.keeps:
            same = [r for r in runs if r["spec"]["scenario"] == sc.name and r["spec"]["keep"] == keep]
            if not same:
                continue
            f = throughput_floor(same, sc.costs(base))
            floors.append({"scenario": sc.name, "keep": keep, **f})
            for r in same:
                r["summary"].update(floor_s=f["floor_s"], step_per_floor=r["summary"]["step_s"] / f["floor_s"],
                                    run_step_per_floor=r["summary"]["run_step_s"] / f["floor_s"])
    return floors


def measure_runs(specs: Sequence[LoopSpec], base: Costs, partial: Path | None = None) -> list[dict[str, Any]]:
    """``specs`` run one after another against a local service of their own (a worker of ``make bench``: the
    figures are simulated time, so workers running at once change the bench's wall time, not its figures).
    ``partial``: each run's result is appended there as it ends, so a bench cut short keeps what it measured."""
    from bench.service import local_service
    from local.toy_data import write_split
    from local.training_session.toy.tokenizer import HF_FILES
    from steps.platform.session import service_client
    from steps.platform.tokenizer import load_tokenizer
    from steps.tasks import load_examples

    tokenizer = load_tokenizer(None, None, HF_FILES)
    with tempfile.TemporaryDirectory() as tmp, local_service() as service:
        train_path, _ = write_split(tmp, 2000, 200, seed=3)
        client = service_client(load_config(LOCAL_CONFIG).session)
        return run_all(specs, service, client, tokenizer, load_examples(train_path), base, partial=partial)


def run_all(specs: Sequence[LoopSpec], service: Service, client: Any, tokenizer: Any,
            examples: Sequence[Example], base: Costs, progress: Callable[[str], None] = print,
            partial: Path | None = None) -> list[dict[str, Any]]:
    """Each spec on a session of its own, created under its scenario's costs; the service's settings restored after."""
    saved = service.costs()["costs"]
    results = []
    try:
        for spec in specs:
            costs = next(sc for sc in SCENARIOS if sc.name == spec.scenario).costs(base)
            service.set_costs(costs)
            with tempfile.TemporaryDirectory() as d:
                result = run(spec, costs, service, client, tokenizer, examples, Path(d))
            s, w = result["summary"], result["window"]
            progress(f"loops: {spec.scenario}: {spec.loop} keep={spec.keep:.0%} step={s['step_s']:.1f}s "
                     f"({s['steps_per_hour']:.0f}/h) busy={s['busy']:.0%} sampled/trained="
                     f"{s['sampled_per_trained']:.2f} critical-path ratio={s['ratio']:.2f} sampled ahead "
                     f"{s['sampled_ahead']}/{len(w['sampled'])} window lines {w['from_line']}-{w['to_line']}")
            results.append(result)
            if partial is not None:
                with open(partial, "a", encoding="utf-8") as f:
                    f.write(json.dumps(result) + "\n")
    finally:
        service.set_costs(Costs.from_mapping(saved))
    return results
