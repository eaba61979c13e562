"""What the ``castor`` commands share: exit statuses, the one-line error, the argument types and
the endpoint choice (``--stdio``/``--socket``/``--tcp``).

Guarantees: every command exits 0 on success and non-zero with one line on stderr otherwise
(``castor: <code>: <message>``, control characters shown escaped), and a command asked for
``--json`` then also prints one JSON document on stdout, ``{"error": {"code": …, "message": …}}``
(a script reading stdout gets JSON whatever happened); a bad value at the edge — a
flag, a number, an address, a socket path — is refused by argparse with exit status 2 before a
runtime starts. Building a parser from these (and :mod:`castor.scaleout.options`' backend flags)
imports nothing of castor but :mod:`castor.version`, :mod:`castor.shown` and :mod:`castor.scaleout` (no pydantic,
loguru, rich, endpoint or runtime code): the
``castor`` command starts in a fresh process for every call, and ``--version``, ``--help`` and a
refused flag pay only for argparse (tests/cli/test_cli_startup.py holds this).
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import enum
import errno
import io
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn, Sequence

from castor.shown import one_line

if TYPE_CHECKING:
    from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# The endpoint's defaults (documented in docs/protocol.md "Limits"); the same numbers as
# castor.endpoint.server's, kept here so building the parser imports no endpoint code.
DEFAULT_HELLO_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 300.0
# ``castor serve --memory-return``'s default and bound: the same numbers as
# castor.ports.session_component's (tests/cli/test_cli_startup.py compares them), kept here so
# building the parser imports no port (pydantic) or supervision code.
DEFAULT_MEMORY_RETURN_S = 2.0
MAX_MEMORY_RETURN_S = 3600.0


def tcp_address(text: str) -> tuple[str, int]:
    """An address to connect to: port 1-65535."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def listen_address(text: str) -> tuple[str, int]:
    """An address to listen on (the endpoint's ``--tcp``, the console): port 0 picks a free one
    (the serving line names the one bound)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (port 0 picks a free one), got {text!r}")
    return host.strip("[]"), int(port)


def interval_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.1 <= value <= 3600:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected seconds between 0.1 and 3600, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def log_level(text: str) -> str:
    from castor.logs import LogSettingError, parse_level

    try:
        return parse_level(text)
    except LogSettingError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--log-level: ")) from None


def socket_path(text: str) -> str:
    import os

    if not text or len(os.fsencode(os.path.abspath(text))) > 107:
        raise argparse.ArgumentTypeError(f"expected a Unix socket path of at most 107 bytes, got {text[:60]!r}")
    return text


def bounded_int(low: int, high: int) -> Callable[[str], int]:
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


def timeout_or_off(text: str) -> float | None:
    """Seconds (> 0), or ``0``/``off`` for no timeout."""
    if text.strip().lower() in ("0", "off", "none"):
        return None
    return positive_seconds(text)


def add_endpoint_choice(parser: argparse.ArgumentParser, *, stdio: bool) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    if stdio:
        group.add_argument("--stdio", action="store_true", help="speak msgpack-rpc on stdin/stdout")
    group.add_argument("--socket", metavar="PATH", type=socket_path, help="a Unix socket path")
    if stdio:  # a server: it may ask for a free port, and its ready line names the port it got
        group.add_argument("--tcp", metavar="HOST:PORT", type=listen_address,
                           help="a loopback TCP address (port 0 picks a free one)")
    else:
        group.add_argument("--tcp", metavar="HOST:PORT", type=tcp_address, help="a loopback TCP address")


class CliParser(argparse.ArgumentParser):
    """argparse with the contract's one-line error (exit 2) instead of a usage block.

    An argument no parser knows is named before anything is said to be missing: argparse checks
    the required arguments (the command, a subcommand's endpoint choice) first, so ``castor
    --bogus`` said ``required: COMMAND`` and ``castor serve --bogus`` asked for an endpoint, never
    naming ``--bogus``. :meth:`parse_args` first parses with nothing required, and refuses what is
    left over; only then does it parse for real."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Each subcommand's parser by name (filled by ``castor.cli.app.build_parser``): a value
        #: refused once the line is parsed is said by its command's parser, pointing at its --help.
        self.command_parsers: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        text = f"{one_line(message)} (see {self.prog} --help)"
        _print_json_error("invalid_params", text)
        self.exit(EXIT_USAGE, f"castor: invalid_params: {text}\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]  # argparse's overloads
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        # until the arguments are parsed, a --json among them (before any "--") asks for a JSON error
        errors_as_json("--json" in argv[:argv.index("--")] if "--" in argv else "--json" in argv)
        with _nothing_required(self):
            known, extras = self.parse_known_args(argv, argparse.Namespace())
        if extras:
            named = [a for a in extras if a.startswith("-") and len(a) > 1]
            what = (f"unknown option{'s' if len(named) > 1 else ''}: {' '.join(named)}" if named
                    else f"unrecognized arguments: {' '.join(extras)}")
            command = getattr(known, "command", None)
            where = self._subparser(command) if isinstance(command, str) else None
            (where or self).error(what)
        return super().parse_args(argv, namespace)

    def _subparser(self, command: str) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, _SUBPARSERS):
                found = action.choices.get(command)
                return found if isinstance(found, argparse.ArgumentParser) else None
        return None


# argparse offers no public way to list a parser's arguments and groups; these names have been
# the same since Python 3.2 and the CLI tests exercise them on every run.
_SUBPARSERS = argparse._SubParsersAction  # noqa: SLF001 - see above


@contextlib.contextmanager
def _nothing_required(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Every argument, group and subcommand choice of ``parser`` and its subparsers optional for a
    while (put back on the way out)."""
    changed: list[Any] = []

    def walk(p: argparse.ArgumentParser) -> None:
        for group in p._mutually_exclusive_groups:  # noqa: SLF001 - see _SUBPARSERS
            if group.required:
                changed.append(group)
                group.required = False
        for action in p._actions:  # noqa: SLF001 - see _SUBPARSERS
            if action.required:
                changed.append(action)
                action.required = False
            if isinstance(action, _SUBPARSERS):
                for sub in set(action.choices.values()):
                    walk(sub)

    walk(parser)
    try:
        yield
    finally:
        for item in changed:
            item.required = True


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread of a command that shuts a runtime down cleanly."""


class Hangup(Terminated):
    """SIGHUP (a closed terminal, a dropped ssh session), handled as SIGTERM is; exit 129."""


def stop_for(signum: int) -> Terminated:
    """What a stop signal raises in the main thread: :class:`Hangup` for SIGHUP, else :class:`Terminated`."""
    import signal

    return Hangup() if signum == signal.SIGHUP else Terminated()


class _Hold(enum.Enum):
    """Where a stop signal that landed while an actor's code ran on the main thread is (:func:`_hold_stop`)."""

    NONE = "none"  #: no stop is held
    HELD = "held"  #: held while the main thread runs the actor's code; a watch thread waits for it to leave
    HANDED_BACK = "handed back"  #: the watch interrupted the main thread: its handler's next call is that stop


class _Stops:
    """The command's stop-signal state, read and changed under one lock by the signal handlers (on
    the main thread), :func:`defer_stops` and its kin, and the held stop's watch thread. The lock
    is re-entrant: a handler runs on the main thread between any two of its steps, perhaps inside a
    section of its own under the lock."""

    __slots__ = ("lock", "deferred", "pending", "saved_sigint", "hold", "held", "released", "limit_s",
                 "stopped_line")

    def __init__(self) -> None:
        self.lock = _thread.RLock()
        #: Inside defer_stops .. resume_stops: a stop is kept in ``pending`` (the first one), not raised.
        self.deferred = False
        self.pending: int | None = None
        self.saved_sigint: Any = None  # the SIGINT handler put back at the deferral's end
        self.hold = _Hold.NONE
        self.held: int | None = None  # the signal held (HELD) or handed back (HANDED_BACK)
        #: Set when the current hold ends other than by being handed back (a second stop, the
        #: deferral, the command's end): its watch thread stops at once. One per hold.
        self.released: Any = None
        #: How long a held stop waits for the actor's code to return before the command is cut
        #: loose (:func:`stopped_as_by_ctrl_c`'s ``hold_limit_s``); None: as long as it runs.
        self.limit_s: float | None = None
        #: What the command says on stderr before ``castor: interrupted`` when it is cut loose.
        self.stopped_line: str | None = None

    def end_hold(self) -> None:
        """No stop is held any longer (under the lock); the hold's watch thread ends."""
        if self.released is not None:
            self.released.set()
        self.hold, self.held, self.released = _Hold.NONE, None, None


_STOPS = _Stops()


@contextlib.contextmanager
def stopped_as_by_ctrl_c(*, hold_limit_s: float | None = None, stopped_line: str | None = None) -> Iterator[None]:
    """Inside, SIGTERM raises :class:`Terminated` and SIGHUP :class:`Hangup` in the main thread (a
    SIGHUP ignored at start, as by ``nohup``, stays ignored), as Ctrl-C raises ``KeyboardInterrupt``:
    the command's ``finally`` blocks run (its runtime shut down, its child processes stopped), it
    says ``castor: interrupted`` and exits 143 / 129. Python's default ended the process on the spot,
    silently. A second SIGTERM (or SIGHUP) ends the process as the default does (the shutdown the
    first started may hang). The handlers before are put back on the way out; off the main thread
    nothing changes.

    The first signal always counts: one that lands while an actor's code runs on the main thread
    (an inline ask's handler, an ``on_start`` run on its starter), where the actor would take it
    for its own crash (the command went on, the signal lost), is held and raised as soon as the
    main thread has left that code (:func:`_hold_stop`). That code may never return (a handler
    that hangs): a second stop while the first is held, or ``hold_limit_s`` seconds of holding it,
    cut the command loose (:func:`_cut_loose`): ``stopped_line`` (if given), a line naming the actor
    code still running, ``castor: interrupted``, and the exit status of the first stop (130 / 143 /
    129), with no shutdown (the main thread, which would run it, is the one that does not return)."""
    import signal
    import threading

    def on_stop(signum: int, frame: Any) -> None:
        with _STOPS.lock:
            if _STOPS.hold is _Hold.HANDED_BACK:  # the held stop, handed back once the actor code was left
                signum = _STOPS.held if _STOPS.held is not None else signum
                _STOPS.end_hold()
            elif _STOPS.hold is _Hold.HELD:  # a second signal while the first is held: the user insists
                first = _STOPS.held if _STOPS.held is not None else signum
                if _in_actor_code(frame):
                    _cut_loose(first, frame, "when a second stop came")
                signum = first  # the code was left before the watch saw it: the held stop is taken now
                _STOPS.end_hold()
            if _STOPS.deferred:
                if _STOPS.pending is None:
                    _STOPS.pending = signum  # raised by resume_stops()
                return
            if _in_actor_code(frame):
                _hold_stop(signum)
                return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)  # a second one ends the process as the default does
        raise stop_for(signum)

    saved: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        with _STOPS.lock:
            _STOPS.limit_s, _STOPS.stopped_line = hold_limit_s, stopped_line
        saved[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_stop)
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
            saved[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_stop)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            saved[signal.SIGINT] = signal.signal(signal.SIGINT, on_stop)
    try:
        yield
    finally:
        _end_deferral()
        with _STOPS.lock:
            _STOPS.end_hold()
            if saved:
                _STOPS.limit_s = _STOPS.stopped_line = None
        for sig, handler in saved.items():
            signal.signal(sig, handler)


_SWALLOWING = ("handle_envelope", "_actor_loop_setup")
"""The methods of castor's ``Actor`` that take any exception raised in them, ``KeyboardInterrupt``
too, for the actor's own crash (castor.supervision.actor)."""


def _actor_frame(frame: Any) -> Any:
    """The innermost frame of ``frame``'s stack (the main thread's, where a signal landed) that
    runs one of :data:`_SWALLOWING`, where a stop raised would be taken for that actor's crash;
    None when there is none."""
    actor = sys.modules.get("castor.supervision.actor")
    if actor is None:  # no actor code loaded, none running
        return None
    codes = {getattr(actor.Actor, name).__code__ for name in _SWALLOWING}
    while frame is not None:
        if frame.f_code in codes:
            return frame
        frame = frame.f_back
    return None


def _in_actor_code(frame: Any) -> bool:
    """Whether ``frame`` (the main thread's, where a signal landed) runs inside one of
    :data:`_SWALLOWING`: a stop raised there would be taken for that actor's crash."""
    return _actor_frame(frame) is not None


def _actor_code_named(frame: Any) -> str:
    """The actor code ``frame``'s stack runs (:func:`_actor_frame`), in words: ``the handler of
    TYPE in PATH`` or ``the on_start of PATH``."""
    found = _actor_frame(frame)
    if found is None:
        return "the actor code"
    try:
        this = found.f_locals.get("self")
        path = getattr(getattr(this, "handle", None), "path", None) or type(this).__name__
        if found.f_code.co_name == "handle_envelope":
            message = getattr(found.f_locals.get("envelope"), "type_name", None) or "a message"
            return f"the handler of {message} in {path}"
        return f"the on_start of {path}"
    except Exception:  # noqa: BLE001 - a frame read from another thread: the words are best effort
        return "the actor code"


HELD_STOP_POLL_S = 0.005
"""How often a held stop (:func:`_hold_stop`) looks whether the main thread has left the actor code."""


def _hold_stop(signum: int) -> None:
    """Hold stop signal ``signum`` while the main thread runs actor code (under the lock); a thread
    of its own hands it back to the main thread's handler (``_thread.interrupt_main``) once it has
    left it, and cuts the command loose (:func:`_cut_loose`) if it has not within the limit.

    Python says no thread when another leaves a frame (short of tracing every call the main thread
    makes), so the thread looks at the main thread's stack every :data:`HELD_STOP_POLL_S`; it waits
    on the hold's own event meanwhile, which the end of the hold (a second stop, the command's end)
    sets: it stops at once then."""
    import signal
    import threading
    import time

    released = threading.Event()
    _STOPS.hold, _STOPS.held, _STOPS.released = _Hold.HELD, signum, released
    limit = _STOPS.limit_s
    main = threading.main_thread()
    deadline = None if limit is None else time.monotonic() + limit

    def watch() -> None:
        while not released.wait(HELD_STOP_POLL_S) and main.is_alive():
            frame = sys._current_frames().get(main.ident or 0)  # noqa: SLF001 - the main thread's stack, read only
            with _STOPS.lock:
                if _STOPS.released is not released:  # ended meanwhile
                    return
                if frame is None or not _in_actor_code(frame):
                    _STOPS.hold = _Hold.HANDED_BACK
                    _thread.interrupt_main(signal.Signals(signum))
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    _cut_loose(signum, frame, f"for {limit:g} s after the stop")

    threading.Thread(target=watch, name="held-stop", daemon=True).start()


def _cut_loose(signum: int, frame: Any, when: str) -> NoReturn:
    """End the process now, as stopped by ``signum``, while the main thread runs the actor code of
    ``frame``'s stack that did not return (``when``: how long, or what came): the command's stopped
    line, one line saying what was cut loose, ``castor: interrupted``, exit status 128 + ``signum``."""
    lines = [_STOPS.stopped_line] if _STOPS.stopped_line else []
    lines.append(f"castor: cut loose: {_actor_code_named(frame)} was still running on the main thread {when}; "
                 "the command ends without shutting its runtime down")
    lines.append("castor: interrupted")
    try:
        sys.stderr.write("".join(f"{one_line(line)}\n" for line in lines))
        sys.stderr.flush()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a reentrant write, from inside a blocked one
        pass
    stderr_caught_up()
    os._exit(128 + signum)


@contextlib.contextmanager
def kept_when_stopped(command: str, workdir: object, *, hold_limit_s: float) -> Iterator[None]:
    """:func:`stopped_as_by_ctrl_c` for ``castor demo`` and ``castor soak``, which say, stopped before
    their end, where what they did so far is kept (``castor demo: stopped before its end; kept: DIR``).
    ``hold_limit_s``: how long a stop held while an actor's code runs on the main thread waits for
    it to return before the command is cut loose (the command's own shutdown timeout)."""
    stopped = f"castor {command}: stopped before its end; kept: {workdir}"
    try:
        with stopped_as_by_ctrl_c(hold_limit_s=hold_limit_s, stopped_line=stopped):
            yield
    except KeyboardInterrupt:
        try:
            print(stopped, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
        raise


def _defer_sigint(signum: int, _frame: Any) -> None:
    with _STOPS.lock:
        if _STOPS.pending is None:
            _STOPS.pending = signum  # raised by resume_stops() as KeyboardInterrupt


def defer_stops() -> None:
    """Inside :func:`stopped_as_by_ctrl_c`, take a SIGTERM, SIGHUP or Ctrl-C (SIGINT) that comes
    from now on only at :func:`resume_stops`: for a step that makes something the command must
    remove on its way out (a token file), between its making and the ``finally`` that removes it.
    Ctrl-C is deferred only where it would raise ``KeyboardInterrupt`` (Python's own handler, on
    the main thread); one that landed inside the step left its half-made file behind."""
    import signal
    import threading

    with _STOPS.lock:
        _STOPS.deferred = True
        if (_STOPS.saved_sigint is None and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            _STOPS.saved_sigint = signal.signal(signal.SIGINT, _defer_sigint)


def _end_deferral() -> int | None:
    """Stop deferring; the signal that came meanwhile (None if none did), not raised."""
    import signal

    with _STOPS.lock:
        saved, _STOPS.saved_sigint = _STOPS.saved_sigint, None
        if saved is not None:
            signal.signal(signal.SIGINT, saved)
        _STOPS.deferred = False  # first: a stop from now on is raised at once, not left pending unseen
        pending, _STOPS.pending = _STOPS.pending, None
        return pending


def resume_stops() -> None:
    """Stop deferring (:func:`defer_stops`), raising the signal that came meanwhile, if one did:
    ``KeyboardInterrupt`` for Ctrl-C, else :func:`stop_for`'s."""
    import signal

    pending = _end_deferral()
    if pending == signal.SIGINT:
        raise KeyboardInterrupt
    if pending is not None:
        raise stop_for(pending)


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """:func:`defer_stops` for the block, :func:`resume_stops` at its end. A block that raises ends
    the deferral and its exception goes on (the command is ending anyway; a stop signal that came
    meanwhile is dropped, not raised over it)."""
    defer_stops()
    try:
        yield
    except BaseException:
        _end_deferral()
        raise
    resume_stops()


def os_error_code(exc: OSError) -> str:
    """The stable code of a file-system error the command could not get past."""
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    if isinstance(exc, PermissionError):
        return "forbidden"
    if isinstance(exc, (FileExistsError, NotADirectoryError, IsADirectoryError)):
        return "conflict"
    return "storage_unavailable"  # full, failing, read-only...: the environment's, never "internal"


def os_error_text(exc: OSError, cwd: str | None = None) -> str:
    """A file-system error as one line users can act on: the file (relative to ``cwd`` when inside
    it; an atomic write's temporary file as the file it stood for), what the system said, and the
    errno's name -- never Python's ``[Errno 30]``."""
    import errno
    import os

    from castor.adapters.fs import shown_path

    name = errno.errorcode.get(exc.errno or -1)
    what = exc.strerror or str(exc)
    if exc.filename is None:
        return f"{what} ({name})" if name else what
    try:
        base = cwd if cwd is not None else os.getcwd()
    except OSError:  # the working directory itself is gone: the path as it is
        base = None
    return f"{shown_path(exc.filename, base)}: {what}" + (f" ({name})" if name else "")


#: The standard file descriptors (0, 1, 2) that were closed when the command started; see
#: :func:`reserve_standard_fds`.
closed_at_start: frozenset[int] = frozenset()


class ClosedStdout(io.TextIOBase):
    """``sys.stdout`` of a command started with fd 1 closed (``castor casts >&-``): what it prints
    fails as a write to a closed descriptor does (``EBADF``), so the command ends with the
    contract's one line, never a traceback and never a silent success."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")

    def isatty(self) -> bool:
        return False


def reserve_standard_fds() -> frozenset[int]:
    """Point every one of fds 0, 1 and 2 that is closed at ``/dev/null``; return which were.

    Otherwise the next file or socket castor opens takes that number: ``castor serve --stdio``
    with stdin closed read its own wake-up socket as the harness (and hung), a log line meant for
    a closed stderr could land in a client's socket or a cast's file, and a child process would
    inherit them as its stdio. Python leaves ``sys.stdout``/``sys.stderr`` ``None`` for a closed
    descriptor; stderr becomes a stream on ``/dev/null`` (logging and the one-line error work, to
    no one), stdout a :class:`ClosedStdout` once the command's arguments are parsed (``--help``
    still goes to stderr then, as argparse does without a stdout).
    """
    global closed_at_start
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)  # inheritable, as a standard descriptor is
            os.close(null)
        else:
            os.set_inheritable(fd, True)
    if 2 in closed or sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    closed_at_start = frozenset(closed)
    return closed_at_start


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader went away (``| head`` has read its fill)."""
    import select

    try:
        poller = select.poll()
        poller.register(1, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def to_devnull(fd: int) -> bool:
    """Point ``fd`` at ``/dev/null`` (for writing); False if the system refused."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        return False
    return True


def quiet_stdout() -> None:
    """After a broken pipe: point fd 1 at ``/dev/null``, so what is still buffered for stdout is
    dropped at exit instead of raising again (Python's "Exception ignored ... BrokenPipeError")."""
    to_devnull(1)


_json_errors = {"on": False}  # see errors_as_json


def errors_as_json(on: bool) -> None:
    """Whether :func:`fail` (and a refused flag) also prints the error as JSON on stdout: on for a
    command run with ``--json``, so its stdout is one valid JSON document whether it succeeded or not."""
    _json_errors["on"] = on


def _print_json_error(code: str, message: str) -> None:
    """``{"error": {"code", "message"}}`` on stdout, if ``--json`` asked for it and stdout can take it
    (non-ASCII and undecodable characters escaped: the document is ASCII, valid whatever the path)."""
    if not _json_errors["on"]:
        return
    import json

    try:
        sys.stdout.write(json.dumps({"error": {"code": code, "message": one_line(message)}}) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass  # stdout closed or its reader gone: the stderr line is the error


def fail(code: str, message: str) -> None:
    """The contract's one-line error on stderr: control characters (a newline in a loadout
    name, terminal escapes in a request) are shown escaped, never acted on. With ``--json``, the
    same error as one JSON document on stdout as well (:func:`errors_as_json`)."""
    _print_json_error(code, message)
    try:
        print(f"castor: {code}: {one_line(message)}", file=sys.stderr)
    except (OSError, ValueError):  # stderr takes nothing (closed, full): the exit status still says it failed
        pass




def private_workdir(text: str) -> str:
    """``--workdir`` of ``castor demo``/``castor soak``, made if missing and returned resolved, when
    no other user could plant a file in it: these commands write their log, projects and configs
    there by name, and run *trusted* sessions on those projects -- a ``demo.log`` another user
    linked to ``~/.bashrc`` took the log's lines, a project config they planted chose the commands
    run as castor's user. So the directory must be castor's user's own and writable by no one else,
    and every directory above it castor's user's or root's and not writable by others unless sticky
    (like ``/tmp``; whoever may rename an ancestor could swap the whole tree). Else ``forbidden``
    (exit 2, nothing written). An existing file is ``FileExistsError``, as ``mkdir`` says it."""
    from pathlib import Path

    from castor.adapters.fs import make_dirs

    path = Path(text).resolve()
    # What exists of it is checked before anything is made: a refused workdir is not left behind.
    _check_private(path, next(d for d in (path, *path.parents) if os.path.lexists(d)))
    make_dirs(path)
    _check_private(path, path)
    return str(path)


def _check_private(path: Path, start: Path) -> None:
    """``forbidden`` unless the workdir ``path`` (when ``start`` is it) is castor's user's own and
    writable by no one else, and every directory from ``start`` up castor's user's or root's and not
    writable by others unless sticky (:func:`private_workdir`)."""
    import stat

    from castor.messages.errors import Forbidden

    me = os.geteuid()
    for directory in (start, *start.parents):
        st = os.lstat(directory)
        where = "the workdir" + ("" if directory == path else f" {path} (its parent {directory})")
        shown = f" {directory}" if directory == path else ""
        if st.st_uid not in ((me,) if directory == path else (me, 0)):
            raise Forbidden(f"{where}{shown} belongs to another user, who could plant its files (a log linked "
                            "elsewhere, the configs its trusted sessions run); use a directory of your own",
                            data={"path": str(directory), "reason": "workdir_not_private"})
        writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable_by_others and (directory == path or not st.st_mode & stat.S_ISVTX):
            raise Forbidden(f"{where}{shown} is writable by other users, who could plant its files (a log linked "
                            "elsewhere, the configs its trusted sessions run); use a directory of your own",
                            data={"path": str(directory), "reason": "workdir_not_private"})


def process_frozen(pid: int) -> str | None:
    """Why the process ``pid`` runs nothing now, in words that say how it runs again, from its
    state in ``/proc/PID/stat``: stopped by a signal (``SIGSTOP``, Ctrl-Z) or held by a debugger;
    None when it runs (or sleeps, waiting as processes do) or its state cannot be read. (A process
    that exited holds no lease: its locks went with its files.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            state = stat_file.read().rpartition(b")")[2].split()[0:1]
    except (OSError, IndexError):
        return None
    if state == [b"T"]:
        return f"stopped (SIGSTOP or Ctrl-Z): it runs nothing until `kill -CONT {pid}`"
    if state == [b"t"]:
        return f"held by a debugger (stopped at a trace point): it runs nothing until the debugger lets pid {pid} go on"
    return None


#: How long a serve that stops waits for the reader of its stderr to take the last lines.
STDERR_RELAY_LAST_LINES_S = 2.0


#: How long a line printed on stdout waits for castor's stderr lines before it to be relayed.
STDERR_CATCH_UP_S = 0.5

_relay: dict[str, Callable[[], bool] | None] = {"caught_up": None}  # see relay_stderr_without_blocking


def _pipe_holds(fd: int) -> bool:
    """Whether the pipe ``fd`` reads from holds bytes (an error: it holds none that will be read)."""
    import array
    import fcntl
    import termios

    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count)
    except OSError:
        return False
    return count[0] > 0


def stderr_caught_up(timeout: float = STDERR_CATCH_UP_S) -> None:
    """Where castor relays its stderr (:func:`relay_stderr_without_blocking`), wait until what it
    has written there so far is relayed, at most ``timeout`` (a reader that stalls is not waited
    for): a line printed on stdout next then comes after the stderr lines said before it, where
    both reach one reader (``2>&1 | tee LOG``). At once where stderr is not relayed."""
    import time

    caught_up = _relay["caught_up"]
    if caught_up is None:
        return
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    deadline = time.monotonic() + timeout
    while not caught_up() and time.monotonic() < deadline:
        time.sleep(0.002)


def relay_stderr_without_blocking(*, terminal: bool = True) -> bool:
    """When fd 2 is a pipe, a socket or (``terminal``) a terminal -- what a reader drains, or not (a
    ``| less`` left paused, a log pipe that stalls, a terminal after Ctrl-S) -- put a pipe of
    castor's own in its place, written without blocking, and relay it to the real stderr on a
    thread of its own. (``castor cast`` and the resuming commands leave a terminal as it is: a user
    who pauses their terminal pauses the command's live view, as any program's, and Ctrl-C still
    ends it; a pipe that stalls must not stall the cast, nor its stop.)

    A write to a full stderr used to block every thread that logged, then every thread waiting on
    them: the serve answered nothing and no longer stopped on SIGTERM. Now a line that does not fit
    is the log's loss (the log sink drops it, counts it, and says how many went once a line fits
    again); only the relay waits for the reader. A regular file or ``/dev/null`` never blocks and
    is left as it is. The relay ends at the process's exit, once every other thread has ended
    (the serve's last lines are logged by the thread that stops it), waiting up to
    :data:`STDERR_RELAY_LAST_LINES_S` for the reader to take what it still holds. True when it
    relays."""
    import os
    import stat

    from castor.supervision.threads import start_thread

    if _relay["caught_up"] is not None:  # relayed already (a command run twice in one process)
        return True
    try:
        mode = os.fstat(2).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or terminal and os.isatty(2)):
            return False
        sys.stderr.flush()
        real = os.dup(2)
        relay_end, write_end = os.pipe()
    except (OSError, ValueError):
        return False
    os.set_blocking(write_end, False)  # castor's own pipe: no other process shares its flags
    os.dup2(write_end, 2)
    os.close(write_end)

    import select
    import threading

    in_hand = threading.Event()  # set from the moment the relay sees bytes until none is left to relay

    def relay() -> None:
        readable = select.poll()
        readable.register(relay_end, select.POLLIN)
        while True:
            readable.poll()  # before the read: what it takes is in hand before it leaves the pipe
            in_hand.set()
            chunk = os.read(relay_end, 1 << 16)
            if not chunk:
                break
            view = memoryview(chunk)
            try:
                while view:
                    view = view[os.write(real, view):]
            except OSError:  # the reader is gone: drain castor's pipe all the same
                pass
            if not _pipe_holds(relay_end):
                in_hand.clear()  # a line written since is seen by _pipe_holds in stderr_caught_up
        _relay["caught_up"] = None
        os.close(relay_end)

    def caught_up() -> bool:
        # The pipe first: bytes the relay took from it since were in hand before it took them.
        return not _pipe_holds(relay_end) and not in_hand.is_set()

    _relay["caught_up"] = caught_up

    thread = start_thread(relay, name="stderr-relay", owner="/runtime",
                          purpose="relays castor's stderr to the real one, which may not take it at once")

    def last_lines() -> None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        # fd 2 becomes /dev/null, closing castor's pipe's last end here: the relay relays what it
        # holds, reads its end, and stops. The real stderr is not put back: what Python still holds
        # for it at exit would wait on a reader that may never read again.
        if to_devnull(2):
            thread.join(STDERR_RELAY_LAST_LINES_S)

    import atexit

    atexit.register(last_lines)  # after the interpreter joined the other threads: nothing logs any more
    return True
