"""The task: GSM8K grade-school maths.

- ``prompt``: the instruction and the chat-templated prompt tokens;
- ``answer``: numbers in canonical form, the gold answer, the answer a completion commits to;
- ``reward``: grading and DAPO's rule-based reward with overlong shaping (the only place a reward is computed);
- ``data``: streaming JSONL reading and the row rules that make an example;
- ``rules``: which rows a dataset may train on (duplicates, train/eval overlap, refusals).
"""
