"""What the demo's sections share: the report of checks, a section's header, the console,
and a fresh working directory. Guarantees: a ``DemoReport`` is ok only when every check passed;
``new_workdir`` never reuses a directory. It runs nothing itself."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from castor.adapters.fs import make_dir
from castor.console.terminal import PipeConsole


@dataclass
class Check:
    section: str
    name: str
    ok: bool
    detail: str = ""


@dataclass
class DemoReport:
    console: Console
    checks: list[Check] = field(default_factory=list)

    def check(self, section: str, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(section, name, bool(ok), detail))
        mark = "[green]✓[/green]" if ok else "[red]✗[/red]"
        self.console.print(f"  {mark} {escape(name)}" + (f" [dim]({escape(detail)})[/dim]" if detail else ""))
        return bool(ok)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def table(self) -> Table:
        table = Table(title="castor demo summary")
        table.add_column("section")
        table.add_column("check")
        table.add_column("result")
        table.add_column("detail")
        for c in self.checks:
            table.add_row(c.section, c.name, "[green]ok[/green]" if c.ok else "[red]FAILED[/red]", c.detail)
        return table


# -- section 1: supervision -------------------------------------------------------


def section_header(console: Console, title: str) -> None:
    """A section title that never wraps or truncates (a rich rule would cut a long one)."""
    console.print()
    console.print(f"[bold]== {title} ==[/bold]")


def make_console(*, quiet: bool = False, file: Any = None) -> Console:
    """The demo's console. On a terminal, rich as usual; piped or redirected, no wrapping or
    truncation at all (a very wide virtual line, soft wrap), so full paths survive ``| cat``."""
    stream = file if file is not None else sys.stdout
    if getattr(stream, "isatty", lambda: False)():
        return PipeConsole(file=stream, quiet=quiet)
    return PipeConsole(file=stream, quiet=quiet, width=100_000, soft_wrap=True, no_color=True)


def new_workdir(prefix: str, parent: Path | None = None) -> Path:
    """A fresh, named directory ``<parent>/<prefix>-<UTC date-time>[-n]`` (default parent: the
    current directory); created exclusively, never reused, and kept after the run."""
    parent = (parent or Path.cwd()).resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for n in range(1, 1000):
        candidate = parent / (f"{prefix}-{stamp}" if n == 1 else f"{prefix}-{stamp}-{n}")
        try:
            make_dir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"no fresh {prefix}-{stamp}-N directory under {parent}")
