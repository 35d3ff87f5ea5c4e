"""The task: GSM8K grade-school maths, one task of the RL core (steps/dapo/task.py).

- ``task``: the task object the entry points hand the loop: its prompt and its grader;
- ``prompt``: the instruction and the chat-templated prompt tokens;
- ``answer``: numbers in canonical form, the gold answer, the answer a completion commits to, its grade;
- ``data``: streaming JSONL reading and the row rules that make an example;
- ``rules``: which rows a dataset may train on (duplicates, train/eval overlap, refusals).
"""
