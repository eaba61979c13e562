"""Running utility commands: no shell, bounded output, deadline, whole tree killed.

This is the IO half of running a utility (the engine decides *when* to run; this
module runs). ``spawn(cmd)`` starts ``cmd.argv`` directly (never through a
shell, so ``;``, ``|``, ``$()`` and globs are plain argument text), in
``cmd.cwd``, in a new session (its own process group), with
``JSON(cmd.stdin) + "\\n"`` on stdin, which is then closed.
A bare program name (``git``, ``make``) is looked up only in the absolute ``PATH``
entries outside ``cmd.cwd`` (:func:`program_of`): an empty or relative entry, or one
inside the project, would run the project's own file of that name.

Guarantees
----------
- **Deadline.** ``timeout_ms`` covers the process *and* its output pipes. On
  expiry the whole tree is terminated: SIGTERM to the process group and to
  every descendant psutil can see (also ones that left the group), a grace
  period (``grace_ms``, default 1000 ms), then SIGKILL to whatever is left.
  The result says ``timed_out=True``.
- **kill() from any thread** (fault injection, cast abort) SIGKILLs the tree at
  once; ``wait()`` then returns ``killed=True``. ``pids()`` lists the live pids
  of the tree (root first) for inspection.
- **Output caps.** stdout and stderr are each kept up to ``max_output_bytes``
  (default 1 MiB); the rest is read and dropped (so the child never blocks on a
  full pipe) and ``*_truncated`` is set. Text is decoded as UTF-8 with
  replacement characters for invalid or cut sequences.
- **Result.** exit code or signal, ``timed_out``, ``killed``, wall duration.
  A non-zero exit is *not* an exception here: the cast's engine turns a
  result into the socket's failure and its wording.
- **Bounded concurrency** is not this module's job: the runtime's pool
  (``/root/utility``, :mod:`castor.actors.materia.utility_pool`) runs at most one
  command per slot and refuses a job past its queue bound with ``MailboxFull``.

Failure behaviour
-----------------
- A binary that cannot be started raises :class:`UtilitySpawnError` (code
  ``not_found`` for a missing file, ``forbidden`` for permission, else
  ``internal``) and nothing runs.
- Background processes that a *successful* command leaves behind after
  closing its stdout/stderr are not hunted down (that is ordinary Unix
  behaviour); ones that keep the pipes open hold the deadline and are killed
  with the tree when it passes — found through ``/proc`` by the pipes they
  hold, even after leaving the process group (``setsid``) once their parent
  died.

Trust: the argv comes from the loadout config; callers must only run
commands of configs whose project is trusted.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from castor._log import logger
from castor.adapters import process_tree
from castor.adapters.executables import which_outside
from castor.messages.errors import ErrorCode
from castor.ports.utility_runner import MAX_OUTPUT_BYTES as MAX_OUTPUT_BYTES
from castor.ports.utility_runner import UtilityCommand as UtilityCommand
from castor.ports.utility_runner import UtilityResult as UtilityResult
from castor.ports.utility_runner import UtilitySpawnError as UtilitySpawnError
from castor.supervision.threads import start_thread

__all__ = [
    "MAX_OUTPUT_BYTES",
    "RunningUtility",
    "UtilityCommand",
    "UtilityResult",
    "UtilitySpawnError",
    "run_command",
    "spawn",
]

_READ_CHUNK = 64 * 1024
_PIPE_DRAIN_AFTER_KILL_S = 2.0



# --------------------------------------------------------------------------- one running process tree


class _CappedReader(threading.Thread):
    """Drain one pipe to EOF, keeping at most ``cap`` bytes."""

    def __init__(self, stream: Any, cap: int, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._fd = stream.fileno()
        self._stream = stream
        self._cap = cap
        self._chunks: list[bytes] = []
        self._kept = 0
        self.truncated = False

    def run(self) -> None:
        try:
            while True:
                chunk = os.read(self._fd, _READ_CHUNK)
                if not chunk:
                    break
                room = self._cap - self._kept
                if len(chunk) > room:
                    self.truncated = True
                    chunk = chunk[: max(room, 0)]
                if chunk:
                    self._chunks.append(chunk)
                    self._kept += len(chunk)
        except OSError:
            pass
        finally:
            try:
                self._stream.close()
            except OSError:
                pass

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")


def _feed_stdin(stream: Any, payload: bytes) -> None:
    try:
        stream.write(payload)
    except (BrokenPipeError, OSError):
        pass  # the child does not read stdin: that is its right
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited (zombies count as exited); return survivors.

    psutil.wait_procs would wait out the whole timeout on a zombie that no one
    reaps (an orphan under a PID 1 that does not reap), so poll liveness instead.
    """
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = [p for p in alive if _alive(p)]
    return alive


