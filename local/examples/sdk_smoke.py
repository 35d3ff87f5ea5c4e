"""Drive the SageMaker training-session SDK against the local service (or any endpoint).

    python -m local.training_session --port 8765 &
    export SAGEMAKER_TRAINING_SESSION_ENDPOINT=http://127.0.0.1:8765
    export SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT=http://127.0.0.1:8765
    python -m local.examples.sdk_smoke

Creates a session on the ``local-toy-arith`` base model, samples a completion
with its logprobs, takes one PPO step (DAPO's clip bounds) that rewards that
completion, and prints how its logprob moved. Only the public SDK is used; the
two environment variables are the SDK's own endpoint overrides.
"""
from __future__ import annotations

import os
import sys
from urllib.parse import urlsplit

from sagemaker.train.training_session import ServiceClient

from local.training_session.toy.tokenizer import ToyTokenizer

REGION = os.environ.get("AWS_REGION", "us-west-2")
ACCOUNT = "123456789012"
BASE_MODEL = f"arn:aws:sagemaker:{REGION}:aws:hub-content/SageMakerPublicHub/Model/local-toy-arith/1.0.0"
ENDPOINT_VARS = ("SAGEMAKER_TRAINING_SESSION_ENDPOINT", "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT")


def main() -> int:
    missing = [v for v in ENDPOINT_VARS if not os.environ.get(v)]
    if missing:
        print(f"set {' and '.join(missing)} to the service URL (see the docstring)", file=sys.stderr)
        return 2
    if urlsplit(os.environ[ENDPOINT_VARS[0]]).hostname in ("127.0.0.1", "localhost"):
        # The local service does not check signatures, but botocore will not sign without credentials.
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")

    tok = ToyTokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Ann has 3 apples and buys 4 more. "
                                                                  "How many apples does she have?"}])
    svc = ServiceClient(
        region=REGION, role_arn=f"arn:aws:iam::{ACCOUNT}:role/LocalTrainingSessionRole",
        model_package_group_arn=f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package-group/sdk-smoke",
        s3_output_path="s3://local-training-session/sdk-smoke")
    with svc.create_lora_training_client(base_model=BASE_MODEL) as tc:
        sampler = tc.create_sampling_client()
        seq = sampler.sample(prompt, 1, {"max_tokens": 512, "temperature": 1.0}).result().sequences[0]
        print(f"sampled: {tok.decode(seq.tokens)!r} ({seq.stop_reason.value}), "
              f"logprob {sum(seq.logprobs):.4f}")

        # Per-token loss inputs cover the prompt too (weight 0 there).
        n_prompt = len(prompt) - 1
        tokens = prompt + seq.tokens
        inputs = {
            "target_tokens": tokens[1:],
            "weights": [0.0] * n_prompt + [1.0] * len(seq.tokens),
            "logprobs": [0.0] * n_prompt + seq.logprobs,
            "advantages": [0.0] * n_prompt + [1.0] * len(seq.tokens),
        }
        fb = tc.forward_backward([tokens[:-1]], "ppo", loss_fn_inputs=inputs,
                                 loss_fn_config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
        step = tc.optim_step({"learning_rate": 0.01})
        print(f"ppo metrics: {fb.result().metrics}; optimizer: {step.result().metrics}")

        trained = tc.save_weights_and_get_sampling_client(description="sdk smoke")
        after = trained.compute_logprobs(tokens).result()[len(prompt):]
        print(f"logprob of the sampled completion: {sum(seq.logprobs):.4f} -> {sum(after):.4f} "
              f"(saved as {trained.model_package_arn})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
