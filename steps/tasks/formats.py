"""The built-in answer formats: for each, the instruction the prompt ends with, how the gold answer is
read from a row's answer field, and the strict and lenient readings of a completion.

- ``gsm8k``: GSM8K as it always was (steps/gsm8k/): gold after the final ``####``; strict ``#### N`` or
  ``\\boxed{N}``; lenient "the answer is N", then the last number.
- ``hash``: gold after the final ``####``; strict ``#### N`` only.
- ``boxed``: gold in the last ``\\boxed{...}`` of the answer (a MATH-style solution); strict ``\\boxed{X}``.
- ``answer_is``: gold after the last ``The answer is:`` (MetaMathQA-style); strict ``The answer is: X``.
- ``choice``: options in a list field, gold a letter (the whole answer field, or after ``The answer is:``);
  strict ``The answer is: B`` (or ``(B)``).
- ``number``: gold the whole answer field, a bare number (``42``, ``1,000``, ``-3.5``, ``3/4``, or a parquet or
  JSON integer), fields ``prompt``/``target`` first; GSM8K's prompt and strict ``#### N`` or ``\\boxed{N}``,
  compared as exact fractions.

Lenient readings also take any other built-in form (and, for a number, the last number). Every reading
sees only the completion's answer region: a reasoning block is never graded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from steps.gsm8k import answer as gsm8k_answer
from steps.gsm8k.prompt import INSTRUCTION as GSM8K_INSTRUCTION
from steps.tasks import answers
from steps.tasks.rows import COMMON_PAIRS

NO_FINAL_ANSWER = "no '#### <number>' final answer"
NO_NUMBER = "gold answer not a number"

BOXED_INSTRUCTION = "Solve the problem. Write the final answer in \\boxed{}."
ANSWER_IS_INSTRUCTION = 'Solve the problem. End with "The answer is:" followed by the answer.'
CHOICE_INSTRUCTION = 'Choose the correct option. End with "The answer is:" followed by its letter.'

QUESTION_ANSWER = ("question", "answer")
PROBLEM_SOLUTION = ("problem", "solution")


def prefer(*first: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """``first``, then the other common pairs (steps/tasks/rows.py) in their order."""
    return (*first, *(p for p in COMMON_PAIRS if p not in first))


@dataclass(frozen=True)
class Reading:
    """One completion read in a format: the answer committed in the instructed form, else one found otherwise."""

    committed: str | None
    found: str | None  # the lenient reading, when nothing was committed


class Format:
    """A built-in answer format. Subclasses set the class attributes and the readers."""

    name: str = ""
    instruction: str = GSM8K_INSTRUCTION
    #: The (question, answer) field pairs a file is auto-detected by, in order of preference.
    field_pairs: tuple[tuple[str, str], ...] = prefer(QUESTION_ANSWER)
    needs_choices: bool = False
    #: Whether a bare number (a parquet or JSON integer) is an answer field's value, as text is.
    takes_numbers: bool = False
    #: Why a row's gold answer cannot be read: a reason key of validation.json.
    no_gold: str = NO_FINAL_ANSWER

    def gold(self, answer_text: str, choices: Sequence[str]) -> str | None:
        """The gold answer of a row, or None when the answer field has none in this format."""
        raise NotImplementedError

    def read(self, region: str, choices: Sequence[str]) -> Reading:
        raise NotImplementedError

    def reference(self, answer_text: str, gold: str) -> str:
        """The text validation grades as a completion to check the grader against the row's gold answer:
        the answer field itself (it ends in the instructed form)."""
        return answer_text

    def same(self, extracted: str | None, gold: str) -> bool:
        return answers.same(extracted, gold)


def _lenient_any(region: str) -> str | None:
    """Any built-in form, else the region's last number."""
    for read in (answers.last_hash, answers.last_boxed, answers.last_answer_is, answers.last_said,
                 answers.last_number):
        value = read(region)
        if value is not None:
            return value
    return None


class Gsm8kFormat(Format):
    """GSM8K's own grader (steps/gsm8k/answer.py), unchanged: grading goes through it (see BuiltinTask.grade)."""

    name = "gsm8k"

    def gold(self, answer_text: str, choices: Sequence[str]) -> str | None:
        return gsm8k_answer.gold_answer(answer_text)

    def read(self, region: str, choices: Sequence[str]) -> Reading:
        committed = gsm8k_answer.committed_answer(region)
        return Reading(committed, None if committed is not None else _lenient_any(region))


