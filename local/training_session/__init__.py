"""The local, wire-compatible training-session service, shaped like a moto backend.

Where a request goes, in order (each module imports only those below it):

- ``server``: HTTP transport and the routing tables (control plane by
  ``X-Amz-Target``, runtime by method and path from botocore's model, admin
  routes); it assembles the service: the backend, and the fault injector and the
  cost model as the backend's hooks. A runtime submit may first be throttled by the
  fault injector;
- ``faults``: fault injection from outside the backend: throttled submits, failing
  operations (it wraps each operation's run), a session that dies; and the
  service's latency;
- ``sickness``: knobs that drive the toy's sampling sick (entropy collapse, repetition
  loops, completions that never end, a dropped answer form), for the training step's
  health guards; it replaces a sampling operation's work from outside the backend;
- ``metering``: the cost model watching the backend from outside it: each costed
  session's simulated GPUs (``costs``) see its operations arrive and run, and hold
  each result back until its simulated time has passed;
- ``responses``: the wire: parse, validate (botocore's service model first, then the
  few rules the model cannot state), one backend call, and the response and error
  shapes botocore parses;
- ``models``: the backend (moto's ``models.py``): the sessions, the registry and the
  hooks, in four modules by what they model:
- ``sessions``: sessions and their operations (sequencing, idempotency, lifecycle, what
  they bill), and the hooks through which faults, costs and sickness plug in;
- ``work``: the work each operation does to the toy model, what it returns and bills;
- ``registry``: the model package registry (groups, versions, weights on disk, approval);
- ``exceptions``: the errors answered on the wire;
- ``costs``: the cost model's event simulation (processor-shared decoding, a training
  queue, fixed save costs) and its clocks, at the product's own throughput figures
  (``pipeline/throughput.py``); faults, costs and sickness are all ``settings``, set by flags,
  ``LOCAL_TS_*`` variables or an admin route;
- ``toy/``: the model behind it all, ``local-toy-arith``: tokenizer, policy,
  model maths, loss functions (one table of their rules), Adam.

``python -m local.training_session`` (``__main__``) serves it on a port and logs its
lifecycle events, refusals and injected faults on stderr.
"""
