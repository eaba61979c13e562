"""The command line and its docs agree on the flags: every flag ``castor … --help`` shows is
documented in README.md or docs/, and every flag the docs show on a ``castor SUBCOMMAND`` command
line is one that subcommand takes.

The parser is read as built (``castor.cli.app.build_parser``), not its help text, so a flag
added without a word in the docs, or a documented one renamed or removed, fails here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from castor.cli.app import build_parser

ROOT = Path(__file__).resolve().parents[1]
#: Every run's figures, not a reference: a flag named there describes what a past run used.
NOT_REFERENCE = {"docs/performance-log.md"}


def _docs() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in paths
            if p.relative_to(ROOT).as_posix() not in NOT_REFERENCE}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices)


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def _mentioned(flag: str, text: str) -> bool:
    return re.search(re.escape(flag) + r"(?![\w-])", text) is not None


def test_every_flag_the_help_shows_is_documented() -> None:
    docs = "\n".join(_docs().values())
    undocumented = [f"castor {name} {flag}" for name, sub in _subcommands().items() for flag in sorted(_flags(sub))
                    if not _mentioned(flag, docs)]
    undocumented += [f"castor {flag}" for flag in sorted(_flags(build_parser())) if not _mentioned(flag, docs)]
    assert not undocumented, undocumented


#: A ``castor SUBCOMMAND …`` command line: in a code span, up to its end, or a line of a code block.
COMMAND_LINE = re.compile(r"`castor ([a-z]+)((?: [^`\n]*)?)`|^(?:\$ )?castor ([a-z]+)((?: .*)?)$", re.MULTILINE)


def test_every_flag_a_documented_command_line_shows_exists() -> None:
    subcommands = _subcommands()
    global_flags = _flags(build_parser())
    unknown: list[str] = []
    for name, text in _docs().items():
        for match in COMMAND_LINE.finditer(text):
            sub = subcommands.get(match.group(1) or match.group(3))
            if sub is None:
                continue
            taken = _flags(sub) | global_flags | {"--help"}
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", match.group(2) or match.group(4) or ""):
                if flag not in taken:
                    unknown.append(f"{name}: {match.group(0)}: {flag}")
    assert not unknown, unknown
