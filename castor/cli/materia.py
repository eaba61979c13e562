"""The materia commands of the ``castor`` CLI (``castor.cli`` wires them in).

| command | what it does |
|---|---|
| ``castor cast REQUEST [--loadout N] [--config P] [--agent SPEC] [--cwd D]`` | runs a cast in an in-process runtime with a standalone harness (the agent adapter, a JSONL session log, a console UI) and shows live progress; exit 0 when it completes |
| ``castor casts [--cwd D] [--limit N] [--cursor C] [--json]`` | lists the casts under the artifact root, newest first, one page (default 50) from the cast index; the last line (or ``next_cursor`` in ``--json``) names the next page |
| ``castor status [CAST_ID] [--cwd D]`` | one cast's persisted status (no CAST_ID: the newest cast still going, else the newest cast) |
| ``castor recast [CAST_ID] [--agent SPEC] [--cwd D]`` / ``castor revive [CAST_ID] ...`` | resumes a persisted cast in this new process and runs it to the end; with no CAST_ID, the newest cast it can resume (recast: failed, aborted, interrupted or orphaned; revive: exhausted same-socket recovery), as an id-less ``/materia recast`` / ``revive`` picks |
| ``castor continue [CAST_ID] [--agent SPEC] [--cwd D]`` | goes on with an active cast: an interrupted one re-runs its turn, a paused one finalizes, an orphaned one redoes its lost work; then runs it to the end |
| ``castor abort [CAST_ID] [--cwd D]`` | ends an active cast (no CAST_ID: the newest one) ``aborted`` (recastable); a cast another runtime holds (another ``castor cast``, a ``castor serve``) is asked to abort and the command waits for it (:data:`ABORT_WAIT_S`); two aborts of one cast take turns (:data:`ABORT_LOCK`): one says aborted, the other already aborted |
| ``castor grid [--loadout N] [--config P] [--cwd D]`` | the resolved graph as text |
| ``castor loadout [NAME] [--cwd D]`` | show the loadouts, or persist ``activeLoadout`` |
| ``castor validate CONFIG_PATH [--cwd D]`` | every problem of the config a cast in D would run with CONFIG_PATH (the same layers; CONFIG_PATH in its own place if it is the profile's or the project's file, else as ``--config``), each on its own line; exit 1 if any |

``--agent`` is ``script:FILE`` or ``openai:BASE_URL[#MODEL]``; it defaults to ``$CASTOR_AGENT``.
``castor cast`` records a ``script:`` agent (a data file, never an executable) in
``<runDir>/cli.json`` (before the cast's first save) so ``castor recast`` can replay it, with the
backend flags of the command that last ran the cast (:data:`BACKEND_FLAGS`: ``castor status`` and
``castor casts`` name them in their resume hints); an
``openai:`` agent is never read back from the project tree (a checkout must not choose where prompts are sent) and has to be
given again. A multi-turn socket has no user to refine with here: the CLI finalizes it at once.

``CAST_ID`` everywhere is the exact id, ``latest`` (the newest cast) or a unique prefix of one (left
out, the cast the id-less ``/materia`` command would take: :data:`IDLESS_HELP`); an
ambiguous prefix is ``invalid_params`` listing the candidates. Every message names ``castor``
commands (a cast started in Pi names ``/materia`` ones there).

Exit codes: 0 success; 1 a failed, aborted or interrupted cast or any error (one line on stderr:
``castor: <code>: <message>``).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from castor.ports.cli_note import CAST_BACKEND_FLAGS
from castor.scaleout.options import add_backend_flags, backend_flags

# What a command runs (the runtime, the cast storage, the typed errors) is imported inside it:
# building the parser, ``--help`` and a refused flag import none of it.

EXIT_OK, EXIT_FAILED = 0, 1
CLI_SESSION = "cli"
POLL_S = 0.1
TERMINAL = {"complete", "failed", "aborted"}
#: ``castor abort`` of a cast another process runs: the request it leaves in the cast's run
#: directory (the runtime that holds the cast -- a ``castor cast`` / ``recast`` / ``continue``, a
#: ``castor serve``, one a harness embeds -- takes it: castor.adapters.materia.abort_requests), and
#: how long it waits for that runtime to abort.
ABORT_WAIT_S = 5.0
#: Two ``castor abort`` of one cast take turns on this lock file of its run directory
#: (:func:`_one_abort_at_a_time`); the second waits this long for the first (which may itself wait
#: :data:`ABORT_WAIT_S` for another process, after building a runtime).
ABORT_LOCK = "abort.lock"
ABORT_LOCK_WAIT_S = 3 * ABORT_WAIT_S
#: ``castor cast``'s mark in the cli.json of the cast it starts (its pid and start time): a command
#: interrupted before its start verb answered finds by it the cast it made, to name it.
STARTED_BY = "startedBy"
#: Where the cast last ran, in its cli.json: the backend flags of the command that ran it
#: (``--backend ray`` and its ``--ray-address``/``--ray-hosts``; never a token, which Ray reads from
#: its environment), absent for this machine. ``castor status`` and ``castor casts`` add them to the
#: commands their hints name, so a cast that ran on the cluster is resumed there.
BACKEND_FLAGS = CAST_BACKEND_FLAGS
#: How long closing a standalone runtime waits for the verb in flight (each is bounded by its ask deadline).
CLOSE_WAIT_S = 15.0
CAST_ID_HELP = "a cast id, a unique prefix of one, or latest"
#: The cast a command given no CAST_ID acts on (as the id-less ``/materia`` command picks it).
IDLESS_HELP = {"recast": "the newest failed, aborted, interrupted or orphaned cast",
               "revive": "the newest cast whose same-socket recovery was exhausted",
               "continue": "the newest active cast", "abort": "the newest active cast"}
#: The statuses of a cast that is still going (a runtime holds it, or it waits to be continued).
GOING = frozenset({"active", "awaiting_refinement", "interrupted", "orphaned"})
#: pi-materia's name for ``--config`` (its Pi flag): accepted everywhere ``--config`` is.
CONFIG_ALIASES = ("--materia-config",)

SCRIPT_HELP = """\
agents:
  --agent script:FILE     replay answers from FILE (JSON or JSONL); no model is called
  --agent openai:URL[#M]  an OpenAI-compatible /v1/chat/completions endpoint (model M)

the scripted agent's FILE (a regular file of at most 16 MiB; a FIFO or a device
is refused): a list of answers, or an object of lists keyed
SOCKET[/ITEM[/VISIT]] ("*": any turn). An answer is a string, or an object
  {"text", "stop_reason", "error", "usage", "delay_ms",
   "socket", "item", "visit", "mode", "key"}
where socket / item (a work item key) / visit (from 1) / mode (normal,
refinement, finalization) / key ("SOCKET[/ITEM[/VISIT]]") say which turns it
belongs to. A turn gets the first unused answer that belongs to it, those naming
more of these fields first, then in file order; so a cast recast in a new
process finds the answers of the turns it resumes at. "stop_reason": "aborted"
plays the user's Esc (the cast is interrupted; castor continue ID re-runs it).
A complete example for the bundled build loadout (planner, then a builder and a
reviewer per work item):

  [
    {"key": "Socket-3", "text": "{\\"workItems\\": [{\\"id\\": \\"w1\\", \\"title\\": \\"Parser\\"}, {\\"id\\": \\"w2\\", \\"title\\": \\"CLI\\"}]}"},
    {"key": "Socket-4/w1", "text": "Built the parser."},
    {"key": "Socket-5/w1", "text": "{\\"satisfied\\": true}"},
    {"key": "Socket-4/w2", "text": "Built the CLI.", "usage": {"input_tokens": 120, "output_tokens": 40}},
    {"key": "Socket-5/w2", "text": "{\\"satisfied\\": true}"},
    "Summary: parser and CLI built."
  ]
