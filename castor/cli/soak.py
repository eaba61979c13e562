"""``castor soak``: the fault-injection soak on the command line (``castor.cli`` wires it in).

::

    castor soak [--sessions N] [--casts M] [--seconds S] [--seed X] [--concurrency C]
                [--delay-ms D] [--no-icarus] [--workdir DIR] [--json]

Prints the figures (a table, or the report as JSON with ``--json``) and exits 0 only when
every must-be-zero figure is zero (see :mod:`castor.testing.soak`). The runtime's own log goes to
``<workdir>/soak.log`` unless ``--log-level`` was given (faults make actors log crashes by
design; they are evidence, not noise on the terminal). Without ``--workdir`` the run's files
go to a new ``./castor-soak-<UTC date-time>`` under the current directory. Either way the
directory is kept and its path printed (on stderr at the start, in the report at the end).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from castor.scaleout.options import SOAK_RAY_HOSTS, add_backend_flags

if TYPE_CHECKING:  # imported where the command runs: building the parser pays for none of them
    from rich.console import Console
    from rich.table import Table

    from castor.testing.soak import SoakReport

EXIT_OK, EXIT_FAILED = 0, 1
#: How long the soak's runtime waits for its actors at its shutdown (castor.testing.soak's ``shutdown(30)``).
SOAK_SHUTDOWN_TIMEOUT_S = 30.0


def add_soak_subcommand(subparsers: Any) -> None:
    soak = subparsers.add_parser("soak", help="casts and worker calls under random fault injection, then invariants")
    soak.add_argument("--sessions", type=int, default=2, help="harness sessions (default 2)")
    soak.add_argument("--casts", type=int, default=4, help="casts per session (default 4)")
    soak.add_argument("--seconds", type=float, default=20.0, help="upper bound on the fault phase (default 20)")
    soak.add_argument("--seed", type=int, default=0, help="seed of the fault schedule, delays and plans")
    soak.add_argument("--concurrency", type=int, default=3, help="casts running at once per session (default 3)")
    soak.add_argument("--delay-ms", type=int, default=150, help="max scripted agent delay per turn (default 150)")
    soak.add_argument("--no-icarus", action="store_true", help="no Icarus worker calls or worker faults")
    soak.add_argument("--workdir", help="where the run's files and log go; kept "
                                         "(default: a new ./castor-soak-<UTC date-time>)")
    soak.add_argument("--json", action="store_true", help="print the report as JSON")
    add_backend_flags(soak, hosts_default=str(SOAK_RAY_HOSTS))
    soak.set_defaults(run=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    import rich.table  # noqa: F401 - print_report's, loaded before the run rather than first after it
    from rich.console import Console

    from castor.testing.report import new_workdir
    from castor.testing.soak import SoakSettings, run_soak

    if args.workdir:
        from castor.cli.common import EXIT_USAGE, fail, private_workdir
        from castor.messages.errors import Forbidden

        try:
            workdir = Path(private_workdir(args.workdir))
        except Forbidden as exc:
            fail(exc.code, exc.message)
            return EXIT_USAGE
    else:
        workdir = new_workdir("castor-soak")
    logged_here = getattr(args, "log_level", None) is None
    if logged_here:
        from castor.logs import configure_logging

        configure_logging("INFO", sink=str(workdir / "soak.log"))
    settings = SoakSettings(sessions=args.sessions, casts=args.casts, seconds=args.seconds, seed=args.seed,
                            concurrency=args.concurrency, delay_ms_max=args.delay_ms,
                            icarus=not args.no_icarus, workdir=str(workdir), backend=args.backend,
                            ray_address=args.ray_address, ray_hosts=args.ray_hosts)
    # Piped or redirected: never wrap or cut a line (paths must survive `| cat`).
    wide = {} if sys.stdout.isatty() else {"width": 100_000, "soft_wrap": True, "no_color": True}
    console = Console(stderr=True, quiet=bool(args.json))
    print(f"castor soak: workdir {workdir}" + (f" (log {workdir / 'soak.log'})" if logged_here else ""),
          file=sys.stderr, flush=True)
    command = "castor " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "castor soak"
    from castor.cli.common import kept_when_stopped

    # SIGTERM and SIGHUP end it as Ctrl-C does: its runtimes shut down. A stop held while an actor's code
    # runs on the main thread waits for it as long as the soak's runtime waits for its actors to stop.
    with kept_when_stopped("soak", workdir, hold_limit_s=SOAK_SHUTDOWN_TIMEOUT_S):
        report = run_soak(settings, command=command, on_progress=lambda line: console.print(f"[dim]{line}[/dim]"))
    if args.json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
        sys.stdout.flush()
    else:
        from castor.console.terminal import PipeConsole

        print_report(report, PipeConsole(**wide))  # type: ignore[arg-type]  # rich's Console keywords are typed narrower than the dict built from flags
        print(f"kept: {report.workdir}")
        projects = sorted(p for p in (workdir / "projects").iterdir() if p.is_dir()) \
            if (workdir / "projects").is_dir() else []
        for project in projects:
            print(f"inspect the kept casts: castor casts --cwd {shlex.quote(str(project))}")
    return EXIT_OK if report.ok else EXIT_FAILED


def report_table(report: SoakReport) -> Table:
    from rich.table import Table

    table = Table(title=f"castor soak — {report.command} — {report.started_at}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows: list[tuple[str, Any]] = [
        ("casts planned / started", f"{report.casts_planned} / {report.casts_started}"),
        ("casts completed", report.casts_completed),
        ("casts failed / aborted (final)", f"{report.casts_failed} / {report.casts_aborted}"),
        ("casts recovered in flight (cast_recast)", report.casts_recovered_in_flight),
        ("casts failed before recast", report.casts_failed_before_recast),
        ("casts resumed by recast / then complete",
         f"{report.casts_resumed_by_recast} / {report.casts_completed_after_recast}"),
        ("faults injected", sum(report.faults.values())),
        *((f"  {kind}", n) for kind, n in report.faults.items()),
        ("utility command executions", report.utility_executions),
        ("worker calls", sum(report.worker_calls.values())),
        *((f"  {code}", n) for code, n in report.worker_calls.items()),
        ("asks made by the soak", report.asks),
        ("elapsed (s)", report.elapsed_s),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    table.add_section()
    for name, value in report.must_be_zero.model_dump().items():
        color = "green" if value == 0 else "red"
        table.add_row(f"{name.replace('_', ' ')} (must be 0)", f"[{color}]{value}[/{color}]")
    return table


def print_report(report: SoakReport, console: Console) -> None:
    console.print(report_table(report))
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    verdict = "[green]all invariants hold[/green]" if report.ok else \
        f"[red]invariants violated: {report.must_be_zero.violations()}[/red]"
    console.print(f"{verdict}  (seed {report.settings.seed}, workdir {report.workdir})")
