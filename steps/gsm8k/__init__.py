"""The task: GSM8K grade-school maths, one task of the RL core (steps/dapo/task.py).

- ``task``: the task object the entry points hand the loop: its prompt and its grader;
- ``prompt``: the instruction and the chat-templated prompt tokens;
- ``answer``: numbers in canonical form, the gold answer, the answer a completion commits to, its grade.

The rows it reads come through steps/tasks/ (the reader and the row rules every task uses), which imports this
package as one of its formats; nothing here imports steps/tasks/.
"""
