"""The local service's numpy policy: losses, gradients, Adam, sampling, and that RL really teaches it.

The policy takes validated arguments: the service refuses bad requests before
they reach it (tests/test_service_validation.py).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from local import toy_data
from local.training_session.toy import model as M
from local.training_session.toy.adam import LR_SCALE, AdamConfig, AdamState, adam_step
from local.training_session.toy.policy import FILLER_WORDS, DatumArrays, Policy
from local.training_session.toy.tokenizer import ToyTokenizer

TOK = ToyTokenizer()
INSTRUCTION = "Solve the problem. Write the final answer as #### followed by the number."
DAPO_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
RL_LEARNING_RATE = 0.006  # the value config/local.yaml uses (x LR_SCALE = 0.03 in the toy's weights)


def prompt_tokens(question: str) -> list[int]:
    return TOK.apply_chat_template([{"role": "user", "content": question + "\n" + INSTRUCTION}],
                                   add_generation_prompt=True)


def extract(completion: str) -> str | None:
    """The number after the last '####', else the last number (a local stand-in for steps.gsm8k)."""
    if "####" in completion:
        m = re.match(r"\s*(-?\d+)", completion.rsplit("####", 1)[1])
        if m:
            return m.group(1)
    numbers = re.findall(r"-?\d+", completion)
    return numbers[-1] if numbers else None


def gold(row: dict) -> str:
    return row["answer"].rsplit("####", 1)[1].strip()


def accuracy(policy: Policy, rows: list[dict], temperature: float, samples: int = 1) -> float:
    hits = [extract(TOK.decode(s.tokens)) == gold(row)
            for i, row in enumerate(rows)
            for s in policy.sample(prompt_tokens(row["question"]), samples, 512, temperature=temperature, seed=i)]
    return sum(hits) / len(hits)


def rl_datum(prompt: list[int], completion: list[int], sampling_logprobs: list[float], advantage: float) -> DatumArrays:
    """The tinker-cookbook layout: weights/logprobs/advantages 0 on positions that predict prompt tokens."""
    full = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    return DatumArrays(np.array(full[:-1]), {
        "target_tokens": np.array(full[1:]),
        "weights": np.array(pad + [1.0] * len(completion)),
        "logprobs": np.array(pad + list(sampling_logprobs)),
        "advantages": np.array(pad + [advantage] * len(completion)),
    })


QUESTION = "Ann has 3 apples and buys 4 more. How many apples does she have?"
PROMPT = prompt_tokens(QUESTION)
ANSWER = TOK.encode("#### 7") + [TOK.eos_token_id]


def perturbed_base(seed: int = 0) -> Policy:
    """The base model with every parameter jittered, so no gradient is zero by symmetry."""
    theta = Policy.base().parameters() + 0.05 * np.random.default_rng(seed).standard_normal(M.N_PARAMS)
    return Policy.from_state_dict({"params": theta})


# ---- losses and gradients ---------------------------------------------------------


def _datum_with_ratios(policy: Policy, ratios: list[float], advantages: list[float], temperature: float | None = None):
    """A datum on PROMPT + ANSWER whose completion tokens have the given ratios exp(p - q)."""
    datum = rl_datum(PROMPT, ANSWER, [0.0] * len(ANSWER), 0.0)
    inputs = dict(datum.inputs)
    if temperature is not None:
        inputs["temperature"] = np.full(len(datum.tokens), temperature)
    p = np.array(policy.forward([DatumArrays(datum.tokens, inputs)])[1][0]["logprobs"])
    n = len(ANSWER)
    inputs["logprobs"] = np.concatenate([np.zeros(len(p) - n), p[-n:] - np.log(ratios)])
    inputs["advantages"] = np.concatenate([np.zeros(len(p) - n), advantages])
    return DatumArrays(datum.tokens, inputs)


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo"])
@pytest.mark.parametrize("temperature", [None, 0.7])
def test_gradient_matches_finite_differences(loss_fn, temperature):
    policy = perturbed_base()
    # Ratios below, inside and above the PPO/CISPO band, with advantages of both signs.
    datum = _datum_with_ratios(policy, ratios=[0.5, 1.1, 1.6], advantages=[1.0, -0.7, 0.4], temperature=temperature)
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    policy.forward_backward([datum], loss_fn, config)
    grad = policy.gradient()
    assert np.abs(grad).sum() > 0

    theta = policy.parameters()
    # CISPO's weight sg(clip(r)) A is a constant for the gradient: its loss is then
    # cross entropy with weights w * clip(r) * A, frozen at the current parameters.
    probe_fn, probe = loss_fn, datum
    if loss_fn == "cispo":
        x = datum.inputs
        r = np.exp(np.array(policy.forward([datum])[1][0]["logprobs"]) - x["logprobs"])
        weights = x["weights"] * np.clip(r, 0.8, 1.28) * x["advantages"]
        probe_fn, probe = "cross_entropy", DatumArrays(datum.tokens, {**x, "weights": weights})
    rng = np.random.default_rng(1)
    head = M.unpack(np.arange(M.N_PARAMS))  # flat indices of the named parameter groups
    focus = np.concatenate([head.head, head.cue_weights[M.BEFORE, [TOK.token_id("has"), TOK.token_id("buys")]],
                            head.table[M.PREV_ROW0 + TOK.token_id("####"), M.NUMBER_IDS[:12]]])
    for direction_index in range(4):
        v = rng.standard_normal(M.N_PARAMS) if direction_index < 2 else np.zeros(M.N_PARAMS)
        if direction_index >= 2:  # directions on the arithmetic head, whose gradient is easy to get wrong
            v[focus] = rng.standard_normal(len(focus))
        eps = 1e-6

        def loss_at(t):
            return Policy.from_state_dict({"params": t}).forward([probe], probe_fn, config)[0]["loss:sum"]

        numeric = (loss_at(theta + eps * v) - loss_at(theta - eps * v)) / (2 * eps)
        assert numeric == pytest.approx(grad @ v, rel=1e-5, abs=1e-8)


def _completion_gradient(ratio: float, advantage: float) -> np.ndarray:
    policy = perturbed_base()
    datum = _datum_with_ratios(policy, ratios=[1.0, ratio, 1.0], advantages=[0.0, advantage, 0.0])
    policy.forward_backward([datum], "ppo", DAPO_CLIP)
    return policy.gradient()


@pytest.mark.parametrize("ratio, advantage, clipped", [
    (1.5, 1.0, True),    # above clip_high with a positive advantage: no further push up
    (1.1, 1.0, False),   # inside the band
    (0.6, -1.0, True),   # below clip_low with a negative advantage: no further push down
    (0.9, -1.0, False),
    (1.5, -1.0, False),  # outside the band on the pessimistic side still trains
    (0.6, 1.0, False),
])
def test_ppo_clips_the_gradient_outside_the_ratio_band(ratio, advantage, clipped):
    grad_norm = np.linalg.norm(_completion_gradient(ratio, advantage))
    assert bool(grad_norm == 0.0) is clipped


def test_ppo_reports_the_clip_fraction():
    policy = perturbed_base()
    datum = _datum_with_ratios(policy, ratios=[1.5, 1.0, 1.0], advantages=[1.0, 1.0, 1.0])
    metrics, _ = policy.forward([datum], "ppo", DAPO_CLIP)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("advantage, direction", [(1.0, 1), (-1.0, -1)])
def test_advantage_sign_moves_the_sampled_tokens_logprobs(advantage, direction):
    policy = Policy.base()
    [seq] = policy.sample(PROMPT, 1, 512, seed=3)
    datum = rl_datum(PROMPT, seq.tokens, seq.logprobs, advantage)
    before = sum(policy.forward([datum])[1][0]["logprobs"][-len(seq.tokens):])
    policy.forward_backward([datum], "ppo", DAPO_CLIP)
    policy.optim_step(AdamConfig(learning_rate=0.05))
    after = sum(policy.forward([datum])[1][0]["logprobs"][-len(seq.tokens):])
    assert direction * (after - before) > 0.01


def test_gradients_accumulate_until_optim_step_and_forward_adds_none():
    policy = perturbed_base()
    datum = _datum_with_ratios(policy, ratios=[1.0, 1.0, 1.0], advantages=[1.0, 1.0, 1.0])
    policy.forward([datum], "ppo", None)
    assert not policy.gradient().any()
    policy.forward_backward([datum], "ppo", None)
    once = policy.gradient()
    policy.forward_backward([datum], "ppo", None)
    np.testing.assert_allclose(policy.gradient(), 2 * once)
    policy.optim_step(AdamConfig(learning_rate=0.01))
    assert not policy.gradient().any()


# ---- clip bounds ------------------------------------------------------------------


def test_clip_bounds_default_to_ppo_epsilon_point_two():
    policy = perturbed_base()
    datum = _datum_with_ratios(policy, ratios=[1.25, 1.25, 1.25], advantages=[1.0, 1.0, 1.0])
    assert policy.forward([datum], "ppo", None)[0]["actor/pg_clipfrac"] == 1.0  # 1.25 > default 1.2
    assert policy.forward([datum], "ppo", DAPO_CLIP)[0]["actor/pg_clipfrac"] == 0.0  # < 1.28


# ---- Adam --------------------------------------------------------------------------


def test_weight_decay_shrinks_parameters_without_gradient():
    policy = perturbed_base()
    before = policy.parameters().copy()
    policy.optim_step(AdamConfig(learning_rate=0.01, weight_decay=0.2))
    np.testing.assert_allclose(policy.parameters(), before * (1 - LR_SCALE * 0.01 * 0.2))


def test_grad_clip_norm_rescales_the_gradient_before_adam():
    rng = np.random.default_rng(0)
    params, grad = rng.standard_normal(50), 10 * rng.standard_normal(50)
    # After one step the moments are non-zero, so the gradient's scale matters.
    _, state, _ = adam_step(params, rng.standard_normal(50), AdamState.zeros((50,)), AdamConfig(learning_rate=0.1))
    clipped, _, metrics = adam_step(params, grad, state, AdamConfig(learning_rate=0.1, grad_clip_norm=1.0))
    rescaled, _, _ = adam_step(params, grad / np.linalg.norm(grad), state, AdamConfig(learning_rate=0.1))
    unclipped, _, _ = adam_step(params, grad, state, AdamConfig(learning_rate=0.1))
    np.testing.assert_allclose(clipped, rescaled)
    assert not np.allclose(clipped, unclipped)
    assert metrics["grad_norm"] == pytest.approx(np.linalg.norm(grad))  # reported before clipping


@pytest.mark.parametrize("field, value", [("learning_rate", -1.0), ("beta1", 1.0), ("eps", 0.0),
                                          ("weight_decay", -0.1), ("grad_clip_norm", 0.0), ("beta2", float("nan"))])
def test_adam_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        AdamConfig(**{"learning_rate": 0.01, field: value})


def _train_steps(policy: Policy, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        seqs = policy.sample(PROMPT, 4, 512, seed=int(rng.integers(1 << 30)))
        datums = [rl_datum(PROMPT, s.tokens, s.logprobs, a) for s, a in zip(seqs, [1.0, -1.0, 0.5, -0.5])]
        policy.forward_backward(datums, "ppo", DAPO_CLIP)
        policy.optim_step(AdamConfig(learning_rate=0.05, weight_decay=0.01))


def test_saved_state_resumes_exactly_like_an_uninterrupted_run():
    a = Policy.base()
    _train_steps(a, 3, seed=0)
    b = Policy.from_state_dict({k: v.copy() for k, v in a.state_dict(include_optimizer=True).items()})
    _train_steps(a, 2, seed=1)
    _train_steps(b, 2, seed=1)
    np.testing.assert_array_equal(a.parameters(), b.parameters())
    # Without the optimizer state the moments restart, and so the next step differs.
    c = Policy.from_state_dict(a.state_dict(include_optimizer=False))
    assert set(a.state_dict(include_optimizer=False)) == {"params"}
    _train_steps(a, 1, seed=2)
    _train_steps(c, 1, seed=2)
    assert not np.array_equal(a.parameters(), c.parameters())


def test_from_state_dict_rejects_a_wrong_shape():
    with pytest.raises(ValueError, match="params"):
        Policy.from_state_dict({"params": np.zeros(3)})


# ---- sampling ---------------------------------------------------------------------


def test_greedy_is_deterministic_and_a_seed_reproducible():
    policy = Policy.base()
    greedy = [policy.sample(PROMPT, 2, 512, temperature=0) for _ in range(2)]
    assert greedy[0] == greedy[1] and greedy[0][0] == greedy[0][1]
    seeded = [policy.sample(PROMPT, 16, 512, temperature=1.0, seed=42) for _ in range(2)]
    assert seeded[0] == seeded[1]
    other = policy.sample(PROMPT, 16, 512, temperature=1.0, seed=43)
    assert other != seeded[0]


def test_sampling_logprobs_equal_forward_at_temperature_one():
    policy = perturbed_base()
    for seq in policy.sample(PROMPT, 8, 512, seed=5):
        datum = rl_datum(PROMPT, seq.tokens, seq.logprobs, 0.0)
        scored = policy.forward([datum])[1][0]["logprobs"][-len(seq.tokens):]
        np.testing.assert_allclose(scored, seq.logprobs, rtol=0, atol=1e-10)
        full = policy.compute_logprobs(PROMPT + seq.tokens)
        assert full[0] is None
        np.testing.assert_allclose(full[-len(seq.tokens):], seq.logprobs, rtol=0, atol=1e-10)


def test_sampling_logprobs_at_other_temperatures_are_of_the_tempered_distribution():
    policy = perturbed_base()
    [seq] = policy.sample(PROMPT, 1, 512, temperature=0.5, seed=5)
    datum = rl_datum(PROMPT, seq.tokens, seq.logprobs, 0.0)
    inputs = {**datum.inputs, "temperature": np.full(len(datum.tokens), 0.5)}
    scored = policy.forward([DatumArrays(datum.tokens, inputs)])[1][0]["logprobs"][-len(seq.tokens):]
    np.testing.assert_allclose(scored, seq.logprobs, atol=1e-10)


def test_generation_ends_at_eos_max_tokens_or_a_stop_string():
    policy = Policy.base()
    [done] = policy.sample(PROMPT, 1, 512, temperature=0)
    assert done.stop_reason == "stop" and done.tokens[-1] == TOK.eos_token_id
    [cut] = policy.sample(PROMPT, 1, 1, temperature=0)
    assert cut.stop_reason == "length" and len(cut.tokens) == 1 == len(cut.logprobs)
    [stopped] = policy.sample(PROMPT, 1, 512, temperature=0, stop=["####"])
    assert stopped.stop_reason == "stop" and TOK.decode(stopped.tokens) == "####"


def test_top_k_one_is_greedy():
    policy = Policy.base()
    assert [s.tokens for s in policy.sample(PROMPT, 4, 512, top_k=1, seed=0)] == \
        [policy.sample(PROMPT, 1, 512, temperature=0)[0].tokens] * 4


def test_a_negative_seed_is_a_seed_of_its_own():
    """The API's seed is a signed 32-bit Integer: negative seeds sample, reproducibly."""
    policy = Policy.base()
    draws = {seed: policy.sample(PROMPT, 16, 512, temperature=1.0, seed=seed) for seed in (-7, 7, -(2**31), 2**31 - 1)}
    assert policy.sample(PROMPT, 16, 512, temperature=1.0, seed=-7) == draws[-7]
    assert len({tuple(tuple(s.tokens) for s in seqs) for seqs in draws.values()}) == len(draws)


