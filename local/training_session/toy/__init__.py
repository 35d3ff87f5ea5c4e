"""The toy base model ``local-toy-arith`` the local service trains and samples from.

- ``tokenizer``: its word-level tokenizer (the HF tokenizer API subset the steps use);
- ``model``: the maths of the policy (features, logits, exact gradients);
- ``losses``: the API's loss functions, one table of their rules and per-token maths;
- ``adam``: AdamW with global-norm clipping;
- ``policy``: parameters, accumulated gradient and Adam state, and the operations
  the service exposes (forward, forward_backward, optim_step, sample, logprobs).

It knows nothing of HTTP or request validation: the service validates a request
before it reaches the policy.
"""
