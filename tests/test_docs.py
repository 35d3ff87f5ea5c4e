"""The README stays a first screen, and no link in it or in docs/ points nowhere (issue 29).

- README.md has at most 150 lines, and none wider than 100 characters: prose, tables and code blocks alike
  (a code block shows what a terminal of 100 columns shows, the run's summary included).
- Every relative link of README.md and docs/*.md names a file that exists, and a ``#anchor`` names a heading
  of its target (GitHub's anchors: lower case, punctuation dropped, spaces to hyphens, ``-1`` for a repeat).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 150
MAX_WIDTH = 100
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans: a link there is an example, not a link."""
    out, fence = [], None
    for line in text.splitlines():
        marker = re.match(r"\s*(`{3,}|~{3,})", line)
        if marker and (fence is None or marker.group(1).startswith(fence)):
            fence = None if fence else marker.group(1)
            out.append("")
            continue
        out.append("" if fence else re.sub(r"(`+).*?\1", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    path, root = path.resolve(), root.resolve()
    problems = []
    for number, line in enumerate(prose(path.read_text(encoding="utf-8")).splitlines(), 1):
        for target in LINK.findall(line):
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where}: no file {dest.relative_to(root) if dest.is_relative_to(root) else dest}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: {dest.name} has no heading with the anchor #{anchor}")
    return problems


def test_the_readme_is_a_first_screen_of_at_most_150_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, more than {MAX_README_LINES}: move the depth into docs/ and link it")


def test_no_readme_line_is_wider_than_100_characters_code_blocks_included():
    wide = [f"README.md:{n}: {len(line)} characters: {line[:60]}..."
            for n, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_WIDTH]
    assert not wide, "wrap these lines (a code block must fit a 100-column terminal too):\n" + "\n".join(wide)


def test_the_readme_links_every_docs_page():
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(prose(README.read_text(encoding="utf-8")))
              if t.startswith("docs/")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_an_existing_file_and_heading(path):
    problems = broken_links(path)
    assert not problems, "\n".join(problems)


def test_the_link_check_sees_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## The cap, and stopping\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#the-cap-and-stopping) [ok](other.md#twice-1) [ok](#page)\n"
                    "[gone](missing.md) [no heading](other.md#nowhere) [ext](https://example.com/x.md)\n"
                    "```\n[in code](missing-too.md)\n```\n`[inline](missing-three.md)`\n")
    problems = broken_links(page, tmp_path)
    assert len(problems) == 2, problems
    assert "no file missing.md" in problems[0] and "#nowhere" in problems[1]


def test_slug_is_githubs():
    assert slug("1. Layout (top level)") == "1-layout-top-level"
    assert slug("What was verified offline, and what only a real account shows") == \
        "what-was-verified-offline-and-what-only-a-real-account-shows"
    assert slug("`make bench`: the loops") == "make-bench-the-loops"
    assert slug("max_steps_off_policy") == "max_steps_off_policy"


def test_the_costs_page_estimate_is_what_its_command_prints():
    """docs/costs.md's estimate of a real run is computed, not typed: its command prints the figures it quotes."""
    import subprocess
    import sys

    text = (ROOT / "docs" / "costs.md").read_text(encoding="utf-8")
    command = re.search(r"```sh\n\.venv/bin/python - <<'PY'\n(.*?)\nPY\n```\n\nIt prints:\n\n```\n(.*?)\n```",
                        text, re.S)
    assert command, "docs/costs.md lost its estimate's command or its printed figures"
    run = subprocess.run([sys.executable, "-"], input=command.group(1), capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == command.group(2).strip(), (
        "pipeline/throughput.py or budget.py changed the estimate: paste the command's output into docs/costs.md "
        "and update the README's figures\n" + run.stdout)
