"""``castor demo``: the whole system on this machine, no network, in one process.

Each section is a small, honest scenario whose outcome is checked; the demo
exits 0 only if every check passed. Sections:

1. supervision — a small tree doing work, an injected crash and the restart,
   a retirement with its rejected queue, a mailbox snapshot.
2. casts — concurrent casts of the bundled build loop with the scripted agent
   (rework loop, utility sockets running real commands), a killed SocketActor
   whose cast recovers (see castor/testing/demo_casts.py).
3. icarus — the worker bridge against the reference backend: retrieval,
   filtering with audit, and a worker timeout that retires the worker while
   its queued calls are rejected (see castor/testing/demo_icarus.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from castor.adapters.fs import make_dirs
from castor.messages.base import LocalMessage
from castor.messages.errors import Retired
from castor.supervision import Actor, ActorSystem, ChildSpec, Strategy, faults, handles, supervisor_spec
from castor.testing.report import DemoReport, make_console, new_workdir, section_header


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
    section_header(console, "1. supervision")
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
        from castor.console.terminal import actor_tree

        console.print(actor_tree(system.snapshot().model_dump(mode="json")))
    finally:
        system.shutdown(10)


def _sections() -> list[tuple[str, Callable[[DemoReport, Path], None]]]:
    from castor.testing.demo_casts import section_casts
    from castor.testing.demo_icarus import section_icarus

    return [("casts", section_casts), ("icarus", section_icarus)]


def run_demo(*, workdir: str | None = None, quiet: bool = False, log_level: str | None = None,
             log_json: bool = False) -> int:
    """Run every section in ``workdir`` (default: a new ``./castor-demo-<date-time>``), keep it,
    and end with how to look at what it left. The runtime's log (the injected crashes' ERROR
    lines and tracebacks included: they are evidence, not news) goes to ``<workdir>/demo.log``
    unless ``log_level`` asks for it on stderr."""
    from castor.logs import configure_logging

    console = make_console(quiet=quiet)
    out = make_console()
    root = Path(workdir).resolve() if workdir else new_workdir("castor-demo")
    make_dirs(root)
    log_path = root / "demo.log"
    if log_level is None:
        configure_logging("INFO", json=log_json or None, sink=str(log_path))
    report = DemoReport(console)
    started = time.monotonic()
    out.print(f"[bold]castor demo[/bold] — working in {root}")
    if log_level is None:
        out.print(f"runtime log (injected crashes and their tracebacks): {log_path}")
    section_supervision(report)
    for name, section in _sections():
        try:
            section(report, root)
        except Exception as exc:  # noqa: BLE001 - a broken section fails the demo, visibly
            report.check(name, f"section {name} ran to the end", False, failure_text(exc, root))
    elapsed = time.monotonic() - started
    out.print(report.table())
    verdict = "[green]all checks passed[/green]" if report.ok else "[red]some checks FAILED[/red]"
    out.print(f"{verdict} in {elapsed:.1f}s")
    for line in kept_run_lines(root, log_path if log_level is None else None):
        out.print(line, markup=False, highlight=False)
    return 0 if report.ok else 1


def failure_text(exc: Exception, root: Path) -> str:
    """A section's failure as castor's errors read: a castor error's code and message; a file-system
    error (the workdir's disk full, read-only) as ``storage_unavailable``, its file relative to the
    workdir and the errno's name, never Python's ``[Errno 28]``; anything else by its type."""
    import errno

    from castor.adapters.fs import shown_path
    from castor.messages.errors import CastorError

    if isinstance(exc, CastorError):
        return f"{exc.code.value}: {exc.message}"
    if isinstance(exc, OSError):
        name = errno.errorcode.get(exc.errno or -1)
        what = (exc.strerror or str(exc)) + (f" ({name})" if name else "")
        return "storage_unavailable: " + (f"{shown_path(exc.filename, root)}: {what}" if exc.filename else what)
    return f"{type(exc).__name__}: {exc}"


def kept_run_lines(root: Path, log_path: Path | None) -> list[str]:
    """What the demo left and the commands to look at it (plain text: paths are never cut)."""
    import shlex

    lines = [f"kept: {root}"]
    if log_path is not None:
        lines.append(f"log:  {log_path}")
    casts = root / "casts"
    projects = sorted(p for p in casts.iterdir() if p.is_dir()) if casts.is_dir() else []
    if projects:
        lines.append("inspect the kept casts:")
        for project in projects:
            lines.append(f"  castor casts --cwd {shlex.quote(str(project))}")
        lines.append(f"  castor status CAST_ID --cwd {shlex.quote(str(projects[0]))}")
    lines.append("watch a live runtime in the browser: castor serve --socket castor.sock "
                 "--console 127.0.0.1:8765, then open http://127.0.0.1:8765/?token=... with the "
                 "console's token (the file its serving line names)")
    return lines
