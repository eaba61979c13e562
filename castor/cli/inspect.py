"""``castor inspect``: the live actor tree, the casts of each session and mailboxes of a running runtime.

Views (``castor inspect --socket PATH VIEW``):

* ``actors`` — the tree; each line says what the actor does now (its activity and for how
  long), its mailbox (depth, oldest message age), incarnation, restarts and last failure.
  With ``--sort oldest|depth|age|restarts`` a flat list, worst first, instead of the tree.
* ``casts`` — per session (its label and project directory), each cast's phase, socket,
  work item, visit, what it waits on and for how long, and its age.
* ``mailbox PATH`` — one actor's mailbox in detail; ``worker`` — process and worker stats.

``--prefix PATH`` keeps the actors at or under PATH; ``--filter TEXT`` those whose path,
kind or activity contains TEXT (case-insensitive); both keep the threads listed after the actors
the same way (an owner at or under PATH; TEXT in the name, owner or purpose). ``--json`` writes the same data as JSON
with :func:`json.dumps` straight to stdout — never through the terminal renderer, so a pipe
always gets valid JSON whatever the paths' length; with ``--follow`` one JSON document per
line per refresh. Text output on a pipe is not wrapped or cut either.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from castor.cli.common import EXIT_USAGE, add_endpoint_choice, fail, interval_seconds
from castor.shown import one_line

#: Seconds each of inspect's calls waits for the runtime's answer.
CALL_TIMEOUT_S = 10.0


def add_inspect_subcommand(sub: Any) -> None:
    inspect = sub.add_parser("inspect", help="show the live actor tree and mailboxes of a running runtime")
    add_endpoint_choice(inspect, stdio=False)
    inspect.add_argument("what", nargs="?", default="actors", choices=["actors", "casts", "mailbox", "worker", "hosts"],
                         help="what to show: actors (the tree, the default), casts (each session's casts and "
                              "what they wait on), mailbox PATH (one actor's mailbox), worker (the runtime's "
                              "process; with --session-id, that session's Icarus worker), hosts (where casts run)")
    inspect.add_argument("path", nargs="?", help="actor path (for mailbox)")
    inspect.add_argument("--sort", default="path", choices=["path", "oldest", "depth", "age", "restarts"],
                         help="actors: a flat list, worst first, by oldest message age, mailbox depth, "
                              "activity age or restarts (default: the tree by path)")
    inspect.add_argument("--prefix", metavar="PATH", help="actors: only those at or under PATH")
    inspect.add_argument("--filter", metavar="TEXT",
                         help="only actors (or casts) whose path, kind, labels or activity contain TEXT")
    inspect.add_argument("--session-id", help="session whose Icarus worker to show (for worker)")
    inspect.add_argument("--follow", action="store_true", help="refresh live until interrupted")
    inspect.add_argument("--interval", type=interval_seconds, default=1.0,
                         help="seconds between refreshes with --follow (0.1 to 3600; default 1)")
    inspect.add_argument("--json", action="store_true",
                         help="print JSON (always valid, never wrapped; one document per line with --follow)")
    inspect.add_argument("--token-file", metavar="PATH", default=None,
                         help="the endpoint's token file (printed by castor serve; env CASTOR_TOKEN_FILE)")
    inspect.set_defaults(run=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    import os

    from castor.endpoint.auth import TOKEN_FILE_ENV, read_token_file
    from castor.endpoint.listeners import is_loopback_host
    from castor.messages.errors import CastorError, Forbidden, InvalidConfig, InvalidParams

    token_file = args.token_file or os.environ.get(TOKEN_FILE_ENV) or None
    # Bad flags are exit 2 before anything connects: a mailbox without its PATH; a host that is not
    # loopback (castor serve never listens off this machine, and a token travels in clear text).
    try:
        if args.what == "mailbox" and not args.path:
            raise InvalidParams("inspect mailbox needs an actor PATH (castor inspect … mailbox /root/session/ID)")
        if args.tcp and not is_loopback_host(args.tcp[0]):
            what = "send the endpoint's token to" if token_file else "connect to"
            raise Forbidden(f"refusing to {what} non-loopback host {args.tcp[0]!r}: castor serves this machine "
                            "only (use 127.0.0.1, ::1 or localhost)", data={"host": args.tcp[0]})
        if token_file:
            read_token_file(token_file)  # a bad token file is a bad flag
    except InvalidConfig as exc:
        message = exc.message
        if token_file and not os.path.lexists(token_file):
            # castor serve removes the token file it made when it stops: the serve it named is gone
            message += (" (castor serve removes its token file when it stops, and writes a new one when it starts: "
                        "use the file its 'listening on' line names now)")
        fail(exc.code, message)
        return EXIT_USAGE
    except CastorError as exc:
        fail(exc.code, exc.message)
        return EXIT_USAGE
    return run_inspect(args)


# -- the command ----------------------------------------------------------------------------
def shape(args: argparse.Namespace, data: Any) -> Any:
    """What ``--json`` prints for a view (and the text views render)."""
    from castor.console.terminal import select, select_threads, session_casts

    if args.what == "actors":
        actors = select(data.get("actors", []), prefix=args.prefix, text=args.filter, sort=args.sort)
        threads = select_threads(data.get("threads", []), prefix=args.prefix, text=args.filter)
        return {"actors": actors, "threads": threads, "sort": args.sort}
    if args.what == "casts":
        sessions = session_casts(data.get("actors", []))
        if args.filter:
            needle = args.filter.lower()
            sessions = [s for s in sessions if needle in json.dumps(s).lower()]
        return {"sessions": sessions}
    return data


def run_inspect(args: argparse.Namespace) -> int:
    from castor.console.terminal import SORT_KEYS
    from castor.messages.errors import InvalidParams

    sort = getattr(args, "sort", "path")
    if sort not in SORT_KEYS:
        raise InvalidParams(f"--sort must be one of {', '.join(SORT_KEYS)}")
    if args.what == "mailbox" and not args.path:
        raise InvalidParams("inspect mailbox needs an actor PATH")
    import os

    from castor.endpoint.auth import TOKEN_FILE_ENV

    token_file = getattr(args, "token_file", None) or os.environ.get(TOKEN_FILE_ENV) or None
    with _client_lines_quiet(args):
        return _inspect_through(args, token_file, sort)


def _inspect_through(args: argparse.Namespace, token_file: str | None, sort: str) -> int:
    """:func:`run_inspect` once the flags are checked: connect, show the view (or follow it), and
    turn what the castor answered into the command's one typed line."""
    from castor.console.terminal import (
        actor_list,
        actor_tree,
        casts_table,
        hosts_table,
        mailbox_table,
        terminal_console,
        worker_table,
    )
    from castor.endpoint.errors import ConnectionClosed
    from castor.messages.errors import MailboxFull, Timeout, Unauthenticated

    try:
        client = _connect(args, token_file)
    except MailboxFull as exc:
        raise _endpoint_full(args, exc) from None
    except Unauthenticated as exc:
        raise _token_refused(args, token_file, exc) from None
    try:
        def fetch() -> Any:
            if args.what in ("actors", "casts"):
                prefix = args.prefix if args.what == "actors" and args.prefix else ""
                return client.call("ops.actors", {"prefix": prefix}, timeout=CALL_TIMEOUT_S)
            if args.what == "mailbox":
                return client.call("ops.mailbox", {"path": args.path}, timeout=CALL_TIMEOUT_S)
            if args.what == "hosts":
                return client.call("ops.hosts", {}, timeout=CALL_TIMEOUT_S)
            return client.call("ops.worker", {"session_id": args.session_id}, timeout=CALL_TIMEOUT_S)

        if args.json:
            return _json_loop(args, fetch, lambda data, indent: _readable(
                args, lambda a, d: json.dumps(shape(a, d), indent=indent), data))
        console = terminal_console()

        def render(data: Any) -> Any:
            return _readable(args, draw, data)

        def draw(_args: argparse.Namespace, data: Any) -> Any:
            shaped = shape(args, data)
            if args.what == "actors":
                if args.sort == "path":
                    return actor_tree(shaped)
                return actor_list(shaped["actors"], args.sort)
            if args.what == "casts":
                return casts_table(shaped["sessions"])
            if args.what == "mailbox":
                return mailbox_table(shaped)
            if args.what == "hosts":
                return hosts_table(shaped)
            return worker_table(shaped)

        if not args.follow:
            console.print(render(fetch()))
            return 0
        if not console.is_terminal:
            # A pipe or a file: rich's live view draws nothing there until it stops, so `| head`
            # got nothing and never ended. Each refresh is printed whole, and flushed, instead.
            with _stop_on_ctrl_c() as stop:
                while not stop.pressed:
                    console.print(render(fetch()))
                    console.file.flush()
                    stop.wait(max(0.1, args.interval))
            return 0
        from rich.live import Live

        with _stop_on_ctrl_c() as stop, Live(render(fetch()), console=console, refresh_per_second=4) as live:
            while not stop.wait(max(0.1, args.interval)):  # a refresh period, or Ctrl-C
                live.update(render(fetch()))
        return 0
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except ConnectionClosed as exc:  # the castor went away (stopped, restarted) under the view
        reason = str((exc.data or {}).get("reason") or "")
        why = (f"it sent what castor cannot decode ({one_line(reason)[:200]}): is it a castor?"
               if reason.startswith("invalid_frame") else "it stopped, or was restarted")
        raise ConnectionClosed(f"the castor at {_where(args)} closed the connection ({why})",
                               data={**(exc.data or {}), "address": _where(args)}) from None
    except Timeout as exc:  # no answer at all (not the runtime's own timeout): which castor, how long
        if "msgid" not in (exc.data or {}):
            raise
        where = _where(args)
        method = (exc.data or {}).get("method") or "ops.actors"
        raise Timeout(f"the castor at {where} did not answer {method} within {CALL_TIMEOUT_S:.0f} s",
                      data={**(exc.data or {}), "address": where}) from None
    except MailboxFull as exc:  # refused at its first call (no token: nothing was asked before)
        raise _endpoint_full(args, exc) from None
    except Unauthenticated as exc:  # the endpoint's words name runtime.hello; say what to type here
        raise _token_refused(args, token_file, exc) from None
    finally:
        client.close()