"""  # noqa: E501 - the example file is printed as is, one JSON answer a line, as docs/materia.md shows it


def _storage_faults_typed(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A cast command whose own read or write of the project's casts meets a storage fault (full,
    read-only, not permitted: ``EACCES`` on a run directory or its lease file) ends with the code the
    store and the endpoint's verbs give the same condition, ``storage_unavailable`` (``errno``,
    ``path``), never the generic ``forbidden`` an ``OSError`` of another command gets. Its line
    names the command to type again once the storage is fixed, unless it names one already."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        from castor.adapters.fs import is_storage_fault, storage_unavailable
        from castor.messages.errors import StorageUnavailable

        try:
            return command(args)
        except StorageUnavailable as exc:  # a verb's own (a lease file on a read-only mount)
            raise _with_the_command_again(exc, args) from None
        except OSError as exc:
            if not is_storage_fault(exc):
                raise
            raise _with_the_command_again(storage_unavailable(exc, action=f"run castor {args.command}"),
                                          args) from None

    return run


def _with_the_command_again(error: Any, args: argparse.Namespace) -> Any:
    """``error`` (a ``StorageUnavailable``) of a command on one cast (status, abort, recast...) saying
    what to type once the storage is fixed (space freed, the mount writable again, the permission
    given): ``castor VERB CAST_ID`` (its ``--cwd`` too); unchanged for another command, or when its
    message names a castor command already."""
    import shlex

    from castor.messages.errors import StorageUnavailable

    if "`castor " in error.message or not hasattr(args, "cast_id"):
        return error
    again = ["castor", args.command, *([args.cast_id] if args.cast_id else [])]
    if getattr(args, "cwd", None):
        again += ["--cwd", args.cwd]
    typed = " ".join(shlex.quote(part) for part in again)
    return StorageUnavailable(f"{error.message}; once the storage is fixed, `{typed}` again",
                              data=dict(error.data or {}))


# --------------------------------------------------------------------------- argparse
def add_materia_subcommands(subparsers: Any) -> None:
    """Declare the materia subcommands on the ``castor`` parser's subparsers."""
    cast = subparsers.add_parser("cast", help="run a materia cast for REQUEST", epilog=SCRIPT_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    cast.add_argument("request", metavar="REQUEST", help="what the cast should do")
    cast.add_argument("--loadout", metavar="NAME", help="loadout to run (default: activeLoadout)")
    cast.add_argument("--config", *CONFIG_ALIASES, dest="config", metavar="PATH", type=_a_path,
                      help="explicit config layer (beats $MATERIA_CONFIG)")
    _add_agent(cast)
    _add_cwd(cast)
    cast.add_argument("--quiet", action="store_true", help="no live progress; print the outcome only")
    add_backend_flags(cast)
    cast.set_defaults(run=cmd_cast)

    casts = subparsers.add_parser("casts", help="list the casts of a project")
    _add_config(casts)
    _add_cwd(casts)
    casts.add_argument("--json", action="store_true", help="print JSON (the rows; with --cursor or --limit, "
                       "{casts, next_cursor, total})")
    casts.add_argument("--limit", type=_page_size, default=None, metavar="N",
                       help="casts per page, 1..1000 (default 50)")
    casts.add_argument("--cursor", default=None, metavar="C", help="the next_cursor of the page before")
    casts.set_defaults(run=cmd_casts)

    status = subparsers.add_parser("status", help="show one cast's status")
    status.add_argument("cast_id", metavar="CAST_ID", nargs="?", default=None,
                        help=f"{CAST_ID_HELP} (default: the newest active cast, else the newest cast)")
    _add_config(status)
    _add_cwd(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=cmd_status)

    for name, func, text in (("recast", "cmd_recast", "resume a failed, aborted, interrupted or orphaned cast"),
                             ("revive", "cmd_revive", "lift exhausted same-socket recovery and resume"),
                             ("continue", "cmd_continue", "go on with an active cast: re-run an interrupted "
                                                          "turn, finalize a paused socket, redo lost work")):
        parser = subparsers.add_parser(name, help=text)
        # id-less, as the /materia commands: the newest cast the verb can act on
        parser.add_argument("cast_id", metavar="CAST_ID", nargs="?", default=None,
                            help=f"{CAST_ID_HELP} (default: {IDLESS_HELP[name]})")
        _add_agent(parser)
        _add_config(parser)
        _add_cwd(parser)
        parser.add_argument("--quiet", action="store_true", help="no live progress")
        add_backend_flags(parser)
        parser.set_defaults(run=globals()[func])

    abort = subparsers.add_parser("abort", help="end an active cast aborted (recastable)")
    abort.add_argument("cast_id", metavar="CAST_ID", nargs="?", default=None,
                       help=f"{CAST_ID_HELP} (default: {IDLESS_HELP['abort']})")
    _add_config(abort)
    _add_cwd(abort)
    abort.set_defaults(run=cmd_abort)

    grid = subparsers.add_parser("grid", help="render the resolved loadout graph")
    grid.add_argument("--loadout", metavar="NAME")
    grid.add_argument("--config", *CONFIG_ALIASES, dest="config", metavar="PATH", type=_a_path)
    _add_cwd(grid)
    grid.set_defaults(run=cmd_grid)

    loadout = subparsers.add_parser("loadout", help="show loadouts, or set the active one")
    loadout.add_argument("name", metavar="NAME", nargs="?")
    loadout.add_argument("--config", *CONFIG_ALIASES, dest="config", metavar="PATH", type=_a_path)
    _add_cwd(loadout)
    loadout.set_defaults(run=cmd_loadout)

    validate = subparsers.add_parser(
        "validate", help="validate a materia config file as a cast here would run it",
        description="Check the config a cast in the project directory (--cwd, default the current one) "
                    "would run with CONFIG_PATH: the same "
                    "layers, lowest first -- the bundled default, the profile's materia.json "
                    "($PI_MATERIA_PROFILE_DIR, else ~/.config/pi/pi-materia), the project's .pi/pi-materia.json "
                    "and $MATERIA_CONFIG; CONFIG_PATH stays in its own place when it is the profile's or the "
                    "project's file, and is otherwise the explicit layer above the project's (as --config "
                    "CONFIG_PATH, which takes the place of $MATERIA_CONFIG); a relative CONFIG_PATH is read "
                    "from the project directory, as castor cast --cwd DIR --config CONFIG_PATH reads it. "
                    "A problem names the file it is in. Exit 1 on any error; warnings alone exit 0.")
    validate.add_argument("config_path", metavar="CONFIG_PATH")
    _add_cwd(validate)
    validate.set_defaults(run=cmd_validate)


def _add_agent(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", metavar="SPEC",
                        help="script:FILE or openai:BASE_URL[#MODEL] (default $CASTOR_AGENT)")


def _a_path(text: str) -> str:
    """A ``--config``/``--cwd`` value: an empty one is refused (a script passing an unset ``$CFG``
    ran on ``$MATERIA_CONFIG``, the project's config or the current directory, without a word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (leave the flag out for the default)")
    return text


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", *CONFIG_ALIASES, dest="config", metavar="PATH", default=None, type=_a_path,
                        help="the explicit config layer the cast was started with, if its artifactDir differs "
                             "(beats $MATERIA_CONFIG)")


def _add_cwd(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cwd", metavar="DIR", default=None, type=_a_path,
                        help="project directory (default: the current one)")


def _cwd(args: argparse.Namespace) -> Path:
    cwd = Path(getattr(args, "cwd", None) or os.getcwd()).resolve()
    if not cwd.is_dir():
        from castor.messages.errors import NotFound

        raise NotFound(f"--cwd {cwd} is not a directory", data={"cwd": str(cwd)})
    return cwd


def _project_flags(args: argparse.Namespace) -> str:
    """What a command this one advises must add to find the same casts, quoted for a shell: `` --cwd
    DIR`` when the project is not the current directory, `` --config PATH`` when one was named (read
    from the project, as this command read it). ``castor abort ID`` alone, typed where the operator
    typed ``castor status ID --cwd DIR``, answered ``not_found``."""
    import shlex

    flags = []
    cwd = _cwd(args)
    if cwd != Path(os.getcwd()).resolve():
        flags += ["--cwd", str(cwd)]
    if getattr(args, "config", None):
        flags += ["--config", str(args.config)]
    return "".join(f" {shlex.quote(flag)}" for flag in flags)


def _out(text: str) -> None:
    """Print ``text``; control characters from cast data (a request with terminal escapes) are
    shown escaped, line breaks kept (a name that may hold one goes through :func:`_name` first)."""
    from castor.cli.common import stderr_caught_up
    from castor.shown import lines_kept

    stderr_caught_up()  # the notices said before this line come before it (2>&1)
    shown = lines_kept(text)
    sys.stdout.write(shown + ("\n" if not shown.endswith("\n") else ""))
    sys.stdout.flush()


def _name(value: Any) -> str:
    """A name a config or a cast chose (a loadout, a socket, a materia, a work item) as
    it is printed: every control character escaped, line breaks included -- :func:`_out` keeps the
    breaks of the text it prints, so a loadout named ``"a\\nFAKE LINE"`` would print a line of its own."""
    from castor.shown import one_line

    return one_line(str(value))


#: The names in a cast's view (``status``) and listing row (``casts``) that a config, a model or a
#: project's saved state chose; their texts print them escaped (:func:`_name`).
_CHOSEN_FIELDS = ("loadout", "current_socket", "current_materia", "item_label", "item_key")


def _shown(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with its chosen names (and the socket names of its visit counts) escaped for printing."""
    shown = {k: _name(v) if k in _CHOSEN_FIELDS and isinstance(v, str) else v for k, v in view.items()}
    if isinstance(view.get("visits"), dict):
        shown["visits"] = {_name(k): v for k, v in view["visits"].items()}
    return shown


# --------------------------------------------------------------------------- a standalone runtime
def _refuse_a_path_not_utf8(project: Path) -> None:
    """A cast's state, events and manifest hold its paths as UTF-8 JSON, so no cast runs in a
    project directory whose path is not UTF-8: ``invalid_params`` (``data.reason:
    path_not_utf8``) naming the directory, the first byte that is not, and the rename that lets a
    cast run there -- before anything starts (the start verb answered Python's "'utf-8' codec
    can't encode ..." naming neither). What only reads the project (``castor casts``, ``status``,
    ``validate``) still works there."""
    raw = os.fsencode(project)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        from castor.messages.errors import InvalidParams
        from castor.shown import one_line

        shown = one_line(str(project))  # the byte escaped (\udcff)
        raise InvalidParams(f"the project directory {shown} is not UTF-8 (byte 0x{raw[exc.start]:02x} at "
                            f"{exc.start}), and a cast's state records its paths as UTF-8: rename it (or the "
                            "directory above it) to UTF-8 text, then run the command again there",
                            data={"reason": "path_not_utf8", "cwd": shown}) from None


class _HeldNotices:
    """The printer of a CLI run's notices (the ``[info]`` / ``[warning]`` lines of its
    :class:`~castor.adapters.stderr_ui.StderrUi`), holding them until :meth:`release`: a cast's
    first effects run on its own thread once its start is saved, so a quick cast's first notices
    (a config warning, even "cast complete") came before the command's ``cast ID started`` line,
    which it prints once the start is answered. The command releases them once it has printed that
    line; :meth:`release` is called again on every way out, so nothing held is lost. The start is
    not delayed: only the printing of what it says."""

    def __init__(self, printer: Callable[[str], None] | None = None) -> None:
        import threading

        self._printer = printer
        self._lock = threading.Lock()
        self._held: list[str] | None = []

    def __call__(self, line: str) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(line)
                return
            self._print(line)

    def release(self) -> None:
        """Print what is held, in order, then every line as it comes (a second call does nothing)."""
        with self._lock:
            held, self._held = self._held, None
            for line in held or ():
                try:
                    self._print(line)
                except Exception:  # noqa: BLE001 - as StderrUi's own writes: a broken stderr fails nothing
                    pass

    def _print(self, line: str) -> None:
        if self._printer is not None:
            self._printer(line)
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


class _Standalone:
    """An in-process Runtime with one trusted session and a standalone harness link.

    The runtime is built, and every verb runs, on one worker thread; the main thread only waits
    for each in turn. A signal's exception (Ctrl-C's ``KeyboardInterrupt``, SIGTERM's
    ``Terminated``) is raised in the main thread, so it lands in that wait -- never inside actor
    code (a session verb and a cast's first incarnation run on the thread that asks, and an
    interrupt there was an actor crash: restarted, the cast ran on and the command exited 0),
    nor inside a first import (pydantic wraps an interrupt taken while it builds a model's schema
    into a ``SchemaError``). :meth:`close` shuts the runtime down at once (a verb in flight then
    fails as its actors stop; one interrupted while the runtime is built is let finish first):
    the cast stays resumable.
    """

    def __init__(self, cwd: Path, agent_spec: str | None, *, config_path: str | None = None,
                 printer: Any = None, need_agent: bool = True, backend: Any = None) -> None:
        # What the main thread needs while a cast runs is imported here, before _StopSignals arms
        # SIGTERM (rich and the cast storage: for _watch and _progress, not used below): a signal
        # that arrives while the main thread is inside a first import can make the handler raise
        # in importlib's module-lock callback, where Python ignores the exception and the SIGTERM
        # is lost.
        from concurrent.futures import Future, ThreadPoolExecutor

        import rich.console  # noqa: F401
        import rich.live  # noqa: F401
        import rich.table  # noqa: F401

        import castor.adapters.materia.storage  # noqa: F401

        _refuse_a_path_not_utf8(cwd)
        self.agent: Any = None
        self.runtime: Any = None
        self.ui: Any = None
        #: The run's notices, held until the command has printed its first line (:class:`_HeldNotices`).
        self.notices = _HeldNotices(printer)
        self.backend = backend  # castor.scaleout's RayBackend, or None: casts run in this process
        self.began_at = time.time()  # the mark of the cast a castor cast starts (STARTED_BY)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="castor-cli-runtime")
        self._in_flight: Future[Any] | None = None
        self._closed = False
        self._signals = _StopSignals()
        try:
            self._on_worker(self._build, cwd, agent_spec, config_path, self.notices, need_agent)
        except BaseException:
            self.close()
            raise

    def _build(self, cwd: Path, agent_spec: str | None, config_path: str | None, printer: Any,
               need_agent: bool) -> None:
        from castor.adapters.agents.factory import make_agent
        from castor.adapters.session_jsonl import JsonlSessionLog
        from castor.adapters.stderr_ui import StderrUi
        from castor.messages.errors import InvalidParams
        from castor.ports.host_context import NoHostContext
        from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo
        from castor.scaleout.options import materia_component_for

        if not agent_spec and need_agent:
            raise InvalidParams("no agent: pass --agent script:FILE or --agent openai:BASE_URL[#MODEL] "
                                "(or set CASTOR_AGENT)", data={"reason": "no_agent"})
        self.agent = make_agent(agent_spec) if agent_spec else None
        self.ui = StderrUi(printer)
        self.runtime = Runtime(RuntimeSettings(), components=[materia_component_for(self.backend)])
        flags = {"materia_config": config_path} if config_path else {}
        root = _artifact_root(cwd, config_path, say_unloaded=False)
        log = JsonlSessionLog(root / ".castor-cli-session.jsonl")
        self.runtime.open_session(SessionInfo(session_id=CLI_SESSION, cwd=str(cwd), trusted=True, flags=flags),
                                  HarnessLink(agent=self.agent, session_log=log, ui=self.ui,
                                              host_context=NoHostContext()))

    def _on_worker(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` on the worker thread and wait for it here (a signal interrupts the wait)."""
        self._in_flight = self._worker.submit(fn, *args)
        return self._in_flight.result()

    def call(self, verb: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        from castor.actors.materia.api import materia_call

        result: dict[str, Any] = self._on_worker(materia_call, self.runtime, CLI_SESSION, verb, params)
        return result

    def close(self) -> None:
        """Shut the runtime down (see the class); a second call does nothing."""
        from concurrent.futures import wait

        if self._closed:
            return
        self._closed = True
        # First: a second signal while the held notices are printed (a stderr pipe may take a while)
        # must kill what is left, not raise into this method and skip the runtime's shutdown, which
        # left the running command's tree behind (test_a_stop_signal_ends_the_cli_..., sigterm-twice).
        self._signals.escalate()  # from now on a signal kills what is left and exits
        self.notices.release()  # what the run said before it stopped, before the lines that say it stopped
        try:
            if self.runtime is None and self._in_flight is not None:
                wait([self._in_flight], timeout=CLOSE_WAIT_S)  # interrupted while it was built: let it finish
            if self.runtime is not None:
                # At once, even with a verb in flight on the worker (it then fails: its actors stop),
                # so an interrupted cast goes no further than the transition it is in.
                self.runtime.shutdown(10.0)
            if self._in_flight is not None:
                wait([self._in_flight], timeout=CLOSE_WAIT_S)
            if self.backend is not None:
                self.backend.shutdown()
        finally:
            self._worker.shutdown(wait=False)
            self._signals.restore()
        close = getattr(self.agent, "close", None) if self.agent is not None else None
        if close is not None:
            close()


class _StopSignals:
    """How a standalone runtime ends on a signal (it owns utility process trees):

    | signal | while | what happens |
    |---|---|---|
    | SIGINT, SIGTERM or SIGHUP | the cast runs | ``KeyboardInterrupt`` (SIGTERM: ``Terminated``; SIGHUP, a closed terminal: ``Hangup``) in the main thread: the runtime shuts down, each running utility command's process tree is ended (SIGTERM, then SIGKILL), the cast stays resumable |
    | a second one | the runtime shuts down | every process this one started (whole trees) is killed at once, then exit 130 / 143 / 129 |

    SIGHUP is left alone when it was ignored at start (``nohup``): the commands run in sessions of
    their own, so a hangup that killed castor outright left them running with no owner.

    Only the main thread can install handlers; elsewhere (tests driving the CLI from a thread)
    the defaults stay.
    """  # noqa: E501 - table rows cannot wrap

    def __init__(self) -> None:
        import signal
        import threading

        self._saved: dict[int, Any] = {}
        _first_stop["signum"] = None
        if threading.current_thread() is threading.main_thread():
            self._saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
            signal.signal(signal.SIGTERM, _raise_terminated)
            if self._saved[signal.SIGINT] is signal.default_int_handler:  # Ctrl-C as before, now counted
                signal.signal(signal.SIGINT, _raise_terminated)
            if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
                self._saved[signal.SIGHUP] = signal.signal(signal.SIGHUP, _raise_terminated)

    def escalate(self) -> None:
        """From now on a signal kills what is left (the runtime is shutting down)."""
        import signal

        for sig in self._saved:
            signal.signal(sig, _kill_descendants_and_exit)

    def restore(self) -> None:
        import signal

        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved = {}


_first_stop: dict[str, int | None] = {"signum": None}
"""The stop signal the cast's run took before its shutdown, if one did: a signal during the shutdown
is then a second one (:func:`_kill_descendants_and_exit` says which)."""


def _raise_terminated(signum: int, _frame: Any) -> None:
    import signal

    from castor.cli.common import stop_for

    _first_stop["signum"] = signum
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise stop_for(signum)


def _kill_descendants_and_exit(signum: int, _frame: Any) -> None:
    """Second signal during shutdown: kill every descendant (collected first, so a grandchild
    whose parent dies first is not missed) and every process tagged with this runtime's pid (a
    command's double-forked orphan), then leave without further cleanup."""
    import psutil

    from castor.adapters.materia.command_records import RUNTIME_PID_ENV, kill_tagged

    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        descendants = []
    for proc in descendants:
        try:
            proc.kill()
        except psutil.Error:
            pass
    me = str(os.getpid())
    kill_tagged(lambda env: env.get(RUNTIME_PID_ENV) == me)
    try:  # a stderr that takes nothing (its pipe full, the signal landing in a write to it) keeps no one here
        # "again" only after a first stop: one that lands during the shutdown of a run that ended
        # by itself (a cast complete, its runtime closing) is the first the user sent
        again = "again" if _first_stop["signum"] is not None else "while shutting down"
        sys.stderr.write(f"castor: interrupted {again}; killed the commands still running\n")
        sys.stderr.flush()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a reentrant write, from inside a blocked one
        pass
    # A relayed stderr (a pipe: castor's own pipe and its relay thread) gets that line before the exit,
    # which would end the relay with it (a reader that stalls is not waited for past the catch-up's bound)
    from castor.cli.common import stderr_caught_up

    stderr_caught_up()
    os._exit(128 + signum)


def _artifact_root(cwd: Path, config_path: str | None, *, say_unloaded: bool = True) -> Path:
    """Where this project's casts are, by the same rule as a runtime's sessions (inside the
    project; ``forbidden`` otherwise). A config that does not load leaves the default, and (unless
    ``say_unloaded`` is false: a cast's start refuses such a config itself) one warning line on
    stderr says so, naming the problem and where casts are looked for instead."""
    from castor.adapters.fs import project_artifact_root  # what castor.runtime's sessions use
    from castor.adapters.materia.config_loader import load
    from castor.domain.materia.config import ConfigError

    unloaded: ConfigError | None = None
    try:
        configured = load(cwd, config_path=config_path).merged.get("artifactDir")
    except ConfigError as exc:
        configured, unloaded = None, exc
    root = project_artifact_root(str(cwd), configured if isinstance(configured, str) and configured else None)
    if unloaded is not None and say_unloaded:
        from castor.shown import one_line

        _say_err(f"castor: warning: {one_line(unloaded.message)}; its artifactDir is not known, so casts are "
                 f"looked for under the default, {root}")
    return root


def _small_file(path: Path) -> bytes:
    """A small regular file of a run directory (``cli.json``, ``abort.request``); ``ValueError`` for
    a FIFO planted in its place (refused at once, never waited on), a device or a file over 64 KiB;
    ``OSError`` ``ELOOP`` for a symbolic link in its place (never followed: it could only lead out of
    the run directory)."""
    from castor.adapters.fs import read_regular_file

    return read_regular_file(path, 64 * 1024, follow_links=False)


def _agent_spec(args: argparse.Namespace, run_dir: Path | None = None) -> str | None:
    spec = getattr(args, "agent", None) or os.environ.get("CASTOR_AGENT") or None
    if spec is None and run_dir is not None:
        note = run_dir / "cli.json"
        try:
            remembered = json.loads(_small_file(note)).get("agent")
        except OSError as exc:
            remembered = None
            if exc.errno == errno.ELOOP:  # planted: what it points at is no note of castor's
                _say_err(f"castor: warning: {note} is a symbolic link, which castor never follows; the agent "
                         "it names is not used (pass --agent, or remove the link)")
        except (ValueError, RecursionError, AttributeError):
            remembered = None
        if isinstance(remembered, str) and remembered.startswith("script:"):
            spec = remembered  # a data file, not a program; openai: is never taken from the tree
    return spec


def _agent_flags(args: argparse.Namespace, run_dir: Path) -> str:
    """What a resuming command this one advises (``castor recast``, ``revive``, ``continue``) must
    add to run with the agent the user gave: `` --agent SPEC``, quoted for a shell, when ``--agent``
    names one the same command without it would not find ($CASTOR_AGENT, or the ``script:`` agent
    the cast's ``cli.json`` remembers); else nothing. An ``openai:`` agent is never remembered, so
    ``castor recast ID`` alone, after ``castor recast ID --agent openai:...`` failed, stopped at once
    on ``no agent``."""
    import shlex

    def as_remembered(spec: str) -> str:
        return str((_cli_note(spec) or {}).get("agent", spec))

    given = getattr(args, "agent", None)
    if not given:
        return ""
    found = _agent_spec(argparse.Namespace(), run_dir)
    if found is not None and as_remembered(found) == as_remembered(given):
        return ""
    return f" --agent {shlex.quote(given)}"


#: The commands that resume a cast: the ones the agent's flags go with (``castor abort`` and
#: ``castor status`` take only the project's).
_RESUMING_VERBS = ("continue", "recast", "revive")


#: A cast id castor allocates (``2026-05-12T19-40-40-605Z``; ``-1``, ``-2`` ... after a collision):
#: how the commands castor's messages name for the cast ``castor cast`` starts look before its start
#: is answered.
_ALLOCATED_CAST_ID = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z(?:-\d+)?"


def _spell_with_flags(session: Any, root: Path, args: argparse.Namespace, cast_ids: str) -> None:
    """Make the commands castor's own messages name for a cast whose id matches ``cast_ids`` (a
    pattern; the engine spells them ``castor continue ID``, knowing nothing of this command line)
    carry what this command's user typed: the project's flags on each, the agent's
    (:func:`_agent_flags`, read once per cast) on the resuming ones. Without them a ``castor continue
    ID`` advised to a user who typed ``--cwd DIR`` or ``--agent openai:...`` answered ``not_found``
    or stopped at once on ``no agent``. Set before the cast runs: a cast's first notices can come
    before its start is answered (its first effects run on its own thread)."""
    project_flags = _project_flags(args)
    if not project_flags and not getattr(args, "agent", None) or session.ui is None:
        return
    verbs = "|".join((*_RESUMING_VERBS, "abort", "status"))
    named = re.compile(rf"castor ({verbs}) ({cast_ids})(?![\w-])")
    agent_flags: dict[str, str] = {}

    def with_flags(found: re.Match[str]) -> str:
        verb, cast_id = found.group(1), found.group(2)
        if verb not in _RESUMING_VERBS:
            return found.group(0) + project_flags
        if cast_id not in agent_flags:
            agent_flags[cast_id] = _agent_flags(args, root / cast_id)
        return found.group(0) + project_flags + agent_flags[cast_id]

    session.ui.spell = lambda text: named.sub(with_flags, text)


def _cli_note(spec: str) -> dict[str, Any] | None:
    """The agent ``<runDir>/cli.json`` remembers: a ``script:`` one (by absolute path), nothing else
    (beside it ``castor cast`` puts its own mark, :data:`STARTED_BY`)."""
    if spec.startswith("script:"):
        return {"agent": f"script:{Path(spec.partition(':')[2]).resolve()}"}
    return None


def _cast_started_by(artifact_root: Path, mark: str, *, since: float) -> str | None:
    """The cast whose ``cli.json`` carries ``mark`` (:data:`STARTED_BY`), looked for among the run
    directories made since ``since`` (a cast id is its start's UTC time, so they sort last); None
    if there is none (the start made no cast, or removed the one that saved no state)."""
    from datetime import datetime, timezone

    earliest = datetime.fromtimestamp(since - 1, timezone.utc).strftime("%Y-%m-%dT%H-%M-%S")
    try:
        names = sorted((name for name in os.listdir(artifact_root) if name >= earliest), reverse=True)
    except OSError:
        return None
    for name in names:
        try:
            note = json.loads(_small_file(artifact_root / name / "cli.json"))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(note, dict) and note.get(STARTED_BY) == mark:
            return name
    return None


def _say_err(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):  # stderr on the same broken storage: the error line is what matters
        pass


@contextmanager
def _named_on_interrupt(session: _Standalone, artifact_root: Path, cast_id: str, flags: str) -> Iterator[None]:
    """On Ctrl-C or SIGTERM inside, say which cast stopped and how to go on -- "castor: interrupted"
    alone named neither; the same when the command meets a storage fault of its own while it watches
    the cast. Entered as soon as the cast's id is known, before anything is printed.

    The line is said once the runtime has stopped, from the cast as it was then saved: a signal
    that lands as the cast ends (or while the runtime stops, as its last turn's end is saved) finds
    it complete, failed or aborted, and the line says so -- it used to promise a ``castor continue``
    that castor then refused. The exit status stays the signal's."""
    from castor.messages.errors import StorageUnavailable
    from castor.ports.cast_storage import STATE_TOO_LARGE

    try:
        yield
    except KeyboardInterrupt:
        session.close()  # the cast goes no further; a second signal now kills what is left
        _say_err(_stopped_line(artifact_root, cast_id, flags))  # a closed terminal (SIGHUP) may take it no more
        raise
    except StorageUnavailable as exc:
        # The command's own read or write failed (its status poll of a state.json the storage no
        # longer lets it read): it ends, and the runtime with it, the cast as last saved. Its own
        # error line follows; this one says which cast stopped and how to go on once it is fixed
        # (a state grown past what castor saves: its error line says no fix helps, and what does).
        session.notices.release()  # what the cast said before, first
        if (exc.data or {}).get("reason") != STATE_TOO_LARGE:
            _say_err(f"castor: cast {cast_id} stopped before it ended; once the storage is fixed, "
                     f"`castor recast {cast_id}{flags}` resumes it")
        raise


def _stopped_line(artifact_root: Path, cast_id: str, flags: str) -> str:
    """What a command interrupted while it ran ``cast_id`` says of it, read after its runtime stopped:
    a cast still going (active: orphaned, interrupted or paused) stays resumable with ``castor
    continue``; one that ended first says how it ended (a failed or aborted one, what resumes it)."""
    from castor.actors.materia.views import persisted_view
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.messages.errors import CastorError

    resumable = f"castor: cast {cast_id} stopped before it ended; it stays resumable: castor continue {cast_id}{flags}"
    try:
        view = _shown(persisted_view(FILE_CAST_STORAGE, artifact_root, cast_id, live=False))
    except (CastorError, OSError, ValueError):
        return resumable  # unreadable now: as it was when the signal came, still going
    if view["status"] not in TERMINAL:
        return resumable
    said = f"castor: cast {cast_id} ended {view['status']} before the interrupt took effect"
    if view["status"] == "complete":
        return f"{said}: {_name(view['run_dir'])}"
    reason = " ".join(str(view.get("failed_reason") or view["status"]).split())
    return f"{said}: {reason}; `castor {'revive' if view.get('revivable') else 'recast'} {cast_id}{flags}` resumes it"


def _watch(session: _Standalone, cast_id: str, *, quiet: bool) -> dict[str, Any]:
    """Poll the cast until it ends, with a rich live view unless quiet; finalizes refinement pauses."""
    from rich.console import Console


    console = Console(stderr=True)
    last: dict[str, Any] = {}

    def poll() -> dict[str, Any]:
        # (`castor abort` from another process is taken by the runtime that holds the cast, this
        # command's as any other: the status below then says aborted.)
        view = session.call("status", {"cast_id": cast_id})
        if view.get("paused") and view.get("live"):
            # Said after the engine's own notice ("... Run castor continue ID to finalize."), which
            # holds if this process stops first; while it runs, it finalizes, so the user need not.
            session.ui.notify(f"{view.get('current_socket')}: no user in the CLI to refine with, so this command "
                              "finalizes it now (no castor continue needed)")
            session.call("continue", {"cast_id": cast_id})
            view = session.call("status", {"cast_id": cast_id})
        return view

    def over(view: dict[str, Any]) -> bool:
        # interrupted: no user here can press Esc again or answer; the process ends and
        # `castor continue ID` goes on (the cast stays active, resumable, in its run directory)
        return (view["status"] in TERMINAL or view["status"] == "interrupted"
                or (not view.get("live") and view["status"] != "active") or stranded(view))

    waited: list[str | None] = [None]  # the pending visit the last poll found waiting for a retry

    def stranded(view: dict[str, Any]) -> bool:
        # Waiting for a retry no agent here makes -- not merely between a re-sent turn and its end:
        # the agent runs no turn, and the same pending visit waited at the poll before.
        visit = (view.get("pending") or {}).get("visit_id") if _awaits_a_retry(view) else None
        busy = getattr(session.agent, "in_flight", None)
        if visit is not None and busy is not None and busy():
            visit = None  # its turn runs
        again = visit is not None and visit == waited[0]
        waited[0] = visit
        return again

    if quiet or not console.is_terminal:
        while True:
            last = poll()
            if over(last):
                return last
            time.sleep(POLL_S)
    from rich.live import Live

    with Live(_progress(last or {"cast_id": cast_id}), console=console, refresh_per_second=8, transient=False) as live:
        while True:
            last = poll()
            live.update(_progress(last))
            if over(last):
                return last
            time.sleep(POLL_S)


def _awaits_a_retry(view: dict[str, Any]) -> bool:
    """The cast waits on after a transient transport failure, as the spec says (in Pi, Pi retries the
    turn and its next end completes it); no agent of the CLI retries, so nothing would ever end it."""
    from castor.domain.materia.engine import TRANSIENT_WAIT

    return (view["status"] == "active" and view.get("socket_state") == "awaiting_agent_response"
            and str(view.get("last_message") or "").startswith(TRANSIENT_WAIT))


def _progress(view: dict[str, Any]) -> Any:
    """The live table of ``castor cast`` on a terminal. Its names are shown as written: escaped for
    the terminal (:func:`_shown`) and for rich, which would read a ``[...]`` in a cell as markup (a
    loadout named ``[/]`` ended the command)."""
    from rich.markup import escape
    from rich.table import Table

    view = _shown(view)
    table = Table(title=f"cast {escape(str(view.get('cast_id')))}", show_header=False, box=None)
    table.add_row("status", escape(str(view.get("status", "starting"))))
    table.add_row("loadout", escape(str(view.get("loadout", ""))))
    where = view.get("current_socket") or ""
    if view.get("current_materia"):
        where += f" ({view['current_materia']})"
    table.add_row("socket", escape(where))
    if view.get("item_label") or view.get("item_key"):
        table.add_row("item", escape(str(view.get("item_label") or view.get("item_key"))))
    visits = view.get("visits") or {}
    table.add_row("visits", escape(", ".join(f"{k}×{v}" for k, v in visits.items()) or "-"))
    usage = view.get("usage") or {}
    table.add_row("tokens", str(int(usage.get("tokens") or 0)))
    return table


def _where_to_resume(args: argparse.Namespace, code: int) -> int:
    """After a cast that did not complete on the cluster (``--backend ray``), say that the resuming
    command the line above names runs it where *it* runs: without the same flags, on this machine.
    Typed as shown, ``castor recast ID`` ran the cast's commands here, not on the cluster."""
    flags = backend_flags(args)
    if code != EXIT_OK and flags:
        import shlex

        print(f"castor: to resume it on the cluster again, add {shlex.join(flags)} to that command "
              "(without them it runs on this machine)", file=sys.stderr)
    return code


def _remember_backend(run_dir: Path, flags: list[str]) -> None:
    """Record in the cast's cli.json where the command that now runs it runs it (:data:`BACKEND_FLAGS`;
    none: this machine). A cli.json castor cannot read is left as it is (the hints then name no flags)."""
    from castor.adapters.materia.storage import FILE_CAST_STORAGE

    note = run_dir / "cli.json"
    try:
        FILE_CAST_STORAGE.note_in_cli_json(run_dir, BACKEND_FLAGS, flags or None)
    except OSError as exc:
        _say_err(f"castor: warning: cannot record where cast {run_dir.name} runs in {note} ({exc.strerror or exc}); "
                 "`castor status` will not name its backend flags")


def _recorded_backend_flags(run_dir: Path) -> list[str]:
    """The backend flags the cast's cli.json records (:data:`BACKEND_FLAGS`), if they are flags
    ``castor cast`` takes and would print; anything else (a project's own file) is no record."""
    from castor.scaleout.options import valid_backend_flags

    try:
        flags = json.loads(_small_file(run_dir / "cli.json")).get(BACKEND_FLAGS)
    except (OSError, ValueError, RecursionError, AttributeError):
        return []
    return flags if valid_backend_flags(flags) else []


def _finish(view: dict[str, Any], flags: str, agent_flags: str = "") -> int:
    """The cast's outcome, one line; a command it advises ends with ``flags`` (:func:`_project_flags`),
    and one that resumes the cast (recast, revive, continue) with ``agent_flags`` too (:func:`_agent_flags`)."""
    from castor.domain.materia.engine import BUDGET_LIMIT_REACHED, BUDGET_RECAST_NOTE

    view = _shown(view)
    resume = flags + agent_flags
    if view.get("artifacts_pending"):
        print(f"castor: cast {view['cast_id']} {view['status']}, but the artifacts of its last step could not all "
              f"be written (see the log above); `castor recast {view['cast_id']}{resume}` writes them", file=sys.stderr)
        return EXIT_FAILED
    cast_id = view["cast_id"]
    if view["status"] == "complete":
        _out(f"cast {cast_id} complete: {_name(view['run_dir'])}")
        return EXIT_OK
    if view["status"] == "interrupted":
        print(f"castor: cast {cast_id} interrupted at socket {view.get('current_socket')}: nothing of that turn was "
              f"kept; `castor continue {cast_id}{resume}` runs it again, `castor abort {cast_id}{flags}` ends the cast",
              file=sys.stderr)
        return EXIT_FAILED
    if _awaits_a_retry(view):
        print(f"castor: cast {cast_id}'s turn at socket {view.get('current_socket')} ended in a transient transport "
              f"error; in Pi, Pi retries such a turn, but no agent here does: `castor continue {cast_id}{resume}` "
              f"sends it again, `castor abort {cast_id}{flags}` ends the cast", file=sys.stderr)
        return EXIT_FAILED
    if view["status"] == "orphaned":  # its runtime stopped it mid-run (a storage fault, a shutdown)
        print(f"castor: cast {cast_id} stopped at socket {view.get('current_socket')} before it ended (see the "
              f"messages above); `castor recast {cast_id}{resume}` resumes it", file=sys.stderr)
        return EXIT_FAILED
    reason = " ".join(str(view.get("failed_reason") or view["status"]).split())
    hint = ""
    if view.get("failed_reason") == BUDGET_LIMIT_REACHED:
        hint = f"; {BUDGET_RECAST_NOTE} (`castor recast {cast_id}{resume}` resumes it)"
    elif view["status"] in ("failed", "aborted"):
        hint = f"; `castor {'revive' if view.get('revivable') else 'recast'} {cast_id}{resume}` resumes it"
    print(f"castor: cast {cast_id} {view['status']}: {reason}{hint}", file=sys.stderr)
    return EXIT_FAILED


# --------------------------------------------------------------------------- commands
@_storage_faults_typed
def cmd_cast(args: argparse.Namespace) -> int:
    from castor.cli.common import relay_stderr_without_blocking
    from castor.scaleout.options import make_backend

    relay_stderr_without_blocking(terminal=False)  # a stalled stderr pipe stalls neither the cast nor its stop
    cwd = _cwd(args)
    spec = _agent_spec(args)
    session = _Standalone(cwd, spec, config_path=args.config, backend=make_backend(args))
    root = _artifact_root(cwd, args.config, say_unloaded=False)
    try:
        assert spec is not None
        mark = f"{os.getpid()}@{session.began_at!r}"  # this command's, in the cast's cli.json
        flags = backend_flags(args)
        _spell_with_flags(session, root, args, _ALLOCATED_CAST_ID)
        try:
            started = session.call("start", {"request": args.request, "loadout": args.loadout,
                                             "config_path": args.config,
                                             "cli_note": {**(_cli_note(spec) or {}), STARTED_BY: mark,
                                                          **({BACKEND_FLAGS: flags} if flags else {})}})
        except KeyboardInterrupt:
            # The start may have made the cast before the signal: it is left resumable, and named.
            session.close()
            left = _cast_started_by(root, mark, since=session.began_at)
            if left is not None:
                _say_err(_stopped_line(root, left, _project_flags(args)))
            raise
        agent_flags = _agent_flags(args, root / started["cast_id"])
        with _named_on_interrupt(session, root, started["cast_id"], _project_flags(args) + agent_flags):
            _out(f"cast {started['cast_id']} started ({_name(started['loadout'])}): {_name(started['run_dir'])}")
            session.notices.release()  # the cast's notices after its start line, never before
            view = _watch(session, started["cast_id"], quiet=args.quiet)
            return _where_to_resume(args, _finish(view, _project_flags(args), agent_flags))
    finally:
        session.close()


def _cast_ref(args: argparse.Namespace) -> tuple[Path, Path, str]:
    """(cwd, artifact root, the cast id ``CAST_ID`` means: exact, ``latest`` or a unique prefix)."""
    from castor.actors.materia.views import resolve_cast_id
    from castor.adapters.materia.storage import FILE_CAST_STORAGE

    cwd = _cwd(args)
    root = _artifact_root(cwd, args.config)
    if args.cast_id is None:
        return cwd, root, _newest_going(root, args.command)
    return (
        cwd,
        root,
        resolve_cast_id(FILE_CAST_STORAGE, root, args.cast_id),
    )  # before asking for an agent it would not need


def _newest_going(root: Path, verb: str) -> str:
    """The cast an id-less ``castor status`` / ``abort`` / ``continue`` means, as pi-materia's
    id-less commands load it: the newest cast still going; with none, status and continue take the
    newest cast (whose status says how it ended, and which continue then refuses), abort says there
    is nothing to abort. ``NotFound`` with pi-materia's sentence when there is no cast at all, and
    naming the unreadable ones when every cast there is unreadable."""
    from castor.actors.materia.views import LATEST, find_cast, resolve_cast_id
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.messages.errors import NotFound

    found = find_cast(FILE_CAST_STORAGE, root, set(), "candidate", lambda row: row["status"] in GOING)
    if found is not None:
        going: str = found["cast_id"]
        return going
    if verb == "abort":
        raise NotFound("No active pi-materia cast to abort.", data={"reason": "no_active_cast"})
    newest = find_cast(FILE_CAST_STORAGE, root, set(), "readable")
    if newest is None:
        try:  # casts none of which can be read (a run directory replaced by a file): say so, as `latest` does
            resolve_cast_id(FILE_CAST_STORAGE, root, LATEST)
        except NotFound as exc:
            if exc.data.get("unreadable"):
                raise
        raise NotFound("No pi-materia cast state in this session.", data={"reason": "no_casts"})
    cast_id: str = newest["cast_id"]
    return cast_id


def _resume(args: argparse.Namespace, verb: str) -> int:
    from castor.cli.common import relay_stderr_without_blocking

    relay_stderr_without_blocking(terminal=False)  # as castor cast's
    if args.cast_id is None and verb != "continue":
        cwd = _cwd(args)
        root = _artifact_root(cwd, args.config)
        cast_id = _newest_resumable(root, revive=verb == "revive")
    else:
        cwd, root, cast_id = _cast_ref(args)
    agent = _agent_spec(args, root / cast_id)
    _refuse_a_pointless_resume(root, cast_id, verb, _project_flags(args) + _agent_flags(args, root / cast_id),
                               needs_agent=agent is None)
    from castor.scaleout.options import make_backend

    session = _Standalone(cwd, agent, config_path=args.config,
                          backend=make_backend(args))
    try:
        agent_flags = _agent_flags(args, root / cast_id)
        _spell_with_flags(session, root, args, re.escape(cast_id))
        with _named_on_interrupt(session, root, cast_id, _project_flags(args) + agent_flags):
            view = session.call(verb, {"cast_id": cast_id})
            _remember_backend(root / cast_id, backend_flags(args))  # it runs where this command runs it
            _out(_name(view["text"]))  # one line by construction: a socket name's line break is shown escaped
            session.notices.release()  # the resumed cast's notices after the line that says it resumed
            return _where_to_resume(args, _finish(_watch(session, cast_id, quiet=args.quiet), _project_flags(args),
                                                  agent_flags))
    finally:
        session.close()


def _newest_resumable(root: Path, *, revive: bool) -> str:
    """The cast an id-less ``castor recast`` / ``castor revive`` means, as pi-materia's id-less
    commands pick it: the newest resumable cast (failed, aborted, interrupted or orphaned), for
    revive the newest whose same-socket recovery was exhausted -- never a newer cast that cannot be
    resumed. ``NotFound`` with pi-materia's sentence when there is none."""
    from castor.actors.materia.views import find_cast
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.messages.errors import NotFound

    found = find_cast(FILE_CAST_STORAGE, root, set(), "revivable" if revive else "candidate",
                      lambda row: bool(row["resumable"] and (row["revivable"] or not revive)))
    if found is not None:
        cast_id: str = found["cast_id"]
        return cast_id
    if revive:
        raise NotFound("No failed pi-materia casts exhausted by same-socket recovery are available to revive. "
                       "Use castor recast [CAST_ID] for general failed or aborted casts.",
                       data={"reason": "none_revivable"})
    raise NotFound("No failed or aborted pi-materia casts are available to recast.", data={"reason": "none_resumable"})


@_storage_faults_typed
def cmd_recast(args: argparse.Namespace) -> int:
    return _resume(args, "recast")


@_storage_faults_typed
def cmd_revive(args: argparse.Namespace) -> int:
    return _resume(args, "revive")


@_storage_faults_typed
def cmd_continue(args: argparse.Namespace) -> int:
    return _resume(args, "continue")


_PAST = {"recast": "recast", "revive": "revived", "continue": "continued"}  # the engine's wording for recast


def _refuse_a_pointless_resume(root: Path, cast_id: str, verb: str, flags: str = "", *,
                               needs_agent: bool = False) -> None:
    """A complete cast can be neither recast, revived nor continued: say so before an agent is
    asked for, and point at no command that would refuse too. The command it names ends with
    ``flags`` (:func:`_project_flags`, then :func:`_agent_flags`); ``needs_agent``: it says what that command needs
    (:data:`NO_AGENT_REMEMBERED`)."""
    from castor.actors.materia.views import persisted_view
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.domain.materia.surface import NO_AGENT_REMEMBERED
    from castor.messages.errors import Conflict

    view = persisted_view(FILE_CAST_STORAGE, root, cast_id, live=False)
    if view["status"] == "complete" and not (verb == "recast" and view.get("artifacts_pending")):
        # (a complete cast whose last artifacts could not be written: `castor recast` writes them)
        raise Conflict(f"pi-materia cast {cast_id} is complete and cannot be {_PAST.get(verb, verb)}; "
                       f"`castor cast REQUEST` starts a new one.", data={"reason": "complete", "cast_id": cast_id})
    if verb == "continue" and not view["active"]:
        hint = ""
        if view.get("resumable"):  # an error is one line: what the command needs goes on it
            hint = (f" `castor {'revive' if view.get('revivable') else 'recast'} {cast_id}{flags}` resumes it"
                    + (f"; {NO_AGENT_REMEMBERED}." if needs_agent else "."))
        raise Conflict(f"pi-materia cast {cast_id} is {view['status']}, not active.{hint}",
                       data={"reason": "not-active", "cast_id": cast_id, "status": view["status"]})


@_storage_faults_typed
def cmd_abort(args: argparse.Namespace) -> int:
    cwd, root, cast_id = _cast_ref(args)
    with _one_abort_at_a_time(root / cast_id):
        return _abort(args, cwd, root, cast_id)


def _abort(args: argparse.Namespace, cwd: Path, root: Path, cast_id: str) -> int:
    """``castor abort`` of ``cast_id``, the only one of this cast under way (:func:`_one_abort_at_a_time`)."""
    from castor.actors.materia.views import persisted_view
    from castor.adapters.materia.cast_lease import CastLease
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.domain.materia.surface import NO_AGENT_REMEMBERED
    from castor.messages.errors import Conflict

    flags = _project_flags(args)
    # the recast the answer names would stop at once on `no agent` (a cast a harness ran): it says so
    needs_agent = _agent_spec(args, root / cast_id) is None
    view = persisted_view(FILE_CAST_STORAGE, root, cast_id, live=False)
    if view["active"] and CastLease.is_held(root, cast_id):
        return _abort_elsewhere(root, cast_id, flags, needs_agent=needs_agent)
    session = _Standalone(cwd, None, config_path=args.config, need_agent=False)
    try:
        text = session.call("abort", {"cast_id": cast_id})["text"]
    except Conflict as exc:
        if exc.data.get("reason") != "held_elsewhere":
            raise
        text = None  # a castor continue / recast took the cast between the check above and this
    finally:
        session.close()
    if text is None:
        return _abort_elsewhere(root, cast_id, flags, needs_agent=needs_agent)
    # the engine names the CLI's recast (`castor recast ID`); typed as shown it must find this project
    text = text.replace(f"castor recast {cast_id}", f"castor recast {cast_id}{flags}")
    _out(f"{text}\n{NO_AGENT_REMEMBERED}" if needs_agent and f"castor recast {cast_id}" in text else text)
    return EXIT_OK


@contextmanager
def _one_abort_at_a_time(run_dir: Path) -> Iterator[None]:
    """Hold ``<runDir>/abort.lock`` (:data:`ABORT_LOCK`, an exclusive ``flock``) while this abort
    runs, so two ``castor abort`` of one cast run one after the other: the second finds the cast
    the first left -- aborted -- and says "already aborted", never "aborted" too (both used to see
    it active with its lease free, and both said they aborted it). It waits for the first at most
    :data:`ABORT_LOCK_WAIT_S`, then ``conflict``. A run directory with no ``state.json`` (no cast
    to abort, or a start that died: only a start's files may be in it) gets no lock file, nor does
    one where it cannot be made; the abort then runs unguarded, as before."""
    import fcntl

    from castor.messages.errors import Conflict

    if not (run_dir / "state.json").is_file():
        yield
        return
    try:
        fd = os.open(run_dir / ABORT_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                     0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + ABORT_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Conflict(f"another castor abort of pi-materia cast {run_dir.name} is still under way "
                                   f"after {ABORT_LOCK_WAIT_S:g}s; `castor status {run_dir.name}` shows how it ended",
                                   data={"reason": "abort_under_way", "cast_id": run_dir.name}) from None
                time.sleep(POLL_S)
        yield
    finally:
        os.close(fd)  # drops the lock


def _abort_elsewhere(root: Path, cast_id: str, flags: str = "", *, needs_agent: bool = False) -> int:
    """Another runtime holds the cast: leave it an abort request (the holder looks for one every
    :data:`castor.adapters.materia.abort_requests.ABORT_POLL_S`) and wait for the cast to end. The
    request never outlives this command: one left behind would abort the cast's next recast the
    moment it started. ``needs_agent``: no agent is remembered for the cast, and the answer says what
    the ``castor recast`` it names needs (:data:`NO_AGENT_REMEMBERED`)."""
    from castor.actors.materia.views import persisted_view
    from castor.adapters.materia.abort_requests import ABORT_REQUEST
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.cli.common import process_frozen
    from castor.domain.materia.surface import NO_AGENT_REMEMBERED
    from castor.messages.errors import Conflict

    holder = _lease_holder(root / cast_id)
    frozen = process_frozen(holder["pid"]) if holder is not None else None
    if holder is not None and frozen is not None:  # it cannot take the request: say why now, leave none
        raise Conflict(f"pi-materia cast {cast_id} runs in castor runtime pid {holder['pid']}, which is {frozen}; "
                       f"then `castor abort {cast_id}{flags}` again (or /materia abort in its harness session)",
                       data={"reason": "held_elsewhere", "cast_id": cast_id, "pid": holder["pid"],
                             "frozen": frozen})
    request = root / cast_id / ABORT_REQUEST
    second = not _ask_to_abort(request)  # another castor abort's request waits: this one is the second
    try:
        deadline = time.monotonic() + ABORT_WAIT_S
        while True:
            view = persisted_view(FILE_CAST_STORAGE, root, cast_id, live=False)
            if not view["active"]:
                break
            if time.monotonic() >= deadline:
                raise Conflict(f"pi-materia cast {cast_id} runs in another castor runtime that did not take the "
                               f"abort request within {ABORT_WAIT_S:g}s (an older castor, or one stalled; in a "
                               "harness session, /materia abort there stops it)",
                               data={"reason": "held_elsewhere", "cast_id": cast_id})
            time.sleep(POLL_S)
    finally:
        untaken = os.path.lexists(request)  # the holder removes the request it applies
        try:
            if not second:  # the first one's is its own to remove
                os.unlink(request)  # taken already (the holder removes it), or never to be taken
        except OSError:
            pass
    if view["status"] != "aborted":
        raise Conflict(f"pi-materia cast {cast_id} ended {view['status']} before the abort request was taken.",
                       data={"reason": "not-active", "cast_id": cast_id, "status": view["status"]})
    # as a second abort in a harness session answers (already: true); untaken: the cast ended aborted
    # without this request (aborted where it ran, e.g. /materia abort in Pi)
    how = "is already aborted" if second or untaken else "aborted"
    said = f"pi-materia cast {cast_id} {how}. Recast it with castor recast {cast_id}{flags}."
    _out(f"{said}\n{NO_AGENT_REMEMBERED}" if needs_agent else said)
    return EXIT_OK


def _ask_to_abort(request: Path) -> bool:
    """Leave the abort request at ``request``, unless one of a ``castor abort`` still running waits
    there (False: this abort is the second). The request is made whole or not at all (linked into
    place), so two aborts at once never both take it for theirs; one whose writer is gone (a killed
    abort) is replaced."""
    import psutil

    from castor.adapters.fs import PRIVATE_FILE_MODE, atomic_write_json

    mine = {"requested_at": time.time(), "pid": os.getpid()}
    draft = request.with_name(f"{request.name}.{os.getpid()}.{time.monotonic_ns()}")
    atomic_write_json(draft, mine, mode=PRIVATE_FILE_MODE)
    try:
        os.link(draft, request)
        return True
    except FileExistsError:
        try:
            writer = json.loads(_small_file(request)).get("pid")
        except (OSError, ValueError, RecursionError, AttributeError):
            writer = None
        if isinstance(writer, int) and not isinstance(writer, bool) and psutil.pid_exists(writer):
            return False
        if os.path.isdir(request) and not os.path.islink(request):  # planted: no request of castor's
            from castor.ports.cast_storage import StateCorrupt

            raise StateCorrupt(f"{request} is a directory, where castor leaves the running command its abort "
                               f"request; remove it (`rm -r {request}`) and abort again",
                               data={"path": str(request), "reason": "abort_request_is_a_directory"}) from None
        atomic_write_json(request, mine, mode=PRIVATE_FILE_MODE)
        return True
    finally:
        try:
            os.unlink(draft)
        except OSError:
            pass


def _page_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be 1..1000")
    return value


def _with_backend_flags(view: dict[str, Any], root: Path) -> dict[str, Any]:
    """``view`` (a cast's status or listing row) with ``backend_flags``, where its cli.json says it
    last ran (:data:`BACKEND_FLAGS`), when its hints name a command that resumes it."""
    if view.get("resumable") or view.get("status") in GOING:
        flags = _recorded_backend_flags(root / str(view["cast_id"]))
        if flags:
            return {**view, "backend_flags": flags}
    return view


def _resumed_here(view: dict[str, Any]) -> bool:
    """Whether the hints on ``view`` (a status or a listing row) name a command that resumes the cast
    in this terminal: one resumable, or going and held by no other runtime; never one outgrown."""
    from castor.actors.materia.views import held_elsewhere

    return not view.get("outgrown") and bool(view.get("resumable")
                                             or (view["status"] in GOING and not held_elsewhere(view)))


def _with_needs_agent(args: argparse.Namespace, view: dict[str, Any], root: Path) -> dict[str, Any]:
    """``view`` with ``needs_agent`` when the recast or continue its hints name would stop at once on
    ``no agent`` (a cast a harness ran, an ``openai:`` one; no ``--agent`` given): said under them."""
    if _resumed_here(view) and _agent_spec(args, root / str(view["cast_id"])) is None:
        return {**view, "needs_agent": True}
    return view


@_storage_faults_typed
def cmd_casts(args: argparse.Namespace) -> int:
    from castor.actors.materia.views import cast_page, casts_text
    from castor.adapters.materia.state_store import DEFAULT_PAGE
    from castor.adapters.materia.storage import FILE_CAST_STORAGE

    root = _artifact_root(_cwd(args), args.config)
    page = cast_page(FILE_CAST_STORAGE, root, set(), limit=args.limit or DEFAULT_PAGE, cursor=args.cursor)
    rows = page["casts"] = [_with_needs_agent(args, _with_backend_flags(row, root), root) for row in page["casts"]]
    if args.json:
        paged = args.limit is not None or args.cursor is not None
        _out(json.dumps(page if paged else rows, indent=2))
        return EXIT_OK
    flags = _project_flags(args)
    text = casts_text([_shown(row) for row in rows], root, "cli", cli_flags=flags)
    if page["next_cursor"]:
        text += f"\n  … more: castor casts --cursor {page['next_cursor']}{flags} ({page['total']} in all)"
    _out(text)
    return EXIT_OK


@_storage_faults_typed
def cmd_status(args: argparse.Namespace) -> int:
    from castor.actors.materia.views import held_elsewhere, persisted_view, status_text
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.domain.materia.surface import NO_AGENT_REMEMBERED

    cwd, root, cast_id = _cast_ref(args)
    view = _with_backend_flags(persisted_view(FILE_CAST_STORAGE, root, cast_id, live=False), root)
    if view.get("resumable") or (view["status"] in GOING and not held_elsewhere(view)):
        unwritable = _not_writable(cwd, root / cast_id)
        if unwritable is not None:
            view["not_writable"] = unwritable
    flags = _project_flags(args)
    text = status_text(_shown(view), "cli", cli_flags=flags)
    # a cast a harness ran (its agent is the harness's), or an openai: one (never taken from the
    # tree): the recast or continue named above would stop at once on `no agent`
    view = _with_needs_agent(args, view, root)
    if view.get("needs_agent"):
        text += f"\n{NO_AGENT_REMEMBERED}"
    from castor.adapters.materia.command_records import utility_running

    running = utility_running(view.get("run_dir"), view.get("pending"))  # which command, since when
    if running is not None:
        view["command_running"] = running
        if not held_elsewhere(view):  # its runtime is gone (kill -9): the command runs on, unowned
            text += (f"\nits utility command {_running_words(running)} still runs, left by the runtime "
                     f"that stopped; a recast kills it before it runs the command again")
    if held_elsewhere(view):  # its lease is held: a harness session or another castor command runs it
        view["elsewhere"] = True
        # Whichever holds it (a harness session's castor serve, another castor command), it takes
        # `castor abort`'s request: typed anywhere, it reaches the cast.
        holder = _lease_holder(root / cast_id)
        if holder is not None:
            view["held_by"] = holder
            where = f"pid {holder['pid']} ({holder['command']})" if holder["command"] else f"pid {holder['pid']}"
            from castor.cli.common import process_frozen

            frozen = process_frozen(holder["pid"])
            if frozen is not None:  # it holds the cast and runs nothing: "runs" alone would not be so
                view["held_by"] = {**holder, "frozen": frozen}
                text = (f"This pi-materia cast runs in another castor runtime, {_name(where)}, which is {frozen}; "
                        f"castor abort {cast_id}{flags} asks it to abort once it runs again:\n{text}")
            else:
                text = (f"This pi-materia cast runs in another castor runtime, {_name(where)}; castor abort "
                        f"{cast_id}{flags} asks it to abort:\n{text}")
        else:  # no /proc/locks (not Linux), or a holder in another pid namespace (a container)
            text = (f"This pi-materia cast runs in another castor runtime (a harness session's castor serve, or "
                    f"another castor command); castor abort {cast_id}{flags} asks it to abort:\n{text}")
        now = _waits_now(view)
        if now is not None:
            first, _, rest = text.partition("\n")
            text = f"{first}\n{now}\n{rest}"
    _out(json.dumps(view, indent=2) if args.json else text)
    return EXIT_OK


_WAITS_WORDS = {"agent_turn": "awaiting the agent's turn", "utility": "running its utility command",
                "compaction": "awaiting the host's compaction"}


def _waits_now(view: dict[str, Any]) -> str | None:
    """What a cast another runtime holds waits for, and since when, as its saved state says (the
    holder says no more to another process): ``now: awaiting the agent's turn at Socket-1 (greeter),
    visit 1, since its last save at 09:45:43 UTC (12s ago)``, the save's date before its time when
    it is not today's (``2026-12-06 09:45:43 UTC (26h 0m ago)``); None when it waits for nothing."""
    pending = view.get("pending")
    if not isinstance(pending, dict) or pending.get("kind") not in _WAITS_WORDS:
        return None
    words = _WAITS_WORDS[pending["kind"]]
    if pending["kind"] == "agent_turn" and pending.get("user_driven"):
        words = "awaiting the user's own turn"
    socket = _name(pending.get("socket_id") or view.get("current_socket") or "?")
    materia = view.get("current_materia")
    at = f"{socket} ({_name(materia)})" if materia and pending["kind"] != "utility" else socket
    visit = f", visit {pending['visit']}" if pending.get("visit") else ""
    running = view.get("command_running")
    if pending["kind"] == "utility" and isinstance(running, dict):  # the command's own process, found running
        words = f"running its utility command {_running_words(running)}"
    saved = view.get("updated_at")
    if not isinstance(saved, (int, float)):
        return f"now: {words} at {at}{visit}"
    age = _age(max(0, int(time.time() - saved)))
    # its date too when not today's (UTC): a cast waiting since yesterday must not read as since today
    today = time.gmtime(saved)[:3] == time.gmtime()[:3]
    clock = time.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M:%S", time.gmtime(saved))
    return f"now: {words} at {at}{visit}, since its last save at {clock} UTC ({age} ago)"


def _running_words(running: dict[str, Any]) -> str:
    """A utility command's process as ``castor status`` names it: the command in backquotes, then
    ``(pid 4242, for 3m 5s)``."""
    command = running["command"] if len(running["command"]) <= 200 else running["command"][:199] + "…"
    return f"`{_name(command)}` (pid {running['pid']}, for {_age(max(0, int(time.time() - running['started_at'])))})"


def _age(seconds: int) -> str:
    """``12s``, ``3m 5s``, ``2h 4m``: how long ago, as ``castor status``'s waiting line says it."""
    return (f"{seconds}s" if seconds < 60 else f"{seconds // 60}m {seconds % 60}s" if seconds < 3600
            else f"{seconds // 3600}h {seconds % 3600 // 60}m")


def _lease_holder(run_dir: Path) -> dict[str, Any] | None:
    """The process that holds the lease of the cast in ``run_dir`` (see ``cast_lease.lease_holder``)."""
    from castor.adapters.materia.cast_lease import lease_holder

    return lease_holder(run_dir)


def _not_writable(project: Path, run_dir: Path) -> dict[str, str] | None:
    """Why no command could write ``run_dir`` now (``errno``: ``EROFS`` on a read-only mount,
    ``EACCES`` without the permission; ``path`` relative to the project), else None. A resume
    writes there first, so a cast its status calls resumable could not be resumed."""
    if os.access(run_dir, os.W_OK) or not run_dir.is_dir():
        return None
    try:
        read_only = bool(os.statvfs(run_dir).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    try:
        shown = str(run_dir.relative_to(project))
    except ValueError:
        shown = str(run_dir)
    return {"errno": "EROFS" if read_only else "EACCES", "path": shown}


def cmd_grid(args: argparse.Namespace) -> int:
    from castor.adapters.materia.config_loader import load_resolved
    from castor.domain.materia.grid import render_grid

    _out(render_grid(load_resolved(_cwd(args), loadout=args.loadout, config_path=args.config)))
    return EXIT_OK


def cmd_loadout(args: argparse.Namespace) -> int:
    from castor.actors.materia.views import loadout_line
    from castor.adapters.materia.config_loader import load, save_active_loadout

    cwd = _cwd(args)
    if args.name is not None:
        _refuse_while_a_cast_runs(cwd, args.config)
        path = save_active_loadout(cwd, args.name, config_path=args.config)
        _out(f"Active loadout: {_name(args.name)} (saved to {_name(str(path))})")
    merged = load(cwd, config_path=args.config).merged
    active = merged.get("activeLoadout")
    _out(loadout_line(None if active is None else _name(active),
                      [_name(name) for name in (merged.get("loadouts") or {})]))
    return EXIT_OK


def _refuse_while_a_cast_runs(cwd: Path, config_path: str | None) -> None:
    """Conformance item 72 (``loadout.set`` refused while a cast is active), across processes: a
    cast whose runtime holds its lease is running somewhere."""
    from castor.actors.materia.views import find_cast
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.messages.errors import Conflict

    row = find_cast(FILE_CAST_STORAGE, _artifact_root(cwd, config_path, say_unloaded=False), set(), "candidate",
                    lambda r: r["status"] in ("active", "awaiting_refinement")
                    or (r["status"] == "interrupted" and not r["resumable"] and not r.get("outgrown")))
    if row is not None:
        raise Conflict(f"pi-materia cast {row['cast_id']} is active. Abort it (`castor abort {row['cast_id']}`) "
                       "before changing the loadout.", data={"reason": "active", "cast_id": row["cast_id"]})


def cmd_validate(args: argparse.Namespace) -> int:
    from castor.adapters.materia.config_loader import validate_file

    issues = validate_file(args.config_path, project=_cwd(args))  # where `castor cast` there would write
    for issue in issues:  # errors first, then warnings ("[warning <code>] ..."); one line each, a
        # config's names (a loadout, a key) and the file's own name shown escaped
        print(_name(str(issue)), file=sys.stderr)
    if not any(not issue.is_warning for issue in issues):
        _out(f"{_name(args.config_path)}: valid")
        return EXIT_OK
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    """Run only the materia commands (tests and scripts; ``castor`` itself is castor.cli)."""
    from castor.logs import configure_logging
    from castor.messages.errors import CastorError

    parser = argparse.ArgumentParser(prog="castor")
    add_materia_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    configure_logging(None)
    try:
        return int(args.run(args) or 0)
    except CastorError as exc:
        print(f"castor: {exc.code}: {' '.join(exc.message.split())}", file=sys.stderr)
        return EXIT_FAILED
    except (OSError, ValueError) as exc:
        print(f"castor: error: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
