"""The RL core: DAPO as one readable loop over pure pieces, for any task.

- ``task``: what the core asks of a dataset (render a prompt, grade a completion) and the :class:`Grade`;
- ``chat``: the chat template on both sides of a sample (prompt tokens; the text a grader reads, its answer region);
- ``loop``: the loop itself, :meth:`Trainer.step` reading sample -> grade -> filter -> health -> advantages ->
  datums -> update -> save in one function; sampling ahead is when its futures are awaited;
- ``sampling``: generation batches of graded groups and their reward (with DAPO's overlong shaping), the seeded
  data order, and dynamic sampling that fills a step;
- ``batch``: group advantages, overlong masking and datums (pure functions, like tinker-cookbook's
  ``data_processing``);
- ``state``: the one frozen :class:`~steps.dapo.state.LoopState` the loop carries and the checkpoint stores,
  and the seeded data order;
- ``metrics``: one metrics dict per step, written to the log lines, ``metrics.jsonl`` and trackers;
- ``health``: a step's health figures (entropy estimate, sampler-trainer mismatch, lengths, repetition loops,
  format errors), pure functions of its rollouts, and the health guards' rules, which stop a sick run as the
  cap does (pure; their counts in the state);
- ``heldout``: accuracy on held-out questions (in training and in the EvaluateModel step): greedy answers, and
  k samples per question for pass@k and maj@k;
- ``stats``: the evaluation's statistics (Wilson intervals, the exact McNemar paired difference, pass@k, maj@k);
- ``rollouts``: the answers an evaluation shows (rollouts.jsonl, MLflow tables);
- ``curves``: curves.png from metrics.jsonl;
- ``selective``: selective rollouts (GRESO): the prompts' history and the filter on which prompts to launch;
- ``forecast``: the forecast before step 1 (pure): the base model's pass, format and keep rates on step 1's first
  generation batch, and the run's predicted tokens; no mixed group stops the run before anything trains.
"""
