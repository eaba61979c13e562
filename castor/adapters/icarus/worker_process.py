"""One Icarus worker subprocess and its JSON-lines protocol, seen from the bridge.

:class:`WorkerProcess` is a plain, thread-agnostic object (no pykka): the
``IcarusWorkerActor`` owns one and calls it from its own thread.

Guarantees
----------
- **One call at a time.** :meth:`WorkerProcess.call` writes one request and
  blocks the *calling* thread until the reply with the same id, the deadline,
  or the end of the process. A second concurrent ``call`` is refused
  (``Conflict``); the worker program is sequential anyway.
- **Deadline.** When the deadline passes the call stops reading, kills the
  whole process tree and raises ``Timeout`` (``may_have_started=True``). A
  late reply is never read. The worker is then retired: later calls raise
  ``WorkerRetired`` without writing anything.
- **kill_tree()** is safe from any thread and idempotent. It kills the process
  group and every descendant psutil can see, reaps the child and wakes a
  blocked ``call`` at once (a self-pipe), which raises ``WorkerRetired``.
- **Crash.** End of stdout (or the process gone) mid-call raises
  ``WorkerCrashed`` with the exit code in ``data`` and the stderr tail on
  ``.stderr_tail`` (kept off the wire: stderr is diagnostic, never shown to
  the model). A failed spawn is ``WorkerCrashed`` with ``may_have_started=False``.
- **A death before the request was read is told apart.** A worker that died idle can still
  look alive for a moment: its first thread is gone (a process listing shows it dead) while
  its last one is still ending, and only then does its exit show; its stdout may already be
  closed (a dying process's files close before its parent is told). A call written into that
  moment finds the worker gone; when the whole request still sits unread in the worker's
  input pipe, the worker never saw it, and when the call finds stdout ended before it writes
  anything, nothing was sent: either way ``WorkerCrashed`` with ``may_have_started=False`` and
  ``data["died_idle"]`` true (on a worker that had answered a call before), which the actor
  treats as it treats a worker found dead between calls -- a fresh worker runs the call.
- **Stream hygiene.** Replies whose id is not the outstanding one are
  discarded and counted; blank lines are skipped; a line that is not a JSON
  reply object is dropped and counted (a warning the first time), and the
  current call still gets its own reply, which carries its id.
- **stderr** is drained by a daemon thread into a tail bounded by lines and
  bytes, so the child can never block on a full pipe.
- **Ids.** :func:`next_request_id` is process-wide and monotonic, so ids are
  never reused across workers.
"""

from __future__ import annotations

import array
import collections
import errno
import fcntl
import itertools
import json
import os
import re
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict

from castor._log import logger
from castor._spin import ReplySpin, reply_spin
from castor.adapters import process_tree
from castor.adapters.icarus.launch import BEGUN_FD_ENV, WorkerLaunch
from castor.domain.icarus.worker_protocol import IcarusCallError, WorkerProtocolError, death_words, reply_result
from castor.domain.jsontext import well_formed
from castor.messages.errors import (
    FD_EXHAUSTION_ERRNOS,
    Conflict,
    InvalidParams,
    Timeout,
    WorkerCrashed,
    WorkerRetired,
    out_of_file_descriptors,
)
from castor.supervision.threads import start_thread

_ids = itertools.count(1)

_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, default=str)
# The C encoder JSONEncoder.encode builds on every call, built once: ASCII, no NaN, str() for
# the rest. Without a markers dict a cycle ends in RecursionError (refused like any bad argument).
# c_make_encoder: CPython's private C accelerator (None without it), which typeshed leaves out.
_MAKE_ENCODER: Callable[..., Any] | None = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODER = (_MAKE_ENCODER(None, str, json.encoder.encode_basestring_ascii, None, ": ", ", ",
                            False, False, False)
              if _MAKE_ENCODER is not None else None)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# ``loads_strict`` (castor.domain.jsontext) with its decoder made once, not per reply.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]  # set by JSONDecoder.__init__; typeshed omits it
#: A JSON escape of a UTF-16 surrogate (U+D800..U+DFFF), the only way a reply's text can hold one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_STDERR_LINE_MAX = 64 * 1024
_LIVENESS_POLL_S = 0.25  # how often a blocked call re-checks that the child is alive
_LIVENESS_POLL_MS = int(_LIVENESS_POLL_S * 1000)
_IDLE_EVENTS_FRESH_S = 0.001  # how old exited_while_idle's poll may be for a call to reuse it
_READ_CHUNK = 1 << 16
#: The longest reply line castor reads (bytes). Longer ones are dropped as they arrive and fail
#: their call (``reply_too_large``): no such answer could reach the harness (a frame holds 16 MiB,
#: and escaped JSON is at most three times the text it carries), and gathering one grew castor
#: by several times its size (a 300 MB answer: 1.2 GB at its peak).
MAX_REPLY_BYTES = 64 << 20
#: The worker program's first line (worker_program.READY_LINE, stripped; a test pins them equal).
_READY = b'{"ready": "castor-icarus-worker"}'
#: What is kept of output before the ready line while it is awaited (it is dropped anyway).
_READY_NOISE_MAX = 1 << 16
#: After a reply was not there yet when a call first looked (see ``_await_reply``), this many
#: calls wait in poll first before a call tries reading first again.
_READ_FIRST_BACKOFF = 16
# The two waits of a call (the idle check and the reply) are epoll sets where there is epoll: the
# descriptors are registered once per worker, not copied into the kernel and hooked onto their
# wait queues on every poll as poll(2) does (about half the cost of an idle check here). epoll
# takes its timeout in seconds, poll in milliseconds: _POLL_UNIT converts the milliseconds.
_EPOLL = getattr(select, "epoll", None)
#: ``os.memfd_create`` (Linux): the page a worker counts its begun requests in. Without it a death
#: that took the request from the pipe is a death during the call, as before.
_MEMFD: Callable[[str, int], int] | None = getattr(os, "memfd_create", None)
_POLL_UNIT = 0.001 if _EPOLL is not None else 1.0


