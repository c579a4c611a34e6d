"""The shell and Python blocks of README.md and docs/, as tests/test_docs_blocks.py runs them.

A block runs as written. An HTML comment on the line before its fence says what it needs, if anything::

    <!-- docs-test: in=jobs -->                      the folder and variables it runs in (a fixture)
    <!-- docs-test: profile=store -->                the install profile it runs in (default: the suite's)
    <!-- docs-test: skip="needs a CUDA device" -->   not run here: counted as skipped, with the reason
    <!-- docs-test: skip-lines="spark://=needs a Spark cluster" -->   the same for the lines that contain
                                                                      `spark://` (several: separated by ;)

A shell block is one check per line (each line a command, as a user types them one after the other); a
Python block is one check. Blocks of other languages (toml, sql, text) are not code and are not counted.
A small runner of polyprof's own rather than pytest-codeblocks, sybil or pytest-examples: a block here
runs in a fixture's folder and install profile and a line can be skipped with its reason, which none of
them does without a plugin of about this size.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"bash": "bash", "sh": "bash", "python": "python"}
_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*docs-test:(.*?)-->\s*$")


@dataclass
class Check:
    """One thing run: a shell line or a Python block."""

    page: str
    line: int
    language: str
    code: str
    fixture: str = "plain"
    profile: str = "suite"
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Block:
    page: str
    line: int
    language: str
    code: str
    options: dict[str, str] = field(default_factory=dict)


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, each with the directive before it."""
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name
    if page.is_symlink():  # docs/benchmarks.md -> BENCHMARKS.md: one page, counted once
        return []
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        previous = lines[i - 1] if i > 0 else ""
        directive = _DIRECTIVE.match(previous)
        options = dict(_options(directive.group(1))) if directive else {}
        found.append(Block(name, i + 2, opening.group(1), "\n".join(lines[i + 1 : j]), options))
        i = j + 1
    return found


def _options(text: str) -> list[tuple[str, str]]:
    return [tuple(part.split("=", 1)) if "=" in part else (part, "") for part in shlex.split(text)]  # type: ignore[misc]


def checks(pages: list[Path] = PAGES) -> tuple[list[Check], int]:
    """Every check of `pages`, and how many blocks were not code (toml, sql, text)."""
    out: list[Check] = []
    not_code = 0
    for page in pages:
        for block in blocks(page):
            language = RUNNABLE.get(block.language)
            if language is None:
                not_code += 1
                continue
            fixture, profile = block.options.get("in", "plain"), block.options.get("profile", "suite")
            skip = block.options.get("skip")
            skipped_lines = [tuple(p.split("=", 1)) for p in block.options.get("skip-lines", "").split(";") if "=" in p]
            if language == "python":
                out.append(Check(block.page, block.line, language, block.code, fixture, profile, skip))
                continue
            for offset, text in enumerate(block.code.splitlines()):
                command = _without_comment(text)
                if not command:
                    continue
                why = skip or next((reason for pattern, reason in skipped_lines if pattern in command), None)
                out.append(Check(block.page, block.line + offset, language, command, fixture, profile, why))
    return out, not_code


def _without_comment(line: str) -> str:
    """A shell line without its trailing `# ...` comment (a `#` inside quotes is kept)."""
    if line.lstrip().startswith("#"):
        return ""
    cut = line.find(" #")
    while cut != -1:
        head = line[:cut]
        if head.count("'") % 2 == 0 and head.count('"') % 2 == 0:
            return head.strip()
        cut = line.find(" #", cut + 1)
    return line.strip()
