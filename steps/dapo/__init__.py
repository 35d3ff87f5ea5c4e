"""The RL core: DAPO as one readable loop over pure pieces.

- ``loop``: the loop itself (sample, filter, update, checkpoint, evaluate);
- ``sampling``: generation batches of graded groups, and dynamic sampling that fills a step;
- ``batch``: group advantages, overlong masking and datums (pure functions, like tinker-cookbook's
  ``data_processing``);
- ``state``: the one frozen :class:`~steps.dapo.state.LoopState` the loop carries and the checkpoint stores,
  and the seeded data order;
- ``metrics``: one metrics dict per step, written to the log lines, ``metrics.jsonl`` and trackers;
- ``heldout``: greedy accuracy on held-out questions (in training and in the EvaluateModel step).
"""