__all__ = ["IcarusCallError", "StderrTail", "WorkerProcess", "WorkerProtocolError", "WorkerStats",
           "next_request_id", "reply_result", "worker_factory"]


#: Process-wide monotonic request ids (never reused, even across workers): ``next_request_id()``
#: is the counter's own ``__next__``, which runs in C under the GIL, so concurrent callers never
#: get the same id (tests/icarus_worker: request ids unique across workers and threads), and a
#: call is one C call with no Python frame.
next_request_id: Callable[[], int] = _ids.__next__


class WorkerStats(BaseModel):
    model_config = ConfigDict(frozen=True)

    pid: int | None
    alive: bool
    state: str
    calls: int
    mismatched_replies: int
    garbage_lines: int
    rss_bytes: int | None = None
    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    open_files: int | None = None
    num_fds: int | None = None
    children: int | None = None
    stderr_tail_lines: int
    stderr_tail_bytes: int


class StderrTail:
    """Last lines of the child's stderr, bounded by line count and bytes."""

    def __init__(self, max_lines: int = 200, max_bytes: int = 32 * 1024, max_line_bytes: int = 2048) -> None:
        self._lines: collections.deque[str] = collections.deque()
        self._bytes = 0
        self._max_lines, self._max_bytes, self._max_line = max_lines, max_bytes, max_line_bytes
        self._lock = threading.Lock()

    def add(self, raw: bytes) -> None:
        text = raw[: self._max_line].decode("utf-8", "replace").rstrip("\r\n")
        with self._lock:
            self._lines.append(text)
            self._bytes += len(text)
            while self._lines and (len(self._lines) > self._max_lines or self._bytes > self._max_bytes):
                self._bytes -= len(self._lines.popleft())

    def text(self) -> str:
        with self._lock:
            return "\n".join(self._lines)

    def size(self) -> tuple[int, int]:
        with self._lock:
            return len(self._lines), self._bytes