@contextmanager
def _client_lines_quiet(args: argparse.Namespace) -> Iterator[None]:
    """The client's own warning lines off while the view runs, unless a log level below WARNING
    was asked for: each fault they tell of (a refusal's ``error`` notification, the write that
    found the connection closed) ends the command as its one typed line, and they printed before
    it as ``server reported an error: {...}`` and ``write failed: [Errno 32] Broken pipe``."""
    import os

    from loguru import logger

    from castor.logs import parse_level

    asked = getattr(args, "log_level", None) or os.environ.get("CASTOR_LOG_LEVEL") or "WARNING"
    try:
        level = parse_level(asked)
        quiet = (int(level) if level.isascii() and level.isdigit() else logger.level(level).no) >= \
            logger.level("WARNING").no
    except (ValueError, TypeError):  # (checked before the command ran: never here)
        quiet = True
    modules = ("castor.client", "castor.endpoint.connection")
    if not quiet:
        yield
        return
    for module in modules:
        logger.disable(module)
    try:
        yield
    finally:
        for module in modules:
            logger.enable(module)


def _endpoint_full(args: argparse.Namespace, exc: Any) -> Any:
    """``mailbox_full`` naming the castor and what to do: every connection it serves is taken
    (its ``--max-connections``), or it is out of file descriptors (the refusal says so)."""
    from castor.messages.errors import MailboxFull

    where = _where(args)
    limit = (exc.data or {}).get("limit")
    if isinstance(limit, int) and not isinstance(limit, bool):
        return MailboxFull(f"the castor at {where} serves its limit of {limit} connections (castor serve "
                           "--max-connections) and refused this one: close one of its clients (each castor inspect "
                           "--follow holds one) or restart it with a higher --max-connections",
                           data={**(exc.data or {}), "address": where})
    return MailboxFull(f"the castor at {where} refused this connection: {exc.message}",
                       data={**(exc.data or {}), "address": where})


