"""Client-side CPU per sample: what the loop itself spends between round trips.

On 1,000 synthetic samples (125 groups of 8) with 512-token completions and
35-token prompts, thread CPU time (best of several repeats: noise only adds) of:

* ``grade`` - ``steps.gsm8k.answer.grade`` + ``steps.dapo.sampling.reward`` on the decoded completions;
* ``advantages`` - ``steps.dapo.batch.train_samples`` (group advantages, overlong mask);
* ``datums`` - ``steps.dapo.batch.build_datums``;
* ``serialise`` - what ``forward_backward`` runs on them before sending
  (``batch_to_datum_list`` + ``chunk_datum_list`` in
  ``sagemaker/train/training_session/_utils.py``).

``build_datums`` builds the wire dicts directly (the SDK's raw datum dicts);
``serialise`` is then only the SDK's checks and chunking of them.

Two more figures, outside that total because they are not the project's code:
``decode`` (the tokenizer turning tokens into text, here the toy tokenizer; a
Hugging Face tokenizer's cost differs) and ``json_encode`` (``json.dumps`` of
the request body, a lower bound of what botocore does to send it).
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable

from sagemaker.train.training_session._utils import batch_to_datum_list, chunk_datum_list

from bench.loops import LOCAL_CONFIG
from local.training_session.toy.tokenizer import HF_FILES
from steps.config import load_config
from steps.dapo.batch import build_datums, train_samples
from steps.dapo.sampling import Group, RewardShaping, Rollout, reward
from steps.dapo.task import Grade
from steps.gsm8k.answer import grade
from steps.gsm8k.prompt import render_prompt
from steps.platform.tokenizer import load_tokenizer

N_SAMPLES = 1000
GROUP_SIZE = 8
COMPLETION_TOKENS = 512
REPEATS = 7
# Toy-vocabulary reasoning, tiled to 512 tokens and ending in the GSM8K answer format.
REASONING = "ann has 5 apples and buys 7 more . 5 + 7 = 12 . so she has 12 apples now . "
QUESTION = "ann has 5 apples and buys 7 more . how many apples does she have ?"


def _completion(tok: Any, answer: int) -> tuple[int, ...]:
    tail = tok.encode(f"so the answer is #### {answer}")
    body = tok.encode(REASONING)
    tokens = (body * (COMPLETION_TOKENS // len(body) + 1))[: COMPLETION_TOKENS - len(tail)] + tail
    return tuple(tokens)


def synthetic_groups(tok: Any) -> list[Group]:
    """Groups of 512-token completions with one right answer (12) in each."""
    prompt = tuple(render_prompt(tok, QUESTION))
    groups = []
    for g in range(N_SAMPLES // GROUP_SIZE):
        rollouts = []
        for k in range(GROUP_SIZE):
            tokens = _completion(tok, 12 if k == 0 else 10 + k)
            rollouts.append(Rollout(tokens, tuple(-0.5 - 0.001 * i for i in range(len(tokens))), "stop",
                                    1.0 if k == 0 else 0.0, Grade(k == 0, True, str(12 if k == 0 else 10 + k))))
        groups.append(Group(g, prompt, tuple(rollouts)))
    return groups


def cpu_seconds(fn: Callable[[], Any]) -> float:
    """Least thread CPU time of ``fn`` over REPEATS runs."""
    times = []
    for _ in range(REPEATS):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return min(times)


def measure() -> dict[str, Any]:
    tok = load_tokenizer(None, None, HF_FILES)
    cfg = load_config(LOCAL_CONFIG).dapo
    groups = synthetic_groups(tok)
    rollouts = [r for g in groups for r in g.rollouts]
    texts = [tok.decode(list(r.tokens), skip_special_tokens=True) for r in rollouts]
    samples = train_samples(groups, cfg.advantage_std_scaling, cfg.overlong_filtering)
    shaping = RewardShaping(cfg.max_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
    datums = build_datums(samples, cfg.loss_aggregation)
    wire = chunk_datum_list(batch_to_datum_list(datums, loss_fn_name=cfg.loss_fn))

    own = {
        "grade": cpu_seconds(lambda: [reward(grade(t, "12"), COMPLETION_TOKENS, shaping) for t in texts]),
        "advantages": cpu_seconds(lambda: train_samples(groups, cfg.advantage_std_scaling, cfg.overlong_filtering)),
        "datums": cpu_seconds(lambda: build_datums(samples, cfg.loss_aggregation)),
        "serialise": cpu_seconds(lambda: chunk_datum_list(batch_to_datum_list(datums, loss_fn_name=cfg.loss_fn))),
    }
    other = {
        "decode": cpu_seconds(lambda: [tok.decode(list(r.tokens), skip_special_tokens=True) for r in rollouts]),
        "json_encode": cpu_seconds(lambda: [json.dumps({"forwardBackward": {"datumList": c}}) for c in wire]),
    }
    return {
        "samples": N_SAMPLES, "completion_tokens": COMPLETION_TOKENS,
        "prompt_tokens": len(groups[0].prompt),
        "per_1000_samples_s": own, "per_1000_samples_total_s": sum(own.values()),
        "not_project_code_per_1000_samples_s": other,
    }


def step_fraction(overhead: dict[str, Any], steps: list[dict[str, Any]], group_size: int,
                  batch_size: int) -> dict[str, Any]:
    """The client's own CPU for one step as a fraction of the step on the service (the cost model's
    simulated seconds of a ~30B model: what the client's work is to be weighed against).

    Grading runs on every sample drawn (groups_sampled x group_size); the rest
    on the batch_size x group_size samples trained.
    """
    per = {k: v / overhead["samples"] for k, v in overhead["per_1000_samples_s"].items()}
    drawn = statistics.mean(s["groups_sampled"] for s in steps) * group_size
    trained = batch_size * group_size
    cpu = per["grade"] * drawn + (per["advantages"] + per["datums"] + per["serialise"]) * trained
    step = statistics.mean(s["step_s"] for s in steps)
    return {"samples_drawn": drawn, "samples_trained": trained, "client_cpu_s": cpu,
            "step_s": step, "fraction": cpu / step}