class WorkerProcess:
    """A persistent worker subprocess; see the module docstring for guarantees."""

    def __init__(self, launch: WorkerLaunch, *, stderr_max_lines: int = 200,
                 stderr_max_bytes: int = 32 * 1024, max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        self._launch = launch
        self._max_reply = max_reply_bytes
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr = StderrTail(stderr_max_lines, stderr_max_bytes)
        self._stderr_thread: threading.Thread | None = None
        self._buffer = b""
        self._call_lock = threading.Lock()
        self._kill_lock = threading.Lock()
        # The self-pipe that wakes a blocked call; made by start(), closed with the other pipes
        # (under _fd_lock, so a late wake never writes to a descriptor number reused since).
        self._wake_r = self._wake_w = -1
        self._pidfd = -1
        #: The page where the worker counts the requests it began (a memfd; -1 where there is none).
        self._begun_fd = -1
        self._stale_poller: Any = None  # stdout and the pidfd (an epoll, else a poll): between calls
        self._reply_poller: Any = None  # stdout and the wake pipe: during a call
        self._idle_events: list[tuple[int, int]] | None = None  # exited_while_idle's poll, for the next call
        self._idle_at = 0.0
        self._poll_first = 0  # calls left that wait in poll before reading (_await_reply)
        #: The bounded spin before the reply's blocking wait (None: confined to one CPU, or not
        #: turned on: the worker call spins only with ``CASTOR_REPLY_SPIN=1``, castor._spin says why).
        self._spin: ReplySpin | None = reply_spin(on_by_default=False)
        self._fd_lock = threading.Lock()
        self._retired: str | None = None  # reason once killed on purpose
        self._crashed = False
        self._killed = False
        self._calls = 0
        self._request_bytes = 0  # the length of the request being answered (died_idle's check)
        self._mismatched = 0
        self._garbage = 0
        self._before_ready = True  # the program's ready line not read yet (_await_ready)

    # ------------------------------------------------------------------ lifecycle

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running_pid(self) -> int | None:
        """The pid while the child runs and is not being killed; else None (never a reaped pid)."""
        proc = self._proc
        if proc is None or self._killed or self._crashed or proc.returncode is not None:
            return None
        return proc.pid

    @property
    def started(self) -> bool:
        return self._proc is not None

    def exited_while_idle(self) -> bool:
        """True when the started child is gone although no call was running (killed or died idle).

        With a pidfd (Linux) this is the same ``poll(0)`` the next call's drain needs: the
        events are handed to it (when it follows within a millisecond), so the check costs no
        syscall of its own."""
        proc = self._proc
        if proc is None or self._killed:
            return False
        if proc.returncode is not None:
            return True
        if self._pidfd < 0:
            return proc.poll() is not None
        events = self._stale_poller.poll(0)
        self._idle_events, self._idle_at = events, time.monotonic()
        for fd, _mask in events:
            if fd == self._pidfd:  # readable once the child has exited
                return proc.poll() is not None
        return False

    @property
    def usable(self) -> bool:
        return self._retired is None and not self._crashed

    def start(self) -> None:
        """Spawn the child (idempotent). Raises ``WorkerCrashed`` if it cannot start; and
        ``mailbox_full`` (``data.reason: out_of_file_descriptors``) while castor has no file
        descriptor for the worker's pipes (``ulimit -n``): then nothing was started, nothing is
        left open, and the next call tries again -- it is no death of the worker."""
        if self._proc is not None:
            return
        if not self.usable:
            raise WorkerRetired("worker was retired before it started", may_have_started=False)
        self._open_own_descriptors()
        env = self._launch.env
        passed: tuple[int, ...] = ()
        if self._begun_fd >= 0:
            env, passed = {**env, BEGUN_FD_ENV: str(self._begun_fd)}, (self._begun_fd,)
        try:
            self._proc = subprocess.Popen(
                list(self._launch.argv), cwd=self._launch.cwd, env=env, pass_fds=passed,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                # Its own process group (kill_tree signals the group), not its own session: a new
                # session is a new scheduling autogroup on Linux, and on a loaded host every reply
                # then waited for that group's turn (p99 3-8 ms against the raw child's 0.1-3 ms;
                # docs/performance.md). A group of its own still keeps the terminal's ^C and ^Z
                # (sent to the foreground group) off the worker.
                process_group=0, close_fds=True,
            )
        except OSError as exc:
            self._close_wake_pipe()
            if exc.errno in FD_EXHAUSTION_ERRNOS:
                raise out_of_file_descriptors(exc, may_have_started=False) from None
            self._crashed = True
            raise WorkerCrashed(f"icarus worker could not start: {exc.strerror or exc}",
                                data={"reason": "spawn_failed", "python": self._launch.python},
                                may_have_started=False) from None
        assert self._proc.stdin is not None and self._proc.stdout is not None  # both opened as PIPEs
        self._in_fd = self._proc.stdin.fileno()
        os.set_blocking(self._in_fd, False)
        out_fd = self._out_fd = self._proc.stdout.fileno()
        os.set_blocking(out_fd, False)  # a wake-up that was not for stdout never blocks a read
        with self._fd_lock:  # closed with the wake pipe (_close_wake_pipe), under the same lock
            self._stale_poller.register(out_fd, select.POLLIN)
            try:
                self._pidfd = os.pidfd_open(self._proc.pid)
            except (AttributeError, OSError):  # not Linux >= 5.3 (or no descriptor): exited_while_idle asks waitpid
                self._pidfd = -1
            else:
                self._stale_poller.register(self._pidfd, select.POLLIN)
            self._reply_poller.register(out_fd, select.POLLIN)
            self._reply_poller.register(self._wake_r, select.POLLIN)
        self._stderr_thread = start_thread(self._drain_stderr, name=f"icarus-stderr-{self._proc.pid}",
                                           owner="icarus-worker", purpose="drains the worker's stderr")
        with self._kill_lock:
            late = self._retired  # retired while it was being spawned: kill_tree saw no process
        if late is not None:
            self.kill_tree(late)

    def _drain_stderr(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None  # started (stderr a PIPE) before this thread
        stream = proc.stderr
        try:
            # A bounded readline: a flood without newlines must not grow without limit here
            # (the tail keeps only the end anyway).
            for line in iter(lambda: stream.readline(_STDERR_LINE_MAX), b""):
                self._stderr.add(line)
        except (OSError, ValueError):
            pass  # pipe closed under us during kill
        finally:
            try:
                stream.close()  # end of file: the whole tree is gone, so is the pipe
            except (OSError, ValueError):
                pass

    def stderr_tail(self) -> str:
        return self._stderr.text()

    # ------------------------------------------------------------------ kill

    def kill_tree(self, reason: str = "retired") -> None:
        """Kill the worker and all its descendants; wake a blocked call. Any thread."""
        with self._kill_lock:
            if self._retired is None and not self._crashed:
                self._retired = reason
            proc = self._proc
            if proc is None or self._killed:
                self._wake()
                if proc is None and self._call_lock.acquire(blocking=False):
                    try:
                        self._close_wake_pipe()  # a start after retirement is refused: nothing uses it
                    finally:
                        self._call_lock.release()
                return
            self._killed = True
        descendants: list[psutil.Process] = []
        # Signals by pid go only where the pid is still the worker's. Until the worker is reaped
        # its zombie holds the pid: its children and its group (process_group=0: pgid == pid) are
        # its own. Once a poll() has reaped it, the pid may have been given to an unrelated process
        # (pids wrap: at 32,768 on many hosts), whose children and group a pid-based kill would
        # end. The group id, though, cannot be given out while anything of the worker's group
        # lives: so a reaped worker's group is killed only while no process has its pid.
        reaped = proc.poll() is not None
        if not reaped:
            descendants = process_tree.descendants(proc.pid)
        if not reaped or not psutil.pid_exists(proc.pid):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for child in descendants:
            try:
                child.kill()
            except psutil.Error:
                pass
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        self._wake()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass
        _wait_ended(descendants, timeout=2.0)
        if self._stderr_thread is not None and self._stderr_thread is not threading.current_thread():
            self._stderr_thread.join(timeout=1.0)  # it closes stderr at the end of file
        if self._call_lock.acquire(blocking=False):
            try:
                self._close_pipes()
            finally:
                self._call_lock.release()
        # else: the running call closes them on its way out (see call)

    def close(self) -> None:
        self.kill_tree("closed")

    def _wake(self) -> None:
        with self._fd_lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _open_own_descriptors(self) -> None:
        """The wake pipe and the two poll sets, made before the child is: a process out of
        descriptors then refuses the call with nothing spawned (``out_of_file_descriptors``), and
        what was made is closed again."""
        with self._fd_lock:
            try:
                self._wake_r, self._wake_w = os.pipe()
                self._stale_poller = _EPOLL() if _EPOLL is not None else select.poll()
                self._reply_poller = _EPOLL() if _EPOLL is not None else select.poll()
                if _MEMFD is not None:
                    self._begun_fd = _MEMFD("castor-icarus-begun", os.MFD_CLOEXEC)
                    os.ftruncate(self._begun_fd, 8)
            except OSError as exc:
                failed: OSError | None = exc
            else:
                failed = None
        if failed is not None:
            self._close_wake_pipe()
            if failed.errno in FD_EXHAUSTION_ERRNOS:
                raise out_of_file_descriptors(failed, may_have_started=False) from None
            raise failed

    def _close_wake_pipe(self) -> None:
        """Close the wake pipe, the pidfd and the epoll sets (the worker is finished)."""
        with self._fd_lock:
            for fd in (self._wake_r, self._wake_w, self._pidfd, self._begun_fd):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self._wake_r = self._wake_w = self._pidfd = self._begun_fd = -1
            for poller in (self._stale_poller, self._reply_poller):
                close = getattr(poller, "close", None)  # an epoll holds a descriptor; a poll does not
                if close is not None:
                    close()

    def _close_pipes(self) -> None:
        """Close stdin, stdout and the wake pipe: the worker is finished (no call is running).
        stderr is closed by its drain thread at the end of file."""
        proc = self._proc
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                assert stream is not None  # both opened as PIPEs
                try:
                    stream.close()
                except (OSError, ValueError):
                    pass
        self._close_wake_pipe()

    # ------------------------------------------------------------------ call

    def call(self, request_id: int, module: str, function: str, args: list[Any] | tuple[Any, ...] | None = None,
             kwargs: dict[str, Any] | None = None, deadline: float | None = None) -> dict[str, Any]:
        """Send one request and return its reply dict ``{id, ok, result|error, traceback}``.

        ``deadline`` is a ``time.monotonic()`` instant (None: wait forever).
        Raises ``Timeout``, ``WorkerRetired``, ``WorkerCrashed``,
        ``WorkerProtocolError`` or ``Conflict`` (a call already in progress).
        """
        if not self._call_lock.acquire(blocking=False):
            raise Conflict("a call is already in progress on this worker", may_have_started=False)
        try:
            if self._retired is not None or self._crashed:
                self._check_usable(may_have_started=False)
            target = f"{module}.{function}"
            line = _encode_request(request_id, module, function, args, kwargs)  # before anything starts
            if self._proc is None:
                self.start()
            if self._before_ready:
                self._await_ready(deadline, target)
            events = self._idle_events
            if events is None or time.monotonic() - self._idle_at > _IDLE_EVENTS_FRESH_S:
                events = self._stale_poller.poll(0)
            self._idle_events = None
            if self._buffer or (events and any(fd == self._out_fd for fd, _mask in events)):
                self._drain_stale()
            self._calls += 1
            self._request_bytes = len(line)
            if self._retired is not None or self._crashed:
                self._check_usable(may_have_started=False, target=target)
            try:  # the whole line in one write, as a rule (the pipe is empty between calls)
                written = os.write(self._in_fd, line)
            except BlockingIOError:
                written = 0
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.EBADF, errno.EINVAL):
                    raise
                # Nothing of the request went in: a worker that answered before died idle (its
                # files close before its exit shows), and the call runs on a fresh one -- unless
                # castor killed it meanwhile (a cancel, a close): then the call fails as retired.
                self._check_usable(may_have_started=False, target=target)
                raise self._crash(target, may_have_started=False, idle=self._calls > 1) from None
            if written < len(line):
                self._write(memoryview(line)[written:], deadline, target)
            return self._await_reply(request_id, deadline, target)
        finally:
            if self._retired is not None or self._crashed:  # not usable (the property, inline)
                self._close_pipes()
            self._call_lock.release()

    def _await_ready(self, deadline: float | None, target: str) -> None:
        """Read up to the worker program's ready line (``READY_LINE``), dropping what came before
        it and counting it as noise: an interpreter's ``sitecustomize`` or a wrapper script that
        prints a banner writes to the pipe before the program runs, and that output used to fail
        the first call of every worker as a non-protocol line. Output without a newline makes one
        line of itself and the ready line: the ready line at its end counts. Nothing has been sent yet, so a
        deadline or a death here is ``may_have_started=False``."""
        out_fd = self._out_fd
        while True:
            for line in self._buffered_lines():
                if line.endswith(_READY):  # after output without a newline too (a banner's printf): dropped
                    if line != _READY:
                        self._garbage += 1
                    self._before_ready = False
                    return
                self._garbage += 1
            remaining = self._remaining(deadline)
            if remaining is not None and remaining <= 0:
                raise self._timeout(target, -1, started=False)
            wait_ms = _LIVENESS_POLL_MS if remaining is None else min(_poll_ms(remaining), _LIVENESS_POLL_MS)
            events = self._reply_poller.poll(wait_ms * _POLL_UNIT)
            if self._retired is not None or self._crashed:
                self._check_usable(may_have_started=False, target=target)
            if not events:
                assert self._proc is not None  # only a started worker is awaited
                if self._proc.poll() is not None:
                    raise self._crash(target, may_have_started=False, before_ready=True)
                continue
            try:
                chunk = os.read(out_fd, _READ_CHUNK)
            except BlockingIOError:
                continue
            if not chunk:  # it ended before it was ready (a wrapper that failed, a bad interpreter)
                self._check_usable(may_have_started=False, target=target)
                raise self._crash(target, may_have_started=False, before_ready=True)
            if len(self._buffer) > _READY_NOISE_MAX:
                self._buffer = self._buffer[-_READY_NOISE_MAX:]  # a banner without an end: keep its tail only
            self._buffer += chunk

    def _check_usable(self, *, may_have_started: bool, target: str | None = None) -> None:
        if self._retired is not None:
            raise WorkerRetired(f"icarus worker {self._retired}" + (f" during {target}" if target else ""),
                                data={"reason": self._retired, "pid": self.pid, "target": target},
                                may_have_started=may_have_started)
        if self._crashed:
            raise WorkerCrashed("icarus worker is gone", data={"pid": self.pid, "target": target},
                                may_have_started=may_have_started)

    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else deadline - time.monotonic()

    def _timeout(self, target: str, request_id: int, *, started: bool) -> Timeout:
        pid = self.pid
        self.kill_tree("timed out")
        return Timeout(f"icarus call {target} timed out; the worker was retired",
                       data={"target": target, "request_id": request_id, "pid": pid},
                       may_have_started=started)

    def _write(self, data: bytes | memoryview, deadline: float | None, target: str) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None  # only a started worker is written to
        fd = proc.stdin.fileno()
        view = memoryview(data)
        while view:
            self._check_usable(may_have_started=False, target=target)
            try:
                written = os.write(fd, view)
                view = view[written:]
                continue
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.EBADF, errno.EINVAL):
                    raise
                # a request without its newline never runs: as above, it died idle
                self._check_usable(may_have_started=False, target=target)
                raise self._crash(target, may_have_started=False, idle=self._calls > 1) from None
            remaining = self._remaining(deadline)
            if remaining is not None and remaining <= 0:
                raise self._timeout(target, -1, started=False)
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.register(self._wake_r, select.POLLIN)
            poller.poll(_poll_ms(remaining))

    def _await_reply(self, request_id: int, deadline: float | None, target: str) -> dict[str, Any]:
        """Wait on stdout and the wake pipe (one poll), read what is there, until the reply.

        Read first, when that has been paying: on one CPU the worker, woken by the request,
        runs before ``write`` returns (the kernel preempts the writer for it), so its reply is
        already there and the poll would only say so (98 % of calls, measured). Unpinned the
        reply is there about one time in four, and a read that finds nothing costs a syscall:
        after such a miss the next ``_READ_FIRST_BACKOFF`` calls poll first. A reply read this
        way on a worker killed meanwhile is not taken: the call raises as it would after a poll.

        With ``CASTOR_REPLY_SPIN=1``, where the process may run on several CPUs, the first wait
        polls without blocking for up to a few tens of microseconds before it blocks
        (``castor._spin``: bounded, adaptive, off on one CPU; off by default for the worker call,
        where it measured slower than the blocking wait): what that poll returns -- the reply,
        the end of stdout, the wake pipe -- is handled exactly as the blocking poll's events.
        """
        out_fd = self._out_fd
        poller = self._reply_poller
        spin = self._spin
        if spin is not None and not spin.wanted():
            spin = None  # in its back-off: this call waits as it would without one
        read_first = not self._poll_first and not self._buffer
        tail: list[bytes] = []  # chunks of a line still without its newline (joined once it comes)
        tail_size = 0
        too_large = False  # the call's own reply is over the bound: dropped as it comes, to its newline
        # Output over the bound that is no reply of this call (a backend writing without a newline):
        # dropped as it comes while the call's reply head is looked for in it; the last bytes seen,
        # for a head split between two reads (None: not dropping).
        seeking: bytes | None = None
        if self._poll_first:
            self._poll_first -= 1
        while True:
            # ``find``, not ``in``: ``b"\n" in data`` first tries the needle as an integer (a byte
            # value) and builds and drops a TypeError for it, about 2k instructions each time.
            if self._buffer and self._buffer.find(b"\n") >= 0:
                reply = self._take_reply(request_id, target)
                if reply is not None:
                    return reply
            if read_first:
                read_first = False
                try:
                    chunk = os.read(out_fd, _READ_CHUNK)
                except BlockingIOError:  # not there yet: poll, and poll first for the next calls
                    self._poll_first = _READ_FIRST_BACKOFF
                    continue
                if self._retired is not None or self._crashed:  # killed meanwhile: the call fails
                    self._check_usable(may_have_started=True, target=target)
            else:
                if spin is not None:  # the first wait only: poll without blocking for a while first
                    events = spin.poll(poller.poll)
                    spin = None
                else:
                    events = []
                if events:
                    pass
                elif deadline is None:
                    events = poller.poll(_LIVENESS_POLL_MS * _POLL_UNIT)
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._timeout(target, request_id, started=True)
                    wait_ms = int(remaining * 1000) + 1  # _poll_ms(remaining), inline: remaining > 0 here
                    events = poller.poll((wait_ms if wait_ms < _LIVENESS_POLL_MS else _LIVENESS_POLL_MS)
                                         * _POLL_UNIT)
                if self._retired is not None or self._crashed:  # killed meanwhile: the call fails
                    self._check_usable(may_have_started=True, target=target)
                if not events:
                    assert self._proc is not None  # only a started worker is awaited
                    if self._proc.poll() is not None:
                        raise self._crash(target, may_have_started=True)
                    continue
                try:
                    chunk = os.read(out_fd, _READ_CHUNK)
                except BlockingIOError:  # the wake pipe alone (the worker is being killed) or a spurious wake
                    continue
            if not chunk:  # end of file: the child is gone
                self._check_usable(may_have_started=True, target=target)
                raise self._crash(target, may_have_started=True)
            if too_large:
                end = chunk.find(b"\n")
                if end < 0:
                    continue
                self._buffer = chunk[end + 1:]
                return {"id": request_id, "ok": False, "traceback": "", "refused": "reply_too_large",
                        "error": f"reply too large: the worker's answer was over {self._max_reply} bytes "
                                 "and was dropped unread"}
            if seeking is not None:
                end = chunk.find(b"\n")
                head = _own_head(request_id)
                found, seeking = _from_head(seeking, [chunk], head, len(chunk) if end < 0 else end)
                if found is not None:  # the call's reply after the output: gathered from its head
                    seeking = None
                    self._dropped_output(target)
                    chunk = found[0]
                elif end < 0:
                    continue
                else:  # the output's line ended with no reply of this call in it
                    seeking = None
                    self._garbage += 1
                    chunk = chunk[end + 1:]
                    if not chunk:
                        continue
            if self._buffer:
                # A long line (a large value) comes in many chunks: they wait in ``tail`` and are
                # joined once, when its newline comes. ``+=`` per chunk copied the whole line each
                # time, and the newline search went over it again: quadratic (a 64 MB reply took
                # 28 s, near the 30 s default deadline).
                if chunk.find(b"\n") < 0:
                    tail.append(chunk)
                    tail_size += len(chunk)
                    if tail_size + len(self._buffer) > self._max_reply:
                        begun = _REPLY_HEAD.match(self._buffer.lstrip())
                        pieces = [self._buffer, *tail]
                        self._buffer = b""
                        tail.clear()
                        tail_size = 0
                        if begun is not None and int(begun.group(1)) == request_id:
                            too_large = True
                            continue
                        # Not this call's reply (output without a newline): its reply may follow it.
                        found, carry = _from_head(b"", pieces, _own_head(request_id), -1)
                        del pieces
                        if found is None:
                            seeking = carry
                            continue
                        self._dropped_output(target)
                        if sum(len(piece) for piece in found) > self._max_reply:
                            too_large = True
                            continue
                        self._buffer, tail = found[0], found[1:]
                        tail_size = sum(len(piece) for piece in tail)
                    continue
                if tail:
                    tail.append(chunk)
                    chunk = b"".join(tail)
                    tail.clear()
                    tail_size = 0
                self._buffer += chunk
                continue
            # find, not count: bytes.count scans byte by byte (~3 us for a 10 KiB reply), find
            # uses memchr; "the first newline is the last byte" is "exactly one, at the end".
            if chunk.find(b"\n") == len(chunk) - 1:
                # The common case: nothing was buffered and the chunk is one whole line, the reply.
                # Anything else it could be (blank, not a reply, a stale id) is left to _take_reply,
                # which counts or raises as ever.
                reply = _decode_reply(chunk.strip())
                if reply is not None and reply.get("id") == request_id:
                    return reply
            self._buffer = chunk

    def _dropped_output(self, target: str) -> None:
        """Count output without a newline dropped before the call's reply (``garbage_lines``), and
        say so the first time (never its text: it may be memory)."""
        self._garbage += 1
        if self._garbage == 1:
            logger.bind(actor="/icarus/worker").warning(
                "icarus worker wrote more than {} bytes without a newline before its reply to {}: dropped; "
                "later ones are counted in its stats (garbage_lines)", self._max_reply, target)

    def _buffered_lines(self) -> Iterator[bytes]:
        """Take the whole, non-blank lines out of the buffer, stripped, one at a time (a partial
        last line stays). ``partition``, not ``split``: it finds the newline with memchr."""
        while self._buffer.find(b"\n") >= 0:  # find, not in: see _await_reply
            raw, _newline, self._buffer = self._buffer.partition(b"\n")
            line = raw.strip()
            if line:
                yield line

    def _take_reply(self, request_id: int, target: str) -> dict[str, Any] | None:
        """The reply to ``request_id`` among the whole lines buffered, or None (not yet). A line
        that is not a reply is dropped and counted (``garbage_lines``), as pi-icarus-hook drops it:
        replies carry their ids, so the call's own reply, which follows, still answers it; a
        warning the first time says a worker writes there (its length only: it may be memory text)."""
        for line in self._buffered_lines():
            reply = _decode_reply(line)
            if reply is None:
                unreadable = _unreadable_reply(line, request_id)
                if unreadable is not None:
                    return unreadable
                own = _reply_at_the_end(line, request_id)
                self._garbage += 1
                if own is not None:
                    # Output without a newline on the reply channel (backend code that found it),
                    # then the call's own reply: the output is dropped, the reply is the call's.
                    if self._garbage == 1:
                        logger.bind(actor="/icarus/worker").warning(
                            "icarus worker wrote {} bytes without a newline before its reply to {}: dropped; "
                            "later ones are counted in its stats (garbage_lines)", len(line), target)
                    return own
                if self._garbage == 1:
                    logger.bind(actor="/icarus/worker").warning(
                        "icarus worker wrote a line that is not a reply during {} ({} bytes): dropped; "
                        "later ones are counted in its stats (garbage_lines)", target, len(line))
                continue
            if reply.get("id") != request_id:
                self._mismatched += 1
                continue
            return reply
        return None

    def _drain_stale(self) -> None:
        """Consume whatever arrived between calls: stale replies and garbage are counted. At most
        ``max_reply_bytes`` are read here (a worker that writes without end is the call's to meet,
        within its deadline); output without a newline is not kept past ``_READY_NOISE_MAX`` bytes
        (no reply of this call can be in it: its request is not written yet)."""
        out_fd = self._out_fd
        budget = self._max_reply
        while budget > 0 and any(fd == out_fd for fd, _mask in self._stale_poller.poll(0)):
            try:
                chunk = os.read(out_fd, _READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:  # ended while idle, before this call's request was written
                raise self._crash("(between calls)", may_have_started=False, idle=self._calls > 0)
            budget -= len(chunk)
            if len(self._buffer) > _READY_NOISE_MAX and chunk.find(b"\n") < 0 and self._buffer.find(b"\n") < 0:
                self._buffer = b""  # one line of output without end so far: dropped as it comes
            self._buffer += chunk
        for line in self._buffered_lines():
            if _decode_reply(line) is None:
                self._garbage += 1
            else:
                self._mismatched += 1
        if len(self._buffer) > _READY_NOISE_MAX:
            self._buffer = b""  # the start of a line of output without end: dropped
            self._garbage += 1

    def _crash(self, target: str, *, may_have_started: bool, idle: bool = False,
               before_ready: bool = False) -> WorkerCrashed:
        """The child ended on its own: reap it, collect the stderr tail, retire. ``idle``: it ended
        between calls on a worker that had served one (``died_idle``, as a request found unread).
        ``before_ready``: it ended before the worker program said it was ready -- the ``python``
        runs but is no Python fit to run it (``data.reason "exited_before_ready"``, with the python)."""
        self._crashed = True
        proc = self._proc
        assert proc is not None  # a crash is only seen on a started worker
        lived_on = False
        try:
            exit_code = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            exit_code = None
            lived_on = True  # its reply channel ended but it did not: castor ends it below
        with self._kill_lock:
            self._killed = False  # make sure a half-dead tree is still swept
        died_idle = idle or (may_have_started and self._calls > 1
                             and (self._request_unread() or self._request_never_begun()))
        self.kill_tree("crashed")
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=0.5)
        data: dict[str, Any] = {"exit_code": exit_code, "target": target, "pid": proc.pid}
        if died_idle:
            data["died_idle"] = True
        if before_ready:
            data.update(reason="exited_before_ready", python=self._launch.python)
        if lived_on:
            data.setdefault("reason", "reply_channel_closed")
            message = f"icarus worker closed its reply channel during {target} and lived on; it was killed"
        else:
            how = death_words(exit_code) or "exit status unknown"  # "killed by SIGKILL", never "code -9"
            message = f"icarus worker ended ({how}) during {target}"
        error = WorkerCrashed(message, data=data, may_have_started=may_have_started and not died_idle)
        error.stderr_tail = self._stderr.text()  # type: ignore[attr-defined]  # an extra, off-wire attribute
        return error

    def _request_unread(self) -> bool:
        """Whether the whole request written last still sits in the worker's input pipe (the
        pipe keeps its bytes while this side holds it open, whatever became of the reader)."""
        unread = array.array("i", [0])
        try:
            fcntl.ioctl(self._in_fd, termios.FIONREAD, unread, True)
        except OSError:
            return False
        return unread[0] == self._request_bytes > 0

    def _request_never_begun(self) -> bool:
        """Whether the worker, dead now, never began the request written last: its count of the
        requests it began (the shared page) is short of the ones written. A kill that lands while
        the worker waits idle can still hand its read the request (the kernel gives a woken read
        its bytes before it ends the process), and the pipe is then empty: only this tells that
        death from one during the call. Read on the crash path only."""
        if self._begun_fd < 0:
            return False
        try:
            raw = os.pread(self._begun_fd, 8, 0)
        except OSError:
            return False
        return len(raw) == 8 and int.from_bytes(raw, sys.byteorder) < self._calls

    # ------------------------------------------------------------------ stats

    def state(self) -> str:
        if self._proc is None:
            return "crashed" if self._crashed else "not_started"
        if self._crashed:
            return "crashed"
        if self._retired is not None:
            return "retired"
        return "running" if self._proc.poll() is None else "exited"

    def stats(self) -> WorkerStats:
        lines, size = self._stderr.size()
        base: dict[str, Any] = dict(pid=self.pid, alive=False, state=self.state(), calls=self._calls,
                                    mismatched_replies=self._mismatched, garbage_lines=self._garbage,
                                    stderr_tail_lines=lines, stderr_tail_bytes=size)
        if self._proc is not None and self._proc.poll() is None:
            try:
                proc = psutil.Process(self._proc.pid)
                with proc.oneshot():
                    cpu = proc.cpu_times()
                    base.update(alive=True, rss_bytes=proc.memory_info().rss, cpu_user_s=cpu.user,
                                cpu_system_s=cpu.system, num_fds=proc.num_fds(),
                                open_files=len(proc.open_files()), children=len(proc.children(recursive=True)))
            except psutil.Error:
                pass
        return WorkerStats(**base)

    def __del__(self) -> None:  # a last resort only: kill_tree / a failed call close everything
        if getattr(self, "_fd_lock", None) is not None:
            self._close_wake_pipe()


