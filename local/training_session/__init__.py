"""The local, wire-compatible training-session service, shaped like a moto backend.

Where a request goes, in order:

- ``server``: HTTP transport and the routing tables (control plane by
  ``X-Amz-Target``, runtime by method and path from botocore's model, admin
  routes); runtime submits pass through ``faults.throttled``;
- ``responses``: wire handling and *all* request validation (botocore's
  service model first, then the few rules the model cannot state), the handlers
  of each operation, and the response and error shapes botocore parses;
- ``models``: the backend's state and behaviour: sessions and their operations
  (sequencing, idempotency, lifecycle), the model package registry, the request log;
- ``faults``: fault injection wrapping that dispatch (throttled submits, failing
  operations, a session that dies) and the service's latency;
- ``costs``: the optional cost model: each session's simulated GPUs (processor-shared
  decoding, a training queue, fixed save costs) and the clocks they run on; faults and
  costs are both ``settings``, set by flags, ``LOCAL_TS_*`` variables or an admin route;
- ``toy/``: the model behind it all, ``local-toy-arith``: tokenizer, policy,
  model maths, loss functions (one table of their rules), Adam.

``python -m local.training_session`` (``__main__``) serves it on a port.
"""