def _token_refused(args: argparse.Namespace, token_file: str | None, exc: Any) -> Any:
    """``unauthenticated`` saying which token was refused and where the right one is."""
    from castor.endpoint.auth import TOKEN_FILE_ENV
    from castor.messages.errors import Unauthenticated

    where = _where(args)
    if not token_file:
        return Unauthenticated(f"{exc.message} (castor inspect: give it the endpoint's token file, printed by "
                               f"castor serve: --token-file PATH or {TOKEN_FILE_ENV}=PATH)",
                               data={**(exc.data or {}), "address": where})
    return Unauthenticated(f"the castor at {where} refused the token in {token_file} (each castor serve writes a new "
                           "token when it starts, unless given --token-file: use the file its 'listening on' line "
                           "names now)", data={**(exc.data or {}), "address": where, "token_file": token_file})


def _where(args: argparse.Namespace) -> str:
    """The address ``args`` names, as castor serve's line prints it."""
    return f"unix:{args.socket}" if args.socket else f"tcp:{args.tcp[0]}:{args.tcp[1]}"


#: The method each view asks for.
_VIEW_METHOD = {"actors": "ops.actors", "casts": "ops.actors", "mailbox": "ops.mailbox", "hosts": "ops.hosts",
                "worker": "ops.worker"}