def _wait_ended(procs: list[psutil.Process], timeout: float) -> None:
    """Wait (bounded) until each process has ended: gone, or a zombie. A zombie is dead; only its
    pid waits for its parent to collect it, and an orphan's parent is whoever adopted it (PID 1, a
    subreaper), which may do so late or never (a container's PID 1). ``psutil.wait_procs`` waited
    for the pid to vanish: up to the whole timeout on every kill of a backend that had started a
    process."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.Error:  # gone (or no longer inspectable: not waited for)
                pass
        procs = alive
        if not procs or time.monotonic() >= deadline:
            return
        time.sleep(delay)  # a SIGKILL takes effect in a moment; nothing to be woken by meanwhile
        delay = min(delay * 2, 0.04)


def _poll_ms(remaining: float | None) -> int:
    if remaining is None:
        return int(_LIVENESS_POLL_S * 1000)
    return max(0, min(int(remaining * 1000) + 1, int(_LIVENESS_POLL_S * 1000)))


#: A request line as the C encoder writes the request object (its keys in this order, its
#: separators) around the arguments' own JSON: formatted, not encoded as a dict, it costs about
#: half (each of the object's five keys and two names was a string the encoder made and joined).
#: Its head is kept per target (:func:`_head`), the two names quoted once.
_REQUEST_LINE = '{"id": %d, "module": %s, "function": %s, "args": %s, "kwargs": %s}\n'
_QUOTE = json.encoder.encode_basestring_ascii
#: From this length on a string is checked for characters JSON escapes before it is encoded: the
#: C encoder's escaping loop costs about 37 instructions a character (~20 us for 10 KiB), a check
#: that every character is printable ASCII other than ``"`` and ``\`` about a third of that, and a
#: string that passes is its own JSON between quotes -- the same bytes the encoder writes.
_LONG_STRING = 2048
#: The characters ``encode_basestring_ascii`` writes as they are (space to ``~``, but ``"`` and ``\``).
_AS_IS = bytes(c for c in range(0x20, 0x7F) if c not in (0x22, 0x5C))


def _quote_long(text: str) -> str:
    """``encode_basestring_ascii(text)``, without its escaping loop for a long string that needs none."""
    if len(text) >= _LONG_STRING and text.isascii() and not text.encode("ascii").translate(None, _AS_IS):
        return '"' + text + '"'
    return _QUOTE(text)


#: The request encoder for arguments that carry a long string (:func:`_long_strings`): the same as
#: ``_C_ENCODER`` but with every string quoted by :func:`_quote_long` (a Python call per string and
#: key, so only for such arguments).
_C_ENCODER_LONG = (_MAKE_ENCODER(None, str, _quote_long, None, ": ", ", ", False, False, False)
                   if _MAKE_ENCODER is not None else None)


def _long_strings(args: list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether a keyword argument, an argument or a value of an argument that is a dict (a tool's
    params) is a string of :data:`_LONG_STRING` characters or more."""
    for value in kwargs.values():
        if type(value) is str and len(value) >= _LONG_STRING:
            return True
    for value in args:
        if type(value) is str:
            if len(value) >= _LONG_STRING:
                return True
        elif type(value) is dict:
            for item in value.values():
                if type(item) is str and len(item) >= _LONG_STRING:
                    return True
    return False


