"""The ``castor`` command line.

Every command exits 0 on success and non-zero with one line on stderr
otherwise (``castor: <code>: <message>``). Logging goes to stderr only.
A bad value at the edge — a flag, ``CASTOR_LOG_LEVEL``/``CASTOR_LOG_JSON``, a
number, an address, a socket or token path refused before a runtime starts — is
exit status 2 and nothing runs; a failure while running is 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from castor.version import __version__
from castor.logs import LogSettingError, configure_logging
from castor.messages.errors import CastorError, Forbidden, InvalidParams
from castor.scaleout.options import add_backend_flags, backend_flag_problem, make_backend, scaleout_components

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# The endpoint's defaults (documented in docs/protocol.md "Limits"); the same numbers as
# castor.endpoint.server's, kept here so building the parser imports no endpoint code.
DEFAULT_HELLO_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 300.0


def _tcp_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _console_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (port 0 picks a free one), got {text!r}")
    return host.strip("[]"), int(port)


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.1 <= value <= 3600:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected seconds between 0.1 and 3600, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _log_level(text: str) -> str:
    from castor.logs import parse_level

    try:
        return parse_level(text)
    except LogSettingError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--log-level: ")) from None


def _socket_path(text: str) -> str:
    import os

    if not text or len(os.fsencode(os.path.abspath(text))) > 107:
        raise argparse.ArgumentTypeError(f"expected a Unix socket path of at most 107 bytes, got {text[:60]!r}")
    return text


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def _timeout_or_off(text: str) -> float | None:
    """Seconds (> 0), or ``0``/``off`` for no timeout."""
    if text.strip().lower() in ("0", "off", "none"):
        return None
    return _positive_seconds(text)


def _add_endpoint_choice(parser: argparse.ArgumentParser, *, stdio: bool) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    if stdio:
        group.add_argument("--stdio", action="store_true", help="speak msgpack-rpc on stdin/stdout")
    group.add_argument("--socket", metavar="PATH", type=_socket_path, help="a Unix socket path")
    group.add_argument("--tcp", metavar="HOST:PORT", type=_tcp_address, help="a loopback TCP address")


class _Parser(argparse.ArgumentParser):
    """argparse with the contract's one-line error (exit 2) instead of a usage block."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"castor: invalid_params: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="castor", description="A supervised actor runtime for materia casts and the Icarus memory bridge."
    )
    parser.add_argument("--version", action="version", version=f"castor {__version__}")
    parser.add_argument("--log-level", default=None, type=_log_level,
                        help="stderr log level: TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR, CRITICAL or 0-50 "
                             "(default WARNING, env CASTOR_LOG_LEVEL)")
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line (env CASTOR_LOG_JSON=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run the msgpack-rpc endpoint for harness plugins")
    _add_endpoint_choice(serve, stdio=True)
    serve.add_argument("--allow-faults", action="store_true", help="enable ops.fault (tests and drills only)")
    serve.add_argument("--utility-slots", type=_bounded_int(1, 256), default=4,
                       help="concurrent utility commands (default 4)")
    serve.add_argument("--max-casts-per-session", type=_bounded_int(1, 10_000), default=1,
                       help="concurrent casts per session (default 1)")
    serve.add_argument("--token-file", metavar="PATH", default=None,
                       help="read the endpoint's token from PATH (a 0600 file of yours; env CASTOR_TOKEN_FILE) "
                            "instead of generating one; --tcp always needs a token")
    serve.add_argument("--require-token", action="store_true",
                       help="with --socket: require the token as --tcp does (the socket is owner-only either way)")
    serve.add_argument("--hello-timeout", type=_positive_seconds, default=DEFAULT_HELLO_TIMEOUT_S,
                       metavar="SECONDS", help="close a connection that has not presented the token within SECONDS "
                                               f"(default {DEFAULT_HELLO_TIMEOUT_S:g})")
    serve.add_argument("--idle-timeout", type=_timeout_or_off, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                       help="close a connection holding no session that is silent for SECONDS "
                            f"(default {DEFAULT_IDLE_TIMEOUT_S:g}; 0 or off: never)")
    serve.add_argument("--max-connections", type=_bounded_int(1, 4096), default=64,
                       help="connections served at once (default 64)")
    serve.add_argument("--user-turn-timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                       help="withdraw a user-driven refinement turn the harness never reports within SECONDS "
                            "(default: no bound)")
    add_backend_flags(serve)
    serve.add_argument("--console", metavar="HOST:PORT", type=_console_address,
                       help="also serve the live web console and /metrics on this loopback address")
    serve.add_argument("--console-token-file", metavar="PATH",
                       help="require the token in PATH (first line, 16+ characters) on every console request")
    serve.set_defaults(run=_cmd_serve)

    inspect = sub.add_parser("inspect", help="show the live actor tree and mailboxes of a running runtime")
    _add_endpoint_choice(inspect, stdio=False)
    inspect.add_argument("what", nargs="?", default="actors", choices=["actors", "casts", "mailbox", "worker", "hosts"])
    inspect.add_argument("path", nargs="?", help="actor path (for mailbox)")
    inspect.add_argument("--sort", default="path", choices=["path", "oldest", "depth", "age", "restarts"],
                         help="actors: a flat list, worst first, by oldest message age, mailbox depth, "
                              "activity age or restarts (default: the tree by path)")
    inspect.add_argument("--prefix", metavar="PATH", help="actors: only those at or under PATH")
    inspect.add_argument("--filter", metavar="TEXT",
                         help="only actors (or casts) whose path, kind, labels or activity contain TEXT")
    inspect.add_argument("--session-id", help="session whose Icarus worker to show (for worker)")
    inspect.add_argument("--follow", action="store_true", help="refresh live until interrupted")
    inspect.add_argument("--interval", type=_interval, default=1.0,
                         help="seconds between refreshes with --follow (0.1 to 3600)")
    inspect.add_argument("--json", action="store_true",
                         help="print JSON (always valid, never wrapped; one document per line with --follow)")
    inspect.add_argument("--token-file", metavar="PATH", default=None,
                         help="the endpoint's token file (printed by castor serve; env CASTOR_TOKEN_FILE)")
    inspect.set_defaults(run=_cmd_inspect)

    demo = sub.add_parser("demo", help="show the whole system on this machine, no network needed")
    demo.add_argument("--workdir", help="where the demo writes its projects, artifacts and log; kept "
                                         "(default: a new ./castor-demo-<UTC date-time>)")
    demo.add_argument("--quiet", action="store_true", help="no live view; print the summary only")
    demo.set_defaults(run=_cmd_demo)

    _add_system_subcommands(sub)
    return parser


def _add_system_subcommands(sub: Any) -> None:
    from castor.cli_materia import add_materia_subcommands
    from castor.cli_soak import add_soak_subcommand

    add_materia_subcommands(sub)
    add_soak_subcommand(sub)


# -- serve ------------------------------------------------------------------------
def _cmd_serve(args: argparse.Namespace) -> int:
    import os

    from castor.endpoint.auth import TOKEN_FILE_ENV
    from castor.endpoint.app import build_dispatcher
    from castor.endpoint.server import serve
    from castor.runtime import Runtime, RuntimeSettings

    from castor.endpoint.listeners import is_loopback_host

    # Every flag value is checked before a runtime starts; a refused one is a usage error (exit 2).
    try:
        if args.tcp and not is_loopback_host(args.tcp[0]):  # same rule as bind_tcp
            raise Forbidden(f"refusing to listen on non-loopback host {args.tcp[0]!r}: the castor endpoint "
                            "serves this machine only; use 127.0.0.1, ::1 or localhost", data={"host": args.tcp[0]})
        if args.socket:
            import os

            from castor.endpoint.listeners import check_socket_dir

            check_socket_dir(os.path.dirname(os.path.abspath(args.socket)))
        token, generated = _serve_token(args)
    except CastorError as exc:
        _fail(exc.code, exc.message)
        return EXIT_USAGE
    backend = console = None
    try:
        backend = make_backend(args)  # None: casts run in this process (Ray is never imported)
        runtime = Runtime(RuntimeSettings(allow_faults=args.allow_faults, utility_slots=args.utility_slots,
                                          max_casts_per_session=args.max_casts_per_session,
                                          user_turn_timeout_s=args.user_turn_timeout),
                          components=scaleout_components(backend), scaleout=backend)
        console = _start_console(args, runtime, endpoint_token=token)
        dispatcher = build_dispatcher(runtime)
        shown_token = generated or args.token_file or os.environ.get(TOKEN_FILE_ENV) if token else None
        try:
            serve(dispatcher, stdio=bool(args.stdio), unix_path=args.socket, tcp=args.tcp,
                  on_shutdown=lambda: runtime.shutdown(30.0), fatal=runtime.system.fatal, token=token,
                  hello_timeout=args.hello_timeout, idle_timeout=args.idle_timeout,
                  max_connections=args.max_connections,
                  on_ready=lambda server: _print_ready(server, token_file=shown_token,
                                                       console_url=_console_shown(console, args)))
        finally:
            if console is not None:
                console.stop()
            runtime.shutdown(30.0)
    finally:
        if backend is not None:
            backend.shutdown()
        if generated is not None:
            from castor.endpoint.auth import remove_token_file

            remove_token_file(generated)
    if runtime.system.fatal.is_set():
        _fail("internal", f"the runtime failed fatally ({runtime.system.fatal_error!r}); the endpoint stopped")
        return EXIT_ERROR
    return EXIT_OK


def _serve_token(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(token, path of a generated token file to remove at exit)`` for ``castor serve``."""
    import os

    from castor.endpoint.auth import TOKEN_FILE_ENV, new_token_file, read_token_file

    if args.stdio:
        if args.token_file or args.require_token:
            raise InvalidParams("--stdio trusts the process that started it: --token-file and --require-token "
                                "are for --socket and --tcp")
        return None, None
    if args.socket and not args.require_token:
        if args.token_file:
            raise InvalidParams("--token-file with --socket needs --require-token")
        return None, None
    path = args.token_file or os.environ.get(TOKEN_FILE_ENV) or None
    if path:
        return read_token_file(path), None
    token, generated = new_token_file()  # its path is in the one line serve prints once it listens
    return token, generated


def _start_console(args: argparse.Namespace, runtime: Any, *, endpoint_token: str | None = None) -> Any:
    """The web console of ``--console`` (None without it); a bad address or token file fails the
    command before anything listens. Its token: ``--console-token-file``'s, else the endpoint's
    own where it has one (``--tcp``, ``--require-token``), so one secret opens both."""
    if args.console is None:
        if args.console_token_file:
            raise InvalidParams("--console-token-file needs --console HOST:PORT")
        return None
    from castor.console.server import ConsoleServer, read_token_file

    token = read_token_file(args.console_token_file) if args.console_token_file else endpoint_token
    try:
        return ConsoleServer(runtime, *args.console, token=token).start()
    except BaseException:
        runtime.shutdown(30.0)
        raise


def _console_shown(console: Any, args: argparse.Namespace) -> str | None:
    if console is None:
        return None
    if args.console_token_file:
        return console.url + f" (token from {args.console_token_file})"
    return console.url + (" (the endpoint's token)" if console.token else "")


def serving_line(address: Any, *, token_file: str | None, console_url: str | None) -> str:
    """The one line ``castor serve`` prints on stderr once it listens."""
    if address is None:
        where = "stdio"
    elif isinstance(address, str):
        where = f"unix:{address}"
    else:
        host, port = address[0], address[1]
        where = f"tcp:[{host}]:{port}" if ":" in str(host) else f"tcp:{host}:{port}"
    return (f"castor serve: listening on {one_line(where)}; token file: {one_line(token_file) if token_file else '-'}; "
            f"console: {console_url or '-'}")


def _print_ready(server: Any, *, token_file: str | None, console_url: str | None) -> None:
    print(serving_line(server.address, token_file=token_file, console_url=console_url), file=sys.stderr, flush=True)


# -- inspect ----------------------------------------------------------------------
def _cmd_inspect(args: argparse.Namespace) -> int:
    import os

    from castor.endpoint.auth import TOKEN_FILE_ENV, read_token_file
    from castor.inspect_view import run_inspect

    token_file = args.token_file or os.environ.get(TOKEN_FILE_ENV) or None
    if token_file:
        try:
            read_token_file(token_file)  # a bad token file is a bad flag: exit 2 before connecting
        except CastorError as exc:
            _fail(exc.code, exc.message)
            return EXIT_USAGE
    return run_inspect(args)


# -- demo -------------------------------------------------------------------------
def _cmd_demo(args: argparse.Namespace) -> int:
    from castor.demo import run_demo

    return run_demo(workdir=args.workdir, quiet=args.quiet, log_level=args.log_level, log_json=bool(args.log_json))


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # A path or request with undecodable bytes must print (escaped), not fail the command.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = backend_flag_problem(args) or _agent_problem(args)  # before a runtime (or a cluster) starts
    if problem is not None:
        parser.error(problem)
    try:
        configure_logging(args.log_level, json=args.log_json or None)
    except LogSettingError as exc:
        _fail("invalid_params", str(exc))
        return EXIT_USAGE
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return int(run(args) or 0)
    except CastorError as exc:
        _fail(exc.code, exc.message)
    except KeyboardInterrupt as exc:
        print("castor: interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except OSError as exc:
        _fail(_os_error_code(exc), str(exc))
    except ValueError as exc:
        _fail("invalid_params", str(exc))
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread of a command that shuts a runtime down cleanly."""


def _os_error_code(exc: OSError) -> str:
    """The stable code of a file-system error the command could not get past."""
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    if isinstance(exc, PermissionError):
        return "forbidden"
    if isinstance(exc, (FileExistsError, NotADirectoryError, IsADirectoryError)):
        return "conflict"
    return "storage_unavailable"  # full, failing, read-only...: the environment's, never "internal"


def _fail(code: str, message: str) -> None:
    """The contract's one-line error on stderr: control characters (a newline in a loadout
    name, terminal escapes in a request) are shown escaped, never acted on."""
    print(f"castor: {code}: {one_line(message)}", file=sys.stderr)


def one_line(text: str) -> str:
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for ch in text)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
