"""What every command prints on a terminal: lines within 100 columns, nothing cut inside a word, a command to copy
whole on one line, and no library's advice on the way (transformers' "PyTorch was not found").

The steps' logs keep their lines whole (SageMaker's metric regexes read them); this is for a person's terminal:
`make local-run` (local/console.py), `make check-task`, `make sample`.
"""
from __future__ import annotations

import os
import re
import sys
import textwrap
from typing import Any

WIDTH = 100
#: A wrapped line's continuation: indented under its first line, a little further.
CONTINUATION = "    "
#: How a command the user may copy begins: such a line is never wrapped, whatever its width (a command broken
#: over two lines runs as two commands when pasted).
COMMANDS = ("make ", ".venv/bin/python ", "python -m ", "mlflow ui ")
#: A command inside a sentence: from its first word to the next ";", "(", ")", ", " or ". ", or the line's end.
_INLINE = re.compile(r"(?:^|(?<=\s))(?:" + "|".join(re.escape(c) for c in COMMANDS) + r")[^;()]*?(?=[;()]|, |\. |\s*$)")
_JOINED = "\x00"  # a space textwrap must not break at: inside an inline command


def whole(line: str) -> bool:
    """A line :func:`fit` leaves as it is however wide: a command to copy, or one word (a path, an ARN)."""
    stripped = line.strip()
    return stripped.startswith(COMMANDS) or " " not in stripped


def fit(text: str, width: int = WIDTH) -> list[str]:
    """``text`` (one line or several) in lines of at most ``width`` columns: each wrapped at spaces, its
    continuation lines indented under it. Nothing is cut inside a word: a word that cannot fit (a long path)
    gets a line of its own; a command to copy stays on one line (a line of its own when it begins the line,
    else moved whole to the next line)."""
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width or whole(line):
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        joined = _INLINE.sub(lambda m: m.group(0).replace(" ", _JOINED), line.lstrip())
        out += [wrapped.replace(_JOINED, " ") for wrapped in
                textwrap.wrap(joined, width=width, initial_indent=lead, subsequent_indent=lead + CONTINUATION,
                              break_long_words=False, break_on_hyphens=False)]
    return out


def say(text: str, file: Any = None) -> None:
    """``text`` printed within :data:`WIDTH` columns (:func:`fit`)."""
    print("\n".join(fit(text)), file=file or sys.stdout, flush=True)


def quiet_libraries() -> None:
    """transformers' advice ("PyTorch was not found ...": only its tokenizers are used) and INFO lines kept off
    the terminal: read from the environment when transformers is first imported, so call this before."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