#: A request line's head up to its arguments (``{"id": %d, "module": ..., "function": ..., "args": ``),
#: per (module, function): the two names quoted once, not on every call. A handful of entries (the
#: backend calls castor makes); past the bound a head is formatted and not kept.
_HEADS: dict[tuple[str, str], str] = {}
_HEADS_KEPT = 64


def _head(module: str, function: str) -> str:
    head = '{"id": %%d, "module": %s, "function": %s, "args": ' % (
        _QUOTE(module).replace("%", "%%"), _QUOTE(function).replace("%", "%%"))
    if len(_HEADS) < _HEADS_KEPT:
        _HEADS[module, function] = head
    return head


def _encode_request(request_id: int, module: str, function: str, args: Any, kwargs: Any) -> bytes:
    """One request line (ASCII JSON). Arguments JSON cannot carry (NaN, infinity, a cycle) are
    the caller's error, raised before anything is sent: ``InvalidParams``."""
    args = args if type(args) is list else list(args or ())
    kwargs = kwargs if type(kwargs) is dict else dict(kwargs or {})
    try:
        if _C_ENCODER is not None:
            encoder = _C_ENCODER
            if _C_ENCODER_LONG is not None:
                # _long_strings, inline for the commonest shapes (a tool's one params dict, no
                # keyword arguments; a hook's keyword arguments): the look costs every call.
                if not kwargs and len(args) == 1 and type(args[0]) is dict:
                    for item in args[0].values():
                        if type(item) is str and len(item) >= _LONG_STRING:
                            encoder = _C_ENCODER_LONG
                            break
                elif _long_strings(args, kwargs):
                    encoder = _C_ENCODER_LONG
            head = _HEADS.get((module, function)) or _head(module, function)
            line = (head % request_id + "".join(encoder(args, 0))
                    + (", \"kwargs\": " + "".join(encoder(kwargs, 0)) + "}\n" if kwargs else ', "kwargs": {}}\n'))
        else:
            line = _ENCODER.encode({"id": request_id, "module": module, "function": function, "args": args,
                                    "kwargs": kwargs}) + "\n"
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidParams(f"arguments for {module}.{function} cannot be sent to the worker: {exc}",
                            data={"target": f"{module}.{function}"}, may_have_started=False) from None
    return line.encode("ascii")


