"""A plain GRPO/PPO loop written against the public SDK only: the local service's policy learns."""
from __future__ import annotations

import numpy as np
import pytest

from local.toy_data import generate_rows
from local.training_session.toy.tokenizer import ToyTokenizer
from steps.gsm8k.answer import gold_answer, grade
from steps.gsm8k.prompt import render_prompt
from tests.local_service import BASE_MODEL_ARN


def greedy_accuracy(sampler, tok, rows) -> float:
    futures = [sampler.sample(render_prompt(tok, r["question"]), 1, {"max_tokens": 512, "temperature": 0.0})
               for r in rows]
    answers = [tok.decode(f.result().sequences[0].tokens) for f in futures]
    return float(np.mean([grade(a, gold_answer(r["answer"])).correct for a, r in zip(answers, rows)]))


@pytest.mark.slow
def test_plain_ppo_loop_through_the_sdk_raises_greedy_accuracy(service_client):
    from sagemaker.train.training_session import Datum, ModelInput, TensorData, TensorDtype

    tok = ToyTokenizer()
    rows = generate_rows(580, seed=3)
    train, held_out = rows[:480], rows[480:]
    rng = np.random.default_rng(0)
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        before = greedy_accuracy(tc.save_weights_and_get_sampling_client(), tok, held_out)
        for _ in range(30):
            sampler = tc.save_weights_and_get_sampling_client()
            batch = [train[i] for i in rng.choice(len(train), 16, replace=False)]
            prompts = [render_prompt(tok, r["question"]) for r in batch]
            futures = [sampler.sample(p, 8, {"max_tokens": 512, "temperature": 1.0}) for p in prompts]
            datums = []
            for prompt, row, fut in zip(prompts, batch, futures):
                seqs = fut.result().sequences
                gold = gold_answer(row["answer"])
                rewards = np.array([grade(tok.decode(s.tokens), gold).correct for s in seqs], float)
                for s, adv in zip(seqs, rewards - rewards.mean()):
                    pad = [0.0] * (len(prompt) - 1)
                    tokens = prompt + s.tokens
                    datums.append(Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
                        "target_tokens": TensorData(data=tokens[1:], dtype=TensorDtype.INT64),
                        "weights": TensorData(data=pad + [1.0] * len(s.tokens)),
                        "logprobs": TensorData(data=pad + list(s.logprobs)),
                        "advantages": TensorData(data=pad + [float(adv)] * len(s.tokens)),
                    }))
            tc.forward_backward(datums, "ppo", loss_fn_config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
            tc.optim_step({"learning_rate": 0.006}).result()
        after = greedy_accuracy(tc.save_weights_and_get_sampling_client(), tok, held_out)
    assert after >= before + 0.30, (before, after)
