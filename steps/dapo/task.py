"""The seam between the RL core and a task: everything the loop, sampling and evaluation ask of a dataset.

A task says how one of its examples becomes a prompt and how a completion of it is graded; the
core (``steps/dapo``) does the rest: sampling, rewards and their overlong shaping, group advantages,
datums, updates, checkpoints. It is tinker-cookbook's environment/loop split (``rl/problem_env.py``
beside ``rl/train.py``) for a single-turn problem with a rule-based grader. The entry points build
the task the config's ``task`` section names (steps/tasks/: GSM8K and the other built-in answer formats,
or the user's own object with this protocol, given as an entry point ``package.module:attr``).

The core reads two fields of an example for its reports (``predictions.jsonl``): ``question`` and
``gold``. Its answer reading comes back inside the :class:`Grade`, so the answer a prediction
reports is the one that was graded, never a second reading that could disagree with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, TypeVar


class Example(Protocol):
    """What the core reads of an example, for reports: the question asked and the reference answer."""

    @property
    def question(self) -> str: ...

    @property
    def gold(self) -> str: ...


@dataclass(frozen=True)
class Grade:
    """A task's verdict on one completion. Two readings: strict (the answer committed in the form the
    prompt instructs) and lenient (also the answer found some other way); DAPO's ``reward_format``
    says which one pays (steps/dapo/sampling.py)."""

    correct: bool  # strict: the reference answer, committed in the instructed form
    formatted: bool  # an answer was committed in the instructed form (right or wrong)
    extracted: str | None  # the answer read (the committed one when there is one), reported in predictions
    correct_unformatted: bool = False  # the reference answer, but not in the instructed form

    @property
    def correct_lenient(self) -> bool:
        return self.correct or self.correct_unformatted


ExampleT = TypeVar("ExampleT", contravariant=True)


class Task(Protocol[ExampleT]):
    """A dataset's prompts and grader. Both are pure: the core caches prompts and grades each
    completion once, in training and in evaluation alike."""

    def prompt(self, example: ExampleT, tokenizer: Any, chat_template_kwargs: Mapping[str, Any]) -> list[int]:
        """The prompt's token ids: the example as the model's chat template renders it
        (``session.chat_template_kwargs`` passed through, e.g. ``enable_thinking``);
        :func:`steps.dapo.chat.render_messages` does the rendering."""
        ...

    def grade(self, text: str, example: ExampleT) -> Grade:
        """Grade a completion's text as :func:`steps.dapo.chat.completion_text` gives it (special tokens
        kept, a reasoning block the prompt opened put back); read the answer only in its
        :func:`steps.dapo.chat.answer_region`."""
        ...