def test_a_sampler_copy_does_not_change_when_the_trainer_steps():
    trainer = Policy.base()
    sampler = trainer.weights_copy()
    frozen = sampler.parameters().copy()
    _train_steps(trainer, 2, seed=0)
    np.testing.assert_array_equal(sampler.parameters(), frozen)
    assert not np.array_equal(trainer.parameters(), frozen)


# ---- the toy task: the base model, and RL on it -------------------------------------


def base_completions(n_rows: int = 200, samples: int = 8):
    rows = toy_data.generate_rows(n_rows, seed=123)
    return [s for i, row in enumerate(rows) for s in Policy.base().sample(prompt_tokens(row["question"]), samples,
                                                                            512, seed=i)]


def test_base_model_writes_reasoning_lengths_some_cut_off_some_without_an_answer():
    completions = base_completions()
    lengths = np.array([len(s.tokens) for s in completions])
    cut = np.array([s.stop_reason == "length" for s in completions])
    texts = [TOK.decode(s.tokens) for s in completions]
    # From an immediate "#### N <eos>" to runs cut off at max_tokens (512, the API's minimum).
    assert lengths.min() <= 3 and 80 <= lengths.mean() <= 250
    assert (lengths[cut] == 512).all() and 0.03 <= cut.mean() <= 0.20
    assert np.mean(lengths <= 3) >= 0.25 and np.mean((lengths > 50) & ~cut) >= 0.25
    # Some end (<eos>) after their filler without ever answering.
    unanswered = np.array(["####" not in t for t in texts]) & ~cut
    assert 0.05 <= unanswered.mean() <= 0.25
    # The "thinking" is filler words; an answer is "#### N" at the very end.
    filler = set(FILLER_WORDS)
    for text in texts:
        words = text.split()
        body = words[:-2] if "####" in words else words
        assert set(body) <= filler, text
        if "####" in words:
            assert words[-2] == "####" and words[-1].isdigit()


