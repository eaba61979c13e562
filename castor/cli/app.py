"""The ``castor`` command line.

Every command exits 0 on success and non-zero with one line on stderr
otherwise (``castor: <code>: <message>``). Logging goes to stderr only.
A bad value at the edge — a flag, ``CASTOR_LOG_LEVEL``/``CASTOR_LOG_JSON``, a
number, an address, a socket or token path refused before a runtime starts — is
exit status 2 and nothing runs; a failure while running is 1.

Building the parser imports only the commands' option definitions; what a command runs (the
runtime, the adapters, logging, the terminal views) is imported when it runs, so ``--version``,
``--help`` and a refused flag start in a fraction of the time a command takes.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from castor.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    CliParser,
    ClosedStdout,
    Hangup,
    Terminated,
    errors_as_json,
    fail,
    log_level,
    os_error_code,
    os_error_text,
    quiet_stdout,
    reserve_standard_fds,
    stdout_reader_gone,
)
from castor.cli.demo import add_demo_subcommand
from castor.cli.inspect import add_inspect_subcommand
from castor.cli.materia import add_materia_subcommands
from castor.cli.serve import add_serve_subcommand
from castor.cli.soak import add_soak_subcommand
from castor.scaleout.options import backend_flag_problem
from castor.version import __version__


def build_parser() -> CliParser:
    parser = CliParser(
        prog="castor", description="A supervised actor runtime for materia casts and the Icarus memory bridge."
    )
    parser.add_argument("--version", action="version", version=f"castor {__version__}")
    parser.add_argument("--log-level", default=None, type=log_level,
                        help="stderr log level: TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR, CRITICAL or 0-50 "
                             "(default WARNING, env CASTOR_LOG_LEVEL)")
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line (env CASTOR_LOG_JSON=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    add_serve_subcommand(sub)
    add_inspect_subcommand(sub)
    add_demo_subcommand(sub)
    add_materia_subcommands(sub)
    add_soak_subcommand(sub)
    parser.command_parsers = dict(sub.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    closed = reserve_standard_fds()  # first: nothing castor opens may take a closed 0, 1 or 2
    for stream in (sys.stdout, sys.stderr):
        # A path or request with undecodable bytes must print (escaped), not fail the command.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    try:  # an interrupt anywhere in here, first imports included, ends the command alike
        parser = build_parser()
        args = parser.parse_args(argv)
        errors_as_json(bool(getattr(args, "json", False)))
        if 1 in closed:  # after parsing: --help and --version go to stderr then, as argparse does
            sys.stdout = ClosedStdout()
        problem = backend_flag_problem(args) or _agent_problem(args)  # before a runtime (or a cluster) starts
        if problem is not None:
            parser.command_parsers.get(args.command, parser).error(problem)
        return _run(args)
    except KeyboardInterrupt as exc:
        try:
            print("castor: interrupted", file=sys.stderr)
        except (OSError, ValueError):  # the terminal is gone (SIGHUP): the status still says why
            pass
        return 129 if isinstance(exc, Hangup) else 143 if isinstance(exc, Terminated) else 130


def _run(args: argparse.Namespace) -> int:
    """Configure logging and run the parsed command; its failures as one line and an exit status."""
    from castor.domain.paths import named_under
    from castor.logs import LogSettingError, configure_logging
    from castor.messages.errors import CastorError, StorageUnavailable

    try:
        configure_logging(args.log_level, json=args.log_json or None)
    except LogSettingError as exc:
        fail("invalid_params", str(exc))
        return EXIT_USAGE
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return int(run(args) or 0)
    except StorageUnavailable as exc:  # a file of the project named relative to it, as everywhere
        project = getattr(args, "cwd", None) or os.getcwd()
        exc = named_under(exc, (str(project), os.path.realpath(project)))
        fail(exc.code, exc.message)
    except CastorError as exc:
        fail(exc.code, exc.message)
    except BrokenPipeError as exc:
        if stdout_reader_gone():  # the reader of our output went away (`| head`): nothing more to say
            quiet_stdout()
            return EXIT_OK
        fail(os_error_code(exc), os_error_text(exc))
    except OSError as exc:
        fail(os_error_code(exc), os_error_text(exc))
    except ValueError as exc:
        fail("invalid_params", str(exc))
    return EXIT_ERROR


def _agent_problem(args: argparse.Namespace) -> str | None:
    """A malformed ``--agent`` or ``CASTOR_AGENT`` of a command that takes an agent (a usage error)."""
    if not hasattr(args, "agent"):
        return None
    import os

    from castor.adapters.agents.factory import agent_spec_problem

    flag = getattr(args, "agent", None)
    problem = agent_spec_problem(flag or os.environ.get("CASTOR_AGENT") or None)
    if problem is not None and not flag:
        problem = f"CASTOR_AGENT: {problem}"
    return problem


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