def _decode_reply(line: bytes) -> dict[str, Any] | None:
    """A reply dict, or None for a line that is not one. Lone surrogates (a backend's escaped
    text) become U+FFFD, so the reply can be audited, filtered and sent on as UTF-8."""
    try:
        text = line.decode("utf-8")  # UnicodeDecodeError is a ValueError
        reply, end = _SCAN(text, 0)  # the line is stripped: one value must fill it
    except (ValueError, RecursionError, StopIteration):
        return None
    if end != len(text):
        return None
    if line.find(b"\\") >= 0 and _SURROGATE_ESCAPE.search(line) is not None:
        # Only a \uD800-\uDFFF escape can carry a lone surrogate (UTF-8 cannot encode one, and
        # a byte that is not UTF-8 failed above), so a line without one needs no walk. The
        # one-byte test first (memchr) and a regex, not ``b"\\u" in line``: CPython's two-byte
        # substring search took ~8 us on a 10 KiB reply, more than parsing it. ``find``, not
        # ``in``: ``in`` tries the needle as an integer first and builds and drops a TypeError.
        reply = well_formed(reply)
    if not isinstance(reply, dict) or "id" not in reply or not isinstance(reply.get("ok"), bool):
        return None
    return reply


#: How the worker program starts a reply line (its dict's key order, the encoder's separators).
_REPLY_HEAD = re.compile(rb'\{"id": (\d{1,19}), "ok": (?:true|false), ')