def test_base_model_answers_at_once_when_greedy_and_is_mostly_wrong():
    rows = toy_data.generate_rows(200, seed=123)
    greedy = [Policy.base().sample(prompt_tokens(row["question"]), 1, 512, temperature=0)[0] for row in rows]
    assert all(len(s.tokens) == 3 and TOK.decode(s.tokens).startswith("#### ") for s in greedy)
    assert 0.05 <= accuracy(Policy.base(), rows, temperature=1.0) <= 0.30
    assert 0.05 <= accuracy(Policy.base(), rows, temperature=0.0) <= 0.40


def test_grpo_with_ppo_raises_greedy_accuracy_by_thirty_points_and_learns_to_stop_rambling():
    rows = toy_data.generate_rows(2100, seed=7)
    train, held_out = rows[:2000], rows[2000:]
    policy = Policy.base()
    base = accuracy(policy, held_out, temperature=0.0)
    rng = np.random.default_rng(0)
    mean_lengths = []
    for _ in range(30):
        datums, lengths = [], []
        for i in rng.choice(len(train), 16, replace=False):
            prompt = prompt_tokens(train[i]["question"])
            seqs = policy.sample(prompt, 8, 512, temperature=1.0, seed=int(rng.integers(1 << 30)))
            rewards = np.array([extract(TOK.decode(s.tokens)) == gold(train[i]) for s in seqs], dtype=float)
            datums += [rl_datum(prompt, s.tokens, s.logprobs, a) for s, a in zip(seqs, rewards - rewards.mean())]
            lengths += [len(s.tokens) for s in seqs]
        policy.forward_backward(datums, "ppo", DAPO_CLIP)
        policy.optim_step(AdamConfig(learning_rate=RL_LEARNING_RATE))
        mean_lengths.append(np.mean(lengths))
    assert accuracy(policy, held_out, temperature=0.0) >= base + 0.30
    # Filler that ends without an answer earns nothing: the policy learns to answer sooner.
    assert np.mean(mean_lengths[-5:]) < np.mean(mean_lengths[:5]) / 3