class HashFormat(Format):
    name = "hash"

    def gold(self, answer_text: str, choices: Sequence[str]) -> str | None:
        return gsm8k_answer.gold_answer(answer_text)

    def read(self, region: str, choices: Sequence[str]) -> Reading:
        committed = answers.last_hash(region)
        return Reading(committed, None if committed is not None else _lenient_any(region))


class BoxedFormat(Format):
    name = "boxed"
    instruction = BOXED_INSTRUCTION
    field_pairs = prefer(PROBLEM_SOLUTION, QUESTION_ANSWER)  # MATH: the solution holds \boxed{}, `answer` may not
    no_gold = "no '\\boxed{...}' final answer"

    def gold(self, answer_text: str, choices: Sequence[str]) -> str | None:
        value = answers.last_boxed(answer_text)
        return value or None

    def read(self, region: str, choices: Sequence[str]) -> Reading:
        committed = answers.last_boxed(region)
        return Reading(committed, None if committed is not None else _lenient_any(region))


class AnswerIsFormat(Format):
    name = "answer_is"
    instruction = ANSWER_IS_INSTRUCTION
    no_gold = "no 'The answer is: ...' final answer"

    def gold(self, answer_text: str, choices: Sequence[str]) -> str | None:
        return answers.last_answer_is(answer_text)

    def read(self, region: str, choices: Sequence[str]) -> Reading:
        committed = answers.last_answer_is(region)
        return Reading(committed, None if committed is not None else _lenient_any(region))


class ChoiceFormat(Format):
    name = "choice"
    instruction = CHOICE_INSTRUCTION
    needs_choices = True
    no_gold = "no answer letter of the choices"

    def gold(self, answer_text: str, choices: Sequence[str]) -> str | None:
        n = len(choices)
        return answers.letter(answer_text, n) or answers.letter(answers.last_answer_is(answer_text), n)

    def read(self, region: str, choices: Sequence[str]) -> Reading:
        n = len(choices)
        committed = answers.letter(answers.last_answer_is(region), n)
        if committed is not None:
            return Reading(committed, None)
        found = answers.letter(answers.last_said(region), n) or answers.letter(region, n)
        if found is None:  # the text of an option, given whole
            said = answers.normalize_text(answers.last_said(region) or region)
            found = next((letter for letter, text in zip(answers.letters(n), choices)
                          if answers.normalize_text(text) == said), None)
        return Reading(None, found)

    def reference(self, answer_text: str, gold: str) -> str:
        # A bare letter ("B") is the gold but not an answer in the instructed form: say it as one.
        return answer_text if answers.last_answer_is(answer_text) else f"The answer is: {gold}"

    def same(self, extracted: str | None, gold: str) -> bool:
        return extracted is not None and extracted.upper() == gold.upper()


class NumberFormat(Format):
    """The gold answer is the whole field, a number (``42``, ``1,000``, ``-3.5``, ``3/4``: a hub dataset's bare
    target); GSM8K's prompt and readings, fractions included: strict ``#### N`` or ``\\boxed{N}``, lenient "the
    answer is N", then the last number. Compared as exact fractions (``3/4`` = ``0.75``)."""

    name = "number"
    field_pairs = prefer(("prompt", "target"), QUESTION_ANSWER)
    takes_numbers = True
    no_gold = NO_NUMBER

    def gold(self, answer_text: str, choices: Sequence[str]) -> str | None:
        return answers.number_text(answer_text)

    def read(self, region: str, choices: Sequence[str]) -> Reading:
        committed = answers.committed_number(region)
        if committed is not None:
            return Reading(committed, None)
        said = answers.last_said(region)
        found = (answers.number_text(said) or answers.last_fraction(said)) if said else None
        return Reading(None, found or answers.last_fraction(region))

    def reference(self, answer_text: str, gold: str) -> str:
        # The bare number is the gold, not an answer in the instructed form: say it as one.
        return f"#### {gold}"

    def same(self, extracted: str | None, gold: str) -> bool:
        return extracted is not None and answers.as_fraction(extracted) == answers.as_fraction(gold)


FORMATS: dict[str, Format] = {f.name: f for f in (Gsm8kFormat(), HashFormat(), BoxedFormat(), AnswerIsFormat(),
                                                  ChoiceFormat(), NumberFormat())}