def _own_head(request_id: int) -> bytes:
    """How the worker program starts its reply to ``request_id`` (:data:`_REPLY_HEAD`)."""
    return b'{"id": %d, "ok": ' % request_id


def _from_head(carry: bytes, pieces: list[bytes], head: bytes, end: int) -> tuple[list[bytes] | None, bytes]:
    """Look for ``head`` in a line's bytes: ``carry`` (the last bytes before ``pieces``, fewer than
    the head's length) then ``pieces``, the last one only up to ``end`` (-1: whole). The pieces from
    the first head on (its first piece starting with it; anything after ``end`` kept), or None and
    the new carry: the last ``len(head) - 1`` bytes looked at, for a head split between reads.
    Linear in the bytes looked at, and it copies none but the head's own piece and the carry."""
    keep = len(head) - 1
    last = len(pieces) - 1
    for i, piece in enumerate(pieces):
        stop = end if i == last and end >= 0 else len(piece)
        if carry:
            joint = carry + piece[:min(keep, stop)]
            at = joint.find(head)
            if at >= 0:  # split between the carry and this piece
                return [joint[at:] + piece[min(keep, stop):], *pieces[i + 1:]], b""
        at = piece.find(head, 0, stop)
        if at >= 0:
            return [piece[at:], *pieces[i + 1:]], b""
        carry = piece[max(0, stop - keep):stop] if stop >= keep else (carry + piece[:stop])[-keep:]
    return None, carry