# ---- the tokenizer ------------------------------------------------------------------


def test_tokenizer_chat_template_text_and_ids_agree():
    messages = [{"role": "user", "content": QUESTION + "\n" + INSTRUCTION}]
    text = TOK.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<bos> <user> ") and text.endswith(" <assistant>")
    assert TOK.encode(text) == TOK.apply_chat_template(messages) == PROMPT
    assert PROMPT[-1] == TOK.token_id("<assistant>")
    assert TOK.unk_token_id not in PROMPT


def test_tokenizer_decodes_completions_for_grading():
    assert TOK.decode(ANSWER) == "#### 7"
    assert TOK.decode(ANSWER, skip_special_tokens=False) == "#### 7 <eos>"
    assert TOK.decode(TOK.encode("Ann has 1234 apples, 07 pens")) == "ann has 1234 apples , 07 pens"
    assert TOK.encode("zebra") == [TOK.unk_token_id]
    assert TOK.convert_ids_to_tokens(TOK.encode("#### 12")) == ["####", "12"]
    assert TOK.encode("hi", add_special_tokens=True)[0] == TOK.bos_token_id


def test_tokenizer_refuses_bad_input():
    with pytest.raises(ValueError, match="messages\\[0\\]"):
        TOK.apply_chat_template([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match=str(TOK.vocab_size + 5)):
        TOK.decode([TOK.vocab_size + 5])