def _readable(args: argparse.Namespace, view: Callable[[argparse.Namespace, Any], Any], data: Any) -> Any:
    """``view(args, data)``; a result of another shape than castor's (an endpoint that is not a
    castor, or another version's) is ``invalid_message`` naming the address and the method, not a
    traceback out of the view."""
    from castor.messages.errors import InvalidMessage

    try:
        return view(args, data)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as exc:
        where, method = _where(args), _VIEW_METHOD.get(args.what, "ops.actors")
        raise InvalidMessage(f"the endpoint at {where} answered {method} with a result castor inspect cannot read "
                             f"({type(exc).__name__}: {one_line(str(exc))[:200]}): is it a castor, of this version?",
                             data={"address": where, "method": method, "reason": "unreadable_result"}) from None


def _json_loop(args: argparse.Namespace, fetch: Callable[[], Any],
               dumped: Callable[[Any, int | None], str]) -> int:
    """JSON straight to stdout: one document (indented), or one per line with ``--follow``."""
    out = sys.stdout
    if not args.follow:
        out.write(dumped(fetch(), 2) + "\n")
        out.flush()
        return 0
    with _stop_on_ctrl_c() as stop:
        while not stop.pressed:
            out.write(dumped(fetch(), None) + "\n")
            out.flush()
            stop.wait(max(0.1, args.interval))  # a refresh period, or Ctrl-C
    return 0


