"""The local, wire-compatible training-session service (SPEC section 6).

``tokenizer`` and ``policy`` are the model behind it: a word-level tokenizer and
a small numpy policy (``local-toy-arith``) that really learns the toy arithmetic
task of :mod:`local.toy_data` by RL. The HTTP layer lives in ``server``.
"""
