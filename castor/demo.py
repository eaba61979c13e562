"""``castor demo``: the whole system on this machine, no network, in one process.

Each section is a small, honest scenario whose outcome is checked; the demo
exits 0 only if every check passed. Sections:

1. supervision — a small tree doing work, an injected crash and the restart,
   a retirement with its rejected queue, a mailbox snapshot.
2. casts — concurrent casts of the bundled build loop with the scripted agent
   (rework loop, utility sockets running real commands), a killed SocketActor
   whose cast recovers (see castor/demo_casts.py).
3. icarus — the worker bridge against the reference backend: retrieval,
   filtering with audit, and a worker timeout that retires the worker while
   its queued calls are rejected (see castor/demo_icarus.py).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

from castor.messages.base import LocalMessage
from castor.messages.errors import Retired
from castor.supervision import Actor, ActorSystem, ChildSpec, Strategy, faults, handles, supervisor_spec


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
        self.console.print(f"  {mark} {name}" + (f" [dim]({detail})[/dim]" if detail else ""))
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
class Square(LocalMessage, type_name="demo.square"):
    n: int


class Crash(LocalMessage, type_name="demo.crash"):
    pass


class GiveUp(LocalMessage, type_name="demo.give_up"):
    reason: str


class Squarer(Actor):
    """Squares numbers; crashes on request; retires on request."""

    @handles(Square)
    def square(self, message: Square) -> int:
        return message.n * message.n

    @handles(Crash)
    def crash(self, _message: Crash) -> None:
        raise RuntimeError("demo crash")

    @handles(GiveUp)
    def give_up(self, message: GiveUp) -> str:
        self.retire(message.reason)
        return "retiring"


def section_supervision(report: DemoReport) -> None:
    console = report.console
    console.rule("[bold]1. supervision")
    system = ActorSystem([
        supervisor_spec("math", [ChildSpec("squarer", Squarer), ChildSpec("spare", Squarer)],
                        strategy=Strategy.ONE_FOR_ONE),
    ])
    try:
        squarer = system.lookup("/root/math/squarer")
        results = [p.result() for p in [squarer.ask_pending(Square(n=n), timeout=5) for n in range(10)]]
        report.check("supervision", "a supervised actor answers 10 asks", results == [n * n for n in range(10)])

        faults.crash_next(squarer, "demo.square")
        try:
            squarer.ask(Square(n=3), timeout=5)
            crashed = False
        except Exception as exc:  # noqa: BLE001 - the injected crash is the point
            crashed = type(exc.__cause__).__name__ == "InjectedCrash"
        answer = squarer.ask(Square(n=4), timeout=5)
        report.check("supervision", "injected crash → restarted by its supervisor",
                     crashed and answer == 16 and squarer.restarts == 1,
                     f"incarnation {squarer.incarnation}, restarts {squarer.restarts}")

        retiring = squarer.ask_pending(GiveUp(reason="demo retirement"), timeout=5)
        queued = [squarer.ask_pending(Square(n=n), timeout=5) for n in range(25)]
        retiring.result()
        rejected = 0
        for pending in queued:
            try:
                pending.result()
            except Retired:
                rejected += 1
        report.check("supervision", "retirement rejects its whole queue, nothing replayed",
                     rejected == 25 and squarer.wait_exited(5) and squarer.snapshot().state == "retired",
                     f"{rejected}/25 rejected")
        fresh = squarer.ask(Square(n=5), timeout=5)
        report.check("supervision", "new demand starts a fresh incarnation", fresh == 25,
                     f"incarnation {squarer.incarnation}")

        spare = system.lookup("/root/math/spare")
        gate_open = time.monotonic()
        faults.delay_next(spare, 0.3)
        for n in range(50):
            spare.tell(Square(n=n))
        snap = spare.snapshot()
        report.check("supervision", "mailbox snapshot while busy consumes nothing",
                     snap.mailbox.depth + snap.mailbox.processed + (1 if snap.mailbox.in_flight else 0) >= 50,
                     f"depth={snap.mailbox.depth} by_type={snap.mailbox.by_type}")
        spare.ask(Square(n=0), timeout=5)
        report.check("supervision", "the delayed mailbox drains in order", time.monotonic() - gate_open >= 0.3)
        from castor.inspect_view import actor_tree

        console.print(actor_tree(system.snapshot().model_dump(mode="json")))
    finally:
        system.shutdown(10)


def _sections() -> list[tuple[str, Callable[[DemoReport, Path], None]]]:
    from castor.demo_casts import section_casts
    from castor.demo_icarus import section_icarus

    return [("casts", section_casts), ("icarus", section_icarus)]


def run_demo(*, workdir: str | None = None, quiet: bool = False) -> int:
    console = Console(stderr=False, quiet=quiet)
    report = DemoReport(console)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="castor-demo-") as tmp:
        root = Path(workdir or tmp).resolve()
        root.mkdir(parents=True, exist_ok=True)
        console.print(f"[bold]castor demo[/bold] — working in {root}")
        section_supervision(report)
        for name, section in _sections():
            try:
                section(report, root)
            except Exception as exc:  # noqa: BLE001 - a broken section fails the demo, visibly
                report.check(name, f"section {name} ran to the end", False, f"{type(exc).__name__}: {exc}")
        elapsed = time.monotonic() - started
        Console(quiet=False).print(report.table())
        verdict = "[green]all checks passed[/green]" if report.ok else "[red]some checks FAILED[/red]"
        Console(quiet=False).print(f"{verdict} in {elapsed:.1f}s")
    return 0 if report.ok else 1