class _CtrlC:
    """Whether Ctrl-C was pressed; see :func:`_stop_on_ctrl_c`."""

    SLICE = 0.05  # how soon a wait notices it

    def __init__(self) -> None:
        self.pressed = False

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until Ctrl-C; ``True`` if it was pressed."""
        deadline = time.monotonic() + seconds
        while not self.pressed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.SLICE, left))
        return True


@contextmanager
def _stop_on_ctrl_c() -> Iterator[_CtrlC]:
    """Ctrl-C ends a ``--follow`` loop between two refreshes, never inside a call.

    A ``KeyboardInterrupt`` raised inside the client's call would close the connection (the
    stream cannot be trusted after it: see ``Connection.close_interrupted``), and the view would
    end on a traceback instead of its last refresh, so the first Ctrl-C only marks the returned
    flag, and the loop ends after the call in progress (at most its 10 s deadline). The handler takes no lock
    (it runs on the main thread wherever that is, perhaps holding one). A second Ctrl-C raises
    at once, as usual. Off the main thread (no handler can be set there) nothing changes.
    """
    ctrl_c = _CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return

    def on_sigint(signum: int, frame: object) -> None:
        if ctrl_c.pressed:
            raise KeyboardInterrupt
        ctrl_c.pressed = True

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous)


def _quiet_broken_pipe() -> None:
    """The reader went away (``| head``): end quietly, and keep Python from complaining at exit."""
    from castor.cli.common import quiet_stdout

    quiet_stdout()


def _connect(args: Any, token_file: str | None) -> Any:
    """The client of the endpoint ``args`` names. Where nothing answers there (no socket file, a
    stale one, a closed port) the error says so, names the address and how a castor is started:
    it read ``storage_unavailable: Connection refused``, as if a disk had failed."""
    from functools import partial

    from castor.client import Client
    from castor.messages.errors import NotFound

    if args.socket:
        where, start = f"unix:{args.socket}", f"--socket {args.socket}"
        connect = partial(Client.connect_unix, args.socket, token_file=token_file)
    else:
        where, start = f"tcp:{args.tcp[0]}:{args.tcp[1]}", f"--tcp {args.tcp[0]}:{args.tcp[1]}"
        connect = partial(Client.connect_tcp, *args.tcp, token_file=token_file)
    try:
        if args.socket:
            _refuse_another_users(args.socket, where)
        return connect()
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        why = "no such socket file" if isinstance(exc, FileNotFoundError) else "connection refused"
        if args.socket and not isinstance(exc, FileNotFoundError):
            # The file is there and nothing accepts on it: a castor serve stops listening first and
            # removes its socket file last, after its sessions closed (seconds, or a hook's deadline).
            why += ("; its socket file is still there: a castor serve that is stopping (it closes its sessions "
                    "first; the log says what it waits on), or one that ended without removing it")
        raise NotFound(f"no castor is listening on {where} ({why}); is `castor serve {start}` running?",
                       data={"address": where}) from None
    except PermissionError:  # the socket file (or a directory above it) keeps this user out
        raise _another_users(where, None) from None


def _another_users(where: str, uid: int | None) -> Any:
    from castor.messages.errors import Forbidden

    whose = f" (uid {uid})" if uid is not None else ""
    return Forbidden(f"the castor at {where} is another user's{whose}: a castor serves only the user that runs it "
                     "(and root); run castor inspect as that user", data={"address": where, "uid": uid})


def _refuse_another_users(path: str, where: str) -> None:
    """A castor serves its own user and root only: any other user's connection is refused once
    accepted, and its first call then failed as ``cancelled: ... Broken pipe``, after two WARNING
    lines. The listener's user (``SO_PEERCRED``) is read from a connection made and closed first,
    so that case is one line too. So is a listener whose process the kernel shows stopped
    (``SIGSTOP``, Ctrl-Z, a debugger): the kernel accepts for it, and the view waited 10 s to say
    only that it did not answer (``timeout``, now at once, naming its pid and ``kill -CONT``)."""
    import os
    import socket
    import struct

    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:  # pragma: no cover - not Linux: the server's refusal is all there is
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5.0)
        probe.connect(path)
        try:
            pid, uid, _gid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i")))
        except OSError:
            return
    if uid != os.geteuid() and os.geteuid() != 0:
        raise _another_users(where, uid)
    from castor.cli.common import process_frozen
    from castor.messages.errors import Timeout

    frozen = process_frozen(pid) if pid > 0 else None
    if frozen is not None:  # it would not answer: say why now, not after the call's 10 s
        raise Timeout(f"the castor at {where} (pid {pid}) cannot answer: its process is {frozen}",
                      data={"address": where, "pid": pid, "frozen": frozen})
