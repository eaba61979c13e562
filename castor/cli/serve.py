"""``castor serve``: the msgpack-rpc endpoint for harness plugins (stdio, a Unix socket or loopback
TCP), with the web console beside it on request.

Every flag value is checked before a runtime starts (a refused one is exit status 2); the
runtime, a scale-out backend and a generated token file are shut down or removed on the way out.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from castor.cli.common import (
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MEMORY_RETURN_S,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    MAX_MEMORY_RETURN_S,
    add_endpoint_choice,
    bounded_int,
    defer_stops,
    fail,
    listen_address,
    positive_seconds,
    relay_stderr_without_blocking,
    resume_stops,
    stops_deferred,
    timeout_or_off,
)
from castor.scaleout.options import add_backend_flags
from castor.shown import one_line

if TYPE_CHECKING:
    from castor.console.server import ConsoleServer
    from castor.runtime import RuntimeSettings

STOPPING_SESSION_CLOSE_S = 5.0
"""How long each session gets to close while castor stops and its connections are still open (a
running turn's stop is sent to its harness then); what is left is closed after the connections."""


def add_serve_subcommand(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the msgpack-rpc endpoint for harness plugins")
    add_endpoint_choice(serve, stdio=True)
    serve.add_argument("--allow-faults", action="store_true", help="enable ops.fault (tests and drills only)")
    serve.add_argument("--utility-slots", type=bounded_int(1, 256), default=4,
                       help="concurrent utility commands (default 4)")
    serve.add_argument("--max-casts-per-session", type=bounded_int(1, 10_000), default=1,
                       help="concurrent casts per session (default 1)")
    serve.add_argument("--token-file", metavar="PATH", default=None,
                       help="read the endpoint's token from PATH (a 0600 file of yours; env CASTOR_TOKEN_FILE) "
                            "instead of generating one; --tcp always needs a token")
    serve.add_argument("--require-token", action="store_true",
                       help="with --socket: require the token as --tcp does (the socket is owner-only either way)")
    serve.add_argument("--hello-timeout", type=positive_seconds, default=DEFAULT_HELLO_TIMEOUT_S,
                       metavar="SECONDS", help="close a connection that has not presented the token within SECONDS "
                                               f"(default {DEFAULT_HELLO_TIMEOUT_S:g})")
    serve.add_argument("--idle-timeout", type=timeout_or_off, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                       help="close a connection holding no session that is silent for SECONDS "
                            f"(default {DEFAULT_IDLE_TIMEOUT_S:g}; 0 or off: never)")
    serve.add_argument("--max-connections", type=bounded_int(1, 4096), default=64,
                       help="connections served at once (default 64)")
    serve.add_argument("--user-turn-timeout", type=positive_seconds, default=None, metavar="SECONDS",
                       help="withdraw a user-driven refinement turn the harness never reports within SECONDS "
                            "(default: no bound)")
    serve.add_argument("--memory-return", type=_memory_return_seconds, default=DEFAULT_MEMORY_RETURN_S,
                       metavar="SECONDS",
                       help="after a session closes, give the allocator's free pages back to the system "
                            f"(malloc_trim), at most once per SECONDS (default {DEFAULT_MEMORY_RETURN_S:g}; "
                            "0 or off: never)")
    serve.add_argument("--icarus-worker-max-deaths", type=bounded_int(1, 10_000), default=5, metavar="N",
                       help="give a session's Icarus worker up after N deaths in calls within the window; its "
                            "calls then fail at once (worker_retired, crash_loop) until the cool-down ends "
                            "(default 5)")
    serve.add_argument("--icarus-worker-death-window", type=_day_or_less, default=60.0, metavar="SECONDS",
                       help="the window those deaths are counted in (default 60)")
    serve.add_argument("--icarus-worker-cool-down", type=_day_or_less, default=60.0, metavar="SECONDS",
                       help="how long a given-up worker's calls are refused before one call tries a fresh "
                            "worker (default 60)")
    add_backend_flags(serve)
    serve.add_argument("--console", metavar="HOST:PORT", type=listen_address,
                       help="also serve the live web console and /metrics on this loopback address")
    serve.add_argument("--console-token-file", metavar="PATH",
                       help="require the token in PATH (first line, 16+ characters) on every console request")
    serve.set_defaults(run=cmd_serve)


def _day_or_less(text: str) -> float:
    """Seconds in (0, 86400]: the crash-loop window and cool-down."""
    value = positive_seconds(text)
    if value > 86_400:
        raise argparse.ArgumentTypeError(f"expected at most 86400 seconds, got {text!r}")
    return value


def _memory_return_seconds(text: str) -> float | None:
    """``--memory-return``: seconds in (0, MAX_MEMORY_RETURN_S], or ``0``/``off`` (never)."""
    value = timeout_or_off(text)
    if value is not None and value > MAX_MEMORY_RETURN_S:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_MEMORY_RETURN_S:g} seconds (or off), got {text!r}")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    from castor.cli.common import stopped_as_by_ctrl_c

    relay_stderr_without_blocking()
    # Before it listens (and once it stopped serving), SIGTERM and SIGHUP end it as Ctrl-C does, its
    # generated token files removed (Python's default killed it there and left them); while it
    # serves, the endpoint's own handlers stop it cleanly (exit 0).
    with stopped_as_by_ctrl_c():
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    import os

    from castor.endpoint.app import build_dispatcher
    from castor.endpoint.auth import TOKEN_FILE_ENV
    from castor.endpoint.connection import ConnectionSettings
    from castor.endpoint.listeners import is_loopback_host
    from castor.endpoint.server import serve
    from castor.messages.errors import CastorError, Forbidden
    from castor.runtime import Runtime
    from castor.scaleout.options import make_backend, scaleout_components

    # Every flag value is checked before a runtime starts; a refused one is a usage error (exit 2).
    try:
        if args.tcp and not is_loopback_host(args.tcp[0]):  # same rule as bind_tcp
            raise Forbidden(f"refusing to listen on non-loopback host {args.tcp[0]!r}: the castor endpoint "
                            "serves this machine only; use 127.0.0.1, ::1 or localhost", data={"host": args.tcp[0]})
        if args.console and not is_loopback_host(args.console[0]):  # same rule as ConsoleServer
            raise Forbidden(f"refusing to serve the console on non-loopback host {args.console[0]!r}: use "
                            "127.0.0.1, ::1 or localhost", data={"host": args.console[0]})
        if args.socket:
            import os

            from castor.endpoint.listeners import check_socket_dir, check_socket_path

            check_socket_dir(os.path.dirname(os.path.abspath(args.socket)))
            check_socket_path(os.path.abspath(args.socket))
        console_token = _console_token(args)
        defer_stops()  # a stop (Ctrl-C too) while its token file is made is taken in the try below, which removes it
        token, generated = _serve_token(args)  # last: nothing after it may refuse, or its file would stay
    except CastorError as exc:
        resume_stops()
        fail(exc.code, exc.message)
        return EXIT_USAGE
    backend = console = console_token_file = None
    try:
        resume_stops()
        settings = runtime_settings(args)
        # None: casts run in this process (Ray is never imported); else each cast host's runtime
        # writes the same cli.json notes as this one would (its casts' session actors run there)
        backend = make_backend(args, host_runtime={"cast_cli_note": settings.cast_cli_note,
                                                   "notes_where_resumed_casts_run": True})
        runtime = Runtime(settings, components=scaleout_components(backend), scaleout=backend)
        try:
            # A stop signal while the console's token file is made (or between its making and
            # these names) is taken after them, so the finally below removes it.
            with stops_deferred():
                console, console_token_file = _start_console(args, runtime, token=console_token or token)
        except BaseException:
            if console is not None:
                console.stop()
            runtime.shutdown(30.0)
            raise
        dispatcher = build_dispatcher(runtime)
        shown_token = generated or args.token_file or os.environ.get(TOKEN_FILE_ENV) if token else None
        try:
            serve(dispatcher, stdio=bool(args.stdio), unix_path=args.socket, tcp=args.tcp,
                  # Sessions close while their connections are open: a harness hears its turns stop.
                  # The casts a socket or TCP serve's stop leaves are said in its log (an operator
                  # stopped it); over stdio the harness that started castor has gone and tells its user.
                  on_stopping=lambda: runtime.close_sessions(STOPPING_SESSION_CLOSE_S,
                                                             say_casts_left=not args.stdio),
                  on_shutdown=lambda: runtime.shutdown(30.0), fatal=runtime.system.fatal, token=token,
                  hello_timeout=args.hello_timeout, idle_timeout=args.idle_timeout,
                  max_connections=args.max_connections,
                  # Every connection the endpoint admits can open its first session.
                  settings=ConnectionSettings(sessions_kept_for_first=args.max_connections),
                  # A closed connection's buffers go back to the kernel too, not only a session's.
                  on_connection_closed=runtime.memory_return.work_ended,
                  on_ready=lambda server: _print_ready(server, token_file=shown_token,
                                                       console_url=_console_shown(console, args,
                                                                                  console_token_file)))
        finally:
            if console is not None:
                console.stop()
            runtime.shutdown(30.0)
    finally:
        if backend is not None:
            backend.shutdown()
        from castor.endpoint.auth import remove_token_file

        for path in (generated, console_token_file):
            if path is not None:
                remove_token_file(path)
    if runtime.system.fatal.is_set():
        fail("internal", f"the runtime failed fatally ({runtime.system.fatal_error!r}); the endpoint stopped")
        return EXIT_ERROR
    return EXIT_OK


def runtime_settings(args: argparse.Namespace) -> RuntimeSettings:
    """The runtime's settings from ``castor serve``'s flags. With ``--backend ray``, each cast a
    harness starts records in its cli.json the backend flags it runs with (``backendFlags``, as
    ``castor cast --backend ray`` records them; never a token), so ``castor status`` and ``castor
    casts`` in its project name them in the command that resumes it, on the cluster; a cast it
    resumes (recast, revive, continue) gets them too, or loses those recorded when this serve runs
    on this machine (see ``RuntimeSettings.notes_where_resumed_casts_run``)."""
    from castor.cli.materia import BACKEND_FLAGS
    from castor.runtime import RuntimeSettings
    from castor.scaleout.options import backend_flags

    flags = backend_flags(args)
    return RuntimeSettings(allow_faults=args.allow_faults, utility_slots=args.utility_slots,
                           max_casts_per_session=args.max_casts_per_session,
                           user_turn_timeout_s=args.user_turn_timeout,
                           memory_return_interval_s=args.memory_return or 0.0,
                           icarus_worker_max_deaths=args.icarus_worker_max_deaths,
                           icarus_worker_death_window_s=args.icarus_worker_death_window,
                           icarus_worker_cool_down_s=args.icarus_worker_cool_down,
                           cast_cli_note={BACKEND_FLAGS: flags} if flags else {},
                           notes_where_resumed_casts_run=True)


def _serve_token(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(token, path of a generated token file to remove at exit)`` for ``castor serve``."""
    import os

    from castor.endpoint.auth import TOKEN_FILE_ENV, new_token_file, read_token_file
    from castor.messages.errors import InvalidParams

    if args.stdio:
        from castor.cli import common

        if 1 in common.closed_at_start:
            raise InvalidParams("--stdio speaks on stdout, and it is closed: start castor with stdout a pipe "
                                "to the harness")
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


def _console_token(args: argparse.Namespace) -> str | None:
    """The token of ``--console-token-file`` (None without it), read with the flags' checks: a
    missing, unsafe or malformed file fails the command (exit 2) before a runtime starts."""
    if args.console_token_file is None:
        return None
    if args.console is None:
        from castor.messages.errors import InvalidParams

        raise InvalidParams("--console-token-file needs --console HOST:PORT")
    from castor.console.server import read_token_file

    return read_token_file(args.console_token_file)


def _start_console(args: argparse.Namespace, runtime: Any, *,
                   token: str | None = None) -> tuple[ConsoleServer | None, str | None]:
    """The web console of ``--console`` and the token file castor made for it, if it made one
    (None, None without ``--console``); a bad address fails the command before anything listens.
    Its token: ``token`` (``--console-token-file``'s, else the endpoint's own where it has one:
    ``--tcp``, ``--require-token``, so one secret opens both); else a token of its own in a new
    ``0600`` file (removed at exit): a loopback port is open to every user of the machine, and the
    console shows each cast's request, its run directory and the actor tree."""
    if args.console is None:
        return None, None
    from castor.console.server import ConsoleServer

    generated = None
    if not token:
        from castor.endpoint.auth import new_token_file

        token, generated = new_token_file(label="console")
    try:
        return ConsoleServer(runtime, *args.console, token=token).start(), generated
    except BaseException:
        if generated is not None:
            from castor.endpoint.auth import remove_token_file

            remove_token_file(generated)
        raise


def _console_shown(console: ConsoleServer | None, args: argparse.Namespace, generated: str | None) -> str | None:
    if console is None:
        return None
    if args.console_token_file:
        return console.url + f" (token from {args.console_token_file})"
    if generated is not None:
        return console.url + f" (token file: {generated})"
    return console.url + " (the endpoint's token)"


def serving_line(address: Any, *, token_file: str | None, console_url: str | None) -> str:
    """The one line ``castor serve`` prints on stderr once it listens (with ``--log-json``, as the
    ``message`` of one JSON log line: :func:`_print_ready`)."""
    from castor.endpoint.server import listening_words

    return (f"castor serve: listening on {one_line(listening_words(address))}; "
            f"token file: {one_line(token_file) if token_file else '-'}; console: {console_url or '-'}")


def _print_ready(server: Any, *, token_file: str | None, console_url: str | None) -> None:
    from castor.endpoint.server import listening_words
    from castor.logs import json_log_line, logging_as_json  # here: `castor --version` imports no logging

    line = serving_line(server.address, token_file=token_file, console_url=console_url)
    if logging_as_json():  # every stderr line of a JSON log is one JSON object, this one too
        line = json_log_line(line, actor="/endpoint", listening=listening_words(server.address),
                             token_file=token_file, console=console_url)
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # stderr on a full disk (`2>>LOG`): the line is news, not what castor serves
        pass