def _unreadable_reply(line: bytes, request_id: int) -> dict[str, Any] | None:
    """The call's own reply, written by the worker program, that castor's parser cannot read, as a
    failure reply; None for any other line. The worker's Python can write what this one cannot
    read: an integer of more than 4,300 digits (no such limit before 3.11), nesting deeper than
    castor's recursion limit. Dropped as garbage, it left its call waiting out its deadline, and
    the worker was then killed with the session's state; it fails the call at once now, as an
    unserializable result does, and the worker goes on."""
    head = _REPLY_HEAD.match(line)
    if head is None or int(head.group(1)) != request_id:
        return None
    try:
        json.loads(line)
        why = "not a reply"
    except RecursionError:
        why = "nested too deeply"
    except ValueError as exc:
        why = "an integer with too many digits" if "digits" in str(exc) else "not JSON"
    return {"id": request_id, "ok": False, "error": f"unreadable result: {why}", "traceback": ""}


def _reply_at_the_end(line: bytes, request_id: int) -> dict[str, Any] | None:
    """The call's own reply at the end of a line that is not a reply (output written to the reply
    channel without a newline, the reply right after it), or None. The reply is the first place
    from which the rest of the line is a reply with the call's id: the worker program starts each
    reply so (``_REPLY_HEAD``), and a string inside one cannot hold that head unescaped."""
    head = b'{"id": %d, "ok": ' % request_id
    start = line.find(head, 1)
    while start > 0:
        reply = _decode_reply(line[start:])
        if reply is not None and reply.get("id") == request_id:
            return reply
        start = line.find(head, start + 1)
    return None


def worker_factory(launch: WorkerLaunch, **kwargs: Any) -> Callable[[], WorkerProcess]:
    """A ``spawn`` callable for the actor: constructs (does not start) a WorkerProcess."""
    return lambda: WorkerProcess(launch, **kwargs)