class RunningUtility:
    """A started command. ``wait()`` once (from one thread); ``kill()``/``pids()`` from any."""

    def __init__(self, cmd: UtilityCommand, popen: subprocess.Popen[bytes], started: float) -> None:
        self.cmd = cmd
        self._popen = popen
        self.pid = popen.pid
        self._started = started
        self._killed = threading.Event()
        self._finished = threading.Event()
        self._tree_lock = threading.Lock()
        self._stopping = False  # a gentle stop (SIGTERM, grace, SIGKILL) is under way: see _terminate_tree
        self._known: dict[int, psutil.Process] = {}
        # The output pipes, by inode: whoever holds them open (even a grandchild that left the
        # process group after its parent died) is part of the command for the deadline.
        assert popen.stdout is not None and popen.stderr is not None  # started with both piped
        self._pipes = {f"pipe:[{os.fstat(stream.fileno()).st_ino}]" for stream in (popen.stdout, popen.stderr)}
        self._stdout = _CappedReader(popen.stdout, cmd.max_output_bytes, f"utility-{self.pid}-stdout")
        self._stderr = _CappedReader(popen.stderr, cmd.max_output_bytes, f"utility-{self.pid}-stderr")
        self._stdout.start()
        self._stderr.start()
        payload = (json.dumps(cmd.stdin, ensure_ascii=False) + "\n").encode("utf-8")
        start_thread(_feed_stdin, args=(popen.stdin, payload), name=f"utility-{self.pid}-stdin",
                     owner="/root/utility", purpose="feed a utility command its stdin")
        self._log = logger.bind(utility_pid=self.pid, argv0=cmd.argv[0])

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    # -- the tree ------------------------------------------------------------

    def _descendants(self, *, pipe_holders: bool = False) -> list[psutil.Process]:
        """Root's descendants now, remembered so orphans are still found later; with
        ``pipe_holders`` also every other process holding the output pipes open."""
        with self._tree_lock:
            if pipe_holders:
                for proc in self._pipe_holders():
                    self._known.setdefault(proc.pid, proc)
            # By the root's pid only while it is the root's: once the root is reaped the system
            # may give its pid to another process (pids wrap), whose children are not ours. Its
            # process group's id is not given out while any member lives, so the group is
            # searched while no process holds the pid (the same rule as the Icarus worker's).
            reaped = self._popen.returncode is not None
            if not reaped:
                for child in process_tree.descendants(self.pid):
                    self._known.setdefault(child.pid, child)
            if reaped and psutil.pid_exists(self.pid):
                return [p for p in self._known.values() if _alive(p)]
            # An orphan (its parent died) is no longer a child of the root but
            # still in our process group; find those too.
            for proc in psutil.process_iter():
                try:
                    if proc.pid != self.pid and os.getpgid(proc.pid) == self.pid:
                        self._known.setdefault(proc.pid, proc)
                except (ProcessLookupError, PermissionError, psutil.Error, OSError):
                    continue
            return [p for p in self._known.values() if _alive(p)]

    def _pipe_holders(self) -> list[psutil.Process]:
        """Processes (not castor itself, which reads the pipes) with the output pipes open (/proc)."""
        me = os.getpid()
        found = []
        try:
            entries = [e.name for e in os.scandir("/proc") if e.name.isdigit() and int(e.name) not in (me, self.pid)]
        except OSError:
            return []
        for pid in entries:
            try:
                if any(os.readlink(fd.path) in self._pipes for fd in os.scandir(f"/proc/{pid}/fd")):
                    found.append(psutil.Process(int(pid)))
            except (OSError, psutil.Error):
                continue
        return found

    def pids(self) -> list[int]:
        """Live pids of the tree, root first (empty once everything has exited)."""
        root = [self.pid] if self._popen.poll() is None else []
        return root + sorted(p.pid for p in self._descendants())

    def _signal_tree(self, sig: signal.Signals, procs: list[psutil.Process]) -> None:
        if self._popen.returncode is None:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass

    def _terminate_tree(self, grace_s: float) -> None:
        """SIGTERM the tree, SIGKILL what is left after ``grace_s``, once: a second gentle stop asked
        meanwhile (a cast and its runtime stopping together, or the deadline passing as one runs)
        returns at once -- the first one's SIGKILL ends the tree, and ``kill`` still ends it now."""
        with self._tree_lock:
            if self._stopping:
                return
            self._stopping = True
        procs = self._descendants(pipe_holders=True)
        self._signal_tree(signal.SIGTERM, procs)
        deadline = time.monotonic() + grace_s
        try:
            self._popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        alive = _wait_gone(procs, max(0.0, deadline - time.monotonic()))
        if self._popen.poll() is None or alive:
            self._log.warning("utility tree survived SIGTERM grace; sending SIGKILL")
            self._kill_tree()

    def _kill_tree(self) -> None:
        procs = self._descendants(pipe_holders=True)
        self._signal_tree(signal.SIGKILL, procs)
        _wait_gone(procs, 1.0)

    def terminate(self, grace_s: float) -> None:
        """SIGTERM the whole tree, SIGKILL what is left after ``grace_s`` (any thread); the
        result says ``killed`` (lost work, not a failure), as after :meth:`kill`."""
        self._killed.set()
        if not self._finished.is_set():
            self._terminate_tree(grace_s)

    def kill(self) -> None:
        """SIGKILL the whole tree now (safe from any thread, idempotent)."""
        self._killed.set()
        if not self._finished.is_set():
            self._kill_tree()

    # -- waiting -------------------------------------------------------------

    def _remaining(self, deadline: float) -> float:
        return max(0.0, deadline - time.monotonic())

    def wait(self) -> UtilityResult:
        """Block until the command ends, its deadline passes, or it is killed."""
        deadline = self._started + self.cmd.timeout_ms / 1000
        timed_out = False
        try:
            self._popen.wait(timeout=self._remaining(deadline))
            self._stdout.join(self._remaining(deadline))
            self._stderr.join(self._remaining(deadline))
            if self._stdout.is_alive() or self._stderr.is_alive():
                raise subprocess.TimeoutExpired(self.cmd.argv, self.cmd.timeout_ms / 1000)
        except subprocess.TimeoutExpired:
            if not self._killed.is_set():
                timed_out = True
                self._log.info("utility deadline passed; terminating its process tree")
                self._terminate_tree(self.cmd.grace_ms / 1000)
        if self._killed.is_set() and not timed_out:
            self._kill_tree()
        self._popen.wait()
        self._stdout.join(_PIPE_DRAIN_AFTER_KILL_S)
        self._stderr.join(_PIPE_DRAIN_AFTER_KILL_S)
        duration_ms = (time.monotonic() - self._started) * 1000
        self._finished.set()
        return self._result(timed_out, duration_ms)

    def _result(self, timed_out: bool, duration_ms: float) -> UtilityResult:
        code = self._popen.returncode
        sig = -code if code is not None and code < 0 else None
        return UtilityResult(
            argv=list(self.cmd.argv),
            pid=self.pid,
            exit_code=None if sig is not None else code,
            signal=sig,
            signal_name=signal.Signals(sig).name if sig is not None else None,
            timed_out=timed_out,
            killed=self._killed.is_set() and not timed_out,
            duration_ms=duration_ms,
            stdout=self._stdout.text(),
            stderr=self._stderr.text(),
            stdout_truncated=self._stdout.truncated,
            stderr_truncated=self._stderr.truncated,
            max_bytes=self.cmd.max_output_bytes,
            timeout_ms=self.cmd.timeout_ms,
        )


