"""``castor demo``: the whole system on this machine, no network (the scenarios are
:mod:`castor.testing.demo`'s); exit 0 only if every check passed."""

from __future__ import annotations

import argparse
from typing import Any

#: How long the demo's runtimes wait for their actors at their shutdown (castor.testing.demo's ``shutdown(10)``).
DEMO_SHUTDOWN_TIMEOUT_S = 10.0


def add_demo_subcommand(sub: Any) -> None:
    demo = sub.add_parser("demo", help="show the whole system on this machine, no network needed")
    demo.add_argument("--workdir", help="where the demo writes its projects, artifacts and log; kept "
                                         "(default: a new ./castor-demo-<UTC date-time>)")
    demo.add_argument("--quiet", action="store_true", help="no live view; print the summary only")
    demo.set_defaults(run=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from castor.cli.common import EXIT_USAGE, fail, kept_when_stopped, private_workdir
    from castor.messages.errors import Forbidden
    from castor.testing.demo import run_demo
    from castor.testing.report import new_workdir

    workdir = args.workdir
    if workdir is not None:
        try:
            workdir = private_workdir(workdir)
        except Forbidden as exc:
            fail(exc.code, exc.message)
            return EXIT_USAGE
    else:
        workdir = str(new_workdir("castor-demo"))
    # SIGTERM and SIGHUP end it as Ctrl-C does: its runtimes shut down. A stop held while an actor's code
    # runs on the main thread waits for it as long as the demo's runtimes wait for their actors to stop.
    with kept_when_stopped("demo", workdir, hold_limit_s=DEMO_SHUTDOWN_TIMEOUT_S):
        return run_demo(workdir=workdir, quiet=args.quiet, log_level=args.log_level, log_json=bool(args.log_json))