def _spawn_error(cmd: UtilityCommand, exc: OSError) -> UtilitySpawnError:
    code = {errno.ENOENT: ErrorCode.NOT_FOUND, errno.EACCES: ErrorCode.FORBIDDEN,
            errno.EPERM: ErrorCode.FORBIDDEN}.get(exc.errno or 0, ErrorCode.INTERNAL)
    return UtilitySpawnError(
        f"cannot start utility command {shlex.join(cmd.argv)}: {exc.strerror or exc}",
        code=code,
        data={"argv0": cmd.argv[0], "errno": exc.errno, "cwd": str(cmd.cwd)},
        may_have_started=False,
    )


def program_of(cmd: UtilityCommand) -> str:
    """The file ``cmd`` runs: a name with a slash as written (relative to its ``cwd``); a bare name
    from the absolute ``PATH`` entries outside ``cmd.cwd`` only (castor.adapters.executables: an
    empty, relative or in-project entry would run the project's own ``git`` or ``make``, whoever
    chose the command). Raises UtilitySpawnError (``not_found``) when there is none."""
    name = cmd.argv[0]
    if "/" in name:
        return name
    path_var = (cmd.env if cmd.env is not None else os.environ).get("PATH")
    found = which_outside(name, path_var, str(cmd.cwd))
    if found is None:
        raise UtilitySpawnError(
            f"cannot start utility command {shlex.join(cmd.argv)}: {name!r} is not on PATH "
            f"(only absolute PATH entries outside the project are searched; write a path to run a project's own)",
            code=ErrorCode.NOT_FOUND, data={"argv0": name, "errno": errno.ENOENT, "cwd": str(cmd.cwd)},
            may_have_started=False)
    return found


def spawn(cmd: UtilityCommand) -> RunningUtility:
    """Start ``cmd`` (see module doc). Raises UtilitySpawnError if it cannot start."""
    started = time.monotonic()
    program = program_of(cmd)
    try:
        popen = subprocess.Popen(  # noqa: S603 - argv list, never a shell
            cmd.argv,
            executable=program,  # argv[0] stays what the command says: the program's own name
            cwd=cmd.cwd,
            env=cmd.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            shell=False,
            close_fds=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise _spawn_error(cmd, exc) from None
    return RunningUtility(cmd, popen, started)


def run_command(cmd: UtilityCommand, *, on_start: Callable[[RunningUtility], None] | None = None) -> UtilityResult:
    """Spawn and wait. ``on_start`` receives the handle (for ``kill``/``pids``) before waiting."""
    running = spawn(cmd)
    if on_start is not None:
        try:
            on_start(running)
        except Exception:
            logger.exception("utility on_start callback failed; killing the command")
            running.kill()
            running.wait()
            raise
    return running.wait()
